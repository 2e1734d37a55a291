"""Replicas: a real worker started with --replica (an engine of its own on the shared
models), paired with a real host engine started with --replicas, on loopback. The host's
API is the one front door: a request may name its machine; a conversation's next turn
goes back to the machine that holds it (its prompt cached there); a busy machine's next
request goes to the idle one, and a burst of sixteen streams is served by both; the
answers come back unchanged through the official clients, each naming its machine;
nothing unauthenticated is forwarded; a replica frozen mid-stream ends that stream with an
error naming it, a request waiting for it is answered here instead, and so is the next; a
replica in another network namespace, over a shaped link, serves and keeps its
conversations.

Every wait here waits for the event itself (a replica serving, a stream started, this
machine idle again), bounded generously: CI's two cores are shared with other work, and
a test that assumed a speed (a stream still running, a tie between two measured speeds)
failed there. The choice on a tie is `choose`'s, tested pure in test_replica_choice.py."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from support.engines import seed_gguf_info, start_engine
from support.models import PARIS_QUESTION, STARTER
from fixtures.network import sse_events

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HERE = socket.gethostname()
CODE = "515151"
READY_S = 300  # for an engine to start or a machine to be idle: waited for, never assumed


@pytest.fixture(scope="module")
def replica(home):
    (home / "r1" / "data").mkdir(parents=True, exist_ok=True)
    if not (home / "r1" / "data" / "models").exists():
        (home / "r1" / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, home / "r1")
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "worker", "--host", "127.0.0.1", "--port", "0", "--name",
         "r1", "--code", CODE, "--no-advertise", "--threads", "1", "--replica"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=dict(os.environ, HOMERACK_HOME=str(home / "r1")))
    line = process.stdout.readline()
    assert "listening on" in line, line
    yield process, line.split("listening on ")[1].strip()
    if process.poll() is None:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def front(home, replica):
    paired = subprocess.run([sys.executable, "-m", "app", "pair", replica[1], "--code", CODE],
                            capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, HOMERACK_HOME=str(home / "front")))
    assert paired.returncode == 0, paired.stdout + paired.stderr
    process, address, _ = start_engine(home, "front", [
        "--model", STARTER, "--ctx", "1024", "--parallel", "1", "--replicas", "r1"])
    deadline = time.monotonic() + READY_S
    while "r1" not in serving(address):  # its engine starts after the worker's gateway
        assert time.monotonic() < deadline, cluster(address)
        time.sleep(0.5)
    yield address
    process.stop()


def cluster(address) -> dict:
    return httpx.get(f"{address.url}/v1/cluster", timeout=10,
                     headers={"Authorization": f"Bearer {address.token}"}).json()


def serving(address) -> dict:
    return {r["name"]: r for r in cluster(address)["replicas"] if r["state"] == "serving"}


def idle_here(address) -> None:
    """Wait until this machine's engine runs and queues nothing (a stream closed is
    cancelled at its next step, not at once)."""
    deadline = time.monotonic() + READY_S
    while True:
        status = httpx.get(f"{address.url}/health", timeout=10,
                           headers={"Authorization": f"Bearer {address.token}"}).json()
        if not any(m["running"] + m["queued"] for m in status["models"]):
            return
        assert time.monotonic() < deadline, status["models"]
        time.sleep(0.2)


def chat(address, question, machine=None, system="Answer in one short sentence.",
         earlier=(), full=False):
    client = openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0)
    reply = client.chat.completions.with_raw_response.create(
        model=STARTER, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": system}, *earlier,
                  {"role": "user", "content": question}],
        extra_headers={"X-Homerack-Machine": machine} if machine else None)
    answer = reply.parse()
    if full:
        return reply.headers["x-homerack-machine"], answer
    return reply.headers["x-homerack-machine"], answer.choices[0].message.content


def test_a_request_may_name_its_machine_and_the_answer_comes_back_unchanged(front):
    machine, text = chat(front, PARIS_QUESTION, machine="r1")
    assert machine == "r1" and text
    client = anthropic.Anthropic(base_url=front.url, api_key=front.token, max_retries=0)
    reply = client.messages.with_raw_response.create(
        model=STARTER, max_tokens=8, messages=[{"role": "user", "content": "Say hello."}],
        extra_headers={"X-Homerack-Machine": "r1"})
    assert reply.headers["x-homerack-machine"] == "r1"
    assert reply.parse().content[0].text
    body = {"model": STARTER, "max_tokens": 6, "stream": True, "prompt": "Once upon a time"}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {front.token}",
                               "X-Homerack-Machine": "r1"}) as stream:
        assert stream.headers["x-homerack-machine"] == "r1"
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["choices"][0]["text"] != \
        None  # noqa: E711
    assert serving(front)["r1"]["requests_sent"] >= 3
    metrics = httpx.get(f"{front.url}/metrics", headers={"Authorization": f"Bearer {front.token}"})
    assert 'homerack_replica_up{machine="r1"} 1.0' in metrics.text


def test_a_conversation_goes_back_to_the_machine_that_holds_it(front):
    system = "You are a patient tutor of geography. " * 20  # a prompt worth caching
    first, answer = chat(front, "Where is Lyon?", machine="r1", system=system, full=True)
    assert first == "r1"
    turn = [{"role": "user", "content": "Where is Lyon?"},
            {"role": "assistant", "content": answer.choices[0].message.content}]
    machine, again = chat(front, "And Nice?", system=system, earlier=turn, full=True)
    assert machine == "r1"  # its next turn, where its KV is
    assert again.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens // 2


def test_a_busy_machine_sends_the_next_request_to_the_idle_one(front):
    body = {"model": STARTER, "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True, "prompt": "Write a long story about a lighthouse."}
    headers = {"Authorization": f"Bearer {front.token}", "X-Homerack-Machine": HERE}
    started, answered = threading.Event(), threading.Event()

    def long_local():  # runs until the other request is answered, however slow this is
        with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=READY_S,
                          headers=headers) as stream:
            for _ in stream.iter_lines():
                started.set()
                if answered.is_set():
                    return  # closed: the engine cancels it

    runner = threading.Thread(target=long_local)
    runner.start()
    try:
        assert started.wait(READY_S)  # one slot here (--parallel 1), and it is taken
        machine, text = chat(front, "Name a river in Europe.", system="Reply with one word.")
        assert machine == "r1" and text
    finally:
        answered.set()
        runner.join(READY_S)
    idle_here(front)  # the next test starts with both machines free


def test_a_burst_of_streams_is_served_by_both_machines(front):
    idle_here(front)
    machines = []

    def one(i):
        body = {"model": STARTER, "max_tokens": 8, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": f"Count to {i + 3}."}]}
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {front.token}"}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            machines.append(stream.headers["x-homerack-machine"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(machines) == 16 and set(machines) == {HERE, "r1"}, machines


@pytest.mark.parametrize("headers, body, status", [
    ({}, {"model": STARTER, "prompt": "hi", "max_tokens": 2}, 401),
    ({"Authorization": "Bearer wrong", "X-Homerack-Machine": "r1"},
     {"model": STARTER, "prompt": "hi", "max_tokens": 2}, 401),
    ({"X-Homerack-Machine": "r1"}, "not json", 400),
])
def test_nothing_unauthenticated_or_malformed_is_forwarded(front, headers, body, status):
    before = serving(front)["r1"]["requests_sent"]
    if "Authorization" not in headers and status == 400:
        headers = {**headers, "Authorization": f"Bearer {front.token}"}
    reply = httpx.post(f"{front.url}/v1/completions", headers=headers, timeout=30,
                       **({"json": body} if isinstance(body, dict) else {"content": body}))
    assert reply.status_code == status, reply.text
    assert serving(front)["r1"]["requests_sent"] == before


def test_a_replica_frozen_mid_stream_is_named_and_what_waited_is_answered_here(front, replica):
    body = {"model": STARTER, "max_tokens": 2000, "temperature": 0, "stream": True,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
    events, waiting, frozen_at = [], {}, None

    def waits_for_r1():  # sent to the frozen machine before anyone knows it is frozen
        waiting["answer"] = chat(front, "What is the capital of Italy?", machine="r1")

    try:
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {front.token}",
                                   "X-Homerack-Machine": "r1"}) as stream:
            for event in sse_events(stream):
                events.append(event)
                if len(events) == 5:
                    replica[0].send_signal(signal.SIGSTOP)  # silent: heartbeats tell
                    frozen_at = time.monotonic()
                    waiter = threading.Thread(target=waits_for_r1)
                    waiter.start()
        noticed = time.monotonic() - frozen_at
        error = events[-1].get("error")
        assert error and "r1" in error["message"] and "lost" in error["message"], events[-1]
        print(f"\nthe frozen replica's stream ended {noticed:.2f} s after")
        assert noticed < 60  # heartbeats (1.8 s; later on a loaded machine), not a TCP
        waiter.join(READY_S)  # timeout (minutes)
        assert waiting["answer"][0] == HERE and waiting["answer"][1]
        machine, text = chat(front, "What is the capital of Spain?", machine="r1")
        assert machine == HERE and text  # the named machine is gone: answered here
        left = {r["name"]: r for r in cluster(front)["replicas"]}
        assert left["r1"]["state"] == "left out" and "r1" in left["r1"]["why"]
    finally:
        replica[0].send_signal(signal.SIGCONT)


# -- across a network namespace ---------------------------------------------------------

@pytest.fixture
def other_machine():
    """A network namespace joined to this one by a veth pair, with a 1 Gbit/s link and
    0.5 ms each way (a home LAN): (its name, its address)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("network namespaces need the ip command and root")
    name, here, there = f"hrr{os.getpid()}", f"hrh{os.getpid() % 100000}", \
        f"hrt{os.getpid() % 100000}"
    commands = [["ip", "netns", "add", name],
                ["ip", "link", "add", here, "type", "veth", "peer", "name", there,
                 "netns", name],
                ["ip", "addr", "add", "10.78.0.2/24", "dev", here],
                ["ip", "-n", name, "addr", "add", "10.78.0.1/24", "dev", there],
                ["ip", "link", "set", here, "up"], ["ip", "-n", name, "link", "set", there, "up"],
                ["ip", "-n", name, "link", "set", "lo", "up"]]
    try:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"network namespaces unavailable: {done.stderr.strip()}")
        for device, netns in ((here, []), (there, ["-n", name])):
            subprocess.run(["tc", *netns, "qdisc", "add", "dev", device, "root", "netem",
                            "delay", "0.5ms", "rate", "1gbit"], capture_output=True)
        yield name, "10.78.0.1"
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_replica_on_another_network_serves_and_keeps_its_conversations(home, other_machine):
    netns, address = other_machine
    (home / "far" / "data").mkdir(parents=True, exist_ok=True)
    if not (home / "far" / "data" / "models").exists():
        (home / "far" / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, home / "far")
    worker = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "app", "worker", "--host", address,
         "--port", "0", "--name", "far", "--code", CODE, "--no-advertise", "--threads", "1",
         "--replica"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=dict(os.environ, HOMERACK_HOME=str(home / "far")))
    process = None
    try:
        line = worker.stdout.readline()
        assert "listening on" in line, line
        paired = subprocess.run(
            [sys.executable, "-m", "app", "pair", line.split("listening on ")[1].strip(),
             "--code", CODE], capture_output=True, text=True, cwd=ROOT,
            env=dict(os.environ, HOMERACK_HOME=str(home / "near")))
        assert paired.returncode == 0, paired.stdout + paired.stderr
        process, front, _ = start_engine(home, "near", [
            "--model", STARTER, "--ctx", "1024", "--replicas", "far"])
        deadline = time.monotonic() + READY_S
        while "far" not in serving(front):
            assert time.monotonic() < deadline, cluster(front)
            time.sleep(0.5)
        system = "You remember the notes of a long conversation about rivers. " * 20
        first, answer = chat(front, "Where is the Rhone?", machine="far", system=system,
                             full=True)
        assert first == "far"
        turn = [{"role": "user", "content": "Where is the Rhone?"},
                {"role": "assistant", "content": answer.choices[0].message.content}]
        machine, again = chat(front, "And the Loire?", system=system, earlier=turn, full=True)
        assert machine == "far"
        assert again.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens // 2
    finally:
        if process:
            process.stop()
        worker.terminate()
        worker.wait(10)
