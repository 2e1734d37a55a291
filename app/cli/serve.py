"""`homerack serve`: the engine and its API, composed from the command line (with `--workers`, as a
supervised child of the API's socket: app/cluster.py)."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys

from ..engine_proc import EngineAddress, find_running, remove_engine_file, write_engine_file
from ..paths import paths
from ..local_models import open_store


def cmd_serve(args) -> int:
    from engine.api.server.serving import is_loopback

    token = args.token or os.environ.get("HOMERACK_TOKEN") or secrets.token_urlsafe(32)
    if args.fd is None and not is_loopback(args.host):
        print(f"warning: serving on {args.host}, beyond this machine: the API token and "
              "every conversation travel unencrypted on the network", file=sys.stderr,
              flush=True)
    if args.fd is None and not args.no_engine_file:
        running = find_running(paths().engine_file)
        if running:  # two engines on one folder would race on its downloads and caches
            print(f"error: an engine already serves this user's folders at {running.url} "
                  f"(pid {running.pid}): use it, or stop it first", file=sys.stderr)
            return 1
    if args.workers and args.fd is None:  # the API's socket here, the engine in a child
        return _supervise(args, token)
    if args.fd is not None or args.no_engine_file:  # a supervised engine, or a replica's
        _become_child()
    return _serve(args, token)


def _supervise(args, token: str) -> int:
    """The API's socket here, the engine in a child process restarted when a worker goes."""
    from ..cluster import supervise

    engine_file = paths().engine_file
    os.environ["HOMERACK_TOKEN"] = token

    def announce(url: str) -> None:
        write_engine_file(engine_file, EngineAddress(url, token, os.getpid()))
        print(f"listening on {url}", flush=True)

    try:
        return supervise(args, args.argv, announce)
    finally:
        remove_engine_file(engine_file, os.getpid())


def _become_child() -> None:
    """A supervised engine child: it dies with its parent, and a native crash leaves every
    thread's Python stack."""
    import faulthandler

    from engine.llama.native import die_with_parent

    die_with_parent()
    faulthandler.enable()


def _serve(args, token: str) -> int:
    from engine.api.admin.hub_routes import hub_routes
    from engine.api.server.serving import ServeConfig, serve
    from engine.engine import Engine
    from engine.hub.downloads import Downloads

    store = open_store()
    if args.model:
        store.resolve(args.model, paths=True)  # an unknown model fails now, not at the first request
    routing = _routing(store, args)
    cluster, holder = None, {}
    if args.workers:
        from ..cluster import lost_handler, make_cluster

        cluster = make_cluster(args, lost_handler(holder))
    replicas = None
    if args.replicas:
        from engine.cluster.replicas import Replicas

        from ..cluster import resolve_workers

        replicas = Replicas(resolve_workers(args.replicas), args.replica_policy)
    engine = holder["engine"] = Engine(store, _settings(args), cluster, replicas)
    downloads = Downloads(store.folder, paths().data / "downloads.json",
                          token=os.environ.get("HF_TOKEN"),
                          on_done=lambda files: store.kind_of(store.resolve(str(files[0]), paths=True)))
    engine_file = paths().engine_file

    def ready(url: str) -> None:
        if args.fd is None and not args.no_engine_file:  # (a supervisor announced it)
            write_engine_file(engine_file, EngineAddress(url, token, os.getpid()))
            print(f"listening on {url}", flush=True)
        if args.model:
            engine.preload(store.resolve(args.model, paths=True))
        engine.library.resume()
        if routing:
            pair = engine.router.set(routing)
            print(f"routing: {pair['note']}", file=sys.stderr, flush=True)
        # every model's kind and defaults known soon (/v1/models does not wait for a
        # parse), and those that appear later within seconds
        engine.shelf.start_watching()

    # uvicorn re-raises the signal it stopped on; exit through `finally` to clean up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(engine, ServeConfig(args.host, args.port, token, args.fd, args.api_docs,
                                  args.generation_only, args.ollama_port,
                                  (args.share_host, args.share_port) if args.share_home
                                  else None), ready,
              routers=(hub_routes(engine, downloads),), holder=holder)
    finally:
        remove_engine_file(engine_file, os.getpid())
        if cluster:
            cluster.close()
    return 0


def _settings(args):
    from engine.settings import EngineSettings
    from engine.settings import LoadSettings

    where = paths()
    return EngineSettings(
        load=LoadSettings(n_ctx=args.ctx or LoadSettings.n_ctx,
                          n_threads=args.threads or _default_threads()),
        auto_ctx=args.ctx is None,
        max_queue=args.queue_size, parallel=args.parallel, resident=args.resident,
        kv_layout=args.kv_layout,
        batch_invariant=args.batch_invariant,
        ram_budget=int(args.ram * 2**30) if args.ram else None,
        cache=_cache_limits(args), speculation=args.speculation,
        calibration_file=where.cache / "memory-calibration.json",
        load_journal=where.runtime / "loading.json",
        no_repack_file=where.cache / "no-repack.json",
        cache_folder=where.cache / "kv" if args.cache_disk_mib else None,
        draft_folder=None if args.whole_drafts else where.cache / "drafts",
        response_cache=where.cache / "responses.sqlite" if args.response_cache_mib else None,
        response_cache_bytes=max(args.response_cache_mib, 1) << 20,
        cpu_moe_layers=args.cpu_moe_layers, max_models=args.max_models,
        tensor_parallel=args.split_mode == "tensor",
        image_urls=args.allow_image_urls,
        image_hosts=frozenset(h.strip().lower() for h in args.image_hosts.split(",") if h.strip()),
        image_tokens=(args.image_min_tokens, args.image_max_tokens),
        jit_ttl_s=args.model_ttl * 60 if args.model_ttl else None,
        presets_file=where.data / "presets.json",
        mcp_config=where.mcp_config, tool_approvals=where.tool_approvals,
        tool_logs=where.tool_logs, request_mcp=args.allow_request_mcp,
        documents=where.data / "documents.sqlite", home=where.data / "home",
        voice=where.cache / "voice")


def _routing(store, args):
    """The pair of --route, checked before the engine starts."""
    from engine.errors import HomerackError
    from engine.routing import DEFAULT_THRESHOLD, route_between

    if not args.route:
        return None
    names = [name.strip() for name in args.route.split(",")]
    if len(names) != 2 or not all(names):
        raise SystemExit("--route takes two models: SMALL,LARGE")
    threshold = DEFAULT_THRESHOLD if args.route_threshold is None else args.route_threshold
    try:
        return route_between(store, *names, args.route_mode, threshold, paths=True)
    except HomerackError as exc:
        raise SystemExit(f"--route: {exc.message}") from None


def _cache_limits(args):
    import psutil

    from engine.settings import CacheLimits

    if args.no_prompt_cache:
        return None
    ram = (args.cache_ram_mib << 20 if args.cache_ram_mib is not None
           else psutil.virtual_memory().available // 4)
    return CacheLimits(ram_bytes=ram, disk_bytes=args.cache_disk_mib << 20)


def _default_threads() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 2


def add_commands(sub) -> None:
    """Adds `serve` to the parser."""
    serve = sub.add_parser("serve", help="run the engine API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 picks a free port")
    serve.add_argument("--api-docs", action="store_true",
                       help="serve the API's OpenAPI schema (/openapi.json) and /docs")
    serve.add_argument("--model", help="load this model at start")
    serve.add_argument("--token", help="API token (default: $HOMERACK_TOKEN or a new one)")
    serve.add_argument("--ctx", type=int, help="context size in tokens (default: the "
                       "largest up to 32k that costs little speed and memory, as planned)")
    serve.add_argument("--threads", type=int, default=0)
    serve.add_argument("--cpu-moe-layers", type=int, metavar="N",
                       help="mixture-of-experts models: keep the routed experts of the first N "
                            "layers in RAM (default: the planner's choice by forecast speed)")
    serve.add_argument("--split-mode", choices=("layer", "tensor"), default="layer",
                       help="several GPUs: 'tensor' lets the planner split every layer across "
                            "them where it forecasts that faster (llama.cpp's experimental "
                            "tensor parallelism; default: whole layers per GPU)")
    serve.add_argument("--max-models", type=int, default=3, metavar="N",
                       help="chat models loaded at once, memory allowing: a request naming "
                            "another loads it beside them, or unloads the least recently "
                            "used idle one that is not pinned (1: one model, swapped)")
    serve.add_argument("--model-ttl", type=float, default=15, metavar="MIN",
                       help="a model loaded on demand is unloaded after this many idle "
                            "minutes (0: never); per model: PUT /v1/models/preset")
    serve.add_argument("--queue-size", type=int, default=16,
                       help="requests that may wait for a slot; more get 503 + Retry-After")
    serve.add_argument("--parallel", type=int, metavar="N",
                       help="requests generating at once, batched together (1: one at a "
                            "time; default: 16 where the memory holds a KV stream of the "
                            "whole context for each, else as many as one pool's KV cells "
                            "hold at 512 tokens each: the plan says how many)")
    serve.add_argument("--kv-layout", choices=("auto", "split", "unified"), default="auto",
                       help="split: a KV stream of the whole context for every request at "
                            "once (faster with many; memory for each); unified: one pool all "
                            "share (any one may use it all); auto: split where it fits")
    serve.add_argument("--batch-invariant", action="store_true",
                       help="batched greedy answers equal solo ones bit for bit: loads "
                            "without the CPU's repacked 4-bit weights (slower decode)")
    serve.add_argument("--ram", type=float, metavar="GIB",
                       help="plan within this much RAM (default: what is available)")
    serve.add_argument("--resident", type=int, default=4,
                       help="finished conversations kept in KV memory for an instant return")
    serve.add_argument("--cache-ram-mib", type=int,
                       help="prompt cache RAM budget (default: a quarter of available RAM)")
    serve.add_argument("--cache-disk-mib", type=int, default=4096,
                       help="prompt cache disk budget; 0 keeps it in RAM only")
    serve.add_argument("--no-prompt-cache", action="store_true")
    serve.add_argument("--allow-image-urls", action="store_true",
                       help="fetch the http(s) images requests name (off: data URLs only; "
                            "on, from public addresses only, unless --image-hosts)")
    serve.add_argument("--image-hosts", default="", metavar="HOST[,HOST...]",
                       help="with --allow-image-urls: hosts on this machine or the home "
                            "network that requests' image URLs may also name")
    serve.add_argument("--allow-request-mcp", action="store_true",
                       help="a request may name an MCP server by URL (the Responses API's "
                            "mcp tool); off: only the servers in mcp.json, by label")
    serve.add_argument("--image-min-tokens", type=int, default=-1, metavar="N",
                       help="tokens an image takes at least, for projectors of dynamic "
                            "resolution (Qwen-VL; -1: the projector's own)")
    serve.add_argument("--image-max-tokens", type=int, default=-1, metavar="N",
                       help="tokens an image takes at most (-1: the projector's own)")
    serve.add_argument("--whole-drafts", action="store_true",
                       help="run draft models whole (no cut output layer)")
    serve.add_argument("--speculation", choices=["off", "lookup", "draft"], default="off",
                       help="default speculative decoding for requests that do not choose "
                            "(draft: the smallest compatible local model)")
    serve.add_argument("--workers", metavar="auto|WORKER,...",
                       help="use paired workers as pipeline stages: 'auto' takes those "
                            "announced on the LAN, or name them (names or host:port)")
    serve.add_argument("--replicas", metavar="auto|WORKER,...",
                       help="send requests to paired workers started with --replica too, "
                            "each serving whole models: by queue, speed and conversation "
                            "('auto': every paired worker)")
    serve.add_argument("--replica-policy", choices=["cache-aware", "round-robin"],
                       default="cache-aware",
                       help="how requests are spread over replicas: by queue, speed and "
                            "conversation, or in turn (to compare)")
    serve.add_argument("--generation-only", action="store_true",
                       help="serve only generation, the model list and /health (what a "
                            "worker shares with paired hosts: no loading, presets, downloads)")
    serve.add_argument("--no-engine-file", action="store_true",
                       help="do not record this engine for `homerack chat` (a worker's "
                            "replica engine)")
    serve.add_argument("--split", metavar="N,...",
                       help="layers on each worker, in --workers order (default: planned)")
    serve.add_argument("--response-cache-mib", type=int, default=256,
                       help="disk for answers to repeated deterministic requests (0: off)")
    serve.add_argument("--route", metavar="SMALL,LARGE",
                       help='serve model "auto": each request to the small or the large model')
    serve.add_argument("--route-mode", choices=["rules", "cascade"], default="rules")
    serve.add_argument("--route-threshold", type=float,
                       help="cascade: the small model's confidence under which the large answers")
    serve.add_argument("--ollama-port", type=int, metavar="PORT",
                       help="also serve Ollama's API on 127.0.0.1:PORT WITHOUT the token, "
                            "for apps that cannot send one (Ollama's own port: 11434); any "
                            "program on this machine can then use the models. Off by default")
    serve.add_argument("--share-home", action="store_true",
                       help="also serve this home's paired devices on the LAN: the web chat "
                            "and the generation routes, with each device's own key "
                            "(`homerack devices add NAME`). Off by default")
    serve.add_argument("--share-host", default=None, metavar="ADDR",
                       help="the address the sharing listener binds (default: this "
                            "machine's LAN address; 0.0.0.0: every interface)")
    serve.add_argument("--share-port", type=int, default=8580, metavar="N")
    serve.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # a supervised engine child
    serve.set_defaults(func=cmd_serve)
