"""A plain 16-bit WAV is read in the engine without the decoding child: the same samples as
the child's, stereo folded to mono, its length limit kept, anything else left to the
child."""

import wave

import numpy as np
import pytest

from engine.errors import InvalidRequest
from engine.voice import decoding


def _wav(path, samples: np.ndarray, rate: int, channels: int = 1, width: int = 2):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return path


def _tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2")


@pytest.mark.parametrize("rate,channels", [(16_000, 1), (22_050, 1), (44_100, 2)])
def test_a_plain_wav_is_read_here_as_the_child_reads_it(tmp_path, rate, channels):
    tone = np.repeat(_tone(rate, 1.5), channels)
    path = _wav(tmp_path / "t.wav", tone, rate, channels)
    here = decoding._plain_wav(path, "file", decoding.MAX_SECONDS)
    assert here is not None
    child = decoding._in_child(path, "file", decoding.MAX_SECONDS)
    assert abs(len(here) - 24_000) <= 2
    assert len(here) == len(child)
    assert np.abs(here - child).max() < 2 / 32768


def test_other_wavs_and_other_files_go_to_the_child(tmp_path):
    eight_bit = _wav(tmp_path / "8.wav", (np.arange(8000) % 256).astype("u1"), 8000, width=1)
    assert decoding._plain_wav(eight_bit, "file", 60) is None
    (tmp_path / "x.mp3").write_bytes(b"ID3" + bytes(100))
    assert decoding._plain_wav(tmp_path / "x.mp3", "file", 60) is None


def test_a_wav_over_the_limit_or_without_sound_is_refused(tmp_path):
    long = _wav(tmp_path / "long.wav", _tone(8000, 3), 8000)
    with pytest.raises(InvalidRequest, match="longer than"):
        decoding.decode(long, "file", max_seconds=2)
    empty = _wav(tmp_path / "empty.wav", np.zeros(0, "<i2"), 16_000)
    with pytest.raises(InvalidRequest, match="no sound"):
        decoding.decode(empty)


def test_a_header_claiming_a_billion_samples_reads_what_is_there(tmp_path):
    liar = _wav(tmp_path / "liar.wav", _tone(16_000, 0.5), 16_000)
    raw = bytearray(liar.read_bytes())
    raw[40:44] = (10**9).to_bytes(4, "little")  # the data chunk's size
    liar.write_bytes(bytes(raw))
    assert len(decoding.decode(tmp_path / "liar.wav")) == 8000
