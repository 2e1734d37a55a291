"""Voice in the chat: *Speak* (push to talk: the words appear in the composer as they are
recognised, editable before sending), *Read aloud* on an answer, and *Talk* (a voice
conversation: each answer spoken sentence by sentence while it streams; pressing *Speak*
over it stops it). Recognition and speech are the engine's (/v1/audio/*), off the UI
thread; capture and playback are Qt Multimedia's, behind two small interfaces so that a
recorded file can stand for the microphone and a recorder for the speakers (the tests,
and a machine without either)."""

from __future__ import annotations

import io
import re
import wave
from typing import Callable

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QTimer, Signal
from PySide6.QtWidgets import QPushButton

from ..tasks import start_task

RATE = 16_000
PARTIAL_MS = 1500  # what was said so far is recognised again this often while speaking
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def wav_of(pcm: bytes, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


class Microphone:
    """The default input device, 16 kHz mono 16-bit (Qt Multimedia)."""

    def __init__(self):
        self._source = self._buffer = None

    def available(self) -> bool:
        from PySide6.QtMultimedia import QMediaDevices

        return bool(QMediaDevices.audioInputs())

    def start(self) -> None:
        from PySide6.QtMultimedia import QAudioFormat, QAudioSource, QMediaDevices

        audio = QAudioFormat()
        audio.setSampleRate(RATE)
        audio.setChannelCount(1)
        audio.setSampleFormat(QAudioFormat.SampleFormat.Int16)
        self._data = QByteArray()
        self._buffer = QBuffer(self._data)
        self._buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        self._source = QAudioSource(QMediaDevices.defaultAudioInput(), audio)
        self._source.start(self._buffer)

    def take(self) -> bytes:
        """What was said so far, as a WAV (recording goes on)."""
        return wav_of(bytes(self._data)) if self._buffer is not None else wav_of(b"")

    def stop(self) -> bytes:
        if self._source is not None:
            self._source.stop()
        said, self._source = self.take(), None
        return said


class RecordedInput:
    """A recording standing for the microphone: what it holds is 'said' as it plays."""

    def __init__(self, wav: bytes, chunk_s: float = PARTIAL_MS / 1000):
        with wave.open(io.BytesIO(wav)) as w:
            self.rate, self.frames = w.getframerate(), w.readframes(w.getnframes())
        self.step = int(self.rate * chunk_s) * 2
        self.heard = 0

    def available(self) -> bool:
        return True

    def start(self) -> None:
        self.heard = 0

    def take(self) -> bytes:
        self.heard = min(len(self.frames), self.heard + self.step)
        return wav_of(self.frames[:self.heard], self.rate)

    def stop(self) -> bytes:
        self.heard = len(self.frames)
        return wav_of(self.frames, self.rate)


class Speakers:
    """The default output device (Qt Multimedia), WAVs played one after another."""

    def __init__(self):
        self._queue: list[bytes] = []
        self._sink = self._buffer = None

    def available(self) -> bool:
        from PySide6.QtMultimedia import QMediaDevices

        return bool(QMediaDevices.audioOutputs())

    def play(self, wav: bytes) -> None:
        self._queue.append(wav)
        if self._sink is None:
            self._next()

    def stop(self) -> None:
        self._queue.clear()
        if self._sink is not None:
            self._sink.stop()
            self._sink = None

    def _next(self) -> None:
        from PySide6.QtMultimedia import QAudio, QAudioFormat, QAudioSink, QMediaDevices

        if not self._queue:
            self._sink = None
            return
        with wave.open(io.BytesIO(self._queue.pop(0))) as w:
            audio = QAudioFormat()
            audio.setSampleRate(w.getframerate())
            audio.setChannelCount(w.getnchannels())
            audio.setSampleFormat(QAudioFormat.SampleFormat.Int16)
            self._data = QByteArray(w.readframes(w.getnframes()))
        self._buffer = QBuffer(self._data)
        self._buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        self._sink = QAudioSink(QMediaDevices.defaultAudioOutput(), audio)
        self._sink.stateChanged.connect(
            lambda state: state == QAudio.State.IdleState and self._next())
        self._sink.start(self._buffer)


class RecordedOutput:
    """A recorder standing for the speakers: what would be heard, kept in order."""

    def __init__(self):
        self.played: list[bytes] = []

    def available(self) -> bool:
        return True

    def play(self, wav: bytes) -> None:
        self.played.append(wav)

    def stop(self) -> None:
        self.played.append(b"")  # a stop, where it came


class VoiceControls(QObject):
    """The composer's Speak and Talk buttons and what they do. `client()`: the engine's
    client now (None while it is down)."""
    error = Signal(str)
    spoken = Signal(int)  # a piece of speech reached the output (its index in the answer)

    def __init__(self, composer, client: Callable, microphone=None, output=None, parent=None):
        super().__init__(parent)
        self.composer, self.client = composer, client
        self.microphone, self.output = microphone or Microphone(), output or Speakers()
        self.speak = QPushButton("Speak", checkable=True, accessibleName="Speak")
        self.talk = QPushButton("Talk", checkable=True, accessibleName="Voice conversation")
        self.talk.setToolTip("A voice conversation: each answer is read aloud as it comes")
        self.speak.toggled.connect(self._speaking)
        self._before = ""      # the composer's text when speaking began
        self._asking = False   # a recognition in flight
        self._asked = self._shown = 0  # recognitions asked, and the latest one shown
        self._spoken = 0       # characters of the answer sent to be spoken
        self._pieces: dict[int, bytes] = {}
        self._made = self._played = 0
        self._round = 0  # pieces of an earlier reading, arriving late, are dropped
        self._timer = QTimer(self, interval=PARTIAL_MS)
        self._timer.timeout.connect(self._partial)
        self._checked_devices = False

    def check_devices(self) -> None:
        """Said once, when first wanted: a machine without a microphone says so."""
        if not self._checked_devices:
            self._checked_devices = True
            if not self.microphone.available():
                self.speak.setEnabled(False)
                self.speak.setToolTip("No microphone was found on this computer")

    # -- speech in -------------------------------------------------------------------

    def _speaking(self, on: bool) -> None:
        if on:
            self.check_devices()
            self.output.stop()  # speaking over an answer stops it, and what was coming
            self._reset()
            self._before = self.composer.toPlainText().rstrip()
            self.microphone.start()
            self._timer.start()
        else:
            self._timer.stop()
            self._recognise(self.microphone.stop(), final=True)

    def _partial(self) -> None:
        if not self._asking:
            self._recognise(self.microphone.take(), final=False)

    def _recognise(self, wav: bytes, final: bool) -> None:
        client = self.client()
        if client is None:
            return
        self._asking = True
        self._asked += 1
        asked = self._asked

        def heard(text: str) -> None:
            self._asking = False
            if asked < self._shown:  # a partial one, overtaken by the final one
                return
            self._shown = asked
            self.composer.setPlainText(" ".join(t for t in (self._before, text.strip()) if t))
            if final:
                self.composer.setFocus()

        def failed(error) -> None:
            self._asking = False
            if final:
                self.error.emit(f"What was said could not be recognised: {error}")

        start_task(lambda _t: client.transcribe(wav), on_done=heard, on_error=failed,
                   owner=self)

    # -- speech out ------------------------------------------------------------------

    def read_aloud(self, text: str) -> None:
        self.output.stop()
        self._reset()
        for sentence in (s for s in SENTENCE_END.split(text) if s.strip()):
            self._say(sentence)

    def reply_grew(self, text: str) -> None:
        """The answer so far (Talk on): each sentence it completes is spoken."""
        if not self.talk.isChecked():
            return
        ends = [m.end() for m in SENTENCE_END.finditer(text, self._spoken)]
        if ends:
            self._say(text[self._spoken:ends[-1]])
            self._spoken = ends[-1]

    def reply_ended(self, text: str) -> None:
        if self.talk.isChecked() and text[self._spoken:].strip():
            self._say(text[self._spoken:])
        self._spoken = 0  # the next answer's sentences follow this one's in the queue

    def _reset(self) -> None:
        self._spoken, self._pieces, self._made, self._played = 0, {}, 0, 0
        self._round += 1

    def _say(self, text: str) -> None:
        client = self.client()
        if client is None:
            return
        index, self._made, round_ = self._made, self._made + 1, self._round
        start_task(lambda _t: client.speech(text.strip()),
                   on_done=lambda wav: self._ready(round_, index, wav),
                   on_error=lambda e: self.error.emit(f"It could not be read aloud: {e}"),
                   owner=self)

    def _ready(self, round_: int, index: int, wav: bytes) -> None:
        """Pieces made out of order are played in order."""
        if round_ != self._round:
            return
        self._pieces[index] = wav
        while self._played in self._pieces:
            self.output.play(self._pieces.pop(self._played))
            self.spoken.emit(self._played)
            self._played += 1
