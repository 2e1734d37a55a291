"""Speech through the API against the same models run directly by their own libraries,
in one run: Whisper base's real-time factor (seconds of audio per second) through
/v1/audio/transcriptions against faster-whisper's own `transcribe` on the same file, the
same folder, threads and settings; and the time to the first audio of a spoken answer
through /v1/audio/speech (wav, streamed) against eSpeak NG's own call for its first
sentence.

    python -m bench.voice [--seconds 60] [--rounds 3] [--quick]

The recording is eSpeak NG's speech of a paragraph, repeated to the length asked. Target:
the API's real-time factor at least 0.95x faster-whisper's own."""

from __future__ import annotations

import io
import statistics
import sys
import time
import wave

import httpx

from .common import arguments, ratio, report, start_engine

PARAGRAPH = ("Every morning the baker opens the shop before the sun is up. She bakes bread "
             "with flour, water and salt, and sells it warm to the people of the village. "
             "On market days the line reaches the corner of the street.")
ANSWER = ("Bread needs four things: flour, water, salt and time. Mix them, let the dough "
          "rise, and bake it hot. The crust should sound hollow when you knock on it.")


def recording(seconds: float) -> tuple[bytes, float]:
    """A WAV of eSpeak NG's speech, the paragraph repeated to `seconds` at least."""
    from engine.voice.speaker import Speaker

    speaker = Speaker()
    speech = b"".join(speaker.sentences(PARAGRAPH, "alloy"))
    pause = bytes(speaker.rate)  # half a second
    repeats = max(1, int(seconds * speaker.rate * 2 / (len(speech) + len(pause))) + 1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(speaker.rate)
        w.writeframes((speech + pause) * repeats)
    return out.getvalue(), repeats * (len(speech) + len(pause)) / 2 / speaker.rate


def through_api(http: httpx.Client, audio: bytes) -> tuple[float, str]:
    began = time.perf_counter()
    said = http.post("/v1/audio/transcriptions", files={"file": ("bench.wav", audio)},
                     data={"model": "whisper-1"})
    said.raise_for_status()
    return time.perf_counter() - began, said.json()["text"]


def directly(audio: bytes, threads: int) -> tuple[float, str]:
    """faster-whisper's own call, as the engine makes it (its folder, its settings)."""
    from faster_whisper import WhisperModel

    from app.paths import paths
    from engine.voice.transcriber import VAD_FROM_S, assemble

    model = WhisperModel(str(assemble(paths().cache / "voice")), device="cpu",
                         compute_type="int8", cpu_threads=threads)
    began = time.perf_counter()
    pieces, _info = model.transcribe(io.BytesIO(audio), beam_size=5, temperature=0.0,
                                     vad_filter=seconds_of(audio) > VAD_FROM_S,
                                     condition_on_previous_text=False)
    text = " ".join(p.text.strip() for p in pieces)
    return time.perf_counter() - began, text


def seconds_of(audio: bytes) -> float:
    with wave.open(io.BytesIO(audio)) as w:
        return w.getnframes() / w.getframerate()


def first_audio(http: httpx.Client) -> float:
    began = time.perf_counter()
    with http.stream("POST", "/v1/audio/speech", json={
            "model": "tts-1", "voice": "alloy", "input": ANSWER,
            "response_format": "wav"}) as reply:
        reply.raise_for_status()
        for piece in reply.iter_bytes():
            if len(piece) > 44:  # past the header: sound
                return time.perf_counter() - began
    raise RuntimeError("the speech had no sound")


def first_sentence_directly() -> float:
    from engine.voice.speaker import SENTENCE, Speaker

    speaker = Speaker()
    speaker.voices()  # loaded first, as the engine's is after its first request
    began = time.perf_counter()
    speaker._say(SENTENCE.split(ANSWER)[0], "en-us", 1.0)
    return time.perf_counter() - began


def main() -> int:
    args = arguments(__doc__, {"seconds": (60.0, 8.0), "rounds": (3, 1)})
    audio, seconds = recording(args.seconds)
    engine = start_engine(["--threads", str(args.threads), "--model",
                           "smollm2-135m-instruct-q4_1", "--ctx", "512"])
    try:
        with engine.client() as http:
            through_api(http, audio)  # loads the recogniser
            api = [through_api(http, audio) for _ in range(args.rounds)]
            first_audio(http)
            speech = [first_audio(http) for _ in range(5 * args.rounds)]
    finally:
        engine.stop()
    api_s = statistics.median(s for s, _ in api)
    print(f"\n{seconds:.1f} s of eSpeak NG's speech, Whisper base (int8), {args.threads} threads")
    print(f"API:        {api_s:.2f} s, real-time factor {seconds / api_s:.1f}x")
    print(f"  heard: {api[0][1][:100]}...")
    first = statistics.median(speech)
    print(f"first audio of a spoken answer (API, wav streamed): {first * 1000:.1f} ms")
    if args.quick:
        print("quick mode: anchors not measured")
        report("whisper-base", "transcription real-time factor", seconds / api_s, "x audio/s")
        report("espeak-ng", "time to first audio", first * 1000, "ms")
        return 0
    direct = [directly(audio, args.threads) for _ in range(args.rounds)]
    direct_s = statistics.median(s for s, _ in direct)
    alone = statistics.median(first_sentence_directly() for _ in range(5 * args.rounds))
    print(f"faster-whisper's own transcribe: {direct_s:.2f} s, real-time factor "
          f"{seconds / direct_s:.1f}x")
    share = ratio(direct_s, api_s, "API real-time factor / faster-whisper's", 0.3, 2.0)
    print(f"API real-time factor: {share:.3f}x faster-whisper's own (target >= 0.95x)")
    print(f"eSpeak NG's own call for the first sentence: {alone * 1000:.1f} ms "
          f"(the API's first audio adds its HTTP round trip: {(first - alone) * 1000:.1f} ms)")
    report("whisper-base", "transcription real-time factor", seconds / api_s, "x audio/s",
           seconds / direct_s, "faster-whisper transcribe", ">= 0.95x")
    report("espeak-ng", "time to first audio", first * 1000, "ms", alone * 1000,
           "espeak_Synth of the first sentence", "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
