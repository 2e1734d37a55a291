"""`homerack models` and `homerack pull`: the local models, and GGUF models from the Hugging
Face Hub."""

from __future__ import annotations

import os
import sys

from ..paths import bundled_models, paths


def open_store(quiet: bool = False):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    where = paths()
    store = ModelStore(where.models, GGUFInspector(where.gguf_cache), bundled_models())
    store.install_starters(log=(lambda _m: None) if quiet else
                           (lambda m: print(m, file=sys.stderr, flush=True)))
    return store


def cmd_models(args) -> int:
    from pathlib import Path

    from engine.errors import HomerackError
    from engine.catalog.models import DEFAULT_MODEL

    store = open_store(quiet=args.quiet)
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
    kinds = {model: store.kind_of(model) for model in store.list()}
    for model, kind in kinds.items():
        if kind == "adapter":
            continue  # listed under the models they fit
        mark = "*" if model.id == DEFAULT_MODEL else " "
        print(f"{mark} {model.id:<32} {kind:<10} "
              f"{model.size_bytes / 2**20:8.1f} MiB  {model.path}")
    for adapter in [model for model, kind in kinds.items() if kind == "adapter"]:
        bases = store.bases_for(adapter)
        fits = f"adapts {bases[0].id} (use {bases[0].id}+{adapter.id})" if bases else \
            "fits no local model"
        print(f"  {adapter.id:<32} {'adapter':<10} {adapter.size_bytes / 2**20:8.1f} MiB  {fits}")
    return 0


def cmd_pull(args) -> int:
    """A GGUF model from the Hub: every quant's verdict on this machine, then the
    recommended one (or --quant) downloaded, verified and added to the models."""
    from engine.errors import HomerackError
    from engine.machine.probe import probe
    from engine.hub.repos import download, repo_verdicts
    from engine.machine.planner import Preferences

    token = os.environ.get("HF_TOKEN")
    store = open_store(quiet=True)
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


def add_commands(sub) -> None:
    """Adds `models`, `pull` to the parser."""
    models = sub.add_parser("models", help="list local models, or add one")
    models.add_argument("action", nargs="?", choices=["list", "add"], default="list")
    models.add_argument("path", nargs="?", help="a .gguf file (with add)")
    models.add_argument("--quiet", action="store_true", help="only install the starters")
    models.set_defaults(func=cmd_models)

    pull = sub.add_parser("pull", help="download a GGUF model from the Hugging Face Hub")
    pull.add_argument("repo", help="a Hub repository, e.g. bartowski/SmolLM2-135M-Instruct-GGUF")
    pull.add_argument("--quant", help="this quant (default: the recommended one)")
    pull.add_argument("--ctx", type=int, default=4096, help="wanted context, for the verdicts")
    pull.set_defaults(func=cmd_pull)
