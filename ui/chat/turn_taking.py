"""When a person has finished speaking, for the hands-free voice conversation: the
microphone's samples in, one utterance out once speech has been followed by a pause. An
energy detector over 30 ms frames against the room's noise floor, learnt as it listens
(a fan's hum is the floor, a voice stands above it); no Qt, no model: the words themselves are the engine's
to recognise."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

FRAME_S = 0.03
ABOVE_FLOOR_DB = 10.0   # a frame is speech this far above the room's noise...
QUIETEST_DB = -50.0     # ...and at least this loud (full scale 0 dB)
START_FRAMES = 5        # 150 ms of speech begins an utterance
END_FRAMES = 27         # 810 ms of quiet ends it (a comma's pause is ~300 ms)
PRE_ROLL_FRAMES = 10    # the 300 ms before it began are kept: a soft first consonant
MAX_SECONDS = 30.0      # a monologue is cut here and recognised


class Turns:
    """Feed 16-bit mono samples as they come; `feed` answers an utterance's samples
    (bytes) when one has ended, else None. `speaking` says whether one has begun."""

    def __init__(self, rate: int):
        self.frame_bytes = int(rate * FRAME_S) * 2
        self.max_frames = int(MAX_SECONDS / FRAME_S)
        self.floor = QUIETEST_DB - ABOVE_FLOOR_DB
        self._levels: deque[float] = deque(maxlen=int(3 / FRAME_S))
        self._pending = b""
        self.clear()

    def clear(self) -> None:
        """Forget what was heard (the answer is being spoken: its echo is not a turn)."""
        self._pending = b""
        self._recent: deque[bytes] = deque(maxlen=PRE_ROLL_FRAMES + START_FRAMES)
        self._utterance: list[bytes] = []
        self._run = self._quiet = 0
        self.speaking = False

    def feed(self, pcm: bytes) -> bytes | None:
        data = self._pending + pcm
        cut = len(data) - len(data) % self.frame_bytes
        self._pending = data[cut:]
        ended = None
        for at in range(0, cut, self.frame_bytes):
            ended = self._frame(data[at:at + self.frame_bytes]) or ended
        return ended

    def _frame(self, frame: bytes) -> bytes | None:
        loud = self._is_speech(_decibels(frame))
        if not self.speaking:
            self._recent.append(frame)
            self._run = self._run + 1 if loud else 0
            if self._run >= START_FRAMES:
                self.speaking, self._quiet = True, 0
                self._utterance = list(self._recent)
            return None
        self._utterance.append(frame)
        self._quiet = 0 if loud else self._quiet + 1
        if self._quiet >= END_FRAMES or len(self._utterance) >= self.max_frames:
            said = b"".join(self._utterance)
            self.clear()
            return said
        return None

    def _is_speech(self, db: float) -> bool:
        """Above the floor: the quietest tenth of the last 3 s (a voice pauses between
        words, so the floor is the room's even while someone speaks). The first 300 ms
        only learn it."""
        self._levels.append(db)
        if len(self._levels) < PRE_ROLL_FRAMES:
            return False
        self.floor = float(np.percentile(self._levels, 10))
        return db > max(self.floor + ABOVE_FLOOR_DB, QUIETEST_DB)


def _decibels(frame: bytes) -> float:
    samples = np.frombuffer(frame, dtype="<i2").astype(np.float32)
    rms = math.sqrt(float(np.mean(samples * samples))) if samples.size else 0.0
    return 20 * math.log10(rms / 32768 + 1e-9)
