"""`homerack worker`, `pair` and `workers`: this machine lent to another as a worker, and
the workers this one uses (docs/cluster.md: the trust model). Not the home's phones and
laptops: those are devices (`homerack share`, `devices`: home.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

from ..cluster import announced
from ..paths import paths


def cmd_worker(args) -> int:
    from engine.cluster.link import new_loop
    from engine.cluster.pairing import Grants, open_window, window_file
    from engine.cluster.worker import Worker, WorkerConfig

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
                          advertise=not args.no_advertise,
                          replica=_replica_options(args) if args.replica else None)
    worker = Worker(config)

    def ready(address: str) -> None:
        print(f"worker {config.name} listening on {address}", flush=True)
        print_code(*open_window(window, args.code))  # the owner shares it: pairing opens
        print("a paired host and this machine trust each other fully: it sends this machine "
              "model weights and activations, and this machine computes what it is sent "
              "(docs/cluster.md: the trust model)", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(worker.run(ready, log=lambda m: print(m, flush=True)))
    except KeyboardInterrupt:
        pass
    return 0


def _replica_options(args) -> tuple[str, ...]:
    """`homerack serve` options of the worker's replica engine."""
    options = ("--threads", str(args.threads)) if args.threads else ()
    return options + (("--ram", str(args.ram)) if args.ram else ())


def print_code(code: str, expires: float) -> None:
    until = time.strftime("%H:%M", time.localtime(expires))
    print(f"pairing code: {code} (open until {until}, for one host)", flush=True)


def cmd_pair(args) -> int:
    from engine.cluster.pairing import PairingConflict
    from engine.cluster.protocol import Refused

    from ..workers import pair_worker

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
    found = announced(args.browse) if args.browse else []
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


def add_commands(sub) -> None:
    """Adds `worker`, `pair`, `workers` to the parser."""
    worker = sub.add_parser("worker", help="share this machine as a LAN pipeline stage")
    worker.add_argument("--host", default="0.0.0.0", help="the gateway's address")
    worker.add_argument("--port", type=int, default=50151, help="the gateway's port (0: any)")
    worker.add_argument("--name", help="the name hosts see (default: the host name)")
    worker.add_argument("--code", help="the pairing code (scripts; default: a new one)")
    worker.add_argument("--pair", action="store_true",
                        help="open pairing again on this machine's running worker (5 minutes, "
                             "one host) and print its code")
    worker.add_argument("--threads", type=int, default=0)
    worker.add_argument("--ram", type=float, metavar="GIB", help="offer at most this much memory")
    worker.add_argument("--no-advertise", action="store_true", help="no mDNS announcement")
    worker.add_argument("--replica", action="store_true",
                        help="also serve whole models to paired hosts (their `serve "
                             "--replicas`): an engine of this machine's own, on its models")
    worker.add_argument("--no-cache", action="store_true", help="no local tensor cache")
    worker.add_argument("--hosts", action="store_true", help="list the hosts paired with this machine")
    worker.add_argument("--revoke-host", metavar="HOST", help="unpair a host (takes effect at once)")
    worker.set_defaults(func=cmd_worker)

    pair = sub.add_parser("pair", help="pair with a worker, using the code it shows")
    pair.add_argument("address", metavar="HOST[:PORT]")
    pair.add_argument("--code", required=True)
    pair.add_argument("--replace", action="store_true",
                      help="replace a paired worker of the same name at another address")
    pair.set_defaults(func=cmd_pair)

    workers = sub.add_parser("workers", help="paired workers (and those announced on the LAN)")
    workers.add_argument("--revoke", metavar="NAME|HOST:PORT", help="forget a paired worker")
    workers.add_argument("--browse", type=float, nargs="?", const=3.0, metavar="S",
                         help="also list workers announced on the LAN (listen S seconds)")
    workers.add_argument("--json", action="store_true")
    workers.set_defaults(func=cmd_workers)
