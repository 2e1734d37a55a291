"""Time to first token with one 1024×768 picture, on a model that sees (SmolVLM-256M's
shape: the starter as its decoder, a random projector of its vision tower), in one run:

  cold       Homerack, the picture never seen: the vision tower encodes it
  again      Homerack, the same picture in another conversation (a different system
             prompt, so no KV state is shared): its embeddings are kept, no encode
  anchor     llama.cpp's llama-server --mmproj (vendored commit) on the same files, the
             same two requests (it keeps no image embeddings across prompts)

Prints Homerack ÷ llama-server for both, and the encode cache's gain (cold ÷ again).
Every timed answer is checked: generated (not replayed); Homerack's cold one encoded the
picture, its second did not.

    python -m bench.vision [--threads 2] [--quick]
"""

from __future__ import annotations

import base64
import io
import statistics
import time
from pathlib import Path

import httpx

from .build_tools import build, llama_server
from .common import (BenchError, QUICK_NOTE, arguments, donor, generated, ratio, report,
                     start_engine)
from app.paths import paths
from fixtures.projectors import SMOLVLM, SMOLVLM_QUICK, write_projector, write_vision_decoder
from fixtures.shapes import CACHE, written_once

MODEL = "smolvlm-256m-shape"


def picture(seed: int, width: int = 1024, height: int = 768) -> str:
    """A photo-like picture (noise over gradients: it compresses like a photo), a new
    one for each seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = (x * 0.6 + y * 0.4 + rng.normal(0, 25, (height, width, 3))).clip(0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype("uint8")).save(out, "JPEG", quality=85)
    return f"data:image/jpeg;base64,{base64.b64encode(out.getvalue()).decode()}"


def files(quick: bool) -> tuple[Path, Path]:
    """The decoder and the projector, written once, linked into the models folder."""
    spec = SMOLVLM_QUICK if quick else SMOLVLM
    decoder = written_once(CACHE / f"{MODEL}.gguf", lambda tmp: write_vision_decoder(donor(), tmp))
    projector = written_once(CACHE / f"mmproj-{spec.name}-f16.gguf",
                             lambda tmp: write_projector(spec, tmp))
    models = paths().models
    for link in models.glob(f"*{MODEL}*.gguf"):
        link.unlink()
    (models / decoder.name).symlink_to(decoder)
    (models / f"mmproj-{MODEL}-f16.gguf").symlink_to(projector)
    return decoder, projector


def body(system: str, image: str, model: str = MODEL) -> dict:
    return {"model": model, "max_tokens": 1, "temperature": 0, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                     {"type": "text", "text": "What is in this picture?"}]}]}


def timed(http: httpx.Client, url: str, request: dict, what: str) -> tuple[float, dict]:
    started = time.perf_counter()
    reply = http.post(f"{url}/v1/chat/completions", json=request)
    took = time.perf_counter() - started
    if reply.status_code != 200:
        raise BenchError(f"{what}: {reply.status_code} {reply.text[:300]}")
    usage = reply.json()["usage"]
    generated(usage, what)
    return took, usage


def measure(url: str, rounds: int, homerack: bool) -> tuple[list[float], list[float]]:
    """TTFT of each round's new picture, then of the same picture in another
    conversation; Homerack's are checked to encode the first time only."""
    cold, again = [], []
    with httpx.Client(headers=HEADERS.get(url, {}), timeout=900) as http:
        for n in range(rounds):
            image = picture(RUN + n)  # never seen before, by this run or an earlier one
            took, usage = timed(http, url, body(f"You are assistant {n}.", image), "cold")
            if homerack and not usage.get("images", {}).get("encode_s"):
                raise BenchError(f"the cold request encoded nothing: {usage}")
            cold.append(took)
            took, usage = timed(http, url, body(f"You are helper {n}.", image), "again")
            if homerack and usage["images"]["encode_s"] != 0:
                raise BenchError(f"the repeated picture was encoded again: {usage}")
            again.append(took)
    return cold, again


HEADERS: dict[str, dict] = {}
RUN = time.time_ns() % 10**9 * 100


def main() -> None:
    args = arguments(__doc__, {"rounds": (3, 1)})
    decoder, projector = files(args.quick)
    engine = start_engine(["--model", MODEL, "--threads", str(args.threads), "--parallel", "1"])
    HEADERS[engine.url] = engine.headers
    try:
        cold, again = measure(engine.url, args.rounds, homerack=True)
    finally:
        engine.stop()
    anchor_cold = anchor_again = None
    if args.quick:
        print(QUICK_NOTE)
    else:
        with llama_server(build(), ["-m", str(decoder), "--mmproj", str(projector), "-t",
                                    str(args.threads), "-c", "4096", "-np", "1"]) as url:
            got = measure(url, args.rounds, homerack=False)
        anchor_cold, anchor_again = statistics.median(got[0]), statistics.median(got[1])
    show("first token, a new 1024x768 picture", statistics.median(cold), anchor_cold)
    show("first token, the same picture again", statistics.median(again), anchor_again)
    gain = statistics.median(cold) / statistics.median(again)
    print(f"encode cache: {gain:.2f}x faster the second time (cold / again)")
    report(MODEL, "image encode cache gain", round(gain, 2), "x")


def show(what: str, seconds: float, anchor: float | None) -> None:
    line = f"{what}: {seconds:.2f} s"
    if anchor is not None:
        line += f" vs llama-server {anchor:.2f} s ({ratio(anchor, seconds, what, 0, 1e9):.2f}x)"
    print(line)
    report(MODEL, what, round(seconds, 3), "s", anchor, "llama-server --mmproj",
           "at least the anchor's speed")


if __name__ == "__main__":
    main()
