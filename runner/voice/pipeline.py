"""A call's spoken path, in one place: the caller's audio in, their turns up, the agent's voice out.

:class:`VoicePipeline` owns one call's audio from end to end. In order, a frame goes:

1. :meth:`VoicePipeline.hear` feeds it to the :class:`~.listener.Listener` (voice activity:
   the caller started, paused, went on, stopped);
2. at the start of speech the owner is told (:meth:`PipelineHooks.on_start_of_speech`); if
   that was a barge-in, the agent's queued speech is dropped from the transport. While the
   agent's voice is playing (and ``turn.backchannels``), its voice is held instead, and the
   caller's words decide (:mod:`.overlap`): a backchannel or no words let it go on from where
   it was, anything else is the barge-in;
3. at each pause the utterance so far is decoded at once (a :class:`~.preempt.Speculation`,
   which may ask the owner for an early reply through :meth:`PipelineHooks.prefetch`), and the
   :class:`Endpointer`, if any, is asked whether the turn is over;
4. at the end of the turn the utterance is recognized in order, by the pipeline's own task, and
   handed to the owner (:meth:`PipelineHooks.on_user_turn`), who runs the agent's turn;
5. what that turn says comes back through :meth:`VoicePipeline.play` to the transport.

A recognizer that streams (``open_stream``) hears each utterance as it comes instead: from
its start (with the listener's preroll) a :class:`~.recording.Recording` feeds it every frame,
a pause takes its words so far rather than decoding in batch, and the end takes its
``finish`` rather than a second decode. Whisper's stream is no more than a batch decode at
pauses it finds itself (``streams_at_pauses``), so Whisper keeps the batch path: the
listener's pauses decide when it decodes, with no second detector.

The pipeline reports upward only through :class:`PipelineHooks` (the direction of
livekit-agents' ``RecognitionHooks``); it never reaches into the agent runtime.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any, Protocol

import trio

from ..providers import Recognizer
from ..providers import recognizer as declared_recognizer
from ..telemetry import enter_span, exit_span, mark, stage, start_span
from .events import AudioData, AudioStart, ReplyDelta, TurnEvent, TurnFinished, TurnStarted
from .listener import Listener, SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted, Utterance
from .overlap import BACKCHANNEL_PROMPT, classify_overlap, worth_a_second_hearing
from .preempt import PrefetchedReply, Speculation
from .recording import Recording
from .turn_taking import TurnTaking

__all__ = ["AudioOut", "Endpointer", "PipelineHooks", "VoicePipeline"]

log = logging.getLogger("runner.voice")

# Speech over the agent's voice this long (its pauses not counted), not yet judged, is an interruption: a backchannel
# ("mm-hm", "okay, sure") is shorter, and a caller who talks on is not waited for.
LONGEST_BACKCHANNEL_MS = 1000

_WORD = re.compile(r"[a-z0-9']+")


class PipelineHooks(Protocol):
    """What the pipeline tells its owner (the agent runtime), and the little it asks of it."""

    def recognizer(self) -> Recognizer:
        """The recognizer to use now (a live language change reaches the next utterance)."""
        ...

    def on_start_of_speech(self) -> bool:
        """The caller started to speak; return True if that cut the agent off (a barge-in)."""
        ...

    def prefetch(self, text: str) -> PrefetchedReply | None:
        """The caller paused after ``text``: an early reply to start, or ``None`` for none now."""
        ...

    def on_user_turn(
        self, heard: Utterance, *, span: Any, ended_at: float, prefetched: PrefetchedReply | None
    ) -> None:
        """The caller's turn, recognized: ``heard.text`` is never empty.

        Args:
            heard: Their words and how much audio they were.
            span: The turn's trace span (its transcription is its first child); the owner ends it.
            ended_at: ``time.monotonic()`` when they stopped speaking.
            prefetched: The early reply asked for these words, if any.
        """
        ...


class Endpointer(Protocol):
    """Decides, at a pause in the caller's speech, whether their turn is over.

    Without one, a turn ends after the agent's end-of-turn silence. With one, the pipeline
    asks it at each short pause; ``True`` ends the turn there, unless the caller went on
    while it decided.
    """

    async def turn_over(self, pcm: bytes, sample_rate_hz: int) -> bool:
        """Whether the utterance so far (``pcm``, since the start of speech) is a finished turn."""
        ...


class AudioOut(Protocol):
    """Where the agent's voice goes: the call's transport session."""

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None: ...

    async def clear_audio(self) -> None: ...


class VoicePipeline:
    """One call's spoken path; run :meth:`serve` in the call's nursery, then feed it frames.

    Args:
        out: Where the agent's voice is played.
        hooks: The owner, told of the caller's turns.
        stt: The recognizer at the start (``None``: the call does not listen, only speaks).
        vad: The voice activity detector, by name.
        turn: How the end of the caller's turn is found (:mod:`.turn_taking`; ``None``: after
            ``silence_ms`` of quiet).
        silence_ms: The end-of-turn silence when ``turn`` is ``None``.
        endpointer: Asked at each pause whether the turn is over (``None``: silence decides).
        session_id: The call's id, for its logs and each turn's span.
        call_span: The call's span, each turn's parent.
    """

    def __init__(
        self,
        out: AudioOut,
        hooks: PipelineHooks,
        *,
        stt: Recognizer | None,
        vad: str = "silero",
        turn: TurnTaking | None = None,
        silence_ms: int = 500,
        endpointer: Endpointer | None = None,
        session_id: str = "",
        call_span: Any = None,
    ) -> None:
        self._out = out
        self._hooks = hooks
        self._listener = Listener(stt, vad=vad, turn=turn, silence_ms=silence_ms) if stt is not None else None
        self._endpointer = endpointer
        self._backchannels = turn is not None and turn.backchannels
        self._session_id = session_id
        self._call_span = call_span
        self._nursery: trio.Nursery | None = None
        # The transcript being decoded at the caller's last pause, while they may go on.
        self._speculation: Speculation | None = None
        # Counts pauses: an endpointer's answer counts only for the pause it was asked at.
        self._pauses = 0
        # Each utterance (and its decode at the last pause, if any) with when it ended
        # (time.monotonic()) and whether it began over the agent's voice, recognized in order.
        self._ended_send, self._ended = trio.open_memory_channel[
            tuple[SpeechEnded, Speculation | None, Recording | None, float, bool]
        ](math.inf)
        # The utterance in progress, heard as it comes (when the recognizer streams).
        self._recording: Recording | None = None
        # The agent's voice is out (a turn's audio published, the turn not finished), and the
        # gate it passes: closed while the caller's speech over it is judged.
        self._playing = False
        self._voice = trio.Event()
        self._voice.set()
        # The caller's utterance in progress began over the agent's voice, and how long it is.
        self._overlapping = False
        self._overlap_ms = 0.0
        self._hearing = 0
        self._heard = trio.Event()
        self._heard.set()
        self._rate_hz = 0
        self._first_audio = False  # a turn's first audio is on its way (for its timeline)
        # What the agent said in its last turn and says in this one (to tell its echo from the caller).
        self._said_before = ""
        self._saying = ""

    @property
    def listens(self) -> bool:
        """Whether the call hears its caller (it has a recognizer)."""
        return self._listener is not None

    @property
    def hearing(self) -> bool:
        """An utterance has ended and is not yet handed to the owner (it is being recognized)."""
        return self._hearing > 0

    async def wait_heard(self) -> None:
        """Wait until every utterance that ended so far was recognized and handed over."""
        await self._heard.wait()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recognize the caller's turns, in order, until cancelled; then give back the detector."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                async for speech, speculation, recording, ended_at, overlapped in self._ended:
                    await self._recognize(speech, speculation, recording, ended_at, overlapped)
        finally:
            self._nursery = None
            if self._listener is not None:
                self._listener.close()

    # -- In: the caller's audio ---------------------------------------------------------------

    async def hear(self, pcm: bytes, sample_rate_hz: int) -> None:
        """Take one frame of the caller's audio (16-bit mono PCM)."""
        listener = self._listener
        if listener is None:
            await trio.lowlevel.checkpoint()
            return
        listener.use(self._hooks.recognizer())
        for heard in listener.feed(pcm, sample_rate_hz):
            match heard:
                case SpeechStarted():
                    self._record_utterance(sample_rate_hz)
                    if self._playing and self._backchannels:
                        # Over the agent's voice: hold it until the words say what this is.
                        mark("voice_held")
                        self._overlapping = True
                        self._overlap_ms = 0.0
                        if self._voice.is_set():
                            self._voice = trio.Event()
                    elif self._hooks.on_start_of_speech():
                        # The caller talks over the agent: drop what of its voice is still queued.
                        await self._out.clear_audio()
                case SpeechPaused():
                    mark("paused")
                    self._on_pause(heard)
                case SpeechResumed():
                    mark("resumed")
                    self._pauses += 1
                    if self._speculation is not None:
                        self._speculation.cancel()
                        self._speculation = None
                case SpeechEnded():
                    self._end_turn(heard)
        if self._recording is not None:
            self._recording.add(listener.speech_after(len(self._recording.audio)))
        if self._overlapping and listener.speaking:
            self._overlap_ms += len(pcm) * 500 / sample_rate_hz
            if self._overlap_ms >= LONGEST_BACKCHANNEL_MS:
                # Talking on over the agent: an interruption, whatever the words; a turn at its end.
                self._overlapping = False
                if self._hooks.on_start_of_speech():
                    await self._out.clear_audio()
                self._voice.set()
        await trio.lowlevel.checkpoint()

    def record(self, stt: Recognizer, rate_hz: int) -> Recording:
        """A turn whose boundaries the transport draws: its audio, between its start and its end.

        Start it (:meth:`~.recording.Recording.start`) to hear it as it comes.
        """
        return Recording(stt, rate_hz)

    def is_caller(self, heard: str) -> bool:
        """Whether words heard while the agent may be speaking are the caller's, not its own echo.

        Some of them must be words the agent did not say in this turn or the one before (a
        barge-in needs the caller to say something of their own).
        """
        said = set(_WORD.findall(self._said_before.lower())) | set(_WORD.findall(self._saying.lower()))
        return bool(set(_WORD.findall(heard.lower())) - said)

    def _record_utterance(self, rate_hz: int) -> None:
        """Hear the utterance that started as it comes, if the call's recognizer streams."""
        assert self._nursery is not None, "serve() runs before frames are heard"
        if self._recording is not None:
            self._recording.close()
        self._recording = None
        stt = self._hooks.recognizer()
        declared = declared_recognizer(stt.provider)
        if declared is not None and declared.streams_at_pauses:
            # Its stream decodes at pauses its own detector finds (Whisper): the listener's
            # pauses are found already, and decoding at them keeps one detector and its timing.
            return
        recording = Recording(stt, rate_hz)
        try:
            recording.start(self._nursery)
        except ValueError as exc:
            log.warning("call %s: the recognizer cannot stream this audio: %s", self._session_id, exc)
            return
        if recording.streams:
            self._recording = recording

    def _end_turn(self, speech: SpeechEnded) -> None:
        mark("turn_ended")
        self._pauses += 1
        # Recognized in order by the pipeline's task: the call keeps reading frames meanwhile.
        self._hearing += 1
        if self._heard.is_set():
            self._heard = trio.Event()
        speculation, self._speculation = self._speculation, None
        overlapped, self._overlapping = self._overlapping, False
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.add(speech.pcm[len(recording.audio) :])
            recording.close(hear=True)
        self._ended_send.send_nowait((speech, speculation, recording, time.monotonic(), overlapped))

    def _on_pause(self, paused: SpeechPaused) -> None:
        """Decode the utterance so far; once decoded, ask for the reply early; ask the endpointer."""
        nursery, listener = self._nursery, self._listener
        assert nursery is not None and listener is not None, "serve() runs before frames are heard"
        if self._speculation is not None:
            self._speculation.cancel()
        speculation = Speculation(len(paused.pcm) / 2 / paused.sample_rate_hz)
        self._speculation = speculation
        recognizer = self._hooks.recognizer()
        recording = self._recording
        if recording is not None:
            recording.add(paused.pcm[len(recording.audio) :])

        def prefetch(text: str) -> PrefetchedReply | None:
            return None if speculation.cancelled else self._hooks.prefetch(text)

        async def transcribe() -> Utterance:
            # Before any turn exists: this transcription's span is a child of the call.
            mark("decoding")
            with stage("stt", recognizer):
                if recording is not None:
                    # The stream's words once it heard up to the pause: no decode of its own.
                    words = await recording.words_so_far()
                    heard = Utterance(text=words, audio_seconds=speculation.seconds)
                else:
                    heard = await listener.transcribe(
                        SpeechEnded(pcm=paused.pcm, sample_rate_hz=paused.sample_rate_hz)
                    )
            mark("decoded")
            for speech in listener.heard_at(paused, heard.text):
                if isinstance(speech, SpeechEnded):
                    self._end_turn(speech)
            return heard

        nursery.start_soon(speculation.run, transcribe, prefetch, nursery)
        self._pauses += 1
        if self._endpointer is not None:
            nursery.start_soon(self._ask_endpointer, self._endpointer, paused, self._pauses)
        if listener.judges:
            nursery.start_soon(self._judge, listener, paused)

    async def _judge(self, listener: Listener, paused: SpeechPaused) -> None:
        # The end-of-turn model's verdict (a worker thread's) may end the turn there and then.
        try:
            ended = await listener.judge(paused, words_coming=True)
        except Exception as exc:  # noqa: BLE001 - a failed judgment leaves the turn to the cap
            log.warning("call %s: the end-of-turn model failed: %s", self._session_id, exc)
            return
        for speech in ended:
            if isinstance(speech, SpeechEnded):
                self._end_turn(speech)

    async def _ask_endpointer(self, endpointer: Endpointer, paused: SpeechPaused, pause: int) -> None:
        try:
            over = await endpointer.turn_over(paused.pcm, paused.sample_rate_hz)
        except Exception as exc:  # noqa: BLE001 - a failed decision leaves the turn to the silence
            log.warning("call %s: the end-of-turn decision failed: %s", self._session_id, exc)
            return
        listener = self._listener
        if over and pause == self._pauses and listener is not None:
            # Still the same pause: the caller did not go on while the endpointer decided.
            for speech in listener.flush():
                if isinstance(speech, SpeechEnded):
                    self._end_turn(speech)

    async def _recognize(
        self,
        speech: SpeechEnded,
        speculation: Speculation | None,
        recording: Recording | None,
        ended_at: float,
        overlapped: bool,
    ) -> None:
        # The turn starts when the person stopped speaking: its transcription is its first child.
        span = start_span("turn", {"curb.session_id": self._session_id}, parent=self._call_span)
        entered = enter_span(span)
        handed = False
        try:
            heard, prefetched = await self._words_of(speech, speculation, recording)
            if overlapped and not await self._barged_in(speech, heard.text):
                if prefetched is not None:
                    prefetched.cancel()
            elif heard.text:
                self._hooks.on_user_turn(heard, span=span, ended_at=ended_at, prefetched=prefetched)
                handed = True
            elif prefetched is not None:
                prefetched.cancel()
        except Exception as exc:  # noqa: BLE001 - any recognizer failure loses that utterance, not the call
            log.warning("call %s: transcription failed: %s", self._session_id, exc)
        finally:
            exit_span(entered)
            if span is not None and not handed:
                span.end()
            self._hearing -= 1
            if self._hearing == 0:
                self._heard.set()

    async def _words_of(
        self, speech: SpeechEnded, speculation: Speculation | None, recording: Recording | None
    ) -> tuple[Utterance, PrefetchedReply | None]:
        """The words of an utterance that ended, and the early reply asked for them, if any."""
        listener = self._listener
        assert listener is not None
        if speculation is not None and recording is None:
            # Decoded at the last pause, and the caller said no more: that is the turn.
            return await speculation.wait(), speculation.prefetched
        prefetched = None
        if speculation is not None:
            # Heard as it came: the early reply asked at the last pause goes with the stream's
            # words (the turn asks afresh if they differ).
            await speculation.wait()
            prefetched = speculation.prefetched
        mark("decoding")
        try:
            if recording is not None:
                # The stream's finish: no second decode of the utterance.
                with stage("stt", recording.stt):
                    text, seconds = await recording.words()
                heard = Utterance(text=text, audio_seconds=seconds)
            else:
                with stage("stt", self._hooks.recognizer()):
                    heard = await listener.transcribe(speech)
        except BaseException:
            if prefetched is not None:
                prefetched.cancel()
            raise
        mark("decoded")
        return heard, prefetched

    async def _barged_in(self, speech: SpeechEnded, words: str) -> bool:
        """Judge ``speech``, heard as ``words``, said over the agent's held voice: resume it, or
        cut its turn."""
        kind = classify_overlap(words)
        if worth_a_second_hearing(words) and self._listener is not None:
            # A short sound heard as words: maybe a backchannel misheard (runner.voice.overlap).
            with stage("stt", self._hooks.recognizer()):
                again = await self._listener.transcribe(speech, prompt=BACKCHANNEL_PROMPT)
            if (kind_again := classify_overlap(again.text)) != "interruption":
                log.info("call %s: %r is %r heard again with a hint", self._session_id, words, again.text)
                kind, words = kind_again, again.text
        if kind != "interruption":
            log.info("call %s: %s over the agent's voice (%r): it goes on", self._session_id, kind, words)
            mark("voice_resumed")
        elif self._hooks.on_start_of_speech():
            await self._out.clear_audio()
        self._voice.set()
        return kind == "interruption"

    # -- Out: the agent's voice ---------------------------------------------------------------

    async def play(self, event: TurnEvent) -> None:
        """Play what of a turn's events is audio; keep what it says (see :meth:`is_caller`)."""
        match event:
            case TurnStarted():
                self._saying = ""
            case ReplyDelta(text=text):
                self._saying += text
            case TurnFinished(result=result):
                self._said_before, self._saying = result.text, ""
                self._playing = False
            case AudioStart(chunk=chunk, sample_rate_hz=rate_hz):
                self._rate_hz = rate_hz
                self._first_audio = self._first_audio or chunk == 0
            case AudioData(pcm=pcm):
                self._playing = True
                if not self._voice.is_set():
                    # Held while the caller's speech over it is judged. Not a yield otherwise: a
                    # sentence's pieces, synthesized together, queue together (one socket frame).
                    await self._voice.wait()
                await self._out.publish_audio(pcm, self._rate_hz)
                if self._first_audio:
                    self._first_audio = False
                    mark("published_first_audio")

    async def clear(self) -> None:
        """Drop what of the agent's voice is still queued (a transfer, a barge-in)."""
        self._overlapping = False
        self._voice.set()
        await self._out.clear_audio()
