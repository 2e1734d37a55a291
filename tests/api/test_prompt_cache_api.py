"""The prompt cache through real `homerack serve` processes on the starter models."""

import os

import openai
import pytest

from app.engine_proc import EngineProcess
from support.engines import seed_gguf_info
from support.models import GEMMA, STARTER

pytestmark = pytest.mark.slow

SYSTEM = ("You are a helpful assistant. Answer questions about the following notes. " +
          "The river flows north through the valley and the town has three bridges. " * 12)


@pytest.fixture
def engine_home(tmp_path, home):
    root = tmp_path / "cache-home"
    (root / "data").mkdir(parents=True)
    (root / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, root)
    return root


def start(root, *extra):
    # the response cache would answer the repeated greedy questions without the KV cache
    process = EngineProcess(["--ctx", "2048", "--response-cache-mib", "0", *extra],
                            env=dict(os.environ, HOMERACK_HOME=str(root)))
    address = process.wait_ready()
    return process, openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token,
                                  max_retries=0)


def ask(client, model, conversation, question):
    messages = [{"role": "system", "content": SYSTEM}, *conversation,
                {"role": "user", "content": question}]
    reply = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                           max_tokens=24)
    conversation += [{"role": "user", "content": question},
                     {"role": "assistant", "content": reply.choices[0].message.content}]
    return reply


def alternate(client, model):
    a, b, out = [], [], []
    for conversation, question in [(a, "How many bridges?"), (b, "Where does the river go?"),
                                   (a, "Name one."), (b, "Is it long?"), (a, "Thanks!")]:
        reply = ask(client, model, conversation, question)
        out.append((reply.choices[0].message.content,
                    reply.usage.prompt_tokens_details.cached_tokens, reply.usage.prompt_tokens))
    return out


@pytest.mark.parametrize("model", [STARTER, GEMMA])
def test_switching_conversations_is_identical_and_cached(engine_home, model):
    # cold: no prompt cache and no conversation kept in KV memory once answered
    process, client = start(engine_home, "--no-prompt-cache", "--resident", "0")
    try:
        cold = alternate(client, model)
    finally:
        process.stop()
    process, client = start(engine_home)
    try:
        warm = alternate(client, model)
    finally:
        process.stop()
    # The same answers, cached or not, but for a near tie that the different rounding of
    # a prompt evaluated whole and one evaluated in parts can turn (docs/batching.md, "Concurrent
    # requests"): every answer opens the same, and nearly all are identical.
    pairs = [(w, c) for (w, _, _), (c, _, _) in zip(warm, cold)]
    assert all(w[:12] == c[:12] for w, c in pairs), pairs
    assert sum(w == c for w, c in pairs) >= 4, pairs
    # The long system prompt is shared: B's first turn reuses what A computed.
    assert warm[1][1] > 150
    # Coming back to a conversation reuses all of its previous prompt and reply.
    for (_, cached, prompt), (_, _, previous) in zip(warm[2:], warm[:-2]):
        assert cached >= previous, (cached, previous)
    # Without it only the shared system prompt survives a switch.
    assert all(c < w for (_, c, _), (_, w, _) in zip(cold[2:], warm[2:]))


def test_disk_tier_survives_an_engine_restart_and_rejects_bad_files(engine_home):
    process, client = start(engine_home)
    conversation = []
    try:
        first = ask(client, STARTER, conversation, "How many bridges?")
    finally:
        process.stop()
    files = list((engine_home / "cache" / "kv").rglob("*.hrkv"))
    assert len(files) == 1

    process, client = start(engine_home)
    try:
        follow = ask(client, STARTER, list(conversation), "Name one.")
        assert follow.usage.prompt_tokens_details.cached_tokens >= (
            first.usage.prompt_tokens + first.usage.completion_tokens - 2)
    finally:
        process.stop()

    # Damage every saved state: the next engine rejects them, deletes them, still answers.
    for path in (engine_home / "cache" / "kv").rglob("*.hrkv"):
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    damaged = list((engine_home / "cache" / "kv").rglob("*.hrkv"))
    process, client = start(engine_home)
    try:
        again = ask(client, STARTER, list(conversation), "Name one.")
        assert again.usage.prompt_tokens_details.cached_tokens < 10
        assert again.choices[0].message.content == follow.choices[0].message.content
    finally:
        process.stop()
    assert not any(path.exists() for path in damaged)
