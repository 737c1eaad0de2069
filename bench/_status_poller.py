"""A host polling ``GET /v1/runner`` once a second, in a process of its own.

    python -m bench._status_poller URL TOKEN SECONDS

Prints ``ready`` once its client is up, then one line per poll: the milliseconds from
sending the request to the whole body read (the body is not parsed: a real host parses
it on its own CPU, and this process is not the runner's). ``bench.calls`` runs it beside
its probes to see what a polling host costs the runner's other requests.
"""

from __future__ import annotations

import sys
import time

import httpx


def main() -> int:
    url, token, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        client.get("/health")
        print("ready", flush=True)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            began = time.perf_counter()
            response = client.get("/v1/runner")
            took = time.perf_counter() - began
            response.raise_for_status()
            print(f"{took * 1000:.3f} {len(response.content)}", flush=True)
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
