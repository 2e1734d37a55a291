"""A Stop that comes while a turn is still being submitted (the web chat's Stop pressed
at once) stops the job as soon as it exists: no AttributeError, no 500, nothing answered.
The engine's side is the real rule of engine/batching/lane.py: a job found cancelled
when its turn comes is answered with CANCELLED before any token."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.api.turns import Turn
from engine.api.wire import Caller
from engine.errors import StoppedBeforeStart
from engine.events import CANCELLED, GenerationRequest, Job


class QueuedEngine:
    """Submits into a queue whose turn comes later, on another thread, as the lanes do."""

    def __init__(self):
        self.submitting = threading.Event()
        self.go_on = threading.Event()

    def submit(self, request, emit) -> Job:
        self.submitting.set()
        self.go_on.wait(10)  # the Stop arrives while this call is still running
        job = Job(1, request, emit)
        threading.Timer(0.05, lambda: job.cancelled.is_set() and emit(CANCELLED)).start()
        return job


def test_a_stop_while_submitting_stops_the_job_once_it_exists():
    engine = QueuedEngine()
    request = GenerationRequest(model=None, prompt="hello")  # (never reaches a model)
    turn = Turn(engine, request, Caller())  # the owner's, never gone

    async def scenario():
        starting = asyncio.create_task(turn.start())
        await asyncio.to_thread(engine.submitting.wait, 10)
        turn.cancel()  # before the job exists: was turn.job's AttributeError (a 500)
        engine.go_on.set()
        with pytest.raises(StoppedBeforeStart) as stopped:
            await asyncio.wait_for(starting, 10)
        return stopped.value

    error = asyncio.run(scenario())
    assert error.status == 409 and turn.job.cancelled.is_set() and turn.started is None
