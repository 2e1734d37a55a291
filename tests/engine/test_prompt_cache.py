"""The prompt cache: its index and tiers alone, then inside the engine on a tiny model."""

import pytest

from engine.model.prompt_cache import BLOCK, PromptCache
from engine.settings import CacheLimits

MiB = 1 << 20


def state(n: int, fill: int = 1) -> bytearray:
    return bytearray([fill % 256]) * n


def cache(tmp_path=None, ram=10 * MiB, disk=10 * MiB, fingerprint="model-a", build="b1"):
    return PromptCache(fingerprint, build, tmp_path, CacheLimits(ram, disk))


def tokens(prefix: int, n: int) -> list[int]:
    return [prefix] + list(range(1000, 1000 + n - 1))


def test_longest_prefix_wins_among_many():
    c = cache()
    shared = list(range(200))
    for i in range(50):
        c.save(shared[:100] + [5000 + i] * 40, state(100, i))
    c.save(shared + [7] * 10, state(100, 99))
    hit = c.best(shared + [7] * 10 + [8] * 50)
    assert hit.length == 210 and hit.entry.tokens == tuple(shared + [7] * 10)
    hit = c.best(shared[:100] + [5000 + 3] * 40 + [1])
    assert hit.length == 140 and c.fetch(hit) == state(100, 3)


def test_short_or_unrelated_prompts_miss():
    c = cache()
    c.save(tokens(1, 100), state(10))
    assert c.best(tokens(2, 100)) is None
    assert c.best(tokens(1, BLOCK - 1)) is None


def test_an_extended_conversation_replaces_its_prefix():
    c = cache()
    c.save(tokens(1, 64), state(10))
    c.save(tokens(1, 128), state(20))
    assert [len(e.tokens) for e in c.entries()] == [128]


def test_ram_budget_evicts_least_recently_used():
    c = cache(ram=3 * MiB)
    for i in range(3):
        c.save(tokens(i, 64), state(MiB, i))
    c.fetch(c.best(tokens(0, 64)))  # 0 is now the most recently used
    c.save(tokens(3, 64), state(MiB, 3))
    kept = {e.tokens[0] for e in c.entries()}
    assert kept == {0, 2, 3} and c.ram_bytes() <= 3 * MiB


def test_disk_tier_survives_a_new_cache_and_verifies(tmp_path):
    first = cache(tmp_path, ram=1 * MiB)
    first.save(tokens(1, 64), state(1000, 7))
    first.flush()
    second = cache(tmp_path)
    hit = second.best(tokens(1, 64) + [3, 4])
    assert hit and hit.length == 64 and hit.entry.state is None
    assert second.fetch(hit) == state(1000, 7)
    assert second.stats["hits_disk"] == 1


def test_a_closed_cache_ends_its_writer_and_lets_its_states_go(tmp_path):
    """A model unloaded and loaded again gets a new cache: the old one's writer thread
    kept it, and every state it held in RAM, for the life of the process."""
    import gc
    import threading
    import weakref

    before = set(threading.enumerate())
    first = cache(tmp_path)
    (writer,) = set(threading.enumerate()) - before
    first.save(tokens(1, 64), state(MiB, 7))
    first.close()
    writer.join(5)
    assert not writer.is_alive() and first.ram_bytes() == 0
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None
    hit = cache(tmp_path).best(tokens(1, 64))  # what it was writing was written first
    assert hit and hit.entry.path is not None


def test_states_saved_under_adapters_are_found_only_under_them_in_both_tiers(tmp_path):
    first = cache(tmp_path)
    first.save(tokens(1, 64), state(1000, 7), salt="+persona*1.0")
    first.save(tokens(1, 64), state(1000, 9))  # the same tokens under the model alone
    first.flush()
    for c in (first, cache(tmp_path)):  # RAM, then the disk tier read again
        assert c.fetch(c.best(tokens(1, 64), "+persona*1.0")) == state(1000, 7)
        assert c.fetch(c.best(tokens(1, 64))) == state(1000, 9)
        assert c.best(tokens(1, 64), "+persona*0.5") is None


def corrupt_state(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, when", [
    (corrupt_state, "fetch"),
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "scan"),
    (lambda p: p.write_bytes(b"garbage" * 10), "scan"),
    (lambda p: p.write_bytes(p.read_bytes()[:8] + b"\x01\x00\x00\x00" + p.read_bytes()[12:]),
     "scan"),  # the earlier format (sha256)
])
def test_damaged_files_are_rejected_and_deleted(tmp_path, damage, when):
    first = cache(tmp_path)
    first.save(tokens(1, 64), state(1000))
    first.flush()
    [path] = list(tmp_path.rglob("*.hrkv"))
    damage(path)
    second = cache(tmp_path)
    hit = second.best(tokens(1, 64))
    if when == "scan":
        assert hit is None
    else:
        assert second.fetch(hit) is None and second.best(tokens(1, 64)) is None
    assert not path.exists() and second.stats["rejected_files"] == 1


@pytest.mark.parametrize("other", [{"build": "b2"}, {"fingerprint": "model-a-changed"}])
def test_files_from_another_build_or_model_are_removed(tmp_path, other):
    first = cache(tmp_path)
    first.save(tokens(1, 64), state(1000))
    first.flush()
    [path] = list(tmp_path.rglob("*.hrkv"))
    if "fingerprint" in other:  # the same folder, as if the file had been copied in
        target = tmp_path / other["fingerprint"][:32]
        target.mkdir()
        path = path.rename(target / path.name)
    second = cache(tmp_path, **other)
    assert second.best(tokens(1, 64)) is None
    assert not path.exists()


def test_disk_budget_evicts_oldest_files(tmp_path):
    c = cache(tmp_path, ram=1 * MiB, disk=int(2.5 * MiB))
    for i in range(4):
        c.save(tokens(i, 64), state(MiB, i))
        c.flush()
    assert c.disk_bytes() <= 2.5 * MiB
    assert len(list(tmp_path.rglob("*.hrkv"))) == 2


# -- inside the engine ---------------------------------------------------------------

from engine.engine import Engine  # noqa: E402
from engine.settings import EngineSettings  # noqa: E402
from engine.settings import LoadSettings  # noqa: E402
from engine.events import SamplingParams
from engine.batching.residency import IN_PLACE_MIN, SPLIT_COPY_MIN  # noqa: E402
from support.engines import run  # noqa: E402

GREEDY = SamplingParams(temperature=0)
A = "the cat is on the mat " * 12
B = "hello world the dog " * 12


def make_engine(store, tmp_path, cached: bool, **settings):
    """One pool of 512 cells by default: too few for both conversations at once."""
    limits = CacheLimits(64 * MiB, 64 * MiB) if cached else None
    settings = {"kv_layout": "unified", **settings}
    return Engine(store, EngineSettings(LoadSettings(n_ctx=512, n_batch=64), cache=limits,
                                        cache_folder=tmp_path / "kv" if cached else None,
                                        **settings))


def alternate(engine, model):
    """Two conversations, switching between them; returns (text, cached) per turn."""
    turns = [A, B, A + " the dog", B + " a cat", A + " the dog is", B]
    out = []
    for prompt in turns:
        _, text, done = run(engine, model=model, prompt=prompt, max_tokens=12, sampling=GREEDY)
        out.append((text, done.usage.cached_tokens))
    return out


def test_engine_outputs_equal_with_and_without_cache(tiny_store, tmp_path):
    model = tiny_store.resolve("tiny")
    plain = make_engine(tiny_store, tmp_path, cached=False)
    cold = alternate(plain, model)
    plain.close()
    cached_engine = make_engine(tiny_store, tmp_path, cached=True)
    warm = alternate(cached_engine, model)
    cached_engine.close()
    assert [t for t, _ in warm] == [t for t, _ in cold]
    # Without the cache, switching conversations loses everything.
    assert all(c < 5 for _, c in cold[2:])
    # With it, coming back to A reuses all of A's first prompt (+ its reply).
    assert all(c > 60 for _, c in warm[2:])


def test_a_split_cache_restores_from_the_prompt_cache_into_a_stream(tiny_store, tmp_path):
    """A stream for each lane, none kept resident: every switch restores the other
    conversation from the prompt cache into a stream, and answers as without it."""
    model = tiny_store.resolve("tiny")
    plain = make_engine(tiny_store, tmp_path, cached=False)
    cold = alternate(plain, model)
    plain.close()
    split = make_engine(tiny_store, tmp_path, cached=True, kv_layout="split", resident=0)
    warm = alternate(split, model)
    layout = split.status()["batching"]["kv_layout"]
    split.close()
    assert layout == "split" and [t for t, _ in warm] == [t for t, _ in cold]
    assert all(c > 60 for _, c in warm[2:])


def test_a_split_cache_full_of_residents_serves_a_shared_prefix_in_place(tiny_store, tmp_path):
    """Two streams, both held by finished conversations: a prompt sharing the start of
    the more recent one (too short a prefix to copy a stream for) takes that stream over,
    its prefix kept, after saving the conversation it held; the other stays resident."""
    model = tiny_store.resolve("tiny")
    engine = make_engine(tiny_store, tmp_path, cached=True, kv_layout="split", parallel=2)
    for prompt in (A, B):
        run(engine, model=model, prompt=prompt, max_tokens=4, sampling=GREEDY)
    shared = B[:10]  # the tiny model reads a character a token
    _, _, done = run(engine, model=model, prompt=shared + "a zebra eats an apple " * 6,
                     max_tokens=4, sampling=GREEDY)
    status = engine.status()
    assert IN_PLACE_MIN <= done.usage.cached_tokens < SPLIT_COPY_MIN
    assert status["batching"]["evictions"] == 1
    _, _, again = run(engine, model=model, prompt=B, max_tokens=4, sampling=GREEDY)
    assert again.usage.cached_tokens >= again.usage.prompt_tokens - 1  # saved before it left
    assert engine.status()["prompt_cache"]["hits_ram"] == 1
    _, _, first = run(engine, model=model, prompt=A, max_tokens=4, sampling=GREEDY)
    assert first.usage.cached_tokens >= first.usage.prompt_tokens - 1
    assert engine.status()["prompt_cache"]["hits_ram"] == 1  # A stayed resident
    engine.close()


def test_engine_restart_reuses_the_disk_tier(tiny_store, tmp_path):
    import threading

    model = tiny_store.resolve("tiny")
    before = set(threading.enumerate())
    first = make_engine(tiny_store, tmp_path, cached=True, response_cache=tmp_path / "a.db")
    run(first, model=model, prompt=A, max_tokens=8, sampling=GREEDY)
    writers = {t for t in set(threading.enumerate()) - before
               if t.name in ("homerack-kv-writer", "homerack-answers")}
    first.close()  # waits for the background write
    for writer in writers:
        writer.join(5)
    assert len(writers) == 2 and not any(t.is_alive() for t in writers)  # none outlives it
    second = make_engine(tiny_store, tmp_path, cached=True)
    _, _, done = run(second, model=model, prompt=A + " the", max_tokens=4, sampling=GREEDY)
    assert done.usage.cached_tokens >= done.usage.prompt_tokens - 4
    assert second.status()["prompt_cache"]["hits_disk"] == 1
    second.close()
