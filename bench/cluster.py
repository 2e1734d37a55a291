"""LAN cluster: decode tokens/s with 0, 1 and 2 RPC stages on loopback for Gemma 3 270M
and SmolLM2 through Homerack (TLS gateways, forwarders, the output layer kept local),
against llama.cpp's own rpc-server + llama-server --rpc (vendored commit) on the same
stage sizes; the gateway's cost against raw RPC with the same client (llama-server
pointed at Homerack's forwarders, or straight at rpc-servers); model load time cold and
from the workers' tensor cache, on loopback and over a simulated LAN (a 1 Gbit/s tbf-
shaped veth into a network namespace, 0.5 ms round trip added by a delaying proxy); and
a lost worker: time to the client's error and to the next answer.

Targets: stages cost no more than llama.cpp's own RPC (within 5%), the gateway <= 3%
against raw RPC, a cached reload >= 3x faster than a cold one, a lost worker detected in
<= 2 s and serving resumed in <= 30 s.

    python -m bench.cluster [--model ID] [--tokens 96] [--threads 1]   (root, for the LAN part)
    python -m bench.cluster --quick    (one worker, Homerack's side only, no anchors)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from .common import QUICK_NOTE, ROOT, arguments, ratio, report, stream_times


from app.engine_proc import EngineProcess
from app.paths import paths
from .build_tools import build, llama_server, packaging_module
from fixtures.network import free_port

MODELS = ("gemma-3-270m-q4_k_m", "smollm2-135m-instruct-q4_1")
PROMPT = "The history of Rome"
NICE = ["nice", "-n", "5"]


def token_times(url: str, headers: dict, tokens: int) -> list[float]:
    """When each token of a streamed completion of exactly `tokens` tokens arrived. From
    Homerack (`headers` given) the answer's usage is checked: generated, every token."""
    return stream_times(url, headers, {"prompt": PROMPT, "cache_prompt": False}, tokens,
                        checked=bool(headers))


def decode_rate(url: str, headers: dict, tokens: int, runs: int = 2) -> float:
    """Median decode tokens/s over `runs` completions, after one that warms up."""
    token_times(url, headers, 8)
    rates = []
    for _ in range(runs):
        times = token_times(url, headers, tokens)
        rates.append((len(times) - 2) / (times[-1] - times[1]))
    return statistics.median(rates)


@functools.cache
def layer_count(model: str) -> int:
    from engine.catalog.gguf_file import GGUFInspector

    return GGUFInspector().inspect(paths().models / f"{model}.gguf").block_count


class Homes:
    """HOMERACK_HOME folders for the host and each worker, under one temporary folder."""

    def __init__(self, root: Path):
        self.root = root
        self.models = root / "host" / "data" / "models"
        self.models.mkdir(parents=True)
        for model in paths().models.glob("*.gguf"):  # the user's models, linked
            (self.models / model.name).symlink_to(model.resolve())

    def add(self, model: Path) -> str:
        """The host's id of `model`, linked into its folder (the API takes ids only)."""
        if not (self.models / model.name).exists():
            (self.models / model.name).symlink_to(model.resolve())
        return model.stem

    def env(self, name: str) -> dict:
        return dict(os.environ, HOMERACK_HOME=str(self.root / name), PYTHONUNBUFFERED="1")


@contextmanager
def homerack_worker(homes: Homes, name: str, threads: int, host: str = "127.0.0.1",
                    netns: str | None = None):
    command = [sys.executable, "-m", "app", "worker", "--host", host, "--port", "0", "--name",
               name, "--code", "246810", "--no-advertise", "--threads", str(threads)]
    prefix = ["ip", "netns", "exec", netns] if netns else []
    process = subprocess.Popen(prefix + command, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env=homes.env(name))
    line = process.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"worker {name} did not start: {line}")
    threading.Thread(target=process.stdout.read, daemon=True).start()
    try:
        yield process, line.split("listening on ")[1].strip()
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(10)


def pair(homes: Homes, address: str) -> str:
    result = subprocess.run([sys.executable, "-m", "app", "pair", address, "--code", "246810"],
                            capture_output=True, text=True, cwd=ROOT, env=homes.env("host"))
    if result.returncode:
        raise RuntimeError(result.stderr)
    return result.stdout.split("worker ")[1].split(" ")[0]


@contextmanager
def homerack_serve(homes: Homes, args: list[str]):
    """The host's engine, without the response cache (the bench repeats its prompt)."""
    process = EngineProcess([*args, "--response-cache-mib", "0"], env=homes.env("host"))
    try:
        address = process.wait_ready()
        yield address, {"Authorization": f"Bearer {address.token}"}
    finally:
        process.stop()


def homerack_split(workers: list[str], layers: int, stages: int) -> list[str]:
    if not stages:
        return []
    share = layers // 3
    return ["--workers", ",".join(workers[:stages]), "--split", ",".join([str(share)] * stages)]


@contextmanager
def rpc_servers(bins: Path, count: int, threads: int):
    ports = [free_port() for _ in range(count)]
    # at the priority Homerack's workers give their RPC servers (engine/llama/rpc.py), so both
    # paths compute alike on a machine that plays host and workers at once
    servers = [subprocess.Popen([*NICE, str(bins / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(p),
                                 "-t", str(threads)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for p in ports]
    time.sleep(1.0)
    try:
        yield [f"127.0.0.1:{p}" for p in ports]
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)


def llama_rpc_args(model_path: Path, endpoints: list[str], layers: int, threads: int) -> list[str]:
    """llama-server over RPC stages of layers//3 each: it cannot keep the output layer on
    its CPU (--device refuses the CPU), so the output goes with the last stage."""
    args = ["-m", str(model_path), "-t", str(threads), "-c", "1024", "-np", "1"]
    if not endpoints:
        return args + ["-ngl", "0"]
    share = layers // 3
    devices = [f"RPC{i}" for i in range(len(endpoints))]
    return args + ["--rpc", ",".join(endpoints), "--device", ",".join(devices),
                   "-ngl", str(share * len(endpoints) + 1),
                   "-ts", ",".join([str(share)] * (len(endpoints) - 1) + [str(share + 1)])]


def decode_table(homes, bins, workers, args) -> dict:
    results = {}
    for model in args.models:
        layers = layer_count(model)
        path = paths().models / f"{model}.gguf"
        for stages in (0, 1, 2):
            serve_args = ["--model", model, "--ctx", "1024", "--parallel", "1",
                          "--threads", str(args.host_threads),
                          *homerack_split(workers, layers, stages)]
            with homerack_serve(homes, serve_args) as (address, headers):
                ours = decode_rate(address.url, headers, args.tokens)
            with rpc_servers(bins, stages, args.threads) as endpoints, \
                    llama_server(bins, llama_rpc_args(path, endpoints, layers, args.host_threads)) as url:
                theirs = decode_rate(url, {}, args.tokens)
            results[(model, stages)] = (ours, theirs)
            # the same stages cannot decode much faster than llama.cpp's own over RPC
            against = ratio(ours, theirs, f"{model} {stages} stages", 0.2, 1.5)
            print(f"{model:<28} {stages} stages: Homerack {ours:6.1f} tok/s, llama.cpp RPC "
                  f"{theirs:6.1f} tok/s ({against:.2f}x)", flush=True)
    print("stage cost (tok/s with stages / without, Homerack against llama.cpp):")
    for model in args.models:
        for stages in (1, 2):
            ours = results[(model, stages)][0] / results[(model, 0)][0]
            theirs = results[(model, stages)][1] / results[(model, 0)][1]
            print(f"  {model:<28} {stages} stages: {ours:.3f} vs {theirs:.3f} "
                  f"-> {ours / theirs:.3f} (target >= 0.95)")
            report(model, f"decode with {stages} RPC stages ÷ without", ours, "x", theirs,
                   "the same in llama.cpp RPC", ">= 0.95")
    return results


def inner_decode(args) -> None:
    """In a process of its own (llama.cpp's device registry is per process): Homerack's
    engine over the stages, through the gateways (`gated`: the paired workers) or straight
    to llama.cpp rpc-servers (`raw`: a bench-only cluster without links); prints tok/s."""
    from engine.cluster.head import Cluster
    from engine.cluster.pairing import Pairings
    from engine.cluster.placement import Machine
    from engine.engine import Engine
    from engine.settings import EngineSettings
    from engine.events import Finished, GenerationRequest, SamplingParams
    from engine.catalog.gguf_file import GGUFInspector
    from engine.settings import LoadSettings
    from engine.catalog.models import ModelStore
    from engine.llama.rpc import add_worker

    class RawCluster(Cluster):
        def connect(self):
            for index, endpoint in enumerate(args.endpoints.split(",")):
                if f"raw{index}" not in self.devices:
                    self.devices[f"raw{index}"] = add_worker(endpoint)

        def machines(self, hw):
            free = {d.name: d.free_bytes for d in hw.devices}
            return [Machine(name, tuple((d, "cpu", free[d]) for d in devices), 10e9, 1e-4)
                    for name, devices in self.devices.items()]

    counts = [int(n) for n in args.split.split(",")]
    if args.inner == "gated":
        pairings = [p for p in Pairings(Path(args.pairings)).all()
                    if not args.workers or p.name in args.workers.split(",")][:len(counts)]
        cluster = Cluster(pairings, lambda *_: None, {p.name: n for p, n in zip(pairings, counts)})
    else:
        cluster = RawCluster([], lambda *_: None, {f"raw{i}": n for i, n in enumerate(counts)})
    store = ModelStore(paths().models, GGUFInspector())
    engine = Engine(store, EngineSettings(load=LoadSettings(n_ctx=1024, n_threads=args.host_threads),
                                          parallel=1, resident=0), cluster)
    model = store.resolve(args.models[0])
    rates = []
    for tokens in (8, args.tokens, args.tokens, args.tokens):
        events = Collector()
        engine.submit(GenerationRequest(model, prompt=PROMPT, max_tokens=tokens, ignore_eos=True,
                                        sampling=SamplingParams(temperature=0),
                                        cache_prompt=False), events)
        finished = events.last()
        assert isinstance(finished, Finished), finished
        rates.append(finished.usage.decode_tokens_per_s)
    print(json.dumps(statistics.median(rates[1:])), flush=True)
    engine.close()
    cluster.close()


class Collector:
    def __init__(self):
        import queue

        self.events = queue.Queue()

    def __call__(self, event):
        self.events.put(event)

    def last(self):
        from engine.events import Failed, Finished

        while not isinstance(event := self.events.get(timeout=600), (Finished, Failed)):
            pass
        return event


def run_inner(homes: Homes, args, mode: str, model: str, split: str, **extra) -> float:
    command = [sys.executable, str(Path(__file__).resolve()), "--inner", mode, "--model", model,
               "--split", split, "--tokens", str(args.tokens), "--host-threads",
               str(args.host_threads), *[f"--{k}={v}" for k, v in extra.items()]]
    result = subprocess.run(command, capture_output=True, text=True, env=homes.env("host"),
                            cwd=ROOT, timeout=900)
    if result.returncode:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def alternate(gated, raw, rounds: int = 3) -> tuple[float, float]:
    """Medians of `rounds` runs of each, taken in turn (this machine's speed drifts)."""
    runs = [(gated(), raw()) for _ in range(rounds)]
    return statistics.median(g for g, _ in runs), statistics.median(r for _, r in runs)


def raw_run(homes, bins, args, model, split, stages):
    with rpc_servers(bins, stages, args.threads) as endpoints:
        return run_inner(homes, args, "raw", model, split, endpoints=",".join(endpoints))


def gateway_cost(homes, bins, args, stages: int) -> None:
    """Homerack's engine on the same split either way: through its forwarders and the TLS
    gateways to the workers' RPC servers, or straight to llama.cpp rpc-servers."""
    pairings = homes.root / "host" / "data" / "cluster" / "pairings.json"
    for model in args.models:
        layers = layer_count(model)
        split = ",".join([str(layers // 3)] * stages)
        gated, raw = alternate(
            lambda: run_inner(homes, args, "gated", model, split, pairings=pairings,
                              workers="w1,w2"),
            lambda: raw_run(homes, bins, args, model, split, stages))
        print(f"gateway: {model}, {stages} stages of {layers // 3} layers (medians of 3, in "
              f"turn): through the TLS "
              f"gateways {gated:.1f} tok/s, straight to rpc-servers {raw:.1f} tok/s -> cost "
              f"{(1 - gated / raw) * 100:+.1f}% (target <= 3%)", flush=True)
        report(model, f"decode through the gateways, {stages} stages, loopback", gated, "tok/s",
               raw, "raw RPC, same engine", ">= 0.97")


def load_times(homes: Homes, worker_name: str, label: str, wide: Path) -> None:
    """Load the wide model with all its layers on the worker: cold (a fresh tensor cache
    there), then again (the cache has its large tensors)."""
    times = []
    for _ in range(2):
        with homerack_serve(homes, ["--ctx", "256", "--workers", worker_name, "--split", "3"]) \
                as (address, headers):
            start = time.perf_counter()
            reply = httpx.post(f"{address.url}/v1/models/load", json={"model": homes.add(wide)},
                               headers=headers, timeout=600)
            reply.raise_for_status()
            times.append(time.perf_counter() - start)
    print(f"load {label}: cold {times[0]:.2f} s, from the tensor cache {times[1]:.2f} s -> "
          f"{times[0] / times[1]:.1f}x faster (target >= 3x)", flush=True)


class DelayProxy:
    """A TCP proxy that delivers every chunk `one_way_s` after it arrived, in order (netem is
    missing here; asyncio's timers round to the millisecond, so threads that sleep until
    each chunk's deadline): the round trip grows by twice `one_way_s`."""

    def __init__(self, target: tuple[str, int], one_way_s: float):
        self.target, self.delay = target, one_way_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                wait = time.perf_counter() + self.delay
                while (left := wait - time.perf_counter()) > 0:
                    time.sleep(left)
                sink.sendall(data)
        except OSError:
            pass
        finally:  # shutdown, not close: the other thread's recv holds the socket open
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass


@contextmanager
def shaped_lan(name: str = "hrbench"):
    """A namespace behind a veth pair shaped to 1 Gbit/s both ways: (namespace, its address)."""
    commands = [
        f"ip netns add {name}",
        f"ip link add hrb0 type veth peer name hrb1 netns {name}",
        "ip addr add 10.78.0.2/24 dev hrb0", "ip link set hrb0 up",
        f"ip -n {name} addr add 10.78.0.1/24 dev hrb1", f"ip -n {name} link set hrb1 up",
        f"ip -n {name} link set lo up",
        "tc qdisc add dev hrb0 root tbf rate 1gbit burst 256kb latency 50ms",
        f"ip netns exec {name} tc qdisc add dev hrb1 root tbf rate 1gbit burst 256kb latency 50ms",
    ]
    try:
        for command in commands:
            subprocess.run(command.split(), check=True, capture_output=True)
        yield name, "10.78.0.1"
    finally:
        subprocess.run(["ip", "link", "del", "hrb0"], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def lan(homes: Homes, bins: Path, wide: Path, args) -> None:
    """One stage in a namespace behind a 1 Gbit/s veth, 0.5 ms further away: Homerack's
    engine through the gateway against the same engine straight to an rpc-server there;
    then the wide model's load, cold and from the worker's tensor cache."""
    try:
        context = shaped_lan()
        netns, address = context.__enter__()
    except subprocess.CalledProcessError as exc:
        print(f"simulated LAN: skipped ({exc.stderr.decode().strip() or exc})")
        return
    port = 50600
    raw = subprocess.Popen(["ip", "netns", "exec", netns, *NICE, str(bins / "ggml-rpc-server"), "-H",
                            address, "-p", str(port), "-t", str(args.threads)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with homerack_worker(homes, "lan", args.threads, host=address, netns=netns) as (_, gw):
            host, gw_port = gw.rsplit(":", 1)
            name = pair(homes, DelayProxy((host, int(gw_port)), 0.00025).address)
            raw_address = DelayProxy((address, port), 0.00025).address
            pairings = homes.root / "host" / "data" / "cluster" / "pairings.json"
            for model in args.models:
                split = str(layer_count(model) // 3)
                gated, direct = alternate(
                    lambda: run_inner(homes, args, "gated", model, split, pairings=pairings,
                                      workers=name),
                    lambda: run_inner(homes, args, "raw", model, split, endpoints=raw_address))
                print(f"simulated LAN (1 Gbit/s, +0.5 ms; medians of 3): {model}, {split} layers on the other "
                      f"machine: through the gateway {gated:.1f} tok/s, raw RPC {direct:.1f} "
                      f"tok/s -> gateway cost {(1 - gated / direct) * 100:+.1f}% (target <= 3%)",
                      flush=True)
                report(model, "decode through the gateway, 1 stage, shaped LAN", gated, "tok/s",
                       direct, "raw RPC, same engine", ">= 0.97")
            load_times(homes, name, "over the simulated LAN", wide)
    finally:
        raw.kill()
        context.__exit__(None, None, None)


def failure(homes: Homes, workers: list, names: list[str], args) -> None:
    model = "smollm2-135m-instruct-q4_1"
    with homerack_serve(homes, ["--model", model, "--ctx", "2048", "--threads",
                                str(args.host_threads), "--workers", ",".join(names),
                                "--split", "8,8"]) as (address, headers):
        token_times(address.url, headers, 8)
        body = {"prompt": PROMPT, "max_tokens": 2000, "temperature": 0, "stream": True,
                "ignore_eos": True}
        stopped = errored = None
        with httpx.stream("POST", f"{address.url}/v1/completions", json=body, headers=headers,
                          timeout=120) as reply:
            for n, line in enumerate(reply.iter_lines()):
                if n == 40:
                    workers[1].send_signal(signal.SIGSTOP)  # silent, as a pulled cable
                    stopped = time.perf_counter()
                if '"error"' in line:
                    errored = time.perf_counter()
                    message = json.loads(line[6:])["error"]["message"]
        token_times(address.url, headers, 8)
        answered = time.perf_counter()
    workers[1].send_signal(signal.SIGCONT)
    print(f"lost worker: the client's error after {errored - stopped:.2f} s (target <= 2 s: "
          f"\"{message[:70]}...\"); the next answer {answered - stopped:.1f} s after the loss "
          "(target <= 30 s)", flush=True)


def quick(homes: Homes, args) -> None:
    """SmolLM2 (or the last --model) with 0 and 1 stage on one worker, through Homerack only."""
    model = args.models[-1]
    layers = layer_count(model)
    with homerack_worker(homes, "w1", args.threads) as (_, address):
        names = [pair(homes, address)]
        for stages in (0, 1):
            serve_args = ["--model", model, "--ctx", "1024", "--parallel", "1", "--threads",
                          str(args.host_threads), *homerack_split(names, layers, stages)]
            with homerack_serve(homes, serve_args) as (engine, headers):
                rate = decode_rate(engine.url, headers, args.tokens, runs=1)
            print(f"{model:<28} {stages} stages: Homerack {rate:6.1f} tok/s", flush=True)
            report(model, f"decode with {stages} RPC stages", rate, "tok/s")
    print(QUICK_NOTE)


def main() -> None:
    def more(parser):
        parser.set_defaults(threads=1)  # of each worker
        parser.add_argument("--host-threads", type=int, default=2)
        parser.add_argument("--inner", choices=["gated", "raw"], help=argparse.SUPPRESS)
        for hidden in ("--split", "--pairings", "--endpoints", "--workers"):
            parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = arguments(__doc__, {"tokens": (96, 8)}, more, models=MODELS)
    if args.inner:
        return inner_decode(args)
    if args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            return quick(Homes(Path(tmp)), args)
    bins = build()
    write_tiny_model = packaging_module("tiny_gguf").write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        homes = Homes(Path(tmp))
        # layers of 576 MiB in all, 92% of it in tensors over llama.cpp's 10 MiB cache threshold
        wide = write_tiny_model(Path(tmp) / "wide.gguf", n_layer=3, n_embd=2048, n_ff=6144)
        with homerack_worker(homes, "w1", args.threads) as (p1, a1), \
                homerack_worker(homes, "w2", args.threads) as (p2, a2):
            names = [pair(homes, a1), pair(homes, a2)]
            decode_table(homes, bins, names, args)
            for stages in (1, 2):
                gateway_cost(homes, bins, args, stages)
            load_times(homes, names[0], "on loopback", wide)
            failure(homes, [p1, p2], names, args)
        lan(homes, bins, wide, args)


if __name__ == "__main__":
    main()
