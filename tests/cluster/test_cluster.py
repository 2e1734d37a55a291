"""The LAN cluster: placement (pure), the gateway's refusals (real TLS, a sentinel where
llama.cpp's RPC server would be), and real worker processes on 127.0.0.1 serving layers
of the starter models to a real engine — identical greedy output, a worker killed in the
middle of a reply, discovery across two network namespaces."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from support import ROOT
from support.engines import start_engine
from support.models import GEMMA, PARIS_QUESTION, STARTER
from engine.cluster import link, protocol
from engine.cluster.gateway import Gateway
from engine.cluster.identity import certificate_fingerprint, ensure_identity, server_context
from engine.cluster.pairing import (WRONG_CODES, Grants, Pairing, PairingConflict, Pairings,
                                    PairingWindow, open_window)
from engine.cluster.placement import THIS_MACHINE, Machine, local_machine, place_cluster
from engine.cluster.protocol import Refused
from engine.catalog.shape import ModelShape
from engine.machine.hardware import GiB, simulated
from engine.machine.planner import Preferences
from fixtures.network import sse_events

MiB = 1 << 20


# -- placement (pure) ---------------------------------------------------------------

def shape(n_layers=32, layer_mib=200) -> ModelShape:
    return ModelShape("big", n_layers, 4096, 14336, 8, 128, 128, 128256, 8192,
                      tuple([layer_mib * MiB] * n_layers), 500 * MiB, 500 * MiB)


def worker(name, ram_gib, bandwidth=20e9, rtt_s=0.0005, gpu_gib=0.0):
    devices = ((f"RPC{name}", "cpu", int(ram_gib * GiB)),)
    if gpu_gib:
        devices += ((f"RPC{name}g", "gpu", int(gpu_gib * GiB)),)
    return Machine(name, devices, bandwidth, rtt_s)


def test_a_model_too_big_for_one_machine_is_spread_with_the_output_here():
    hw = simulated(ram_gib=3)
    here = local_machine(hw, Preferences(), 20e9)
    result = place_cluster(shape(), hw, here, [worker("a", 4), worker("b", 4)],
                           Preferences(ctx=2048))
    assert result.plan.fits
    stages = result.stages
    assert stages[-1].machine == THIS_MACHINE and stages[-1].last_layer == 32  # the output
    assert [s.first_layer for s in stages] == [0] + [s.last_layer + 1 for s in stages[:-1]]
    assert {s.machine for s in stages} == {"a", "b", THIS_MACHINE}
    assert result.plan.gpus[-1] == "CPU" and result.plan.n_gpu_layers == 33
    assert sum(result.plan.tensor_split) == 33
    assert all(u.total <= u.budget for u in result.plan.uses)


def test_a_worker_that_would_only_slow_generation_is_left_out_with_the_reason():
    hw = simulated(ram_gib=64)
    here = local_machine(hw, Preferences(), 20e9)
    slow = worker("slow", 64, bandwidth=20e9, rtt_s=0.005)
    result = place_cluster(shape(), hw, here, [slow], Preferences(ctx=2048))
    assert [s.machine for s in result.stages] == [THIS_MACHINE]
    (name, why), = result.left_out
    assert name == "slow" and "would slow generation" in why


def test_a_worker_must_bring_more_than_the_probes_noise_to_be_used():
    hw = simulated(ram_gib=64)
    here = local_machine(hw, Preferences(), 20e9)
    barely = worker("barely", 64, bandwidth=23e9, rtt_s=0.00001)  # measured 15% faster
    result = place_cluster(shape(), hw, here, [barely], Preferences(ctx=2048))
    assert [s.machine for s in result.stages] == [THIS_MACHINE]
    (name, why), = result.left_out
    assert name == "barely" and "gains under 15%" in why
    twice = worker("twice", 64, bandwidth=40e9, rtt_s=0.00001)
    assert "twice" in {s.machine for s in place_cluster(shape(), hw, here, [twice],
                                                         Preferences(ctx=2048)).stages}


def test_a_faster_worker_takes_layers_and_is_never_slower_than_this_machine_alone():
    hw = simulated(ram_gib=64)
    here = local_machine(hw, Preferences(), 10e9)
    alone = place_cluster(shape(), hw, here, [], Preferences(ctx=2048))
    gpu = worker("gpu-box", 16, bandwidth=20e9, gpu_gib=24)
    helped = place_cluster(shape(), hw, here, [gpu], Preferences(ctx=2048))
    assert "gpu-box" in {s.machine for s in helped.stages}
    assert helped.tokens_per_s > alone.tokens_per_s
    assert helped.stages[-1].machine == THIS_MACHINE


def test_a_mixture_of_experts_reads_only_its_active_experts_across_machines():
    """The same bytes as a dense model, three quarters of them routed experts of which a
    token reads 8 of 128: the cluster's forecast counts what a token reads."""
    from dataclasses import replace

    hw = simulated(ram_gib=3)
    here = local_machine(hw, Preferences(), 20e9)
    dense = shape()
    moe = replace(dense, expert_bytes=tuple(b * 3 // 4 for b in dense.layer_bytes),
                  n_expert=128, n_expert_used=8)
    workers = [worker("a", 4), worker("b", 4)]
    plans = [place_cluster(s, hw, here, workers, Preferences(ctx=2048)) for s in (dense, moe)]
    assert [s.first_layer for s in plans[0].stages] == [s.first_layer for s in plans[1].stages]
    assert plans[1].tokens_per_s > 2.5 * plans[0].tokens_per_s


def test_a_chosen_split_is_kept():
    hw = simulated(ram_gib=64)
    here = local_machine(hw, Preferences(), 20e9)
    result = place_cluster(shape(), hw, here, [worker("a", 8), worker("b", 8)],
                           Preferences(ctx=2048), split={"a": 5, "b": 7})
    assert [(s.machine, s.first_layer, s.last_layer) for s in result.stages] == \
        [("a", 0, 4), ("b", 5, 11), (THIS_MACHINE, 12, 32)]


def test_versions_must_match():
    ours = {"homerack": "0.1.0", "rpc": "7.0.0"}
    assert protocol.mismatch(ours, {"homerack": "0.1.3", "rpc": "7.0.0"}) is None
    assert "RPC protocol 6.1.0" in protocol.mismatch(ours, {"homerack": "0.1.0", "rpc": "6.1.0"})
    assert "Homerack 0.2.0" in protocol.mismatch(ours, {"homerack": "0.2.0", "rpc": "7.0.0"})


# -- the gateway's refusals (in process, real TLS) ------------------------------------

class Sentinel:
    """A TCP listener where llama.cpp's RPC server would be: it records every byte."""

    async def start(self):
        self.connections, self.received = 0, b""
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader, writer):
        self.connections += 1
        self.received += await reader.read(1024)
        writer.write(b"pong")
        await writer.drain()
        writer.close()


async def start_gateway(folder: Path, rpc_endpoint: str, code: str | None = "123456",
                        owner=lambda _port: True):
    """A gateway in this process; pairing open with `code` (None: closed); `owner` says
    whether the RPC server's port is the worker's own child's."""
    cert, key = ensure_identity(folder, "w")
    window = PairingWindow(folder / "window.json")
    if code:
        open_window(window.path, code)
    gateway = Gateway("w", Grants(folder / "grants.json"), window, certificate_fingerprint(cert),
                      lambda: rpc_endpoint, owner, lambda: {"free_bytes": 1})
    server = await gateway.serve("127.0.0.1", 0, server_context(cert, key))
    return gateway, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_only_a_paired_host_reaches_the_rpc_server(tmp_path, monkeypatch):
    async def scenario():
        sentinel = Sentinel()
        gateway, address = await start_gateway(tmp_path / "w", await sentinel.start())
        host, port = address.split(":")
        # raw bytes, no TLS: the handshake fails, nothing passes
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\x00\x00\x00\x00 raw llama.cpp RPC hello\n")
        await writer.drain()
        assert await reader.read(100) == b""
        # TLS but no pairing
        fp = certificate_fingerprint(tmp_path / "w" / "gateway.crt")
        with pytest.raises(Refused, match="not paired"):
            await link.open_link(address, "rpc", fp, "a guessed token")
        # a wrong code
        with pytest.raises(Refused, match="wrong pairing code"):
            await link.pair(address, "654321", "intruder")
        # a host with another version of llama.cpp's RPC protocol, even with the right code
        with monkeypatch.context() as patched:
            patched.setattr(link, "versions", lambda: {**protocol.versions(), "rpc": "6.1.0"})
            with pytest.raises(Refused, match="version mismatch"):
                await link.pair(address, "123456", "old host")
        # another certificate than the one pinned: the host sends nothing
        other = tmp_path / "other"
        ensure_identity(other, "impostor")
        with pytest.raises(Refused, match="another certificate"):
            await link.open_link(address, "rpc", certificate_fingerprint(other / "gateway.crt"),
                                 "token")
        assert sentinel.connections == 0 and sentinel.received == b""
        # the right code pairs; the pairing's token reaches the RPC server
        pairing, _ = await link.pair(address, "123456", "host")
        assert pairing.fingerprint == fp
        reader, writer, _ = await link.open_link(address, "rpc", fp, pairing.token)
        writer.write(b"ping")
        await writer.drain()
        assert await reader.read(4) == b"pong"
        assert sentinel.received == b"ping"
        assert gateway.stats.refused >= 3

    asyncio.run(scenario())


def test_pairing_opens_for_one_host_and_a_few_wrong_codes_close_it(tmp_path):
    async def scenario():
        gateway, address = await start_gateway(tmp_path / "w", "127.0.0.1:9", code=None)
        with pytest.raises(Refused, match="pairing is closed"):
            await link.pair(address, "123456", "early")  # nobody opened it
        code, _ = open_window(gateway.window.path)
        for left in range(WRONG_CODES - 1, 0, -1):
            with pytest.raises(Refused, match=f"wrong pairing code \\({left} tries left"):
                await link.pair(address, "000000" if code != "000000" else "1", "guesser")
        with pytest.raises(Refused, match="pairing is closed now"):
            await link.pair(address, "999999" if code != "999999" else "1", "guesser")
        with pytest.raises(Refused, match="pairing is closed"):
            await link.pair(address, code, "host")  # the right code, too late: a new one
        code, _ = open_window(gateway.window.path)
        shown = []
        gateway.on_paired = lambda host, comparison: shown.append((host, comparison))
        pairing, comparison = await link.pair(address, code, "host")
        assert shown == [("host", comparison)] and len(comparison) == 7  # "123 456"
        assert gateway.grants.admits(pairing.token) == "host"
        with pytest.raises(Refused, match="pairing is closed"):
            await link.pair(address, code, "second host")  # one host per window
        open_window(gateway.window.path, "424242", seconds=-1)
        with pytest.raises(Refused, match="pairing is closed"):
            await link.pair(address, "424242", "late host")  # expired

    asyncio.run(scenario())


class Relay:
    """A man in the middle at the worker's address: TLS with its own certificate to the
    host, TLS to the real worker, passing every line on (it cannot do more without the
    code)."""

    async def start(self, folder: Path, worker_address: str) -> str:
        ensure_identity(folder, "relay")
        cert, key = folder / "gateway.crt", folder / "gateway.key"
        self.worker_address, self.seen = worker_address, []
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0,
                                                 ssl=server_context(cert, key))
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, host_reader, host_writer):
        worker_reader, worker_writer, _ = await link._connect(self.worker_address)
        try:
            for _ in range(2):  # the host's line to the worker, the worker's answer back
                line = await host_reader.readline()
                self.seen.append(json.loads(line))
                worker_writer.write(line)
                await worker_writer.drain()
                answer = await worker_reader.readline()
                self.seen.append(json.loads(answer))
                host_writer.write(answer)
                await host_writer.drain()
        finally:
            worker_writer.close()
            host_writer.close()


def test_a_relay_with_its_own_certificate_pairs_nothing_and_learns_no_code(tmp_path):
    async def scenario():
        gateway, address = await start_gateway(tmp_path / "w", "127.0.0.1:9", code="123456")
        relay = Relay()
        relayed = await relay.start(tmp_path / "relay", address)
        with pytest.raises(Refused, match="wrong pairing code"):
            await link.pair(relayed, "123456", "host")  # the right code, the wrong machine
        assert gateway.grants.hosts() == [] and gateway.window.wrong == 1
        sent = json.dumps(relay.seen)
        assert "123456" not in sent and "token" not in relay.seen[-1]
        pairing, _ = await link.pair(address, "123456", "host")  # straight: it pairs
        assert gateway.grants.admits(pairing.token) == "host"

    asyncio.run(scenario())


def test_bytes_reach_only_the_workers_own_rpc_server(tmp_path):
    async def scenario():
        sentinel = Sentinel()  # listening, but not the worker's child
        gateway, address = await start_gateway(tmp_path / "w", await sentinel.start(),
                                               owner=lambda _port: False)
        pairing, _ = await link.pair(address, "123456", "host")
        with pytest.raises(Refused, match="RPC server is not running"):
            await link.open_link(address, "rpc", pairing.fingerprint, pairing.token)
        assert sentinel.connections == 0

    asyncio.run(scenario())


def test_a_second_worker_of_the_same_name_is_not_paired_over_the_first(tmp_path):
    store = Pairings(tmp_path / "pairings.json")
    store.add(Pairing("attic", "10.0.0.5:50151", "ab", "t1"))
    with pytest.raises(PairingConflict, match="already paired at 10.0.0.5:50151"):
        store.add(Pairing("attic", "10.0.0.5:50152", "cd", "t2"))
    assert [p.address for p in store.all()] == ["10.0.0.5:50151"]
    store.add(Pairing("attic", "10.0.0.5:50151", "ef", "t3"))  # reinstalled, same address
    assert [p.fingerprint for p in store.all()] == ["ef"]
    store.add(Pairing("attic", "10.0.0.5:50152", "cd", "t2"), replace=True)
    assert [p.address for p in store.all()] == ["10.0.0.5:50152"]


def test_an_announced_address_is_tried_but_never_written(tmp_path, monkeypatch):
    from app import cluster as app_cluster
    from engine.cluster.discovery import Announced

    monkeypatch.setenv("HOMERACK_HOME", str(tmp_path))
    store = Pairings(tmp_path / "data" / "cluster" / "pairings.json")
    store.add(Pairing("attic", "10.0.0.5:50151", "ab", "t1"))
    store.add(Pairing("den", "10.0.0.6:50151", "cd", "t2"))
    before = store.path.read_bytes()
    spoofed = [Announced("attic", "10.0.0.6:50151", {}, [], 0)]  # den's address
    monkeypatch.setattr(app_cluster, "announced", lambda _s: spoofed)
    chosen = app_cluster.resolve_workers("auto")
    assert [(p.name, p.address) for p in chosen] == [("attic", "10.0.0.6:50151"),
                                                      ("den", "10.0.0.6:50151")]
    assert store.path.read_bytes() == before  # both pairings stay as they were


def test_pairings_are_private_and_revocable(tmp_path):
    store = Pairings(tmp_path / "pairings.json")
    store.add(Pairing("w1", "127.0.0.1:1", "ab", "t1"))
    store.add(Pairing("w2", "127.0.0.1:2", "cd", "t2"))
    assert (tmp_path / "pairings.json").stat().st_mode & 0o777 == 0o600
    assert store.revoke("w1") and [p.name for p in store.all()] == ["w2"]
    grants = Grants(tmp_path / "grants.json")
    old = grants.grant("host")
    secret = grants.grant("host")  # the same host pairing again replaces its grant
    assert grants.admits(old) is None and len(grants.hosts()) == 1
    assert grants.admits(secret) == "host" and secret not in (tmp_path / "grants.json").read_text()
    assert grants.revoke("host") and grants.admits(secret) is None


# -- real workers -----------------------------------------------------------------------

def start_worker(home: Path, name: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "worker", "--host", "127.0.0.1", "--port", "0", "--name",
         name, "--code", "424242", "--no-advertise", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=dict(os.environ, HOMERACK_HOME=str(home / name), **(env or {})))
    line = process.stdout.readline()
    assert "listening on" in line, line
    return process, line.split("listening on ")[1].strip()


def pair(home: Path, host: str, address: str, code="424242") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "pair", address, "--code", code],
                          capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, HOMERACK_HOME=str(home / host)))


@pytest.fixture
def workers(home):
    started = [start_worker(home, f"w{i}") for i in (1, 2)]
    yield started
    for process, _ in started:
        if process.poll() is None:
            process.terminate()
            process.wait(10)


def ask(address, model, prompt, max_tokens=24, chat=True, **extra):
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, **extra}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    reply = httpx.post(f"{address.url}/v1/{'chat/' if chat else ''}completions", json=body,
                       headers={"Authorization": f"Bearer {address.token}"}, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


def cluster(address) -> dict:
    return httpx.get(f"{address.url}/v1/cluster", timeout=10,
                     headers={"Authorization": f"Bearer {address.token}"}).json()


@pytest.mark.slow
def test_the_rpc_server_listens_on_loopback_only(workers):
    process, _ = workers[0]
    time.sleep(1)
    rpc = [c for c in psutil.Process(process.pid).children()
           if "engine.llama.rpc" in " ".join(c.cmdline())]
    assert rpc, "the worker runs llama.cpp's RPC server in a child process"
    listening = [c.laddr for c in rpc[0].net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)


@pytest.mark.slow
@pytest.mark.parametrize("model,chat", [(STARTER, True), (GEMMA, False)])
def test_layers_on_two_workers_give_the_same_greedy_text(home, workers, model, chat):
    host = f"host-{model}"
    for _, address in workers:
        assert pair(home, host, address).returncode == 0
    prompt = PARIS_QUESTION if chat else "The three primary colours are"
    # The same kernels here and on the workers: llama.cpp's RPC devices never repack
    # 4-bit weights (Gemma's Q4_K), so the solo engine must not either.
    same_kernels = ["--model", model, "--ctx", "1024", "--batch-invariant"]
    solo, solo_address, _ = start_engine(home, f"{host}-solo", same_kernels)
    try:
        expected = ask(solo_address, model, prompt, chat=chat)
    finally:
        solo.stop()
    process, address, _ = start_engine(home, host, [*same_kernels, "--workers", "w1,w2",
                                                    "--split", "6,6"])
    try:
        assert ask(address, model, prompt, chat=chat) == expected
        view = cluster(address)
        stages = {w["name"]: w["stages"] for w in view["workers"]}
        assert [(s["first_layer"], s["last_layer"]) for s in stages["w1"]] == [(0, 5)]
        assert [(s["first_layer"], s["last_layer"]) for s in stages["w2"]] == [(6, 11)]
        assert view["local_stages"][0]["first_layer"] == 12
        assert all(w["bytes_sent"] > 0 and w["rtt_ms"] for w in view["workers"])
    finally:
        process.stop()


@pytest.mark.slow
def test_a_worker_killed_mid_reply_is_named_and_the_next_prompt_is_answered(home, workers):
    for _, address in workers:
        assert pair(home, "host-failover", address).returncode == 0
    process, address, _ = start_engine(home, "host-failover", [
        "--model", STARTER, "--ctx", "2048", "--workers", "w1,w2", "--split", "8,8"])
    try:
        ask(address, STARTER, "Hello", max_tokens=4)
        body = {"model": STARTER, "max_tokens": 1500, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
        events, killed_at = [], None
        with httpx.stream("POST", f"{address.url}/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {address.token}"}) as stream:
            for event in sse_events(stream):
                events.append(event)
                if len(events) == 10:
                    workers[1][0].send_signal(signal.SIGSTOP)  # silent: only heartbeats tell
                    killed_at = time.monotonic()
        noticed = time.monotonic() - killed_at
        error = events[-1].get("error")
        assert error and error["type"] == "worker_lost" and "w2" in error["message"], events[-1]
        assert noticed < protocol.LOST_AFTER_S + 0.7  # heartbeats, then the error's way out
        started = time.monotonic()
        answer = ask(address, STARTER, PARIS_QUESTION, max_tokens=12)
        assert answer and time.monotonic() - started < 30
        view = cluster(address)
        states = {w["name"]: (w["state"], w["why"]) for w in view["workers"]}
        assert states["w1"][0] == "linked" and states["w2"][0] == "left out", states
    finally:
        workers[1][0].send_signal(signal.SIGCONT)
        process.stop()


@pytest.mark.slow
def test_an_engine_that_dies_is_started_again_on_the_same_address(home, workers):
    """With workers the engine is a supervised child: killed (the OOM killer, a llama.cpp
    abort), it is started again behind the same socket, token and address."""
    assert pair(home, "host-crash", workers[0][1]).returncode == 0
    process, address, _ = start_engine(home, "host-crash", [
        "--model", STARTER, "--ctx", "1024", "--workers", "w1", "--split", "6"])
    try:
        first = ask(address, STARTER, PARIS_QUESTION)
        (engine,) = psutil.Process(process.process.pid).children()
        engine.kill()
        assert ask(address, STARTER, PARIS_QUESTION) == first
        assert any("engine was killed" in line for line in process.output), process.output
        (engine,) = psutil.Process(process.process.pid).children()
    finally:
        process.stop()
    # stopped (SIGTERM), the supervisor ends by itself once its engine has: not killed
    # after the wait (a wait in its signal handler could never reap the child)
    assert process.process.returncode == 0, process.output[-5:]
    assert not engine.is_running()
    assert not (home / "host-crash" / "run" / "engine.json").exists()


@pytest.mark.slow
def test_a_worker_of_another_version_is_refused_before_loading(home):
    worker_process, address = start_worker(home, "old", env={"HOMERACK_RPC_PROTOCOL": "6.1.0"})
    try:
        result = pair(home, "host-versions", address)
        assert result.returncode == 1
        assert "version mismatch" in result.stderr and "6.1.0" in result.stderr
    finally:
        worker_process.terminate()


# -- discovery across network namespaces ------------------------------------------------

def _netns_available() -> str | None:
    if shutil.which("ip") is None:
        return "the ip command is missing"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = subprocess.run(["ip", "netns", "add", "hr-probe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "hr-probe"], capture_output=True)
    return None if probe.returncode == 0 else f"network namespaces unavailable: {probe.stderr.strip()}"


@pytest.fixture
def namespaces():
    why = _netns_available()
    if why:
        pytest.skip(why)
    names = (f"hrw{os.getpid()}", f"hrh{os.getpid()}")
    commands = [
        ["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
        ["ip", "link", "add", "hrv0", "netns", names[0], "type", "veth", "peer", "name", "hrv1",
         "netns", names[1]],
        ["ip", "-n", names[0], "addr", "add", "10.77.0.1/24", "dev", "hrv0"],
        ["ip", "-n", names[1], "addr", "add", "10.77.0.2/24", "dev", "hrv1"],
        ["ip", "-n", names[0], "link", "set", "hrv0", "up", "multicast", "on"],
        ["ip", "-n", names[1], "link", "set", "hrv1", "up", "multicast", "on"],
        ["ip", "-n", names[0], "link", "set", "lo", "up"], ["ip", "-n", names[1], "link", "set", "lo", "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True)
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.slow
def test_a_worker_is_discovered_in_another_namespace_and_its_departure_noticed(home, namespaces):
    worker_ns, host_ns = namespaces
    env = dict(os.environ, HOMERACK_HOME=str(home / "ns-worker"))
    worker_process = subprocess.Popen(
        ["ip", "netns", "exec", worker_ns, sys.executable, "-m", "app", "worker", "--host",
         "10.77.0.1", "--port", "0", "--name", "attic", "--code", "111111", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    assert "listening on" in worker_process.stdout.readline()
    browse = [sys.executable, "-c", BROWSE]
    browser = subprocess.Popen(["ip", "netns", "exec", host_ns, *browse], stdout=subprocess.PIPE,
                               text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        seen = json.loads(browser.stdout.readline())
        assert seen["name"] == "attic" and seen["address"].startswith("10.77.0.1:")
        assert seen["after_s"] < 5 and seen["versions"]["rpc"] == protocol.rpc_protocol()
        worker_process.kill()  # no goodbye: the records' TTL must expire
        gone = json.loads(browser.stdout.readline())
        assert gone["gone_after_s"] < 30  # TTL_S + 2 x CHECK_S, and slack
    finally:
        browser.kill()
        if worker_process.poll() is None:
            worker_process.kill()


BROWSE = """
import json, time
from engine.cluster.discovery import Browser
browser = Browser(["10.77.0.2"])
start = time.monotonic()
while not browser.workers():
    time.sleep(0.1)
found = browser.workers()[0]
print(json.dumps({**vars(found), "after_s": time.monotonic() - start}), flush=True)
lost = time.monotonic()
while browser.workers() and time.monotonic() - lost < 90:
    time.sleep(0.2)
print(json.dumps({"gone_after_s": time.monotonic() - lost}), flush=True)
"""


@pytest.mark.slow
def test_a_second_load_takes_the_weights_from_the_workers_tensor_cache(home, workers, tmp_path):
    """llama.cpp's RPC cache keeps tensors over 10 MiB on the worker's disk; a load that
    finds them there sends their hashes instead (so: a model with wide layers)."""
    from tiny_gguf import write_tiny_model

    model = write_tiny_model(tmp_path / "wide.gguf", n_layer=3, n_embd=1024, n_ff=4096)
    assert pair(home, "host-cache", workers[0][1]).returncode == 0
    sent = []
    for _ in range(2):
        process, address, _ = start_engine(home, "host-cache", [
            "--model", str(model), "--ctx", "256", "--workers", "w1", "--split", "3"])
        try:
            ask(address, model.stem, "Hello", max_tokens=2, chat=False)
            (view,) = cluster(address)["workers"]
            assert view["stages"], view
            sent.append(view["bytes_sent"])
        finally:
            process.stop()
    big = 3 * 3 * 16 * MiB  # three 16 MiB feed-forward matrices a layer
    assert sent[0] > big
    assert sent[0] - sent[1] >= big, sent  # the second time they stayed on the worker


OTHER_PROGRAM = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"stolen")
try:
    print("closed" if s.recv(10) == b"" else "answered")
except ConnectionResetError:
    print("closed")
"""


def test_a_forwarder_carries_only_this_process_s_connections(tmp_path):
    """The host's forwarder (127.0.0.1) carries a paired session: another local program
    connecting to it is closed, and the worker's RPC server sees none of its bytes."""
    from engine.cluster.link import LinkLoop, WorkerLink

    loop = LinkLoop()
    sentinel = Sentinel()

    async def setup():
        _gateway, address = await start_gateway(tmp_path / "w", await sentinel.start())
        return (await link.pair(address, "123456", "host"))[0]

    pairing = loop.run(setup())
    forwarder = WorkerLink(pairing, lambda *_: None)
    loop.run(forwarder.start())
    host, port = forwarder.endpoint.split(":")
    other = subprocess.run(
        [sys.executable, "-c", OTHER_PROGRAM, host, port], capture_output=True, text=True,
        timeout=30)
    assert other.stdout.strip() == "closed", other.stderr
    own = socket.create_connection((host, int(port)))
    own.sendall(b"ping")
    assert own.recv(4) == b"pong"
    assert sentinel.received == b"ping"
    own.close()
    loop.run(forwarder.stop())
    loop.close()


def test_the_own_process_check_ignores_older_rows_of_a_reused_port():
    """A client port last used towards another address (now TIME_WAIT, inode 0) must not
    hide this process's connection: a forwarder closing llama.cpp's connection would make
    llama.cpp abort the engine."""
    from engine.cluster.relay import from_this_process

    server, elsewhere = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    first = socket.socket()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    first.bind(("127.0.0.1", 0))
    port = first.getsockname()[1]
    first.connect(elsewhere.getsockname())
    accepted, _ = elsewhere.accept()
    first.close()  # the client closes first: its row stays, in TIME_WAIT
    accepted.close()
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    again.bind(("127.0.0.1", port))
    again.connect(server.getsockname())
    connection, peer = server.accept()
    assert from_this_process(peer, connection.getsockname())
    for sock in (again, connection, server, elsewhere):
        sock.close()


def test_the_own_process_check_refuses_another_process_and_fails_closed(monkeypatch):
    """Another local program gets no paired session; where the system will not say who
    opened a connection (no /proc off Linux, access denied), nobody does."""
    import psutil

    from engine.cluster.relay import from_this_process

    server = socket.create_server(("127.0.0.1", 0))
    other = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; "
                              f"s = socket.create_connection(('127.0.0.1', {server.getsockname()[1]})); "
                              "print(s.getsockname()[1], flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    connection, peer = server.accept()
    assert int(other.stdout.readline()) == peer[1]
    assert not from_this_process(peer, connection.getsockname())
    other.kill()
    own = socket.create_connection(server.getsockname())
    mine, peer = server.accept()
    assert from_this_process(peer, mine.getsockname())

    def denied(*_args, **_kwargs):
        raise psutil.AccessDenied()
    monkeypatch.setattr(psutil.Process, "net_connections", denied)
    assert not from_this_process(peer, mine.getsockname())
    for sock in (own, mine, connection, server):
        sock.close()
