"""Speech samples (16-bit mono) into the formats OpenAI's speech API answers with: WAV and
raw PCM as they are made (a WAV header first, its sizes left open as streams do), FLAC,
MP3 and Opus encoded by PyAV (FFmpeg) once the speech is whole."""

from __future__ import annotations

import io
import struct
from typing import Iterable, Iterator

FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
           "opus": "audio/ogg", "aac": "audio/aac"}
STREAMED = ("wav", "pcm")
_CODECS = {"flac": ("flac", "flac", "s16"), "mp3": ("mp3", "libmp3lame", "s16p"),
           "opus": ("ogg", "libopus", "s16"), "aac": ("adts", "aac", "fltp")}


def wav_header(rate: int, data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    return (b"RIFF" + struct.pack("<I", min(0xFFFFFFFF, data_bytes + 36)) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" +
            struct.pack("<I", min(0xFFFFFFFF, data_bytes)))


def streamed(pieces: Iterable[bytes], rate: int, fmt: str) -> Iterator[bytes]:
    """The pieces as they come, a WAV's header sent with the first (one write, not two)."""
    header = wav_header(rate) if fmt == "wav" else b""
    for piece in pieces:
        yield header + piece
        header = b""


def encoded(pieces: Iterable[bytes], rate: int, fmt: str) -> bytes:
    import av
    import numpy as np

    container_format, codec, sample_format = _CODECS[fmt]
    samples = np.frombuffer(b"".join(pieces), dtype="<i2")
    out = io.BytesIO()
    with av.open(out, "w", format=container_format) as container:
        target = 48_000 if codec == "libopus" else rate
        stream = container.add_stream(codec, rate=target, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=sample_format, layout="mono", rate=target)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()
