"""The `homerack` command line (the contract is in DESIGN.md)."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
from contextlib import contextmanager

from .cluster import cmd_pair, cmd_worker, cmd_workers
from .engine_proc import EngineAddress, remove_engine_file, write_engine_file
from .history import DEFAULT_SYSTEM_PROMPT
from .paths import bundled_models, make_private, paths


def _store(quiet: bool = False):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    where = paths()
    store = ModelStore(where.models, GGUFInspector(where.gguf_cache), bundled_models())
    store.install_starters(log=(lambda _m: None) if quiet else
                           (lambda m: print(m, file=sys.stderr, flush=True)))
    return store


# -- serve ------------------------------------------------------------------------

def cmd_serve(args) -> int:
    from engine.engine import Engine, EngineSettings
    from engine.llama.runtime import LoadSettings
    from engine.hub.downloads import Downloads
    from engine.api.hub_routes import hub_routes
    from engine.api.server import ServeConfig, is_loopback, serve

    token = args.token or os.environ.get("HOMERACK_TOKEN") or secrets.token_urlsafe(32)
    engine_file = paths().engine_file
    if args.fd is None and not is_loopback(args.host):
        print(f"warning: serving on {args.host}, beyond this machine: the API token and "
              "every conversation travel unencrypted on the network", file=sys.stderr,
              flush=True)
    if args.workers and args.fd is None:  # the API's socket here, the engine in a child
        from .cluster import supervise

        os.environ["HOMERACK_TOKEN"] = token

        def announce(url: str) -> None:
            write_engine_file(engine_file, EngineAddress(url, token, os.getpid()))
            print(f"listening on {url}", flush=True)

        try:
            return supervise(args, args.argv, announce)
        finally:
            remove_engine_file(engine_file, os.getpid())
    if args.fd is not None:
        import faulthandler

        from engine.machine.native import die_with_parent

        die_with_parent()
        faulthandler.enable()  # a native crash leaves every thread's Python stack
    store = _store()
    if args.model:
        store.resolve(args.model)  # an unknown model fails now, not at the first request
    settings = EngineSettings(
        load=LoadSettings(n_ctx=args.ctx, n_threads=args.threads or _default_threads()),
        max_queue=args.queue_size, parallel=args.parallel, resident=args.resident,
        ram_budget=int(args.ram * 2**30) if args.ram else None,
        cache=_cache_limits(args), speculation=args.speculation,
        calibration_file=paths().cache / "memory-calibration.json",
        load_journal=paths().runtime / "loading.json",
        no_repack_file=paths().cache / "no-repack.json",
        cache_folder=paths().cache / "kv" if args.cache_disk_mib else None,
        draft_folder=None if args.whole_drafts else paths().cache / "drafts",
        response_cache=paths().cache / "responses.sqlite" if args.response_cache_mib else None,
        response_cache_bytes=max(args.response_cache_mib, 1) << 20)
    routing = _routing(store, args)
    cluster, holder = None, {}
    if args.workers:
        from .cluster import lost_handler, make_cluster

        cluster = make_cluster(args, lost_handler(holder))
    engine = holder["engine"] = Engine(store, settings, cluster)
    downloads = Downloads(store.folder, paths().data / "downloads.json",
                          token=os.environ.get("HF_TOKEN"))

    def ready(url: str) -> None:
        if args.fd is None:  # a supervised child's parent has announced the address
            write_engine_file(engine_file, EngineAddress(url, token, os.getpid()))
            print(f"listening on {url}", flush=True)
        if args.model:
            engine.preload(store.resolve(args.model))
        if routing:
            pair = engine.set_routing(routing)
            print(f"routing: {pair['note']}", file=sys.stderr, flush=True)

    # uvicorn re-raises the signal it stopped on; exit through `finally` to clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(engine, ServeConfig(args.host, args.port, token, args.fd, args.api_docs), ready,
              routers=(hub_routes(store, downloads),), holder=holder)
    finally:
        remove_engine_file(engine_file, os.getpid())
        if cluster:
            cluster.close()
    return 0


def _routing(store, args):
    """The pair of --route, checked before the engine starts."""
    from engine.errors import HomerackError
    from engine.routing import DEFAULT_THRESHOLD, pair

    if not args.route:
        return None
    names = [name.strip() for name in args.route.split(",")]
    if len(names) != 2 or not all(names):
        raise SystemExit("--route takes two models: SMALL,LARGE")
    threshold = DEFAULT_THRESHOLD if args.route_threshold is None else args.route_threshold
    try:
        return pair(store, *names, args.route_mode, threshold)
    except HomerackError as exc:
        raise SystemExit(f"--route: {exc.message}") from None


def _cache_limits(args):
    import psutil

    from engine.model.prompt_cache import CacheLimits

    if args.no_prompt_cache:
        return None
    ram = (args.cache_ram_mib << 20 if args.cache_ram_mib is not None
           else psutil.virtual_memory().available // 4)
    return CacheLimits(ram_bytes=ram, disk_bytes=args.cache_disk_mib << 20)


def _default_threads() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 2


# -- chat -------------------------------------------------------------------------

@contextmanager
def engine_client(model: str | None):
    """A client of this user's running engine, or of one started for this command."""
    from .client import EngineClient
    from .engine_proc import EngineProcess, find_running

    address = find_running(paths().engine_file)
    process = None
    if address is None:
        _store()  # install the starter models first, with visible progress
        process = EngineProcess(["--model", model] if model else [])
        address = process.wait_ready()
    client = EngineClient(address)
    try:
        yield client
    finally:
        client.close()
        if process:
            process.stop(timeout=100)  # it may be finishing a draft's cut (Engine.close)


def _stream_reply(client, messages, args) -> str:
    from .client import Reply

    reply = Reply()
    for piece in client.stream_chat(messages, reply, model=args.model,
                                    max_tokens=args.max_tokens, seed=args.seed,
                                    temperature=args.temperature, draft_model=args.draft,
                                    speculation="lookup" if args.lookup else None):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    for note in reply.notes:
        print(f"[note] {note}", file=sys.stderr)
    if args.verbose:  # how the model was loaded: a safer plan, no repacked weights
        for note in client.health().get("load_notes", []):
            print(f"[load] {note}", file=sys.stderr)
    if args.verbose and reply.usage:
        timings = reply.usage.get("timings", {})
        replayed = ", replayed from the response cache" if reply.response_cache == "hit" else ""
        print(f"[{reply.usage['completion_tokens']} tokens, "
              f"{timings.get('decode_tokens_per_s', 0):.1f} tok/s, "
              f"first token after {timings.get('time_to_first_token_s', 0):.2f} s{replayed}]",
              file=sys.stderr)
        spec = reply.usage.get("speculative")
        if spec:
            draft = (f", draft on {spec['draft_device']} proposing from {spec['draft_vocab']:,} "
                     "tokens" if spec.get("draft_vocab") else "")
            print(f"[speculative {spec['mode']}: {spec['accepted']}/{spec['drafted']} drafts "
                  f"accepted, {spec['speedup'] or '?'}x{draft}"
                  f"{'; ' + spec['note'] if spec.get('note') else ''}]", file=sys.stderr)
    return reply.text


def cmd_chat(args) -> int:
    from .client import EngineError

    messages = [{"role": "system", "content": args.system}] if args.system else []
    try:
        with engine_client(args.model) as client:
            if args.prompt is not None:
                messages.append({"role": "user", "content": args.prompt})
                _stream_reply(client, messages, args)
                return 0
            return _interactive(client, messages, args)
    except (EngineError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _interactive(client, messages, args) -> int:
    print("Homerack chat. Ctrl+D to quit.", file=sys.stderr)
    while True:
        try:
            prompt = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not prompt.strip():
            continue
        messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": _stream_reply(client, messages, args)})


# -- models -----------------------------------------------------------------------

def cmd_models(args) -> int:
    from pathlib import Path

    from engine.errors import HomerackError
    from engine.catalog.models import DEFAULT_MODEL

    store = _store(quiet=args.quiet)
    if args.action == "add":
        try:
            model = store.add(Path(args.path))
        except HomerackError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        print(f"added {model.id}")
        return 0
    if args.quiet:
        return 0
    for model in store.list():
        mark = "*" if model.id == DEFAULT_MODEL else " "
        print(f"{mark} {model.id:<32} {store.kind_of(model):<10} "
              f"{model.size_bytes / 2**20:8.1f} MiB  {model.path}")
    return 0


# -- hardware and plans ---------------------------------------------------------

def cmd_hardware(args) -> int:
    import json

    from engine.machine.probe import probe

    hardware = probe()
    if args.json:
        print(json.dumps(hardware.as_dict(), indent=2))
        return 0
    for device in hardware.devices:
        print(f"{device.name:<10} {device.kind:<6} {device.free_bytes / 2**30:7.1f} of "
              f"{device.total_bytes / 2**30:7.1f} GiB free  {device.description}")
    print(f"RAM        {hardware.ram_available_bytes / 2**30:7.1f} of "
          f"{hardware.ram_total_bytes / 2**30:7.1f} GiB available; "
          f"{hardware.cpu_cores} CPU cores")
    print(f"llama.cpp CPU backend: {hardware.cpu_backend}")
    return 0


def cmd_plan(args) -> int:
    import json

    from engine.errors import HomerackError
    from engine.machine.hardware import simulated
    from engine.machine.probe import probe
    from engine.machine.planner import Preferences, plan

    store = _store(quiet=True)
    try:  # validates the file, and reads its shape once (cached with its metadata)
        shape = store.inspector.inspect(store.resolve(args.model).path).shape
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if shape is None:
        print("error: the planner cannot describe this model's architecture", file=sys.stderr)
        return 1
    if args.vram is not None or args.ram is not None:
        real = probe()
        hardware = simulated(tuple(args.vram or ()),
                             args.ram if args.ram is not None else real.ram_available_bytes / 2**30,
                             real.cpu_cores)
    else:
        hardware = probe()
    if args.workers:
        return _plan_cluster(args, shape)
    result = plan(hardware, shape, Preferences(ctx=args.ctx))
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
        return 0 if result.fits else 2
    _print_plan(result)
    return 0 if result.fits else 2


def _plan_cluster(args, shape) -> int:
    """The preview `serve --workers` would load by: stages, bytes, expected speed."""
    import json

    from engine.machine.planner import Preferences
    from engine.machine.probe import probe

    from .cluster import make_cluster

    cluster = make_cluster(args, on_lost=lambda *_: None)
    try:
        cluster.connect()
        preview = cluster.preview(probe(), shape, Preferences(ctx=args.ctx))
    finally:
        cluster.close()
    if args.json:
        print(json.dumps(preview.as_dict(), indent=2))
        return 0 if preview.plan.fits else 2
    _print_plan(preview.plan)
    for stage in preview.stages:
        print(f"  {stage.machine:<24} {stage.device:<6} layers {stage.first_layer:>3}-"
              f"{stage.last_layer:<3} {stage.bytes / 2**20:8.1f} MiB")
    if preview.tokens_per_s:
        print(f"expected: {preview.tokens_per_s:.1f} tokens/s")
    for worker, why in preview.left_out:
        print(f"left out: {worker}: {why}")
    for name, why in cluster.left_out.items():
        print(f"unreachable: {name}: {why}")
    return 0 if preview.plan.fits else 2


def _print_plan(result) -> None:
    print(f"{result.model}: {'fits' if result.fits else 'DOES NOT FIT'} — "
          f"n_gpu_layers {result.n_gpu_layers}, n_ctx {result.n_ctx}, KV {result.kv_type}"
          + (f", split {list(result.tensor_split)}" if result.tensor_split else ""))
    print(f"{'device':<8}{'weights':>10}{'KV':>10}{'compute':>10}{'output':>9}{'total':>10}"
          f"{'budget':>11}  (MiB)")
    for use in result.uses:
        print(f"{use.device:<8}" + "".join(f"{v / 2**20:>10.1f}" for v in
              (use.weights, use.kv, use.compute)) + f"{use.output / 2**20:>9.1f}"
              f"{use.total / 2**20:>10.1f}{use.budget / 2**20:>11.0f}")
    for reason in result.reasons:
        print(f"- {reason}")


def cmd_pull(args) -> int:
    """A GGUF model from the Hub: every quant's verdict on this machine, then the
    recommended one (or --quant) downloaded, verified and added to the models."""
    from engine.errors import HomerackError
    from engine.machine.probe import probe
    from engine.hub.repos import download, repo_verdicts
    from engine.machine.planner import Preferences

    token = os.environ.get("HF_TOKEN")
    store = _store(quiet=True)
    try:
        _, verdicts = repo_verdicts(args.repo, probe(), Preferences(ctx=args.ctx), token=token)
        for v in verdicts:
            print(f"{'*' if v.recommended else ' '} {v.quant.quant:<12}"
                  f"{v.quant.size / 2**30:>7.2f} GiB  {v.words}")
        wanted = args.quant.upper() if args.quant else \
            next((v.quant.quant for v in verdicts if v.recommended), None)
        chosen = next((v for v in verdicts if v.quant.quant == wanted), None)
        if chosen is None:
            print(f"error: {'no quant ' + args.quant if args.quant else 'no quant fits'} "
                  f"in {args.repo}", file=sys.stderr)
            return 1
        print(f"downloading {chosen.quant.quant} ({', '.join(chosen.quant.files)})", flush=True)
        files = download(args.repo, chosen.quant, store.folder, token=token)
        store.inspector.inspect(files[0])  # a GGUF llama.cpp can open
        model = store.resolve(str(files[0]))
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"ready: {model.id}")
    return 0


# -- desktop ----------------------------------------------------------------------

def cmd_install_desktop(_args) -> int:
    from .desktop import install_desktop

    entry, icon = install_desktop()
    print(f"installed {entry}\ninstalled {icon}")
    return 0


def launch_desktop() -> int:
    """The window, or a terminal chat where it cannot open (a server install, Qt or one
    of the system libraries its platform plugin needs missing)."""
    from .qt_check import platform_problem

    headless = (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
                and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")))
    try:
        if headless:
            raise ImportError("no display")
        problem = platform_problem()
        if problem:
            print(problem, file=sys.stderr)
            raise ImportError("a system library is missing")
        from ui.app import main as gui_main  # composition: the CLI starts the app
    except ImportError as exc:
        print(f"the desktop app is unavailable ({exc}); chatting in the terminal",
              file=sys.stderr)
        return cmd_chat(build_parser().parse_args(["chat"]))
    return gui_main()


def cmd_self_test(args) -> int:
    from .self_test import PROMPT, check_engine

    prompt = args.prompt or PROMPT
    if args.gui:
        from ui.self_test import check_window  # composition: the CLI starts the app

        return check_window(args.gui, prompt, args.timeout)
    return check_engine(prompt, args.timeout)


# -- entry ------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="homerack", description=__doc__)
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the engine API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--api-docs", action="store_true",
                       help="serve the API's OpenAPI schema (/openapi.json) and /docs")
    serve.add_argument("--model", help="load this model at start")
    serve.add_argument("--token", help="API token (default: $HOMERACK_TOKEN or a new one)")
    serve.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    serve.add_argument("--threads", type=int, default=0)
    serve.add_argument("--queue-size", type=int, default=16,
                       help="requests that may wait for a slot; more get 503 + Retry-After")
    serve.add_argument("--parallel", type=int, default=4,
                       help="requests generating at once, batched together (1: one at a time)")
    serve.add_argument("--ram", type=float, metavar="GIB",
                       help="plan within this much RAM (default: what is available)")
    serve.add_argument("--resident", type=int, default=4,
                       help="finished conversations kept in KV memory for an instant return")
    serve.add_argument("--cache-ram-mib", type=int,
                       help="prompt cache RAM budget (default: a quarter of available RAM)")
    serve.add_argument("--cache-disk-mib", type=int, default=4096,
                       help="prompt cache disk budget; 0 keeps it in RAM only")
    serve.add_argument("--no-prompt-cache", action="store_true")
    serve.add_argument("--whole-drafts", action="store_true",
                       help="run draft models whole (no cut output layer)")
    serve.add_argument("--speculation", choices=["off", "lookup", "draft"], default="off",
                       help="default speculative decoding for requests that do not choose "
                            "(draft: the smallest compatible local model)")
    serve.add_argument("--workers", metavar="auto|WORKER,...",
                       help="use paired workers as pipeline stages: 'auto' takes those "
                            "announced on the LAN, or name them (names or host:port)")
    serve.add_argument("--split", metavar="N,...",
                       help="layers on each worker, in --workers order (default: planned)")
    serve.add_argument("--response-cache-mib", type=int, default=256,
                       help="disk for answers to repeated deterministic requests (0: off)")
    serve.add_argument("--route", metavar="SMALL,LARGE",
                       help='serve model "auto": each request to the small or the large model')
    serve.add_argument("--route-mode", choices=["rules", "cascade"], default="rules")
    serve.add_argument("--route-threshold", type=float,
                       help="cascade: the small model's confidence under which the large answers")
    serve.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # a supervised engine child
    serve.set_defaults(func=cmd_serve)

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

    chat = sub.add_parser("chat", help="chat in the terminal")
    chat.add_argument("prompt", nargs="?", help="one prompt (interactive without it)")
    chat.add_argument("--model")
    chat.add_argument("--system", default=DEFAULT_SYSTEM_PROMPT,
                      help=f"system prompt (default: {DEFAULT_SYSTEM_PROMPT!r}; '' for none)")
    chat.add_argument("--max-tokens", type=int)
    chat.add_argument("--seed", type=int)
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--draft", metavar="MODEL",
                      help="speculative decoding with this draft model ('auto' picks one)")
    chat.add_argument("--lookup", action="store_true", help="prompt-lookup speculative decoding")
    chat.add_argument("-v", "--verbose", action="store_true", help="print speed figures")
    chat.set_defaults(func=cmd_chat)

    models = sub.add_parser("models", help="list local models, or add one")
    models.add_argument("action", nargs="?", choices=["list", "add"], default="list")
    models.add_argument("path", nargs="?", help="a .gguf file (with add)")
    models.add_argument("--quiet", action="store_true", help="only install the starters")
    models.set_defaults(func=cmd_models)

    hardware = sub.add_parser("hardware", help="devices and memory as the engine sees them")
    hardware.add_argument("--json", action="store_true")
    hardware.set_defaults(func=cmd_hardware)

    pull = sub.add_parser("pull", help="download a GGUF model from the Hugging Face Hub")
    pull.add_argument("repo", help="a Hub repository, e.g. bartowski/SmolLM2-135M-Instruct-GGUF")
    pull.add_argument("--quant", help="this quant (default: the recommended one)")
    pull.add_argument("--ctx", type=int, default=4096, help="wanted context, for the verdicts")
    pull.set_defaults(func=cmd_pull)

    plan = sub.add_parser("plan", help="how a model would run on this machine")
    plan.add_argument("model", help="a model id or a .gguf path")
    plan.add_argument("--ctx", type=int, default=4096, help="wanted context")
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--vram", type=float, nargs="*", metavar="GIB",
                      help="simulate GPUs with this much memory each")
    plan.add_argument("--ram", type=float, metavar="GIB", help="simulate this much RAM")
    plan.add_argument("--workers", metavar="auto|WORKER,...",
                      help="plan over this machine and these paired workers (as serve would)")
    plan.add_argument("--split", metavar="N,...", help="layers on each worker")
    plan.set_defaults(func=cmd_plan)

    check = sub.add_parser("self-test", help="start the engine, load the starter model and "
                                             "answer a question (checks an installation)")
    check.add_argument("--gui", metavar="PNG", help="through the desktop window; save it here")
    check.add_argument("--prompt", help="the question (default: the capital of France)")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds")
    check.set_defaults(func=cmd_self_test)

    desktop = sub.add_parser("install-desktop", help="add Homerack to the desktop menu")
    desktop.set_defaults(func=cmd_install_desktop)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    make_private(paths())
    if args.command is None:
        return launch_desktop()
    if args.command == "models" and args.action == "add" and not args.path:
        build_parser().error("models add needs a path")
    from engine.errors import HomerackError

    try:
        return args.func(args)
    except HomerackError as exc:  # what a command did not handle itself: said, not a traceback
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
