"""Continuous batching: the scheduler's pure batch plan, the KV cell ledger, and the
engine serving many requests at once (tiny models in-process; the starter model through
a real `homerack serve` and the official openai client)."""

import threading
import time

import httpx
import openai
import pytest

from support.engines import GREEDY, Collector, run, settled, start_engine
from support.models import PARIS_QUESTION, STARTER
from engine.engine import Engine
from engine.settings import EngineSettings, LoadSettings
from engine.errors import MemoryFull, QueueFull
from engine.events import Failed, Finished, GenerationRequest
from engine.batching.kv_pool import CellLedger
from engine.batching.plan import plan_batch
from engine.batching.slot import Slot


# -- pure parts ----------------------------------------------------------------------

def slot(seq_id, held, prompt=(), last=None, admitted=0.0):
    s = Slot(seq_id, tokens=list(held), prompt=list(prompt), last=last, admitted=admitted)
    s.job = object()  # active
    return s


def test_by_default_generated_tokens_and_prompts_share_one_call():
    decoding = [slot(0, range(10), range(10), last=7), slot(1, range(5), range(5), last=9)]
    young = slot(2, [], range(300), admitted=2.0)
    old = slot(3, range(3), range(100), admitted=1.0)
    calls = plan_batch([*decoding, young, old], n_batch=512)
    shape = [[(c.seq_id, c.start, len(c.tokens), c.logits) for c in call] for call in calls]
    # the older prompt whole (its last token sampled), the younger one up to 128 a waiting
    # prompt; in sequence order
    assert shape == [[(0, 10, 1, True), (1, 5, 1, True), (2, 0, 159, False), (3, 3, 97, True)]]
    calls = plan_batch([slot(5, [], range(30), admitted=1.0), slot(6, [], range(40))], 512)
    assert [[(c.seq_id, len(c.tokens)) for c in call] for call in calls] == [[(5, 30), (6, 40)]]


def test_by_default_generated_tokens_keep_their_sequence_order():
    decoding = [slot(12, range(4), range(4), last=1), slot(0, range(3), range(3), last=2),
                slot(5, range(9), range(9), last=3)]
    calls = plan_batch(decoding, n_batch=64)
    assert [c.seq_id for c in calls[0]] == [0, 5, 12]  # llama.cpp's order for split streams
    # a prompt joining them takes its place in that order too
    calls = plan_batch([*decoding, slot(3, [], range(20))], n_batch=64)
    assert [c.seq_id for c in calls[0]] == [0, 3, 5, 12]


def test_batch_invariant_puts_generated_tokens_together_and_each_prompt_apart():
    decoding = [slot(0, range(10), range(10), last=7), slot(1, range(5), range(5), last=9)]
    young = slot(2, [], range(300), admitted=2.0)
    old = slot(3, range(3), range(100), admitted=1.0)
    calls = plan_batch([*decoding, young, old], n_batch=512, prefill_share=80, invariant=True)
    shape = [[(c.seq_id, c.start, len(c.tokens), c.logits) for c in call] for call in calls]
    assert shape == [[(0, 10, 1, True), (1, 5, 1, True)],
                     [(3, 3, 80, False)]]  # the older prompt first, capped
    # alone, a prompt takes the whole batch, its last token's logits sampled
    calls = plan_batch([slot(3, range(3), range(100))], n_batch=512, invariant=True)
    assert [[(c.start, len(c.tokens), c.logits) for c in call] for call in calls] == \
        [[(3, 97, True)]]
    # two short prompts: one batch each, in one step
    calls = plan_batch([slot(5, [], range(30), admitted=1.0), slot(6, [], range(40))], 512,
                       invariant=True)
    assert [[(c.seq_id, len(c.tokens)) for c in call] for call in calls] == [[(6, 40)], [(5, 30)]]


def test_the_ledger_counts_shared_cells_once():
    ledger = CellLedger(100)
    ledger.hold(0, 40)
    ledger.share(0, 1, 30)  # a common prefix
    ledger.hold(1, 35)
    assert ledger.used == 45 and ledger.own(0) == 10 and ledger.own(1) == 5
    ledger.drop(0)
    assert ledger.used == 35 and ledger.held(1) == 35
    ledger.hold(1, 10)
    assert ledger.used == 10 and ledger.free == 90


# -- the engine in-process, tiny model -----------------------------------------------

@pytest.fixture
def engine_for(tiny_store):
    engines = []

    def make(**settings):
        load = settings.pop("load", LoadSettings(n_ctx=512, n_batch=64))
        engines.append(Engine(tiny_store, EngineSettings(load, **settings)))
        return engines[-1]
    yield make
    for engine in engines:
        engine.close()


def submit(engine, model, prompt, **request):
    collector = Collector()
    job = engine.submit(GenerationRequest(model=model, prompt=prompt, sampling=GREEDY,
                                          **request), collector)
    return job, collector


def together_equal_solo(engine, model, count: int, tokens: int) -> list:
    """`count` prompts run one by one, then all at once: the results of the second, each
    checked equal to its solo answer."""
    prompts = [f"request number {i} says" for i in range(count)]
    solo = [run(engine, model=model, prompt=p, max_tokens=tokens, sampling=GREEDY,
                ignore_eos=True, cache_prompt=False)[1] for p in prompts]
    jobs = [submit(engine, model, p, max_tokens=tokens, ignore_eos=True, cache_prompt=False)
            for p in prompts]
    results = [collector.result() for _, collector in jobs]
    assert [text for _, text, _ in results] == solo
    return results


def test_concurrent_requests_share_steps_and_equal_their_solo_output(engine_for, tiny_store):
    engine, model = engine_for(parallel=4), tiny_store.resolve("tiny")
    results = together_equal_solo(engine, model, 6, 24)
    assert max(done.usage.shared_streams for _, _, done in results) == 4  # the slots were full
    assert settled(engine)["requests"] == 12


def test_without_parallel_the_lanes_come_from_the_context(engine_for, tiny_store):
    """The tiny model takes 512 tokens: one pool of 512 cells holds one request of 512
    tokens, so three take turns (four lanes had batched them)."""
    engine = engine_for(load=LoadSettings(n_ctx=512, n_batch=64), kv_layout="unified")
    model = tiny_store.resolve("tiny")
    jobs = [submit(engine, model, f"request number {i} says", max_tokens=16, ignore_eos=True,
                   cache_prompt=False) for i in range(3)]
    results = [collector.result() for _, collector in jobs]
    assert max(done.usage.shared_streams for _, _, done in results) == 1
    batching = settled(engine)
    assert batching["parallel"] == 1 and "512 KV cells" in batching["lanes_why"]
    assert batching["kv_layout"] == "unified"


def test_a_kv_stream_for_each_lane_where_the_memory_holds_them(engine_for, tiny_store):
    """By default the plan gives each of 16 lanes a stream of the whole 512-token context
    (and one spare): the three run together, each equal to its solo answer."""
    engine, model = engine_for(), tiny_store.resolve("tiny")
    results = together_equal_solo(engine, model, 3, 16)
    assert max(done.usage.shared_streams for _, _, done in results) == 3
    batching = settled(engine)
    assert batching["kv_layout"] == "split" and batching["parallel"] == 16
    assert batching["kv_cells_total"] == 17 * 512 and "stream of its own" in batching["lanes_why"]


def test_steps_of_the_same_streams_reuse_llama_cpps_graph(engine_for, tiny_store):
    """Six requests together in a split cache, their tokens in sequence order: llama.cpp
    evaluates each step in one pass and runs the last step's graph again (it builds one
    for each run of consecutive sequence ids), and /health's figures say so."""
    engine, model = engine_for(), tiny_store.resolve("tiny")
    jobs = [submit(engine, model, f"request {i} says", max_tokens=24, ignore_eos=True)
            for i in range(6)]
    assert all(isinstance(c.result()[2], Finished) for _, c in jobs)
    # 23 decoding steps for six together; the first of them, and any a prompt joined,
    # build their graph
    assert settled(engine)["graphs_reused"] >= 18


def test_a_prefix_copied_between_streams_answers_as_if_evaluated(engine_for, tiny_store):
    """A split cache copies a shared document as its source's whole stream cut back to
    the prefix: the answer after it equals the answer of the same prompt evaluated
    afresh, and a prefix too short to be worth a copy is evaluated again. (Four lanes:
    a sequence stays free for each prompt, so none is served in place.)"""
    engine, model = engine_for(parallel=4), tiny_store.resolve("tiny")
    document = " ".join(f"line {i} of the shared document." for i in range(8))
    first = document + " Question one?"
    second = document + " Question two, a longer one?"
    fresh = run(engine, model=model, prompt=second, max_tokens=12, sampling=GREEDY,
                ignore_eos=True, cache_prompt=False)[1]
    run(engine, model=model, prompt=first, max_tokens=12, sampling=GREEDY, ignore_eos=True)
    started, copied, _ = run(engine, model=model, prompt=second, max_tokens=12,
                             sampling=GREEDY, ignore_eos=True)
    assert started.cached_tokens > 100 and copied == fresh
    short = run(engine, model=model, prompt="line 0 of something else", max_tokens=4,
                sampling=GREEDY, ignore_eos=True)[0]
    assert short.cached_tokens == 0  # "line 0 of" is shared, and too short to copy
    assert settled(engine)["kv_layout"] == "split"


def test_a_full_queue_answers_503_with_a_retry_time(engine_for, tiny_store):
    engine, model = engine_for(parallel=1, max_queue=1), tiny_store.resolve("tiny")
    release = threading.Event()
    busy = Collector()
    # the worker blocks inside the first request's first event: the queue cannot drain
    engine.submit(GenerationRequest(model=model, prompt="first", max_tokens=2),
                  lambda event: (release.wait(10), busy(event)))
    time.sleep(0.3)
    waiting = submit(engine, model, "waits", max_tokens=2)
    with pytest.raises(QueueFull) as refused:
        submit(engine, model, "one too many", max_tokens=2)
    assert refused.value.retry_after_s >= 1
    release.set()
    assert isinstance(busy.result()[2], Finished)
    assert isinstance(waiting[1].result()[2], Finished)


def test_a_sequence_outgrowing_the_pool_fails_alone(engine_for, tiny_store):
    # 256 cells for three requests that would need ~3 x 200: one fails, clearly.
    engine = engine_for(load=LoadSettings(n_ctx=256, n_batch=64), parallel=3,
                        kv_layout="unified")
    model = tiny_store.resolve("tiny")
    jobs = [submit(engine, model, f"stream {i}", max_tokens=200, ignore_eos=True)
            for i in range(3)]
    ends = [collector.result()[2] for _, collector in jobs]
    failed = [e for e in ends if isinstance(e, Failed)]
    assert failed and all(isinstance(e.error, MemoryFull) for e in failed)
    assert "KV memory is full" in failed[0].error.message
    assert any(isinstance(e, Finished) and e.finish_reason == "length" for e in ends)
    batching = settled(engine)
    assert batching["kv_cells_total"] == 256 and batching["memory_full"] == len(failed)


def test_a_full_pool_fails_a_devices_sequence_before_the_owners(engine_for, tiny_store):
    """The owner's request holds more cells (a longer prompt), yet the device's fails."""
    engine = engine_for(load=LoadSettings(n_ctx=256, n_batch=64), parallel=2,
                        kv_layout="unified")
    model = tiny_store.resolve("tiny")
    owner = submit(engine, model, "the owner's stream " * 6, max_tokens=200, ignore_eos=True)
    phone = submit(engine, model, "a phone", max_tokens=200, ignore_eos=True, client="phone")
    assert isinstance(phone[1].result()[2].error, MemoryFull)
    assert owner[1].result()[2].finish_reason == "length"


def test_requests_wait_for_cells_rather_than_fail(engine_for, tiny_store):
    # The pool holds one long prompt at a time: the second waits, then runs.
    engine = engine_for(load=LoadSettings(n_ctx=256, n_batch=64), parallel=2, resident=0,
                        kv_layout="unified")
    model = tiny_store.resolve("tiny")
    long_prompt = " ".join(["word"] * 30)  # ~150 tokens
    first = submit(engine, model, long_prompt, max_tokens=40, ignore_eos=True)
    second = submit(engine, model, long_prompt + " again", max_tokens=40, ignore_eos=True,
                    cache_prompt=False)
    for _, collector in (first, second):
        assert isinstance(collector.result()[2], Finished)


def test_a_common_prefix_is_stored_once(engine_for, tiny_store):
    engine, model = engine_for(parallel=2, kv_layout="unified"), tiny_store.resolve("tiny")
    document = " ".join(f"line {i} of the shared document." for i in range(8))
    a = run(engine, model=model, prompt=document + " Question one?", max_tokens=8,
            sampling=GREEDY, ignore_eos=True)
    b = run(engine, model=model, prompt=document + " Question two, longer?", max_tokens=8,
            sampling=GREEDY, ignore_eos=True)
    held = sum(done.usage.prompt_tokens + done.usage.completion_tokens - 1
               for _, _, done in (a, b))
    assert b[2].usage.cached_tokens > 100  # the document came from the first sequence
    assert settled(engine)["kv_cells_used"] <= held - b[2].usage.cached_tokens


def test_returning_to_a_resident_conversation_reuses_every_cell(engine_for, tiny_store):
    engine, model = engine_for(parallel=2, resident=2), tiny_store.resolve("tiny")
    talks = {name: f"conversation {name}: " + " ".join([name] * 60) for name in "AB"}
    held = {}
    for turn in range(3):
        for name in "AB":
            started, _, done = run(engine, model=model, prompt=talks[name], max_tokens=6,
                                      sampling=GREEDY, ignore_eos=True)
            if turn:  # all of the last prompt was resident (a re-tokenized seam aside)
                assert started.cached_tokens >= held[name] - 2, (started, held[name])
            held[name] = done.usage.prompt_tokens
            talks[name] += f" and turn {turn}"
    assert settled(engine)["evictions"] == 0


def test_a_cancelled_request_leaves_at_once_and_its_conversation_stays_idle(engine_for, tiny_store):
    engine, model = engine_for(parallel=2), tiny_store.resolve("tiny")
    runner = submit(engine, model, "keeps going", max_tokens=200, ignore_eos=True)
    leaver, seen = Collector(), []

    def emit(event):  # the client goes away after five pieces of text
        seen.append(event)
        if len(seen) == 6:
            job.cancel()
        leaver(event)

    job = engine.submit(GenerationRequest(model=model, prompt="leaves early", max_tokens=200,
                                          sampling=GREEDY, ignore_eos=True), emit)
    _, _, gone = leaver.result()
    _, _, done = runner[1].result()
    assert gone.finish_reason == "cancelled" and done.finish_reason == "length"
    assert done.usage.shared_streams == 2
    batching = settled(engine)
    # both conversations stay resident, idle (evicted like any other when room is
    # needed): a stopped answer's next turn starts from its cells
    assert batching["active"] == 0 and batching["resident"] == 2
    runner_held = done.usage.prompt_tokens + done.usage.completion_tokens - 1
    assert batching["kv_cells_used"] >= runner_held + gone.usage.prompt_tokens
    _, _, again = submit(engine, model, "leaves early", max_tokens=1)[1].result()
    assert again.usage.cached_tokens == gone.usage.prompt_tokens - 1


# -- through the API, the starter model --------------------------------------------

QUESTIONS = [PARIS_QUESTION, "Name three colours.", "What is 2 + 2?",
             "Say hello in Spanish.", "What do bees make?", "Name a large ocean.",
             "What is water made of?", "Which planet is red?"]


@pytest.fixture(scope="module")
def batching_server(home):
    process, address, _ = start_engine(home, "batching", [
        "--model", STARTER, "--ctx", "4096", "--parallel", "8", "--queue-size", "8"])
    yield address
    process.stop()


def stream(client, question, times=None, **extra):
    """One streamed greedy answer; `times` collects when each chunk arrived."""
    chunks = client.chat.completions.create(
        model=STARTER, messages=[{"role": "user", "content": question}], temperature=0,
        stream=True, stream_options={"include_usage": True}, **extra)
    text, usage = "", None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            if times is not None:
                times.append(time.perf_counter())
        usage = chunk.usage or usage
    return text, usage


# The engine's greedy pick takes the lowest id among tokens within GREEDY_TIE of the best
# (greedy_pick in engine/llama/sampler.py). llama.cpp's CPU kernels sum a row's terms in
# another order when the batch holds other sequences (docs/batching.md), which moves logits a little:
# where a token lies close to the edge of the tie (the best logit minus GREEDY_TIE), a batched and
# a solo answer may part. SmolLM2's answers here meet steps within 0.02 of that edge in
# most of their 32 tokens, which is why "6 of 8 answers equal" failed on fresh clones:
# luck, not a bug. So the test measures, in the engine itself, every step of each solo
# answer and compares the answers up to the first step closer to the edge than
# SAFE_MARGIN. Observed: a batched answer parted from its solo one at a step 0.024 from
# the edge (so 0.002 was too little), and on a CI run at a step more than 0.1 from it, 16
# tokens into "Which planet is red?" (the two runs' rounding differences grow along an
# answer). And the first step is the prompt's evaluation, batched with the other prompts:
# the bare "What is the capital of France?" opens 0.23 from the edge (The/La/L'), and in two
# whole-suite runs its batched answer began "The" where the solo one began "L'" (a shift
# over 0.115). So 0.3, and that question asked as support.models' PARIS_QUESTION, whose
# steps are clear: 166 characters of the eight answers are still checked.
SAFE_MARGIN = 0.3


def safe_prefixes(model_path, questions, max_tokens: int, monkeypatch) -> list[str]:
    """For each question, its solo greedy answer (from an engine in this process, set up
    as the server is) up to the first step where a logit lies within SAFE_MARGIN of the
    greedy decision's edge."""
    import numpy as np
    from llama_cpp import Llama

    from engine.llama import sampler
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    steps: list[list[tuple[int, float]]] = []
    pick = sampler.greedy_pick

    def measured(logits):
        token, edge = pick(logits), float(logits.max()) - sampler.GREEDY_TIE
        near = np.partition(logits, -9)[-9:]  # the edge lies within the top few
        near = np.delete(near, np.argmax(near))  # the best is GREEDY_TIE from it, always
        steps[-1].append((token, float(np.abs(near - edge).min())))
        return token

    monkeypatch.setattr(sampler, "greedy_pick", measured)
    store = ModelStore(model_path.parent, GGUFInspector())
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=4096, n_threads=2), parallel=8))
    try:
        for question in questions:
            steps.append([])
            run(engine, model=store.resolve(STARTER), sampling=GREEDY, max_tokens=max_tokens,
                messages=({"role": "user", "content": question},), cache_prompt=False)
    finally:
        engine.close()
    vocab = Llama(str(model_path), vocab_only=True, verbose=False)
    prefixes = []
    for answer in steps:
        safe = next((i for i, (_, margin) in enumerate(answer) if margin < SAFE_MARGIN),
                    len(answer))
        prefixes.append(vocab.detokenize([t for t, _ in answer[:safe]]).decode(errors="ignore"))
    return prefixes


@pytest.mark.slow
def test_eight_streams_through_the_openai_client_equal_their_solo_answers(batching_server, home,
                                                                         monkeypatch):
    client = openai.OpenAI(base_url=f"{batching_server.url}/v1", api_key=batching_server.token,
                           max_retries=0)
    fresh = {"extra_body": {"cache_prompt": False}}  # see docs/batching.md's limits
    solo = [stream(client, q, max_tokens=32, **fresh)[0] for q in QUESTIONS]
    results = [None] * len(QUESTIONS)

    def ask(i):
        results[i] = stream(client, QUESTIONS[i], max_tokens=32, **fresh)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(QUESTIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # Each stream is its own answer, equal to its solo answer bit for bit as far as the
    # greedy choice is clear (measured margins); after a near tie the two may part.
    texts = [text for text, _ in results]
    prefixes = safe_prefixes(home / "data" / "models" / f"{STARTER}.gguf", QUESTIONS, 32,
                             monkeypatch)
    assert sum(len(p) for p in prefixes) >= 150, prefixes  # the check is not vacuous
    for question, prefix, alone, together in zip(QUESTIONS, prefixes, solo, texts):
        assert alone.startswith(prefix) and together.startswith(prefix), \
            (question, prefix, alone, together)
    shared = [usage.model_extra["timings"]["shared_streams"] for _, usage in results]
    assert max(shared) >= 4, shared


@pytest.mark.slow
def test_a_long_prompt_joins_without_stalling_running_streams(batching_server):
    client = openai.OpenAI(base_url=f"{batching_server.url}/v1", api_key=batching_server.token,
                           max_retries=0)
    times: list[list[float]] = [[], []]
    runners = [threading.Thread(target=stream, args=(client, q, times[i]),
                                kwargs={"max_tokens": 200, "extra_body": {"ignore_eos": True}})
               for i, q in enumerate(QUESTIONS[:2])]
    for runner in runners:
        runner.start()
    while len(times[0]) < 10:
        time.sleep(0.01)
    document = " ".join(f"Paragraph {i} talks about rivers and bridges." for i in range(150))
    joined = time.perf_counter()
    _, usage = stream(client, document + " Summarise.", max_tokens=4)
    prefill_s = usage.model_extra["timings"]["time_to_first_token_s"]
    for runner in runners:
        runner.join(timeout=120)
    assert usage.prompt_tokens > 1000
    during = [b - a for run_times in times for a, b in zip(run_times, run_times[1:])
              if a >= joined and b <= joined + prefill_s]
    assert during, "the running streams produced nothing while the prompt was evaluated"
    assert max(during) < prefill_s / 4, (max(during), prefill_s)


@pytest.mark.slow
def test_metrics_and_health_show_the_batch(batching_server):
    headers = {"Authorization": f"Bearer {batching_server.token}"}
    metrics = httpx.get(f"{batching_server.url}/metrics", headers=headers)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    for name in ("homerack_requests_processing", "homerack_requests_deferred",
                 "homerack_kv_cells_used", "homerack_kv_cells_total",
                 "homerack_predicted_tokens_seconds", "homerack_prompt_tokens_seconds"):
        assert f"\n{name} " in metrics.text, name
    assert "homerack_kv_cells_total 36864.0" in metrics.text  # a stream of 4,096 for 8 + 1
    assert httpx.get(f"{batching_server.url}/metrics").status_code == 401
    health = httpx.get(f"{batching_server.url}/health", headers=headers).json()
    batching = health["batching"]
    assert batching["parallel"] == 8 and batching["kv_cells_total"] == 9 * 4096
    assert batching["kv_layout"] == "split"
    assert health["flash_attn"] is True  # llama.cpp's auto, on for the CPU
    assert batching["host_ms_per_step"] > 0


def test_the_pool_comes_from_the_plan_within_a_memory_budget(starters_dir):
    """150 MiB of RAM for SmolLM2: the plan gives 2,048 cells (q8_0) instead of the 8,192
    asked for; four requests that would need 2,400 share them, and one that outgrows the
    pool fails alone."""
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    store = ModelStore(starters_dir, GGUFInspector())
    model = store.resolve(STARTER)
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=8192), parallel=4,
                                          ram_budget=150 << 20))
    try:
        planned = engine.plan_for(model)
        assert planned.fits and planned.n_ctx < 8192
        jobs = [submit(engine, model, f"Write a long story about the number {i}.",
                       max_tokens=600, ignore_eos=True) for i in range(4)]
        ends = [collector.result(timeout=300)[2] for _, collector in jobs]
        batching = settled(engine)
    finally:
        engine.close()
    assert batching["kv_cells_total"] == planned.n_ctx
    failed = [e for e in ends if isinstance(e, Failed)]
    assert failed and all(isinstance(e.error, MemoryFull) for e in failed)
    assert sum(isinstance(e, Finished) and e.finish_reason == "length" for e in ends) >= 2


def test_repacked_weights_are_given_up_only_for_batch_invariance():
    """Repacked 4-bit weights are llama.cpp's fast CPU kernels; only --batch-invariant
    gives them up, and only where there is a batch to be invariant to."""
    assert EngineSettings(parallel=4).load_settings().repack
    assert not EngineSettings(parallel=4, batch_invariant=True).load_settings().repack
    assert EngineSettings(parallel=1, batch_invariant=True).load_settings().repack
    unsafe = EngineSettings(load=LoadSettings(repack=False), parallel=4)  # the crash journal's
    assert not unsafe.load_settings().repack


def test_a_grammar_past_its_time_budget_ends_its_request_alone(engine_for, tiny_store,
                                                                monkeypatch):
    """The grammar llama-cpp-python's converter makes of the issue's nested pattern (the
    schema check refuses the pattern now; a raw grammar could still be as slow): its time
    per token grows with every token; past the answer's budget (1 s here, 30 s by
    default) that request ends with a 400 naming the grammar, and a request beside it in
    the same steps finishes."""
    from engine.conversation.json_schema import Branch
    from engine.errors import GrammarTooSlow
    from engine.llama import sampler
    from engine.llama.grammar import grammar

    monkeypatch.setattr(sampler, "GRAMMAR_TOTAL_S", 1.0)
    engine, model = engine_for(parallel=2), tiny_store.resolve("tiny")
    nested = grammar([Branch({"type": "string", "pattern": "^((a{9,99}){9,99}){9,99}$"})], "x")
    slow = submit(engine, model, "letters:", max_tokens=2000, grammar=nested,
                  cache_prompt=False)[1]
    beside = submit(engine, model, "the cat", max_tokens=40, ignore_eos=True,
                    cache_prompt=False)[1]
    _, text, ended = slow.result(timeout=300)
    assert isinstance(ended, Failed) and isinstance(ended.error, GrammarTooSlow)
    assert ended.error.status == 400 and ended.error.param == "grammar"
    assert "grammar took" in ended.error.message and set(text) <= {"a", '"'}
    _, _, done = beside.result(timeout=300)
    assert isinstance(done, Finished) and done.usage.completion_tokens == 40


def test_while_the_owners_prompt_waits_a_devices_prefill_takes_no_part_of_the_step():
    decoding = slot(0, range(10), range(10), last=7)
    device = slot(1, [], range(300), admitted=1.0)
    device.client = "phone"
    owner = slot(2, [], range(40), admitted=2.0)
    owner.precedence = True
    calls = plan_batch([decoding, device, owner], n_batch=512)
    assert [(c.seq_id, len(c.tokens)) for c in calls[0]] == [(0, 1), (2, 40)]
    owner.tokens = list(range(40))  # the owner's prompt is in: the device's comes next
    owner.last = 3
    calls = plan_batch([decoding, device, owner], n_batch=512)
    assert [(c.seq_id, len(c.tokens)) for c in calls[0]] == [(0, 1), (1, 128), (2, 1)]
