"""Phone calls for the LiveKit tests: LiveKit's SIP service beside livekit-server, and phones.

One namespace (lk_harness.Netns) holds redis-server (127.0.0.1:6379), a livekit-server that
routes through it, and livekit-sip, which takes its SIP calls on 127.0.0.1:5060 and puts
each caller into a LiveKit room as a participant of kind SIP. A :class:`Phone` is baresip, a
real SIP user agent, in the same namespace: it dials (or answers), plays a WAV file as its
microphone, records what it hears (baresip's sndfile module) and presses keys (RFC 4733).
The test drives it over baresip's ctrl_tcp socket.

.ci/install-livekit-sip builds livekit-sip and installs baresip; see docs/livekit-testing.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from lk_harness import (
    REDIS_PORT,
    SERVER_START_TIMEOUT,
    SERVER_STOP_TIMEOUT,
    HarnessError,
    LiveKitEnv,
    LiveKitServer,
    Netns,
    _tail,
)

SIP_BIN_ENV = "CURB_LIVEKIT_SIP_BIN"
DEFAULT_SIP_BIN = Path.home() / ".cache" / "curb-runner" / "bin" / "livekit-sip"
SIP_INSTALL_HINT = "run .ci/install-livekit-sip to build it and install baresip (see docs/livekit-testing.md)"

SIP_PORT = 5060
RTP_PORTS = "20000-20199"
PHONE_RATE_HZ = 8000  # G.711: what a phone line carries
COMMAND_TIMEOUT_S = 10.0


def find_livekit_sip() -> str | None:
    """$CURB_LIVEKIT_SIP_BIN if set, else the default install path, else PATH."""
    explicit = os.environ.get(SIP_BIN_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    if os.access(DEFAULT_SIP_BIN, os.X_OK):
        return str(DEFAULT_SIP_BIN)
    return shutil.which("livekit-sip")


class SipStack:
    """redis-server, livekit-server and livekit-sip in one private namespace."""

    def __init__(self, server_binary: str, sip_binary: str, workdir: Path) -> None:
        self.workdir = workdir
        self.netns = Netns()
        self.redis_address = f"127.0.0.1:{REDIS_PORT}"
        self.server = LiveKitServer(server_binary, workdir, netns=self.netns, redis=self.redis_address)
        self.sip_binary = sip_binary
        self.sip_log = workdir / "livekit-sip.log"
        self.redis_log = workdir / "redis-server.log"
        self._procs: list[subprocess.Popen[bytes]] = []
        self.sip: subprocess.Popen[bytes] | None = None

    def _spawn(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.netns.argv(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def start(self) -> None:
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise HarnessError("redis-server is missing (apt-get install redis-server; .ci/run does)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netns.create()
        redis = self._spawn(
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
            ],
            self.redis_log,
        )
        self._wait_tcp(redis, REDIS_PORT, self.redis_log, b"PING\r\n", b"+PONG")
        self.server.start()
        config = {
            "api_key": self.server.api_key,
            "api_secret": self.server.api_secret,
            "ws_url": self.server.url,
            "redis": {"address": self.redis_address},
            "sip_port": SIP_PORT,
            "rtp_port": RTP_PORTS,
            "use_external_ip": False,
            "nat_1_to_1_ip": "127.0.0.1",
            # The tests share two cores with everything else: never refuse a call for CPU.
            "max_cpu_utilization": 1.0,
            "logging": {"level": "debug"},
        }
        config_path = self.workdir / "livekit-sip.yaml"
        config_path.write_text(json.dumps(config, indent=2))
        self.sip = self._spawn([self.sip_binary, "--config", str(config_path)], self.sip_log)
        # v1.0.0 serves no health check: it logs when it takes calls.
        for _ in range(int(SERVER_START_TIMEOUT / 0.05)):
            if self.sip.poll() is not None:
                raise HarnessError(f"livekit-sip exited while starting:\n{_tail(self.sip_log)}")
            if b"service ready" in self.sip_log.read_bytes():
                return
            time.sleep(0.05)
        raise HarnessError(f"livekit-sip did not get ready:\n{_tail(self.sip_log)}")

    def _wait_tcp(
        self, proc: subprocess.Popen[bytes], port: int, log: Path, probe: bytes, expect: bytes
    ) -> None:
        for _ in range(int(SERVER_START_TIMEOUT / 0.05)):
            if proc.poll() is not None:
                raise HarnessError(f"{proc.args!r} exited while starting:\n{_tail(log)}")
            try:
                with self.netns.socket() as sock:
                    sock.settimeout(1.0)
                    sock.connect(("127.0.0.1", port))
                    sock.sendall(probe)
                    head = sock.recv(64)
                    if head.startswith(expect):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise HarnessError(f"{proc.args!r} did not answer on port {port}:\n{_tail(log)}")

    def alive(self) -> bool:
        return self.server.alive() and all(p.poll() is None for p in self._procs)

    def log_tail(self) -> str:
        return (
            f"--- livekit-server:\n{self.server.log_tail()}\n--- livekit-sip:\n{_tail(self.sip_log)}"
            f"\n--- redis-server:\n{_tail(self.redis_log, 1000)}"
        )

    def stop(self) -> None:
        try:
            if self.sip is not None and self.sip.poll() is None:
                self.sip.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.sip.wait(SERVER_STOP_TIMEOUT)
            self.server.stop()
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(SERVER_STOP_TIMEOUT)
        finally:
            self.netns.delete()


def write_wav(path: Path, pcm: bytes, rate: int = PHONE_RATE_HZ) -> Path:
    """16-bit mono PCM at ``rate`` as a WAV file (what baresip's aufile plays)."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return path


class Phone:
    """A baresip user agent in the stack's namespace, driven over its ctrl_tcp socket.

    Its microphone is a WAV file (``speak`` switches to another; a file that ends hangs the
    call up, so every file ends with quiet to spare), and everything it hears is written to
    ``heard_path()`` by baresip's sndfile module.
    """

    def __init__(self, env: LiveKitEnv, workdir: Path, *, user: str, sip_port: int, ctrl_port: int) -> None:
        self.env = env
        self.workdir = workdir
        self.user = user
        self.sip_port = sip_port
        self.ctrl_port = ctrl_port
        self.dumps = workdir / "heard"
        self.log_path = workdir / "baresip.log"
        self.events: list[dict[str, Any]] = []
        self._responses: dict[str, dict[str, Any]] = {}
        self._changed = trio.Event()
        self._stream: trio.SocketStream | None = None
        self._tokens = 0
        self.proc: trio.Process | None = None

    @property
    def uri(self) -> str:
        return f"sip:{self.user}@127.0.0.1:{self.sip_port}"

    def _configure(self) -> None:
        modules = Path("/usr/lib/baresip/modules")
        self.dumps.mkdir(parents=True, exist_ok=True)
        quiet = write_wav(self.workdir / "quiet.wav", bytes(2 * PHONE_RATE_HZ * 600))
        (self.workdir / "config").write_text(
            "\n".join(
                [
                    "poll_method epoll",
                    f"sip_listen 127.0.0.1:{self.sip_port}",
                    "net_interface 127.0.0.1",
                    f"rtp_ports {30000 + 10 * (self.sip_port - 5100)}-{30099 + 10 * (self.sip_port - 5100)}",
                    "audio_player aubridge,nil",
                    "audio_alert aubridge,nil",
                    f"audio_source aufile,{quiet}",
                    f"module_path {modules}",
                    "module g711.so",
                    "module aufile.so",
                    "module aubridge.so",
                    "module sndfile.so",
                    "module_app account.so",
                    "module_app menu.so",
                    "module_app ctrl_tcp.so",
                    f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
                    f"snd_path {self.dumps}",
                    "",
                ]
            )
        )
        (self.workdir / "accounts").write_text(
            f"<sip:{self.user}@127.0.0.1:{self.sip_port}>;regint=0;answermode=manual;audio_codecs=PCMU,PCMA\n"
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Phone]:
        self._configure()
        with open(self.log_path, "wb") as log:
            self.proc = await self.env.open_process(
                ["baresip", "-f", str(self.workdir)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            async with trio.open_nursery() as nursery:
                self._stream = await self._connect()
                nursery.start_soon(self._read)
                try:
                    yield self
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self._stream is not None:
                    await self._stream.aclose()
                if self.proc.returncode is None:
                    self.proc.terminate()
                    with trio.move_on_after(3):
                        await self.proc.wait()
                    if self.proc.returncode is None:
                        self.proc.kill()
                        await self.proc.wait()

    async def _connect(self) -> trio.SocketStream:
        for _ in range(200):
            assert self.proc is not None
            if self.proc.returncode is not None:
                raise HarnessError(f"baresip exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return await self.env.open_tcp_stream("127.0.0.1", self.ctrl_port)
            except OSError:
                await trio.sleep(0.05)
        raise HarnessError(f"baresip's ctrl_tcp did not listen on {self.ctrl_port}:\n{self.log()}")

    def log(self) -> str:
        return _tail(self.log_path)

    async def _read(self) -> None:
        # Netstrings: "<length>:<json>,".
        assert self._stream is not None
        buf = b""
        async for chunk in self._stream:
            buf += chunk
            while True:
                length, colon, rest = buf.partition(b":")
                if not colon or len(rest) < int(length) + 1:
                    break
                message = json.loads(rest[: int(length)])
                buf = rest[int(length) + 1 :]
                if message.get("response"):
                    self._responses[str(message.get("token"))] = message
                else:
                    self.events.append(message)
                self._changed.set()
                self._changed = trio.Event()

    async def command(self, command: str, params: str = "") -> dict[str, Any]:
        """Run a baresip command (``dial``, ``hangup``, ``accept``, ``sndcode``, ``ausrc``...)."""
        assert self._stream is not None
        self._tokens += 1
        token = str(self._tokens)
        body = json.dumps({"command": command, "params": params, "token": token}).encode()
        await self._stream.send_all(str(len(body)).encode() + b":" + body + b",")
        with trio.fail_after(COMMAND_TIMEOUT_S):
            while token not in self._responses:
                await self._changed.wait()
        answer = self._responses.pop(token)
        if not answer.get("ok"):
            raise HarnessError(f"baresip {command} {params!r} failed: {answer}\n{self.log()}")
        return answer

    async def wait_event(self, kind: str, *, within: float = 20) -> dict[str, Any]:
        """The first event of type ``kind`` (``CALL_ESTABLISHED``, ``CALL_CLOSED``,
        ``CALL_INCOMING``...), consumed."""
        with trio.move_on_after(within):
            while True:
                for i, event in enumerate(self.events):
                    if event.get("type") == kind:
                        return self.events.pop(i)
                await self._changed.wait()
        raise HarnessError(f"baresip reported no {kind} within {within} s: {self.events}\n{self.log()}")

    async def dial(self, uri: str) -> None:
        await self.command("dial", uri)

    async def speak(self, wav: Path) -> None:
        """Play ``wav`` as the microphone from now on (its end hangs the call up)."""
        await self.command("ausrc", f"aufile,{wav}")

    async def press(self, digits: str) -> None:
        """Press keys: RFC 4733 telephone events, one after another."""
        for digit in digits:
            await self.command("sndcode", digit)
            await trio.sleep(0.25)  # a key is held, then released, as a person presses it

    async def hang_up(self) -> None:
        await self.command("hangup")

    def heard_path(self) -> Path | None:
        """The WAV sndfile writes with what the phone hears (its ``-dec`` dump), once a call ran."""
        found = sorted(self.dumps.glob("*-dec.wav"))
        return found[-1] if found else None

    def heard(self) -> bytes:
        """What the phone heard so far: 16-bit mono PCM at 8 kHz."""
        path = self.heard_path()
        if path is None:
            return b""
        data = path.read_bytes()
        return data[44:] if len(data) > 44 else b""


class SipEnv(LiveKitEnv):
    """A LiveKitEnv on the SIP stack's server, which also makes phones (baresip)."""

    def __init__(self, stack: SipStack, workdir: Path) -> None:
        super().__init__(stack.server, workdir)
        self.stack = stack
        self.sip_address = f"127.0.0.1:{SIP_PORT}"
        self._phones = 0

    @contextlib.asynccontextmanager
    async def phone(self, user: str) -> AsyncIterator[Phone]:
        """A running baresip whose address is ``sip:USER@127.0.0.1:PORT``."""
        self._phones += 1
        workdir = self.workdir / f"phone-{self._phones}"
        workdir.mkdir()
        port = 5100 + 10 * self._phones
        async with Phone(self, workdir, user=user, sip_port=port, ctrl_port=port + 5).running() as phone:
            yield phone
