"""`homerack hardware` and `homerack plan`: this machine as the engine sees it, and how a model
would run on it (or on it and paired workers); `homerack gpu-runtime`: the packaged app's
CUDA runtime, fetched once."""

from __future__ import annotations

import sys
from dataclasses import replace

from ..local_models import open_store


def cmd_hardware(args) -> int:
    import json

    from engine.llama.probe import probe

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
    for line in hardware.same_gpu + hardware.gpu_modules_refused:
        print(line)
    if why := hardware.cpu_only_why():
        print(why)
    return 0


def cmd_gpu_runtime(args) -> int:
    """What the packaged app's CUDA module needs, whether it is here, and (--fetch) fetching
    it once, with progress."""
    from engine.llama.cuda_runtime import driver_present
    from engine.llama.native import cuda_runtime

    runtime = cuda_runtime()
    if runtime is None:
        print("no CUDA module in this build: nothing to fetch")
        return 0
    megabytes = runtime.size / 1e6
    if runtime.ready():
        print(f"NVIDIA's CUDA {runtime.cuda} runtime is here ({runtime.folder})")
        return 0
    if not args.fetch:
        print(f"NVIDIA's CUDA {runtime.cuda} runtime is not fetched ({megabytes:,.0f} MB; "
              f"{'' if driver_present() else 'no NVIDIA driver here, so it would not be used; '}"
              "homerack gpu-runtime --fetch fetches it)")
        return 1

    def progress(done: int, total: int) -> None:
        print(f"\rfetching NVIDIA's CUDA {runtime.cuda} runtime: {done / 1e6:,.0f} of "
              f"{total / 1e6:,.0f} MB", end="", file=sys.stderr, flush=True)

    try:
        runtime.fetch(progress)
    except (OSError, ValueError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    print(f"\nNVIDIA's CUDA {runtime.cuda} runtime is here ({runtime.folder}): the engine "
          "uses the GPU through it from its next start", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    import json

    from engine.errors import HomerackError
    from engine.llama.probe import probe
    from engine.machine.planner import Preferences, auto_context, plan

    store = open_store(quiet=True)
    try:  # validates the file, and reads its shape once (cached with its metadata)
        shape = store.inspector.inspect(store.resolve(args.model, paths=True).path).shape
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if shape is None:
        print("error: the planner cannot describe this model's architecture", file=sys.stderr)
        return 1
    hardware = probe()
    if args.vram is not None or args.ram is not None:
        hardware = _simulated(args, hardware)
    prefs = auto_context() if args.ctx is None else Preferences(ctx=args.ctx)
    if args.workers:
        return _plan_cluster(args, shape, prefs)
    result = plan(hardware, shape, replace(prefs, cpu_moe_layers=args.cpu_moe_layers,
                                           tensor_parallel=args.split_mode == "tensor",
                                           parallel=args.parallel, kv_layout=args.kv_layout))
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
        return 0 if result.fits else 2
    _print_plan(result)
    return 0 if result.fits else 2


def _simulated(args, real):
    """The machine of --vram/--ram/--gpu, with this machine's cores and RAM speed."""
    from engine.machine.bandwidth import gpu_speed
    from engine.machine.hardware import simulated

    bandwidth, flops = gpu_speed(args.gpu or "")
    ram = args.ram if args.ram is not None else real.ram_available_bytes / 2**30
    return simulated(tuple(args.vram or ()), ram, real.cpu_cores,
                     gpu_bandwidth_gbs=bandwidth / 1e9, gpu_tflops=flops / 1e12,
                     ram_bandwidth_gbs=real.ram_bandwidth / 1e9)


def _plan_cluster(args, shape, prefs) -> int:
    """The preview `serve --workers` would load by: stages, bytes, expected speed."""
    import json

    from engine.llama.probe import probe

    from ..cluster import make_cluster

    cluster = make_cluster(args, on_lost=lambda *_: None)
    try:
        cluster.connect()
        preview = cluster.preview(probe(), shape, prefs)
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
          f"n_gpu_layers {result.n_gpu_layers}, n_ctx {result.n_ctx}, KV {result.kv_type}, "
          f"{result.lanes} lane{'s' * (result.lanes > 1)}"
          + (" (a KV stream each)" if result.kv_split else "")
          + (f", experts of {result.cpu_moe_layers} layers in RAM" if result.cpu_moe_layers else "")
          + (f", {result.split_mode} split {list(result.tensor_split)}"
             if result.tensor_split else ""))
    print(f"{'device':<8}{'weights':>10}{'KV':>10}{'compute':>10}{'output':>9}{'total':>10}"
          f"{'budget':>11}  (MiB)")
    for use in result.uses:
        print(f"{use.device:<8}" + "".join(f"{v / 2**20:>10.1f}" for v in
              (use.weights, use.kv, use.compute)) + f"{use.output / 2**20:>9.1f}"
              f"{use.total / 2**20:>10.1f}{use.budget / 2**20:>11.0f}")
    for reason in result.reasons:
        print(f"- {reason}")


def add_commands(sub) -> None:
    """Adds `hardware`, `gpu-runtime`, `plan` to the parser."""
    hardware = sub.add_parser("hardware", help="the GPUs, RAM and CPU as the engine sees them")
    hardware.add_argument("--json", action="store_true")
    hardware.set_defaults(func=cmd_hardware)

    runtime = sub.add_parser("gpu-runtime", help="NVIDIA's CUDA runtime for the packaged app's "
                             "CUDA module: whether it is here; --fetch fetches it once")
    runtime.add_argument("--fetch", action="store_true",
                         help="download it (checked against the sha256 the app was built with)")
    runtime.set_defaults(func=cmd_gpu_runtime)

    plan = sub.add_parser("plan", help="how a model would run on this machine")
    plan.add_argument("model", help="a model id or a .gguf path")
    plan.add_argument("--ctx", type=int, help="wanted context (default: the largest up "
                      "to 32k that costs little, as serve chooses)")
    plan.add_argument("--parallel", type=int, metavar="N",
                      help="requests at once, as serve --parallel (default: the plan's lanes)")
    plan.add_argument("--kv-layout", choices=("auto", "split", "unified"), default="auto",
                      help="as serve --kv-layout")
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--vram", type=float, nargs="*", metavar="GIB",
                      help="simulate GPUs with this much memory each")
    plan.add_argument("--ram", type=float, metavar="GIB", help="simulate this much RAM")
    plan.add_argument("--gpu", metavar="NAME",
                      help="the simulated GPUs' model, for their speed (e.g. 'RTX 3090')")
    plan.add_argument("--cpu-moe-layers", type=int, metavar="N",
                      help="keep the routed experts of the first N layers in RAM "
                           "(default: the fastest placement that fits)")
    plan.add_argument("--split-mode", choices=("layer", "tensor"), default="layer",
                      help="as serve's: 'tensor' may split every layer across the GPUs")
    plan.add_argument("--workers", metavar="auto|WORKER,...",
                      help="plan over this machine and these paired workers (as serve would)")
    plan.add_argument("--split", metavar="N,...", help="layers on each worker")
    plan.set_defaults(func=cmd_plan)
