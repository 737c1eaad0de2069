"""A real livekit-server in a private network namespace, and peers that join it.

WebRTC gathers ICE candidates on every interface it can see, so the server and
every participant run inside a network namespace made here: ``lo`` up plus a
veth pair whose two ends both stay inside, each with an address of its own.
Nothing in it has a route out. See docs/livekit-testing.md.

This module is imported by tests/livekit/conftest.py and the tests there; the
participant program it launches is lk_peer.py (asyncio, the livekit SDK).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import trio

BIN_ENV = "CURB_LIVEKIT_BIN"
DEFAULT_BIN = Path.home() / ".cache" / "curb-runner" / "bin" / "livekit-server"
INSTALL_HINT = "run .ci/install-livekit-server to build it (see docs/livekit-testing.md)"
PEER_SCRIPT = Path(__file__).with_name("lk_peer.py")

API_KEY = "curbtestkey"
API_SECRET = "curb-test-secret-0123456789abcdef0123456789"  # >= 32 chars

HTTP_PORT = 7880  # signalling (WebSocket) and the HTTP API
RTC_TCP_PORT = 7881  # ICE over TCP
RTC_UDP_PORT = 7882  # ICE over UDP, one muxed port
# The server's webhooks go to these management listeners in its namespace: the workers of the
# failover tests listen there (`runner start --address 127.0.0.1:PORT`); elsewhere nobody does,
# and the server logs the refused posts.
WEBHOOK_PORTS = (7951, 7952)
WEBHOOK_URLS = [f"http://127.0.0.1:{port}/v1/livekit/webhook" for port in WEBHOOK_PORTS]

SERVER_START_TIMEOUT = 20.0
SERVER_STOP_TIMEOUT = 5.0
PEER_READY_TIMEOUT = 20.0
PEER_STOP_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 10.0
MAX_LINE = 1 << 20  # one JSON line from a peer, bytes


class HarnessError(RuntimeError):
    pass


def find_livekit_server() -> str | None:
    """$CURB_LIVEKIT_BIN if set, else the default install path, else PATH."""
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    if os.access(DEFAULT_BIN, os.X_OK):
        return str(DEFAULT_BIN)
    return shutil.which("livekit-server")


def _tail(path: Path | None, limit: int = 4000) -> str:
    if path is None:
        return ""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def _run(argv: Sequence[str], timeout: float = 10.0) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


# --- network namespace -------------------------------------------------------

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns_net(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python >= 3.12
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Netns:
    """A private network namespace: lo, and a veth pair with both ends inside.

    ``server_ip`` (10.213.N.1) is on ``lk0``, ``peer_ip`` (10.213.N.2) on
    ``lk1``. The /24 is chosen at random; it only exists inside the namespace.
    """

    def __init__(self) -> None:
        self.name = f"curb-lk-{secrets.token_hex(4)}"
        octet = secrets.randbelow(250) + 1
        self.subnet = f"10.213.{octet}.0/24"
        self.server_ip = f"10.213.{octet}.1"
        self.peer_ip = f"10.213.{octet}.2"
        self.created = False

    def create(self) -> None:
        if shutil.which("ip") is None:
            raise HarnessError("`ip` (iproute2) is missing; " + INSTALL_HINT)
        _run(["ip", "netns", "add", self.name])
        self.created = True
        ns = ["ip", "-n", self.name]
        _run([*ns, "link", "set", "lo", "up"])
        _run([*ns, "link", "add", "lk0", "type", "veth", "peer", "name", "lk1"])
        # No IPv6 on the veth ends: no link-local candidates, no DAD wait.
        for dev in ("lk0", "lk1"):
            _run([*ns, "link", "set", dev, "addrgenmode", "none"])
        _run([*ns, "addr", "add", f"{self.server_ip}/24", "dev", "lk0"])
        _run([*ns, "addr", "add", f"{self.peer_ip}/24", "dev", "lk1"])
        _run([*ns, "link", "set", "lk0", "up"])
        _run([*ns, "link", "set", "lk1", "up"])

    def argv(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` wrapped to run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *(os.fspath(a) for a in argv)]

    def pids(self) -> list[int]:
        try:
            out = _run(["ip", "netns", "pids", self.name])
        except (HarnessError, subprocess.TimeoutExpired):
            return []
        return [int(p) for p in out.split() if p.isdigit()]

    def socket(self, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that belongs to the namespace (made on a short-lived thread
        that joined it), usable from this process like any other socket."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _setns_net(fd)
                finally:
                    os.close(fd)
                box["sock"] = socket.socket(family, type)
            except BaseException as exc:  # noqa: BLE001 - whatever it is, it is handed to the caller
                box["exc"] = exc

        thread = threading.Thread(target=work, name=f"netns-{self.name}", daemon=True)
        thread.start()
        thread.join(10.0)
        if "exc" in box:
            raise box["exc"]
        if "sock" not in box:
            raise HarnessError(f"could not make a socket in {self.name}")
        return box["sock"]

    def delete(self) -> None:
        if not self.created:
            return
        # Whatever a test left running in the namespace was started by us.
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            try:
                _run(["ip", "netns", "del", self.name])
                self.created = False
                return
            except HarnessError:
                time.sleep(0.1)
        raise HarnessError(f"could not delete network namespace {self.name}")


# --- the server --------------------------------------------------------------


class LiveKitServer:
    """livekit-server --dev in a private namespace. Started once per session.

    A node of a cluster (:class:`LiveKitCluster`) is given the namespace it shares, its own
    address in it, and the redis that routes between the nodes.
    """

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        netns: Netns | None = None,
        ip: str | None = None,
        redis: str | None = None,
        name: str = "livekit-server",
        port_offset: int = 0,
        webhooks: bool = False,
    ) -> None:
        self.webhooks = webhooks
        self.binary = binary
        self.workdir = workdir
        self.owns_netns = netns is None
        self.netns = netns or Netns()
        self._ip = ip
        self.redis = redis
        self.port_offset = port_offset
        self.api_key = API_KEY
        self.api_secret = API_SECRET
        self.log_path = workdir / f"{name}.log"
        self.config_path = workdir / f"{name}.yaml"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return self._ip or self.netns.server_ip

    @property
    def port(self) -> int:
        return HTTP_PORT + self.port_offset

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "port": self.port,
            "bind_addresses": [self.host],
            "keys": {self.api_key: self.api_secret},
            "rtc": {
                "tcp_port": RTC_TCP_PORT + self.port_offset,
                "udp_port": str(RTC_UDP_PORT + self.port_offset),
                "node_ip": self.host,
                "use_external_ip": False,
                "enable_loopback_candidate": False,
                "ips": {"includes": [self.netns.subnet]},
            },
            "turn": {"enabled": False},
            "logging": {"level": "info"},
        }
        if self.webhooks:
            # Only where a test listens: posts nobody takes are retried for 15 s each, in
            # order, and hold back every later event of a long-lived server.
            config["webhook"] = {"api_key": self.api_key, "urls": WEBHOOK_URLS}
        if self.redis is not None:
            config["redis"] = {"address": self.redis}
        return config

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: no YAML writer needed.
        self.config_path.write_text(json.dumps(self.config(), indent=2))
        if self.owns_netns:
            self.netns.create()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.netns.argv([self.binary, "--dev", "--config", self.config_path, "--bind", self.host]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        last: Exception | None = None
        for _ in range(int(SERVER_START_TIMEOUT / 0.05) + 1):
            rc = self.proc.poll()
            if rc is not None:
                raise HarnessError(f"livekit-server exited with {rc} while starting:\n{_tail(self.log_path)}")
            try:
                if self._http_ok():
                    return
            except OSError as exc:
                last = exc
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise HarnessError(
            f"livekit-server did not accept connections on {self.http_url} within "
            f"{SERVER_START_TIMEOUT}s (last error: {last!r}):\n{_tail(self.log_path)}"
        )

    def _http_ok(self) -> bool:
        with self.netns.socket() as sock:
            sock.settimeout(1.0)
            sock.connect((self.host, self.port))
            sock.sendall(f"GET / HTTP/1.0\r\nHost: {self.host}\r\n\r\n".encode())
            head = sock.recv(64)
        return head.startswith(b"HTTP/1.") and b" 200 " in head

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, limit: int = 4000) -> str:
        return _tail(self.log_path, limit)

    def stop(self) -> None:
        try:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(SERVER_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(SERVER_STOP_TIMEOUT)
        finally:
            if self.owns_netns:
                self.netns.delete()


REDIS_PORT = 6379


class LiveKitCluster:
    """Two livekit-server nodes sharing one redis-server, in one private namespace.

    This is LiveKit's multi-node deployment, on one machine: node 0 listens on the
    namespace's ``server_ip``, node 1 on its ``peer_ip`` (the same ports: each address
    has its own), and redis on the namespace's loopback routes rooms, signals and agent
    jobs between them.
    """

    def __init__(self, binary: str, workdir: Path) -> None:
        self.workdir = workdir
        self.netns = Netns()
        self.redis_address = f"127.0.0.1:{REDIS_PORT}"
        self.redis_log = workdir / "redis-server.log"
        self.redis: subprocess.Popen[bytes] | None = None
        self.nodes = [
            LiveKitServer(
                binary,
                workdir,
                netns=self.netns,
                ip=ip,
                redis=self.redis_address,
                name=f"livekit-node{i}",
                # Each node its own ports too: the RTC ports may bind every address.
                port_offset=10 * i,
                webhooks=True,  # a cluster lives for one test: the failover tests listen
            )
            for i, ip in enumerate((self.netns.server_ip, self.netns.peer_ip))
        ]

    def start(self) -> None:
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise HarnessError("redis-server is missing (apt-get install redis-server; .ci/run does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netns.create()
        with open(self.redis_log, "wb") as log:
            self.redis = subprocess.Popen(
                self.netns.argv(
                    [
                        redis_server,
                        "--bind",
                        "127.0.0.1",
                        "--port",
                        str(REDIS_PORT),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ]
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_redis()
        for node in self.nodes:
            node.start()

    def _wait_redis(self) -> None:
        assert self.redis is not None
        for _ in range(int(SERVER_START_TIMEOUT / 0.05)):
            if self.redis.poll() is not None:
                raise HarnessError(f"redis-server exited while starting:\n{_tail(self.redis_log)}")
            try:
                with self.netns.socket() as sock:
                    sock.settimeout(1.0)
                    sock.connect(("127.0.0.1", REDIS_PORT))
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise HarnessError(f"redis-server did not answer:\n{_tail(self.redis_log)}")

    def stop(self) -> None:
        try:
            for node in self.nodes:
                node.stop()
            if self.redis is not None and self.redis.poll() is None:
                self.redis.terminate()
                try:
                    self.redis.wait(SERVER_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.redis.kill()
                    self.redis.wait(SERVER_STOP_TIMEOUT)
        finally:
            self.netns.delete()


# --- what a test gets --------------------------------------------------------


class LiveKitEnv:
    """The running server as one test sees it: where it is, how to mint tokens,
    how to run programs (the runner, participants) inside its namespace.

    Every process started through this object is killed and reaped when the
    test ends, if it has not ended by itself.
    """

    def __init__(self, server: LiveKitServer, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.url = server.url
        self.http_url = server.http_url
        self.host = server.host
        self.peer_ip = server.netns.peer_ip
        self.netns = server.netns.name
        self.api_key = server.api_key
        self.api_secret = server.api_secret
        self._popens: list[subprocess.Popen[Any]] = []
        self._processes: list[trio.Process] = []
        self._seq = itertools.count(1)

    # names and tokens

    def unique_room(self, prefix: str = "room") -> str:
        return f"{prefix}-{secrets.token_hex(4)}"

    def token(
        self,
        identity: str,
        room: str,
        *,
        agent: bool = False,
        kind: str | None = None,
        name: str | None = None,
        metadata: str | None = None,
        attributes: dict[str, str] | None = None,
    ) -> str:
        """A room token; ``agent=True`` is ``kind="agent"`` (``kind="sip"`` makes a phone)."""
        from livekit import api

        tok = (
            api.AccessToken(self.api_key, self.api_secret)
            .with_identity(identity)
            .with_grants(api.VideoGrants(room_join=True, room=room))
        )
        if agent:
            kind = "agent"
        if kind:
            tok = tok.with_kind(kind)
        if name is not None:
            tok = tok.with_name(name)
        if metadata is not None:
            tok = tok.with_metadata(metadata)
        if attributes:
            tok = tok.with_attributes(attributes)
        return tok.to_jwt()

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ plus LIVEKIT_URL / LIVEKIT_API_KEY / LIVEKIT_API_SECRET."""
        env = dict(os.environ)
        env.update(
            LIVEKIT_URL=self.url,
            LIVEKIT_API_KEY=self.api_key,
            LIVEKIT_API_SECRET=self.api_secret,
        )
        if extra:
            env.update(extra)
        return env

    # processes inside the namespace

    def argv(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        return self.server.netns.argv(argv)

    def popen(self, argv: Sequence[str | os.PathLike[str]], **kw: Any) -> subprocess.Popen[Any]:
        """subprocess.Popen of ``argv`` inside the namespace."""
        kw.setdefault("env", self.env())
        proc = subprocess.Popen(self.argv(argv), **kw)
        self._popens.append(proc)
        return proc

    async def open_process(self, argv: Sequence[str | os.PathLike[str]], **kw: Any) -> trio.Process:
        """trio.lowlevel.open_process of ``argv`` inside the namespace."""
        kw.setdefault("env", self.env())
        proc = await trio.lowlevel.open_process(self.argv(argv), **kw)
        self._processes.append(proc)
        return proc

    async def open_tcp_stream(self, host: str, port: int) -> trio.SocketStream:
        """A TCP connection made from inside the namespace (to the runner's
        API, say), for use by the test itself."""
        sock = await trio.to_thread.run_sync(self.server.netns.socket)
        tsock = trio.socket.from_stdlib_socket(sock)
        try:
            await tsock.connect((host, port))
        except BaseException:
            tsock.close()
            raise
        return trio.SocketStream(tsock)

    @contextlib.asynccontextmanager
    async def peer(
        self,
        identity: str,
        room: str,
        *,
        agent: bool = False,
        kind: str | None = None,
        attributes: dict[str, str] | None = None,
        name: str | None = None,
        ready_timeout: float = PEER_READY_TIMEOUT,
        program: str | os.PathLike[str] = PEER_SCRIPT,
    ) -> AsyncIterator[Peer]:
        """A participant process connected to ``room``; ``kind`` and ``attributes`` go into
        its token (see :meth:`token`). ``program`` is lk_peer.py (the Python SDK) unless the
        test names another with its protocol (lk_browser.py: a page in Chromium)."""
        seq = next(self._seq)
        stderr_path = self.workdir / f"peer-{seq}-{identity}.log"
        env = self.env(
            {
                "LK_PEER_TOKEN": self.token(
                    identity, room, agent=agent, kind=kind, name=name, attributes=attributes
                ),
                "PYTHONUNBUFFERED": "1",
            }
        )
        with open(stderr_path, "wb") as stderr:
            proc = await self.open_process(
                [sys.executable, program, "--url", self.url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
        peer = Peer(identity, proc, stderr_path)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(peer._read_stdout)
                try:
                    peer.info = await peer.expect("connected", timeout=ready_timeout)
                    yield peer
                finally:
                    with trio.CancelScope(shield=True):
                        await peer._stop()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _reap(proc)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for tproc in self._processes:
                await _reap(tproc)
            for proc in self._popens:
                if proc.poll() is None:
                    proc.kill()
                await trio.to_thread.run_sync(proc.wait)
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()


async def _reap(proc: trio.Process) -> None:
    if proc.returncode is None:
        with trio.move_on_after(PEER_STOP_TIMEOUT):
            await proc.wait()
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()


# --- a participant process, seen from the test -------------------------------


class PeerError(AssertionError):
    """A peer reported a failed request (``result`` holds its result line,
    with ``error`` and, for RPC errors, ``code``), or did not answer in time
    (``result`` is None)."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


class Peer:
    """One lk_peer.py process. Requests go in on stdin as JSON lines; results
    and events come back on stdout as JSON lines.

    ``await peer.request(op, **args)`` returns the result of one request;
    ``await peer.expect(event, **match)`` returns (and consumes) the first
    event of that kind whose fields equal ``match``.
    """

    def __init__(self, identity: str, proc: trio.Process, stderr_path: Path) -> None:
        self.identity = identity
        self.proc = proc
        self.stderr_path = stderr_path
        self.info: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []  # not yet consumed by expect()
        self.seen: list[dict[str, Any]] = []  # every line, for diagnostics
        self._results: dict[int, dict[str, Any]] = {}
        self._changed = trio.Event()
        self._ids = itertools.count(1)
        self._eof = False
        self._send_lock = trio.Lock()

    def _diag(self) -> str:
        rc = self.proc.returncode
        state = "running" if rc is None else f"exited with {rc}"
        recent = "\n".join(json.dumps(e) for e in self.seen[-10:])
        return (
            f"peer {self.identity!r} ({state})\n--- last lines from it:\n{recent}\n"
            f"--- its stderr:\n{_tail(self.stderr_path)}"
        )

    async def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        try:
            while True:
                chunk = await self.proc.stdout.receive_some(65536)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_LINE and b"\n" not in buf:
                    raise HarnessError(f"peer {self.identity!r} wrote a line over {MAX_LINE} bytes")
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._dispatch(line)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            self._eof = True
            self._notify()

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = {"event": "garbage", "line": line.decode("utf-8", "replace")}
        self.seen.append(msg)
        if msg.get("event") == "result" and isinstance(msg.get("id"), int):
            self._results[msg["id"]] = msg
        else:
            self.events.append(msg)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self, deadline: float, what: str) -> None:
        if self._eof:
            raise PeerError(f"{what}: the peer closed its stdout\n{self._diag()}")
        changed = self._changed
        with trio.move_on_at(deadline):
            await changed.wait()
            return
        raise PeerError(f"{what}: nothing within the timeout\n{self._diag()}")

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        data = (json.dumps(msg) + "\n").encode()
        async with self._send_lock:
            try:
                await self.proc.stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PeerError(f"cannot write to peer: {exc!r}\n{self._diag()}") from None

    async def request(self, op: str, *, timeout: float = DEFAULT_TIMEOUT, **args: Any) -> dict[str, Any]:
        req_id = next(self._ids)
        await self.send({"id": req_id, "op": op, **args})
        deadline = trio.current_time() + timeout
        what = f"{self.identity}: {op} {args!r}"
        for _ in range(1_000_000):
            result = self._results.pop(req_id, None)
            if result is not None:
                if not result.get("ok"):
                    raise PeerError(f"{what} failed: {result}\n{self._diag()}", result)
                return result
            await self._wait_change(deadline, what)
        raise PeerError(f"{what}: too many lines")

    async def expect(self, event: str, *, timeout: float = DEFAULT_TIMEOUT, **match: Any) -> dict[str, Any]:
        deadline = trio.current_time() + timeout
        what = f"{self.identity}: waiting for {event} {match!r}"
        for _ in range(1_000_000):
            for i, msg in enumerate(self.events):
                if msg.get("event") == event and all(msg.get(k) == v for k, v in match.items()):
                    del self.events[i]
                    return msg
            await self._wait_change(deadline, what)
        raise PeerError(f"{what}: too many lines")

    async def expect_since(
        self, event: str, since: float, *, timeout: float = DEFAULT_TIMEOUT, **match: Any
    ) -> dict[str, Any]:
        """The first ``event`` matching ``match`` that happened after ``since`` (its ``at``,
        monotonic time); earlier matches are dropped on the way."""
        with trio.fail_after(timeout):
            while (found := await self.expect(event, timeout=timeout, **match))["at"] < since:
                pass
        return found

    async def _stop(self) -> None:
        if self.proc.returncode is None and not self._eof:
            with contextlib.suppress(PeerError), trio.move_on_after(PEER_STOP_TIMEOUT):
                await self.send({"id": 0, "op": "quit"})
        if self.proc.stdin is not None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.proc.stdin.aclose()
        with trio.move_on_after(PEER_STOP_TIMEOUT):
            await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


__all__ = [
    "API_KEY",
    "API_SECRET",
    "BIN_ENV",
    "DEFAULT_BIN",
    "INSTALL_HINT",
    "HarnessError",
    "LiveKitCluster",
    "LiveKitEnv",
    "LiveKitServer",
    "Netns",
    "Peer",
    "PeerError",
    "find_livekit_server",
]
