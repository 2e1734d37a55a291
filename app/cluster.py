"""The cluster, composed: the `worker`, `pair` and `workers` commands, and `serve
--workers` — which runs the engine as a supervised child on the API's socket, so a worker
lost mid-request (llama.cpp cannot survive it in-process) costs a restart of the engine,
not the API."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from engine.spawn import module_command

from .paths import paths

EXIT_REPLAN = 75  # the engine child's "a worker was lost: start me again"
MAX_RESTARTS_A_MINUTE = 5


def cmd_worker(args) -> int:
    from engine.cluster.link import new_loop
    from engine.cluster.pairing import Grants, open_window
    from engine.cluster.worker import Worker, WorkerConfig, window_file

    if args.hosts or args.revoke_host:  # the hosts this machine admits, kept by the worker
        grants = Grants(paths().worker_folder / "grants.json")
        if args.revoke_host:
            return _revoke(grants, args.revoke_host, "host")
        for entry in grants.hosts():
            print(f"{entry['host']:<24} paired {entry.get('since', '?')}")
        return 0
    window = window_file(paths().worker_folder)
    if args.pair:  # a running worker reads the window file at the next pairing attempt
        print_code(*open_window(window, args.code))
        return 0

    config = WorkerConfig(name=args.name or socket.gethostname(), folder=paths().worker_folder,
                          cache_dir=None if args.no_cache else paths().cache / "rpc",
                          host=args.host, port=args.port,
                          threads=args.threads or os.cpu_count() or 2,
                          ram_bytes=int(args.ram * 2**30) if args.ram else None,
                          advertise=not args.no_advertise)
    worker = Worker(config)

    def ready(address: str) -> None:
        print(f"worker {config.name} listening on {address}", flush=True)
        print_code(*open_window(window, args.code))  # the owner shares it: pairing opens
        print("a paired host and this machine trust each other fully: it sends this machine "
              "model weights and activations, and this machine computes what it is sent "
              "(README: the cluster's trust model)", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(worker.run(ready, log=lambda m: print(m, flush=True)))
    except KeyboardInterrupt:
        pass
    return 0


def print_code(code: str, expires: float) -> None:
    until = time.strftime("%H:%M", time.localtime(expires))
    print(f"pairing code: {code} (open until {until}, for one host)", flush=True)


def cmd_pair(args) -> int:
    from engine.cluster.pairing import PairingConflict
    from engine.cluster.protocol import Refused

    from .sharing import pair_worker

    try:
        pairing, comparison = pair_worker(args.address, args.code, args.replace)
    except (Refused, ConnectionError, PairingConflict) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"paired with worker {pairing.name} at {pairing.address}")
    print(f"confirmation {comparison}: the worker shows the same digits; if it does not, "
          f"unpair at once (homerack workers --revoke {pairing.name})")
    return 0


def cmd_workers(args) -> int:
    import json

    from engine.cluster.pairing import Pairings

    store = Pairings(paths().pairings)
    if args.revoke:
        return _revoke(store, args.revoke, "worker")
    found = _announced(args.browse) if args.browse else []
    if args.json:
        print(json.dumps({"paired": [{"name": p.name, "address": p.address,
                                      "fingerprint": p.fingerprint} for p in store.all()],
                          "announced": [vars(a) for a in found]}, indent=2))
        return 0
    for p in store.all():
        print(f"paired     {p.name:<20} {p.address:<22} {p.fingerprint[:16]}")
    paired = {p.name for p in store.all()}
    for a in found:
        state = "paired" if a.name in paired else "not paired"
        print(f"announced  {a.name:<20} {a.address:<22} {state}; "
              f"{a.free_bytes / 2**30:.1f} GiB free; Homerack {a.versions.get('homerack')}")
    return 0


def _revoke(store, key: str, what: str) -> int:
    """Unpair on this side (Pairings on a host, Grants on a worker): it must pair again."""
    if not store.revoke(key):
        print(f"error: no paired {what} {key}", file=sys.stderr)
        return 1
    print(f"revoked {key}: it must pair again to take part")
    return 0


def _announced(seconds: float):
    from engine.cluster.discovery import Browser

    browser = Browser()
    try:
        return browser.wait(seconds)
    finally:
        browser.close()


def resolve_workers(spec: str, browse_s: float = 2.0):
    """The pairings `--workers` names: "auto" (every paired worker, at the address it
    announces on the LAN now if it moved; the certificate pin still applies) or a comma
    list of names or addresses."""
    from dataclasses import replace

    from engine.cluster.pairing import Pairings

    store = Pairings(paths().pairings)
    if spec == "auto":
        # An announcement only suggests where a paired worker is now: it is tried there
        # (the link checks the pinned certificate) and never written back, so a spoofed
        # one can neither move nor delete a stored pairing.
        browse = store.all() and os.environ.get("HOMERACK_MDNS") != "off"
        moved = {a.name: a.address for a in _announced(browse_s)} if browse else {}
        return [replace(p, address=moved.get(p.name, p.address)) for p in store.all()]
    chosen = []
    for key in filter(None, (k.strip() for k in spec.split(","))):
        pairing = store.find(key)
        if pairing is None:
            raise SystemExit(f"error: worker {key} is not paired; run: homerack pair {key} --code CODE")
        chosen.append(pairing)
    return chosen


def make_cluster(args, on_lost):
    from engine.cluster.host import Cluster

    pairings = resolve_workers(args.workers)
    split = None
    if args.split:
        counts = [int(n) for n in args.split.split(",")]
        split = {p.name: n for p, n in zip(pairings, counts)}
    return Cluster(pairings, on_lost, split)


def lost_handler(holder: dict):
    """What the engine child does when a worker goes: answer everything in flight with an
    error naming it, then exit for the supervisor to start it again."""
    from engine.errors import WorkerLost

    def lost(name: str, why: str) -> None:
        print(f"cluster: {why}; restarting the engine without it", flush=True)
        if "stop_accepting" in holder:  # new requests wait in the backlog for the next engine
            holder["stop_accepting"]()
        engine = holder.get("engine")
        if engine is not None:
            engine.abandon(WorkerLost(f"{why}; the engine restarts without worker {name}"))
        threading.Timer(0.5, os._exit, (EXIT_REPLAN,)).start()  # the error reaches clients first

    return lost


def supervise(args, argv: list[str], on_ready) -> int:
    """Hold the API's socket and run the engine as a child on it, again after each exit
    for a lost worker or death by a signal (llama.cpp aborts, the OOM killer). Clients that
    connect meanwhile wait in the socket's backlog."""
    from engine.api.server import bind

    from .supervisor import describe_exit

    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    on_ready(f"http://{host}:{port}")
    child = None

    def stop(*_):
        if child and child.poll() is None:
            child.terminate()  # it saves its conversations first (it dies with this process)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    restarts: list[float] = []
    while True:
        child = subprocess.Popen(module_command("app", *argv, "--fd", str(sock.fileno())),
                                 pass_fds=[sock.fileno()])
        try:
            code = child.wait()
        except KeyboardInterrupt:
            stop()
        if code != EXIT_REPLAN and code >= 0:
            return code  # stopped, or could not start: starting it again would not help
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < 60] + [now]
        if len(restarts) > MAX_RESTARTS_A_MINUTE:
            print("cluster: the engine keeps failing; it stops", flush=True)
            return 1
        why = "a worker was lost" if code == EXIT_REPLAN else describe_exit(code)
        print(f"cluster: {why}; restarting the engine", flush=True)

