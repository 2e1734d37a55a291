"""The cluster, composed for `serve --workers` (and `plan --workers`): the workers named
resolved to paired ones, and the engine run as a supervised child on the API's socket, so
a worker lost mid-request (llama.cpp cannot survive it in-process) costs a restart of the
engine, not the API. The commands that pair and share machines are app/cli/workers.py."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from engine.spawn import child_env, module_command

from .paths import paths

EXIT_REPLAN = 75  # the engine child's "a worker was lost: start me again"
MAX_RESTARTS_A_MINUTE = 5
STOP_GRACE_S = 60  # what a stopping engine child gets to save its conversations


def announced(seconds: float):
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
        moved = {a.name: a.address for a in announced(browse_s)} if browse else {}
        return [replace(p, address=moved.get(p.name, p.address)) for p in store.all()]
    chosen = []
    for key in filter(None, (k.strip() for k in spec.split(","))):
        pairing = store.find(key)
        if pairing is None:
            raise SystemExit(f"error: worker {key} is not paired; run: homerack pair {key} --code CODE")
        chosen.append(pairing)
    return chosen


def make_cluster(args, on_lost):
    from engine.cluster.head import Cluster

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
    from engine.api.server.listeners import bind

    from .supervisor import describe_exit

    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    on_ready(f"http://{host}:{port}")
    child = None
    stopping = threading.Event()

    def stop(*_):
        # Only signals here: the loop below is inside child.wait(), which holds the
        # Popen's wait lock, so a wait in this handler could never reap the child (it
        # spun out its whole timeout: a stopped cluster took a minute to exit).
        stopping.set()
        if child is not None:
            child.terminate()  # it saves its conversations first (it dies with this process)
            deadline = threading.Timer(STOP_GRACE_S, child.kill)
            deadline.daemon = True
            deadline.start()

    signal.signal(signal.SIGTERM, stop)
    restarts: list[float] = []
    while not stopping.is_set():
        child = subprocess.Popen(module_command("app", *argv, "--fd", str(sock.fileno())),
                                 pass_fds=[sock.fileno()], env=child_env())
        if stopping.is_set():  # the signal came while it started
            stop()
        try:
            code = child.wait()
        except KeyboardInterrupt:
            stop()
            code = child.wait()
        if stopping.is_set():
            break
        if code != EXIT_REPLAN and code >= 0:
            return code  # stopped, or could not start: starting it again would not help
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < 60] + [now]
        if len(restarts) > MAX_RESTARTS_A_MINUTE:
            print("cluster: the engine keeps failing; it stops", flush=True)
            return 1
        why = "a worker was lost" if code == EXIT_REPLAN else describe_exit(code)
        print(f"cluster: {why}; restarting the engine", flush=True)
    return 0

