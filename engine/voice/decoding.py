"""An uploaded recording decoded into 16 kHz mono 16-bit samples, in a child process with
a memory limit, a time limit and a limit on the seconds it may hold: a recording is
untrusted input (a truncated MP3, a WAV header claiming 10^9 samples, a video without a
sound track), and a demuxer's or decoder's bug must cost the child, never the engine. A
plain 16-bit PCM WAV is read in the engine by Python's own `wave` (no native parser, no
child's 0.2 s start: the app's microphone sends one every 1.5 s while a person speaks).

`python -m engine.voice.decoding PATH MAX_SECONDS MEMORY_BYTES` writes one JSON line
({"seconds", "rate"} or {"error"}), then the samples as little-endian int16."""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest
from ..spawn import module_command

RATE = 16_000
MAX_SECONDS = 20 * 60   # 20 minutes a request (37 MiB of samples at most)
MAX_BYTES = 25 << 20    # what OpenAI's API takes too
TIMEOUT_S = 120.0
MEMORY_BYTES = 2 << 30


def decode(path: Path, param: str = "file", max_seconds: int = MAX_SECONDS) -> np.ndarray:
    """The recording's samples as float32 in [-1, 1]; InvalidRequest naming `param` when
    it cannot be read, holds no sound, or is too long."""
    samples = _plain_wav(path, param, max_seconds)
    return _in_child(path, param, max_seconds) if samples is None else samples


def _plain_wav(path: Path, param: str, max_seconds: int) -> np.ndarray | None:
    """A 16-bit PCM WAV (what the app's microphone and most recorders write) read here,
    with Python's own parser: no native demuxer touches the file, and what is read is
    bounded by the upload's size whatever its header claims. None for anything else, which
    the child decodes. The samples are resampled by FFmpeg's resampler (as in the child)
    from an array this code built, never from the file's bytes."""
    try:
        with wave.open(str(path)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            if width != 2 or channels not in (1, 2) or not 8_000 <= rate <= 192_000:
                return None
            data = w.readframes(max_seconds * rate + 1)
    except (wave.Error, EOFError, ValueError):
        return None
    frames = np.frombuffer(data[:len(data) // (2 * channels) * 2 * channels], dtype="<i2")
    if frames.size // channels > max_seconds * rate:
        raise InvalidRequest(f"{param}: it is longer than {max_seconds // 60} minutes",
                             param=param)
    if not frames.size:
        raise InvalidRequest(f"{param}: it holds no sound", param=param)
    return _resampled(frames.reshape(-1, channels).T.copy(), rate)


def _resampled(planes: np.ndarray, rate: int) -> np.ndarray:
    import av

    frame = av.AudioFrame.from_ndarray(planes, format="s16p",
                                       layout="mono" if len(planes) == 1 else "stereo")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    out = [p.to_ndarray().reshape(-1) for p in [*resampler.resample(frame),
                                                 *resampler.resample(None)]]
    return np.concatenate(out).astype(np.float32) / 32768.0


def _in_child(path: Path, param: str, max_seconds: int) -> np.ndarray:
    try:
        done = subprocess.run(module_command("engine.voice.decoding", str(path),
                                             str(max_seconds), str(MEMORY_BYTES)),
                              capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise InvalidRequest(f"{param}: decoding it took more than {TIMEOUT_S:g} s",
                             param=param) from None
    head, _, body = done.stdout.partition(b"\n")
    try:
        said = json.loads(head)
    except ValueError:
        raise InvalidRequest(f"{param}: its decoder stopped (exit status {done.returncode})",
                             param=param) from None
    if "error" in said:
        raise InvalidRequest(f"{param}: {said['error']}", param=param)
    samples = np.frombuffer(body[:len(body) // 2 * 2], dtype="<i2")
    if not samples.size:
        raise InvalidRequest(f"{param}: it holds no sound", param=param)
    return samples.astype(np.float32) / 32768.0


def _decode(path: Path, max_seconds: int) -> None:
    import av

    out = sys.stdout.buffer
    limit = max_seconds * RATE
    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            if not container.streams.audio:
                return _say({"error": "it has no audio track"})
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            chunks, count = [], 0
            for frame in container.decode(stream):
                for piece in resampler.resample(frame):
                    data = piece.to_ndarray().astype("<i2").tobytes()
                    count += len(data) // 2
                    if count > limit:
                        return _say({"error": f"it is longer than {max_seconds // 60} minutes"})
                    chunks.append(data)
            for piece in resampler.resample(None):
                chunks.append(piece.to_ndarray().astype("<i2").tobytes())
    except MemoryError:
        return _say({"error": "decoding it needs more memory than a recording may"})
    except Exception as exc:  # noqa: BLE001 (any failure of the demuxer: the file's fault)
        said = str(exc).replace(str(path), "the upload")  # not the engine's folders
        return _say({"error": f"not a recording this engine can read ({type(exc).__name__}: "
                              f"{said[:200]})"})
    _say({"seconds": count / RATE, "rate": RATE})
    for data in chunks:
        out.write(data)


def _say(head: dict) -> None:
    sys.stdout.buffer.write(json.dumps(head).encode() + b"\n")


if __name__ == "__main__":
    try:
        import resource

        memory = int(sys.argv[3])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except ImportError:  # Windows: the timeout still holds
        pass
    _decode(Path(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.buffer.flush()
