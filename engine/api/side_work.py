"""The routes' work that is no chat turn (speech, hearing, embeddings): threads of their
own, and a device's such requests checked and metered (home/household.py `working`).

Threads of their own for the work that waits on a one-at-a-time lock or a child process:
speech (eSpeak's child), hearing (Whisper), decoding (the audio decoder's child) and
embedding (the embedder). asyncio's default pool (a few threads on a small machine)
carries the chat path's rendering and submission: ten transcriptions waiting there on
Whisper's lock made the owner's one-token chat take 75.9 s. Here they wait in a queue of
their own, and the chat path never waits behind them.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from ..engine import Engine
from ..errors import InvalidRequest
from .wire import device_of

MAX_INPUTS = 2048  # embedding inputs a request, as OpenAI's API
_POOLS = {"speech": 1, "hearing": 1, "decoding": 2, "embedding": 1}
_made: dict[str, ThreadPoolExecutor] = {}


async def off_loop(pool: str, call, *args):
    """`call(*args)` on the named pool's threads."""
    executor = _made.get(pool)
    if executor is None:
        executor = _made[pool] = ThreadPoolExecutor(_POOLS[pool],
                                                    thread_name_prefix=f"homerack-{pool}")
    return await asyncio.get_running_loop().run_in_executor(executor, partial(call, *args))


async def embedded(engine: Engine, model, inputs: list, http) -> tuple:
    """The inputs' vectors and their tokens, at most MAX_INPUTS a request (OpenAI's cap),
    on the embedder's own thread; a device's request checked against what is shared and
    counted against its limits while it runs."""
    if not inputs:
        raise InvalidRequest("input is empty", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"input: at most {MAX_INPUTS} inputs a request, not "
                             f"{len(inputs)}", param="input")
    with engine.home.working(device_of(http), model.id) as charge:
        vectors, tokens = await off_loop("embedding", engine.embedder.embed, model, inputs)
        charge.tokens = tokens
    return vectors, tokens
