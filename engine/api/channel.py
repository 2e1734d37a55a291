"""Events from the engine's worker thread into a request's event loop."""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Awaitable, Callable

from ..events import Job


class _Dispatcher:
    """Hands events from the engine thread to one event loop. A step emits a token for
    every stream at once: one wake-up of the loop per burst, not one per event (each
    is a write to the loop's self-pipe, on the thread that feeds llama.cpp)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._pending: list[tuple[asyncio.Queue, object]] = []
        self._lock = threading.Lock()

    def post(self, queue: asyncio.Queue, event) -> None:
        with self._lock:
            self._pending.append((queue, event))
            if len(self._pending) > 1:  # a wake-up is already on its way
                return
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, event in pending:
            queue.put_nowait(event)


_dispatchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> dispatcher


class Channel:
    """Carries events from the engine thread into this request's event loop."""

    def __init__(self):
        loop = asyncio.get_running_loop()
        self._dispatcher = _dispatchers.setdefault(loop, _Dispatcher(loop))
        self._queue: asyncio.Queue = asyncio.Queue()

    def emit(self, event) -> None:
        self._dispatcher.post(self._queue, event)

    async def next(self, job: Job, gone: Callable[[], Awaitable[bool]]):
        """The next event; cancels the job if the client goes away (`gone`) meanwhile."""
        if not self._queue.empty():  # a burst (a step's tokens, a cached answer): no timer
            return self._queue.get_nowait()
        while True:
            try:
                return await asyncio.wait_for(self._queue.get(), timeout=0.25)
            except asyncio.TimeoutError:
                if await gone():
                    job.cancel()
                    raise asyncio.CancelledError("client disconnected")
