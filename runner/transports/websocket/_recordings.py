"""A socket's recordings (``user_audio.start`` ... ``user_audio.end``): the one open, its
partial words and barge-in, and the ``transcribe_only`` ones in flight."""

from __future__ import annotations

import secrets
from typing import Any, Protocol

import attrs
import trio

from ... import ino_wire as w
from ...platform import HEARING_RATE_HZ, Participant, TurnRequest
from ...providers import ProviderError
from ...voice.recording import Recording
from ._call import InoCall
from ._common import CONFLICT, MAX_TRANSCRIBING, CloseSocket, SocketHost, log


class RecordingSocket(Participant, Protocol):
    """What the recordings need of their socket (:class:`~._connection.Connection`)."""

    service: SocketHost
    call: InoCall | None

    def send(self, frame: Any) -> None: ...

    def request_turn(self, request: TurnRequest) -> bool: ...

    def check_close_after_turn(self) -> None: ...


@attrs.define(eq=False, kw_only=True)
class _OpenRecording:
    """A recording this socket opened: the pipeline's :class:`Recording`, and what the client asked of it."""

    audio: Recording
    recording_id: str | None
    barge_in: bool = False
    speech: bool | None = None
    thoughts: bool = False
    barged: bool = False


class Recordings:
    """The recordings of one socket: at most one open, and ``transcribe_only`` ones in flight.

    Args:
        socket: The socket they are sent on; its turns are asked for through it.
    """

    def __init__(self, socket: RecordingSocket) -> None:
        self._socket = socket
        self.open: _OpenRecording | None = None
        self.transcribing = 0
        """``transcribe_only`` recordings whose words are not sent yet."""

    async def start(self, start: w.UserAudioStart, nursery: trio.Nursery) -> None:
        """Open a recording (``user_audio.start``); its stream runs in ``nursery``."""
        call = self._socket.call
        assert call is not None
        runtime = call.conversation.runtime
        assert runtime is not None
        if self.open is not None:
            self._socket.send(
                w.Error(
                    code="invalid_request",
                    message="a recording is already open: end it with user_audio.end first",
                    recording_id=start.recording_id,
                )
            )
            return
        try:
            stt = runtime.recognizer(start.language)
        except ValueError as exc:
            self._socket.send(
                w.Error(code="validation_failed", message=f"language: {exc}", recording_id=start.recording_id)
            )
            return
        if stt is None:
            raise CloseSocket(4010, "this agent does not hear speech: it has no recognizer")
        if start.model is not None and start.model != stt.provider:
            self._socket.send(
                w.Error(
                    code="validation_failed",
                    # The model asked for is not repeated: an error never echoes what it refuses.
                    message=f"that model is not available here; this agent transcribes with {stt.provider!r}",
                    recording_id=start.recording_id,
                )
            )
            return
        pipeline = runtime.pipeline
        assert pipeline is not None, "the call runs"
        recording = _OpenRecording(
            audio=pipeline.record(stt, start.rate or HEARING_RATE_HZ),
            recording_id=start.recording_id,
            barge_in=start.barge_in is True,
            speech=start.speech,
            thoughts=start.thoughts is True,
        )
        try:
            recording.audio.start(nursery, lambda text: self._heard_partial(recording, text))
        except ValueError as exc:
            self._socket.send(
                w.Error(code="validation_failed", message=f"rate: {exc}", recording_id=start.recording_id)
            )
            return
        self.open = recording
        await trio.lowlevel.checkpoint()

    def add(self, data: bytes) -> None:
        """Take a binary frame of the open recording's audio.

        Raises:
            CloseSocket: 4011, no recording is open, or it would grow too long.
        """
        recording = self.open
        if recording is None:
            raise CloseSocket(4011, "binary audio with no user_audio.start before it")
        if len(recording.audio.audio) + len(data) > w.MAX_RECORDING_BYTES:
            raise CloseSocket(4011, w.RECORDING_TOO_LONG)
        recording.audio.add(data)

    def close(self, *, hear: bool = False) -> None:
        """No more audio for the open recording; ``hear``: its stream finishes it (its words are wanted)."""
        recording, self.open = self.open, None
        if recording is not None:
            recording.audio.close(hear=hear)

    def end(self, end: w.UserAudioEnd, nursery: trio.Nursery) -> None:
        """End the open recording (``user_audio.end``): a turn, words only, or thrown away."""
        call = self._socket.call
        assert call is not None
        recording = self.open
        if end.discard and end.transcribe_only:
            self._socket.send(
                w.Error(
                    code="validation_failed",
                    message="transcribe_only and discard exclude each other",
                    recording_id=recording.recording_id if recording else None,
                )
            )
            return
        if end.discard:
            self.close()  # thrown away without a word
            return
        if recording is None:
            self._socket.send(
                w.Error(code="invalid_request", message="no recording is open: send user_audio.start first")
            )
            return
        if len(recording.audio.audio) < 2:
            self.close()
            self._socket.send(
                w.Error(
                    code="invalid_request",
                    message="nothing was recorded",
                    recording_id=recording.recording_id,
                )
            )
            return
        if end.transcribe_only:
            if self.transcribing >= MAX_TRANSCRIBING:
                self._socket.send(
                    w.Error(
                        code="rate_limited",
                        message=f"{MAX_TRANSCRIBING} transcribe_only recordings are already in flight; the recording is still open",
                        recording_id=recording.recording_id,
                    )
                )
                return
            self.close(hear=True)
            self.transcribing += 1
            nursery.start_soon(self._transcribe_only, recording)
            return
        request = TurnRequest(recording=recording.audio, speech=recording.speech, thoughts=recording.thoughts)
        if not self._socket.request_turn(request):
            self._socket.send(w.Error(code="conflict", message=CONFLICT, recording_id=recording.recording_id))
            return
        self.close(hear=True)

    def _heard_partial(self, recording: _OpenRecording, text: str) -> None:
        call = self._socket.call
        if self.open is not recording or call is None:
            return
        self._socket.send(w.HeardPartial(text=text))
        runtime = call.conversation.runtime
        pipeline = runtime.pipeline if runtime is not None else None
        if recording.barge_in and not recording.barged and pipeline is not None and pipeline.is_caller(text):
            recording.barged = True
            call.conversation.barge_in(self._socket, text, recording.recording_id)

    async def _transcribe_only(self, recording: _OpenRecording) -> None:
        request_id = "req_" + secrets.token_hex(8)
        try:
            text, seconds = await recording.audio.words()
        except ProviderError as exc:
            self._socket.send(
                w.Error(
                    code="provider_failed",
                    message=str(exc)[:500],
                    stage="transcription",
                    request_id=request_id,
                    recording_id=recording.recording_id,
                )
            )
        else:
            self._socket.send(
                w.Transcript(
                    text=text,
                    audio_seconds=round(seconds, 3),
                    request_id=request_id,
                    recording_id=recording.recording_id,
                )
            )
            if self._socket.call is not None and seconds > 0:
                try:
                    spent = await self._socket.service.platform.charge_transcription(
                        conversation_id=self._socket.call.conversation_id,
                        request_id=request_id,
                        token_id=self._socket.token_id,
                        end_user_id=self._socket.end_user_id,
                        seconds=seconds,
                    )
                except Exception:  # noqa: BLE001 - a usage row not stored is logged; the transcript was sent
                    log.exception("the usage of a transcription was not stored")
                else:
                    self._socket.service.after_charge(self._socket.token_id, spent)
        finally:
            self.transcribing -= 1
            self._socket.check_close_after_turn()
