"""Voice in the chat: *Speak* (push to talk: the words appear in the composer as they are
recognised, editable before sending), *Read aloud* on an answer, and *Talk* (a voice
conversation: each answer spoken sentence by sentence while it streams; pressing *Speak*
over it stops it). Recognition and speech are the engine's (/v1/audio/*), off the UI
thread; capture and playback are Qt Multimedia's (sound_devices.py), where a recorded file
can stand for the microphone and a recorder for the speakers. With *Talk* on, the
microphone listens hands-free: turn_taking.py says when a question has been said."""

from __future__ import annotations

import re
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QPushButton

from ..tasks import start_task
from .sound_devices import LISTEN_MS, PARTIAL_MS, Microphone, Speakers, wav_of
from .turn_taking import Turns

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class VoiceControls(QObject):
    """The composer's Speak and Talk buttons and what they do. `client()`: the engine's
    client now (None while it is down). While Talk is on the microphone listens hands-free:
    a question is taken when its speaker pauses, recognised and `said` (the page sends it),
    and listening rests while the answer is made and spoken (its own voice is no turn)."""
    error = Signal(str)
    spoken = Signal(int)  # a piece of speech reached the output (its index in the answer)
    said = Signal(str)    # a hands-free question, recognised: to be sent

    def __init__(self, composer, client: Callable, microphone=None, output=None, parent=None):
        super().__init__(parent)
        self.composer, self.client = composer, client
        self.microphone, self.output = microphone or Microphone(), output or Speakers()
        self.speak = QPushButton("Speak", checkable=True, accessibleName="Speak")
        self.talk = QPushButton("Talk", checkable=True, accessibleName="Voice conversation")
        self.talk.setToolTip("A voice conversation: each answer is read aloud as it comes")
        self.speak.toggled.connect(self._speaking)
        self.talk.toggled.connect(self._talking)
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
        self._speakers_found: bool | None = None  # asked when first wanted
        self._turns: Turns | None = None  # listening hands-free
        self._replying = False  # an answer is being made
        self._listener = QTimer(self, interval=LISTEN_MS)
        self._listener.timeout.connect(self._listened)

    def check_devices(self) -> bool:
        """Whether there is a microphone; found wanting, it is said once in the window
        and Speak is turned off (most desktops have no microphone plugged in)."""
        if not self._checked_devices:
            self._checked_devices = True
            if not self.microphone.available():
                self.speak.setEnabled(False)
                self.speak.setChecked(False)  # (its handler sees it disabled: nothing heard)
                self.speak.setToolTip("No microphone was found on this computer")
                self.error.emit("No microphone was found on this computer: Speak and the "
                                "voice conversation need one (answers can still be read "
                                "aloud)")
        return self.speak.isEnabled()

    # -- speech in -------------------------------------------------------------------

    def _speaking(self, on: bool) -> None:
        if on:
            if not self.check_devices():
                return
            self.output.stop()  # speaking over an answer stops it, and what was coming
            self._reset()
            self._listener.stop()
            self._before = self.composer.toPlainText().rstrip()
            self.microphone.start()
            self._timer.start()
        elif self.speak.isEnabled():
            self._timer.stop()
            self._recognise(self.microphone.stop(), final=True)
            self._talking(self.talk.isChecked())

    # -- hands-free ------------------------------------------------------------------

    def _talking(self, on: bool) -> None:
        self.check_devices()
        if on and self.speak.isEnabled() and not self.speak.isChecked():
            self._turns = Turns(self.microphone.rate)
            self.microphone.listen()
            self._listener.start()
        elif not on and self._turns is not None:
            self._listener.stop()
            self._turns = None
            self.microphone.stop()

    def _resting(self) -> bool:
        return (self._replying or self._asking or self._played < self._made
                or self.output.busy())

    def _listened(self) -> None:
        heard = self.microphone.fresh()
        if self._resting():
            self._turns.clear()
            return
        question = self._turns.feed(heard)
        if question is not None:
            self._before = ""
            self._replying = True  # until the answer ends (or the question comes to nothing)
            self._recognise(wav_of(question, self.microphone.rate), final=True,
                            then=self._ask)

    def _ask(self, text: str) -> None:
        if text.strip():
            self.said.emit(text.strip())
        else:
            self._replying = False

    def _partial(self) -> None:
        if not self._asking:
            self._recognise(self.microphone.take(), final=False)

    def _recognise(self, wav: bytes, final: bool, then: Callable[[str], None] = None) -> None:
        client = self.client()
        if client is None:
            self._replying = False
            return
        self._asking = True
        self._asked += 1
        asked = self._asked

        def heard(text: str) -> None:
            self._asking = False
            if asked < self._shown:  # a partial one, overtaken by the final one
                return
            self._shown = asked
            if then is not None:
                return then(text)
            self.composer.setPlainText(" ".join(t for t in (self._before, text.strip()) if t))
            if final:
                self.composer.setFocus()

        def failed(error) -> None:
            self._asking = self._replying = False
            if final:
                self.error.emit(f"What was said could not be recognised: {error}")

        start_task(lambda _t: client.transcribe(wav), on_done=heard, on_error=failed,
                   owner=self)

    # -- speech out ------------------------------------------------------------------

    def read_aloud(self, text: str) -> None:
        if not self._speakers():
            return
        self.output.stop()
        self._reset()
        for sentence in (s for s in SENTENCE_END.split(text) if s.strip()):
            self._say(sentence)

    def reply_grew(self, text: str) -> None:
        """The answer so far (Talk on): each sentence it completes is spoken."""
        if not self.talk.isChecked():
            return
        self._replying = True
        ends = [m.end() for m in SENTENCE_END.finditer(text, self._spoken)]
        if ends:
            self._say(text[self._spoken:ends[-1]])
            self._spoken = ends[-1]

    def reply_ended(self, text: str) -> None:
        self._replying = False
        if self.talk.isChecked() and text[self._spoken:].strip():
            self._say(text[self._spoken:])
        self._spoken = 0  # the next answer's sentences follow this one's in the queue

    def _reset(self) -> None:
        self._spoken, self._pieces, self._made, self._played = 0, {}, 0, 0
        self._round += 1

    def _speakers(self) -> bool:
        """Whether there are speakers; without them, said once, and nothing is made."""
        if self._speakers_found is None:
            self._speakers_found = self.output.available()
            if not self._speakers_found:
                self.error.emit("No speakers were found on this computer: answers cannot "
                                "be read aloud")
        return self._speakers_found

    def _say(self, text: str) -> None:
        client = self.client()
        if client is None or not self._speakers():
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
