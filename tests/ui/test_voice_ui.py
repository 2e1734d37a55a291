"""Voice in the chat against a real engine: a recorded question fed through the
microphone's path becomes text in the composer (words appearing while it is 'said'),
Read aloud and a voice conversation send speech to the speakers' stand-in in order,
speaking over an answer stops it, a hands-free question is taken when its speaker pauses,
and a machine without a microphone says so."""

from __future__ import annotations

import time

import pytest
from PySide6.QtWidgets import QPlainTextEdit

from ui.chat.sound_devices import RATE, Microphone, RecordedInput, RecordedOutput, wav_of
from ui.chat.voice import VoiceControls

pytestmark = pytest.mark.slow
QUESTION = "Good morning. What is the weather like in Paris today?"


@pytest.fixture(scope="module")
def client(tiny_client):
    return tiny_client


def controls(qtbot, client, microphone=None):
    composer = QPlainTextEdit()
    qtbot.addWidget(composer)
    output = RecordedOutput()
    voice = VoiceControls(composer, lambda: client, microphone, output)
    return composer, voice, output


def test_a_recorded_question_becomes_text_as_it_is_said(qtbot, client):
    # eSpeak's voice, which Whisper hears the same each time (Piper's varies a little,
    # as it is made to: tests/api/test_audio.py measures how well it is heard)
    recording = RecordedInput(client.speech(QUESTION, voice="en-us", speed=0.9), chunk_s=1.0)
    composer, voice, output = controls(qtbot, client, recording)
    composer.setPlainText("About the trip:")
    voice.speak.setChecked(True)
    assert output.played == [b""]  # speaking over stops what was being said
    qtbot.waitUntil(lambda: composer.toPlainText() != "About the trip:", timeout=30000)
    partial = composer.toPlainText()
    voice.speak.setChecked(False)
    qtbot.waitUntil(lambda: "paris" in composer.toPlainText().lower(), timeout=60000)
    final = composer.toPlainText()
    assert final.startswith("About the trip: ") and "morning" in final.lower()
    assert len(partial) <= len(final)


def test_read_aloud_plays_each_sentence_in_order(qtbot, client):
    _, voice, output = controls(qtbot, client, RecordedInput(client.speech("hi")))
    voice.read_aloud("This first sentence is about bread. The second one is about "
                     "water! And the third sentence is about salt?")
    qtbot.waitUntil(lambda: len([p for p in output.played if p]) == 3, timeout=30000)
    pieces = [p for p in output.played if p]
    assert all(p.startswith(b"RIFF") for p in pieces)
    heard = [client.transcribe(p).lower() for p in pieces]
    assert "first" in heard[0] and "second" in heard[1] and "third" in heard[2], heard


def test_a_voice_conversation_speaks_each_sentence_as_the_answer_streams(qtbot, client):
    _, voice, output = controls(qtbot, client, RecordedInput(wav_of(bytes(RATE * 2))))
    voice.talk.setChecked(True)
    voice.reply_grew("Bread needs time")
    assert not output.played  # no sentence is complete yet
    began = time.monotonic()
    voice.reply_grew("Bread needs time. Mix the dough")
    qtbot.waitUntil(lambda: len(output.played) == 1, timeout=30000)
    first = time.monotonic() - began
    voice.reply_ended("Bread needs time. Mix the dough, then wait.")
    qtbot.waitUntil(lambda: len(output.played) == 2, timeout=30000)
    assert "dough" in client.transcribe(output.played[1]).lower()
    print(f"\nfirst sound {first * 1000:.0f} ms after the first sentence ended")
    voice.talk.setChecked(False)
    voice.reply_grew("Not spoken. Not at all.")
    qtbot.wait(300)
    assert len(output.played) == 2


def test_hands_free_a_question_is_taken_when_its_speaker_pauses(qtbot, client):
    """Talk on, no button pressed: the question is recognised once its speaker has paused
    and `said`; while the answer is made and spoken the microphone's sound is no turn;
    after it, a question is heard again."""
    recording = RecordedInput(client.speech(QUESTION, voice="en-us", speed=0.9), quiet_s=0.5)
    rate = recording.rate
    _, voice, output = controls(qtbot, client, recording)
    asked: list[str] = []
    voice.said.connect(asked.append)
    voice.talk.setChecked(True)
    qtbot.waitUntil(lambda: len(asked) == 1, timeout=30000)
    assert "morning" in asked[0].lower() and "paris" in asked[0].lower(), asked
    voice.reply_grew("It is sunny in Paris. It is")
    recording.heard = 0  # the same words again, as an echo of the room, while it answers
    qtbot.waitUntil(lambda: recording.heard > len(recording.frames) + 2 * rate,
                    timeout=30000)  # and a second's quiet after them: a turn, were it heard
    qtbot.waitUntil(lambda: not voice._asking, timeout=30000)
    assert len(asked) == 1
    voice.reply_ended("It is sunny in Paris. It is warm, too.")
    qtbot.waitUntil(lambda: len(output.played) == 2, timeout=30000)
    recording.heard = 0
    qtbot.waitUntil(lambda: len(asked) == 2, timeout=30000)
    assert "paris" in asked[1].lower()
    voice.talk.setChecked(False)


def test_a_machine_without_audio_devices_says_so_and_stays_usable(qtbot, client):
    """Speak, Talk and Read aloud where Qt Multimedia finds no device (this machine, no
    PulseAudio): the window is told once each, Speak turns off, nothing is recorded or
    sent to be recognised, and the controls stay alive (Speak there once aborted the app:
    tests/ui/test_qt_refcounts.py)."""
    from ui.chat.sound_devices import Speakers

    microphone, speakers = Microphone(), Speakers()
    if microphone.available() or speakers.available():
        pytest.skip("this machine has audio devices")
    composer = QPlainTextEdit()
    qtbot.addWidget(composer)
    voice = VoiceControls(composer, lambda: client, microphone, speakers)
    said = []
    voice.error.connect(said.append)
    voice.speak.setChecked(True)  # clicked
    assert not voice.speak.isChecked() and not voice.speak.isEnabled()
    assert "No microphone" in voice.speak.toolTip() and "No microphone" in said[0]
    voice.talk.setChecked(True)
    voice.read_aloud("A first sentence. A second one.")
    voice.reply_grew("An answer streams. It goes on.")
    qtbot.wait(500)
    assert len(said) == 2 and "No speakers" in said[1]
    assert voice._asked == 0 and voice._made == 0  # nothing recognised, nothing synthesised
    voice.talk.setChecked(False)
