"""The speech recogniser's memory is the planner's to count: while Whisper is loaded the
RAM a chat model may plan for is smaller by what it holds, and once it has been idle for
its time it is let go and the room comes back."""

import time

import numpy as np

from app.paths import paths
from engine.engine import Engine
from engine.settings import EngineSettings, LoadSettings
from engine.voice.transcriber import RESIDENT_BYTES

pytestmark = __import__("pytest").mark.slow


def cpu_budget(engine, model) -> int:
    return next(u.budget for u in engine.plan_for(model).uses if u.device == "CPU")


def test_the_recogniser_is_counted_while_loaded_and_let_go_when_idle(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256), ram_budget=2 << 30,
                                               voice=paths().cache / "voice"))
    tiny = tiny_store.resolve("tiny")
    try:
        alone = cpu_budget(engine, tiny)
        recogniser = engine.voice.transcription_model("whisper-1")
        recogniser.idle_s = 2.0
        recogniser.transcribe(np.zeros(16_000, dtype=np.float32))
        assert recogniser.loaded
        # the budget is the RAM left less the planner's margin (and its calibration)
        assert 0.8 * RESIDENT_BYTES <= alone - cpu_budget(engine, tiny) <= RESIDENT_BYTES
        deadline = time.monotonic() + 20
        while recogniser.loaded:
            assert time.monotonic() < deadline, "the idle recogniser was never let go"
            time.sleep(0.1)
        assert cpu_budget(engine, tiny) == alone
    finally:
        engine.close()
