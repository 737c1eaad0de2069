"""Helpers shared by the benchmarks: statistics, machine facts, results files, tables,
and a raw HTTP/1.1 reader of the runner's NDJSON events stream.

Nothing here imports the runner: a benchmark measures the runner from the outside
(or beside it), with the same tools a host would use.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import trio

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# -- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], *, scale: float = 1.0) -> dict[str, float | int]:
    """Count, mean and the usual percentiles of ``values``, each multiplied by ``scale``."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": statistics.fmean(values) * scale,
        "p50": percentile(values, 50) * scale,
        "p90": percentile(values, 90) * scale,
        "p99": percentile(values, 99) * scale,
        "max": max(values) * scale,
    }


SAMPLES_KEPT = 2_000  # latency samples per configuration kept in results files, for the plots


def thin(values: Sequence[float], keep: int = SAMPLES_KEPT) -> list[float]:
    """An evenly spaced subsample of the sorted ``values``: enough to draw their distribution."""
    ordered = sorted(values)
    if len(ordered) <= keep:
        return ordered
    step = (len(ordered) - 1) / (keep - 1)
    return [ordered[round(i * step)] for i in range(keep)]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing (or the baseline is 0)."""
    return value / baseline if value is not None and baseline else None


# -- bounded loops ----------------------------------------------------------------------------


class Budget:
    """A count and a wall-clock bound for one measured loop: stop at whichever comes first."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count = count
        self.seconds = seconds
        self.started = time.perf_counter()
        self.deadline = self.started + seconds

    def expired(self) -> bool:
        return time.perf_counter() >= self.deadline


def freeze_heap_as_the_runner_does() -> dict[str, float]:
    """Freeze the imported heap as ``runner serve`` does once warm; time a full collection before and after.

    Every benchmark that runs the runner in-process calls this first, so the runner's code
    runs with the collector set up as in production.
    """
    import gc

    from runner.runtime import freeze_startup_heap

    def full_collection_ms() -> float:
        started = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - started) * 1000

    before = full_collection_ms()
    tracked = len(gc.get_objects())
    freeze_startup_heap()
    return {
        "tracked_objects": tracked,
        "full_collection_ms": before,
        "frozen_full_collection_ms": full_collection_ms(),
    }


# -- machine and results ----------------------------------------------------------------------


def _filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path`` (from /proc/mounts), or ``unknown``."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1]
                resolved = str(path.resolve())
                if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(
                    best
                ):
                    best, kind = point, parts[2]
    except OSError:
        pass
    return kind


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info(data_dir: Path | None = None) -> dict[str, Any]:
    """What the figures depend on: cores, CPU, Python, SQLite, library versions, filesystem."""
    info: dict[str, Any] = {
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": {
            name: _version(name)
            for name in ("trio", "hypercorn", "quart-trio", "quart", "h11", "sqlite-utils")
        },
    }
    if data_dir is not None:
        info["data_dir"] = str(data_dir)
        info["data_filesystem"] = _filesystem_of(data_dir)
    return info


@attrs.frozen
class CpuSample:
    """Jiffies the whole machine was busy, and CPU seconds this process (and its children) used."""

    wall: float
    machine_busy_s: float | None
    own_s: float


def cpu_sample() -> CpuSample:
    busy = None
    try:
        with open("/proc/stat", encoding="utf-8") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait.
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    times = os.times()
    return CpuSample(
        wall=time.perf_counter(),
        machine_busy_s=busy,
        own_s=times.user + times.system + times.children_user + times.children_system,
    )


def cpu_report(start: CpuSample, end: CpuSample) -> dict[str, Any]:
    """How loaded the machine was between two samples, and how much of it was someone else.

    ``others_cores`` is the average number of cores other processes kept busy: the
    figures are trustworthy only when it is near zero.
    """
    wall = end.wall - start.wall
    report: dict[str, Any] = {
        "seconds": wall,
        "own_cores": (end.own_s - start.own_s) / wall if wall else None,
    }
    if start.machine_busy_s is not None and end.machine_busy_s is not None and wall:
        machine = (end.machine_busy_s - start.machine_busy_s) / wall
        report["machine_cores_busy"] = machine
        report["others_cores"] = max(0.0, machine - report["own_cores"])
    report["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return report


def utc_stamp(moment: datetime | None = None) -> str:
    """``20250101T120000Z``: sortable, and safe in a file name."""
    return (moment or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def write_results(name: str, data: Mapping[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """Write ``<name>-<UTC stamp>.json`` and ``<name>-latest.json``; return the stamped path."""
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    path = directory / f"{name}-{utc_stamp()}.json"
    path.write_text(text, encoding="utf-8")
    (directory / f"{name}-latest.json").write_text(text, encoding="utf-8")
    return path


# -- printing ---------------------------------------------------------------------------------


def fmt(value: Any, unit: str = "") -> str:
    """A number short enough for a table cell: 3 significant figures, thousands separated."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    number = float(value)
    if number == 0:
        text = "0"
    elif abs(number) >= 100:
        text = f"{number:,.0f}"
    elif abs(number) >= 10:
        text = f"{number:.1f}"
    else:
        text = f"{number:.2f}"
    return f"{text}{(' ' + unit) if unit else ''}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], file: Any = None) -> None:
    """A plain aligned table: first column left, the others right."""
    file = file or sys.stdout
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()

    print(line(cells[0]), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells[1:]:
        print(line(row), file=file)


def say(*parts: Any) -> None:
    """Progress, on stderr, so stdout keeps only the results."""
    print(*parts, file=sys.stderr, flush=True)


# -- the events stream over a raw socket ------------------------------------------------------

ENVELOPE_PREFIX = b'{"envelope":'


def envelope_of(line: bytes) -> int:
    """The envelope of a stream line that starts with ``{"envelope":N,``."""
    return int(line[len(ENVELOPE_PREFIX) : line.index(b",", len(ENVELOPE_PREFIX))])


class EventsReader:
    """``GET /v1/runner/events`` over one raw HTTP/1.1 connection.

    It decodes the chunked body incrementally and hands back whole NDJSON lines as
    bytes, stamped with the monotonic time their bytes arrived, so a benchmark
    pays for no JSON it does not need.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._raw = bytearray()
        self._body = bytearray()
        self._left: int | None = None  # payload bytes left in this chunk; 0: its CRLF is next
        self._ended = False
        self._arrived = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.error_body = b""

    @classmethod
    async def connect(cls, address: str, token: str, query: str = "") -> EventsReader:
        """Connect, send the request and read the answer's head (``status``, ``headers``)."""
        host, port = address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        reader = cls(stream)
        try:
            request = (
                f"GET /v1/runner/events{'?' + query if query else ''} HTTP/1.1\r\nHost: {address}\r\n"
                f"Authorization: Bearer {token}\r\nAccept: application/x-ndjson\r\n\r\n"
            )
            await stream.send_all(request.encode())
            await reader._read_head()
        except BaseException:
            await stream.aclose()
            raise
        return reader

    async def _read_head(self) -> None:
        while (end := self._raw.find(b"\r\n\r\n")) < 0:
            data = await self._stream.receive_some(65536)
            if not data:
                raise EOFError("the connection closed before the answer's head")
            self._raw += data
        status_line, *header_lines = bytes(self._raw[:end]).decode("latin-1").split("\r\n")
        del self._raw[: end + 4]
        self.status = int(status_line.split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        if "chunked" not in self.headers.get("transfer-encoding", ""):
            need = int(self.headers.get("content-length", "0"))
            while len(self._raw) < need:
                data = await self._stream.receive_some(65536)
                if not data:
                    break
                self._raw += data
            self.error_body = bytes(self._raw)
            self._ended = True

    def _decode(self) -> None:
        raw, pos, size = self._raw, 0, len(self._raw)
        while pos < size and not self._ended:
            if self._left is None:
                end = raw.find(b"\r\n", pos)
                if end < 0:
                    break
                length = int(bytes(raw[pos:end]).split(b";")[0], 16)
                pos = end + 2
                if length == 0:
                    self._ended = True
                    break
                self._left = length
            elif self._left > 0:
                take = min(self._left, size - pos)
                self._body += raw[pos : pos + take]
                pos += take
                self._left -= take
            else:
                if size - pos < 2:
                    break
                pos += 2
                self._left = None
        del raw[:pos]

    async def receive_lines(self) -> tuple[int, list[bytes]] | None:
        """The next whole lines and the ``time.monotonic_ns()`` their last bytes arrived.

        Returns None once the stream ended (its last chunk, or the connection closed).
        """
        while True:
            cut = self._body.rfind(b"\n")
            if cut >= 0:
                lines = bytes(self._body[:cut]).split(b"\n")
                del self._body[: cut + 1]
                return self._arrived, lines
            if self._ended:
                return None
            data = await self._stream.receive_some(1 << 18)
            self._arrived = time.monotonic_ns()
            if not data:
                self._ended = True
                return None
            self._raw += data
            self._decode()

    async def aclose(self) -> None:
        await self._stream.aclose()
