"""The routes' work off the event loop that others than the owner could pile up: speech,
hearing, embeddings, and the guests' turns before their first token (turn_work), on
threads of their own, a device's checked and metered (home/household.py `working`).

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
from .wire import Caller, device_of

MAX_INPUTS = 2048  # embedding inputs a request, as OpenAI's API
_POOLS = {"speech": 1, "hearing": 1, "decoding": 2, "embedding": 1, "guests": 2}
_made: dict[str, ThreadPoolExecutor] = {}


async def off_loop(pool: str, call, *args):
    """`call(*args)` on the named pool's threads."""
    executor = _made.get(pool)
    if executor is None:
        executor = _made[pool] = ThreadPoolExecutor(_POOLS[pool],
                                                    thread_name_prefix=f"homerack-{pool}")
    return await asyncio.get_running_loop().run_in_executor(executor, partial(call, *args))


async def callers_threads(caller: Caller, call, *args, **kwargs):
    """A turn's work before its first token (its conversation built, checked, grounded,
    rendered; then submitted): the owner's on asyncio's pool, as before; a device's or the
    Ollama door's on a pool of their own ("guests"), so no number of them can fill the
    pool the owner's chat waits on (six bodies of 40,000 calls held it past a minute)."""
    if caller.client is None:
        return await asyncio.to_thread(call, *args, **kwargs)
    return await off_loop("guests", partial(call, *args, **kwargs))


async def turn_work(engine: Engine, caller: Caller, call, *args, **kwargs):
    """A turn built on the caller's threads (callers_threads), a device's first admitted
    and counted in flight against its limits (a 429 before any of it runs)."""
    with engine.home.working(caller.device, None, counted=False):
        return await callers_threads(caller, call, *args, **kwargs)


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
