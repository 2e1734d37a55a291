"""Which machine answers a request (engine/cluster/replicas.py: choose, opening_key): a
pure function of the machines' models, queues and speeds and the conversation's last
machine."""

from engine.cluster.replicas import LOAD_COST, MachineLoad, choose, opening_key

M = "qwen3-8b"


def machine(name, busy=0.0, loaded=True, speed=None, local=False, models=(M,)):
    return MachineLoad(name, frozenset(models), frozenset(models if loaded else ()), busy,
                       {M: speed} if speed else {}, local)


def test_the_least_busy_machine_answers_and_a_tie_stays_here():
    here, attic = machine("here", local=True), machine("attic")
    assert choose([here, attic], M) is here
    assert choose([machine("here", busy=1.0, local=True), attic], M) is attic
    assert choose([machine("here", busy=0.25, local=True), attic], M) is attic


def test_a_model_that_must_load_costs_a_load():
    here = machine("here", busy=LOAD_COST / 2, local=True)
    assert choose([here, machine("attic", loaded=False)], M) is here
    assert choose([machine("here", busy=1.0, local=True), machine("attic", loaded=False)],
                  M).name == "attic"


def test_measured_speed_weighs_the_queue():
    slow_idle = machine("here", busy=0.0, speed=5.0, local=True)
    fast_busy = machine("gpu-box", busy=1.0, speed=50.0)
    assert choose([slow_idle, fast_busy], M) is fast_busy  # two turns at 50 beat one at 5
    assert choose([machine("here", speed=5.0, local=True), machine("gpu-box", speed=50.0,
                                                                   busy=12.0)], M).name == "here"


def test_a_conversation_stays_on_its_machine_unless_it_is_busier_by_a_slot():
    here, attic = machine("here", local=True), machine("attic", busy=0.75)
    assert choose([here, attic], M, sticky="attic") is attic
    assert choose([here, machine("attic", busy=1.5)], M, sticky="attic") is here
    assert choose([here, attic], M, sticky="gone") is here


def test_only_machines_that_have_the_model_are_chosen():
    other = machine("attic", models=("gemma",))
    assert choose([other], M) is None
    assert choose([machine("here", busy=3, local=True), other], M).name == "here"


def test_a_conversation_keeps_its_key_across_turns_and_others_differ():
    first = {"model": M, "messages": [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "hi"}]}
    later = {**first, "messages": [*first["messages"], {"role": "assistant", "content": "hello"},
                                   {"role": "user", "content": "and then?"}]}
    assert opening_key(first) == opening_key(later)
    another = {"model": M, "messages": [first["messages"][0], {"role": "user", "content": "yo"}]}
    assert opening_key(another) != opening_key(first)  # the same system prompt, another talk
    bare = {"model": M, "messages": [{"role": "user", "content": "hi"}]}
    assert opening_key(bare) == opening_key({**bare, "messages": [
        *bare["messages"], {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"}]})
    assert opening_key({**first, "model": "other"}) != opening_key(first)
    assert opening_key({"model": M, "prompt": "Once upon a time"}) != opening_key(first)
    assert opening_key({"model": M}) is None


def test_a_prompt_cache_key_is_the_conversations_key():
    """OpenAI's `prompt_cache_key` (Codex sends its session's id): requests sharing it go to
    the machine holding their prefix, whatever their messages; another key, another."""
    one = {"model": M, "input": [{"role": "user", "content": "hi"}], "prompt_cache_key": "s1"}
    other_words = {**one, "input": [{"role": "user", "content": "something else"}]}
    assert opening_key(one) == opening_key(other_words)
    assert opening_key({**one, "prompt_cache_key": "s2"}) != opening_key(one)
    assert opening_key({**one, "prompt_cache_key": ""}) == opening_key(
        {k: v for k, v in one.items() if k != "prompt_cache_key"})
