"""The microphone and the speakers, as the voice controls use them: Qt Multimedia's default
devices, and the stand-ins that implement the same small interfaces for a machine without
them and for the tests (a recording 'said' as it plays, a recorder for what would be
heard). Speech is 16-bit mono WAV on both sides."""

from __future__ import annotations

import io
import wave

from PySide6.QtCore import QBuffer, QByteArray, QIODevice

RATE = 16_000
PARTIAL_MS = 1500  # what was said so far is recognised again this often while speaking
LISTEN_MS = 100    # the voice conversation's listening reads the microphone this often


def wav_of(pcm: bytes, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


class Microphone:
    """The default input device, 16 kHz mono 16-bit (Qt Multimedia): recorded whole while
    *Speak* is held (`start`, `take`, `stop`), or heard as it comes while the voice
    conversation listens (`listen`, `fresh`, `stop`), nothing kept."""
    rate = RATE

    def __init__(self):
        self._source = self._buffer = self._device = None

    def available(self) -> bool:
        from PySide6.QtMultimedia import QMediaDevices

        return bool(QMediaDevices.audioInputs())

    def _opened(self):
        from PySide6.QtMultimedia import QAudioFormat, QAudioSource, QMediaDevices

        self.stop()
        audio = QAudioFormat()
        audio.setSampleRate(RATE)
        audio.setChannelCount(1)
        audio.setSampleFormat(QAudioFormat.SampleFormat.Int16)
        self._source = QAudioSource(QMediaDevices.defaultAudioInput(), audio)
        return self._source

    def start(self) -> None:
        source = self._opened()
        self._data = QByteArray()
        self._buffer = QBuffer(self._data)
        self._buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        source.start(self._buffer)

    def listen(self) -> None:
        self._device = self._opened().start()

    def fresh(self) -> bytes:
        """What was heard since the last call (listening)."""
        return bytes(self._device.readAll()) if self._device is not None else b""

    def take(self) -> bytes:
        """What was said so far, as a WAV (recording goes on)."""
        return wav_of(bytes(self._data)) if self._buffer is not None else wav_of(b"")

    def stop(self) -> bytes:
        if self._source is not None:
            self._source.stop()
        said, self._source, self._device = self.take(), None, None
        self._buffer = None
        return said


class RecordedInput:
    """A recording standing for the microphone: what it holds is 'said' as it plays."""

    def __init__(self, wav: bytes, chunk_s: float = PARTIAL_MS / 1000, quiet_s: float = 0.0):
        """`quiet_s`: the room's quiet before the words (a person speaks after pressing)."""
        with wave.open(io.BytesIO(wav)) as w:
            self.rate, self.frames = w.getframerate(), w.readframes(w.getnframes())
        self.frames = bytes(int(self.rate * quiet_s) * 2) + self.frames
        self.step = int(self.rate * chunk_s) * 2
        self.heard = 0

    def available(self) -> bool:
        return True

    def start(self) -> None:
        self.heard = 0

    listen = start

    def take(self) -> bytes:
        self.heard = min(len(self.frames), self.heard + self.step)
        return wav_of(self.frames[:self.heard], self.rate)

    def fresh(self) -> bytes:
        """The next listening tick's worth; a quiet room once the recording has played."""
        tick = int(self.rate * LISTEN_MS / 1000) * 2
        piece = self.frames[self.heard:self.heard + tick]
        self.heard += tick
        return piece + bytes(tick - len(piece))

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

    def busy(self) -> bool:
        return self._sink is not None or bool(self._queue)

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

    def busy(self) -> bool:  # what it records has been 'heard' at once
        return False

    def stop(self) -> None:
        self.played.append(b"")  # a stop, where it came
