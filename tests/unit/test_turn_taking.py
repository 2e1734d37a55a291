"""The hands-free conversation's end of a turn: speech followed by a pause is one utterance
(its first syllable kept), the pauses between words are not an end, a steady noise in the
room is no speech, and a monologue is cut at its limit."""

import numpy as np

from ui.chat.turn_taking import END_FRAMES, FRAME_S, MAX_SECONDS, Turns

RATE = 16_000


def _quiet(seconds: float, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, noise, int(RATE * seconds)) if noise \
        else np.zeros(int(RATE * seconds))


def _words(count: int, gap_s: float = 0.25) -> np.ndarray:
    """Syllable-like bursts (a 200 Hz voice, 0.3 s each) with pauses between them."""
    t = np.arange(int(RATE * 0.3)) / RATE
    word = np.sin(2 * np.pi * 200 * t) * np.hanning(t.size) * 8000
    return np.concatenate([np.concatenate([word, _quiet(gap_s)]) for _ in range(count)])


def _heard(signal: np.ndarray, step_s: float = 0.1) -> list[tuple[float, float]]:
    """(when it ended, its length) in seconds, for each utterance, fed as a microphone."""
    pcm = np.clip(signal, -32768, 32767).astype("<i2").tobytes()
    turns, step, out = Turns(RATE), int(RATE * step_s) * 2, []
    for at in range(0, len(pcm), step):
        said = turns.feed(pcm[at:at + step])
        if said:
            out.append(((at + step) / 2 / RATE, len(said) / 2 / RATE))
    return out


def test_speech_then_a_pause_is_one_utterance_with_its_beginning():
    heard = _heard(np.concatenate([_quiet(1.0), _words(6), _quiet(1.5)]))
    assert len(heard) == 1
    ended, length = heard[0]
    spoken = 6 * 0.55
    assert 1.0 + spoken + END_FRAMES * FRAME_S - 0.3 <= ended <= 1.0 + spoken + 1.2
    assert length >= spoken  # from before its first word to the pause


def test_two_questions_with_a_pause_between_are_two():
    signal = np.concatenate([_quiet(0.6), _words(3), _quiet(1.5), _words(4), _quiet(1.5)])
    assert len(_heard(signal)) == 2


def test_a_steady_noise_is_no_speech_and_a_voice_above_it_is():
    assert _heard(_quiet(6.0, noise=400)) == []
    voice = np.concatenate([_quiet(1.0), _words(5), _quiet(1.5)])
    noisy = voice + _quiet(len(voice) / RATE + 0.01, noise=400, seed=1)[:len(voice)]
    assert len(_heard(noisy)) == 1


def test_a_monologue_is_cut_at_the_limit():
    heard = _heard(np.concatenate([_quiet(0.5), _words(int(MAX_SECONDS / 0.4) + 20, 0.1)]))
    assert heard and abs(heard[0][1] - MAX_SECONDS) < 0.1
