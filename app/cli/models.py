"""`homerack models` and `homerack pull`: the local models, and GGUF models from the Hugging
Face Hub."""

from __future__ import annotations

import os
import sys

from ..local_models import open_store
from ..paths import paths


def cmd_models(args) -> int:
    from pathlib import Path

    from engine.errors import HomerackError
    from engine.catalog.other_apps import LABELS
    from engine.catalog.models import DEFAULT_MODEL

    if args.action in ("loaded", "unload", "keep"):
        return _in_the_engine(args)
    if args.action in ("sources", "folder"):
        return cmd_sources(args)
    store = open_store(quiet=args.quiet)
    if args.action == "add":
        try:
            model = store.add(Path(args.target))
        except HomerackError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        print(f"added {model.id}")
        return 0
    if args.quiet:
        return 0
    kinds = {model: store.kind_of(model) for model in store.list()}
    held = {entry["id"]: entry for entry in _loaded()}
    for model, kind in kinds.items():
        if kind == "adapter":
            continue  # listed under the models they fit
        mark = "*" if model.id == DEFAULT_MODEL else " "
        where = f"  [{held_text(held[model.id])}]" if model.id in held else ""
        print(f"{mark} {model.id:<32} {kind:<10} "
              f"{model.size_bytes / 2**20:8.1f} MiB  {place_text(model)}{where}")
        for source, name in model.also_at:
            print(f"  {'':<32} {'':<10} {'':>12}  also in {LABELS[source]}: {name}")
    for adapter in [model for model, kind in kinds.items() if kind == "adapter"]:
        bases = store.bases_for(adapter)
        fits = f"adapts {bases[0].id} (use {bases[0].id}+{adapter.id})" if bases else \
            "fits no local model"
        print(f"  {adapter.id:<32} {'adapter':<10} {adapter.size_bytes / 2**20:8.1f} MiB  {fits}")
    for model in store.unusable():
        print(f"! {model.id:<32} {'unusable':<10} {'':>12}  {place_text(model)}: "
              f"{model.problem}")
    return 0


def place_text(model) -> str:
    """Where a model lives, in words: its path, or "from Ollama: qwen3:8b"."""
    from engine.catalog.other_apps import LABELS

    return str(model.path) if model.source == "homerack" else \
        f"from {LABELS[model.source]}: {model.label}"


def cmd_sources(args) -> int:
    """`models sources [on|off SOURCE]`, `models folder add|remove PATH`: where models
    are found besides the models folder; a running engine reads the choice again."""
    from engine.errors import HomerackError

    from ..local_models import other_models, set_folder

    words = [w for w in (args.target, *args.more) if w]
    try:
        if args.action == "folder":
            if len(words) != 2 or words[0] not in ("add", "remove"):
                print("usage: homerack models folder add|remove PATH", file=sys.stderr)
                return 2
            set_folder(words[1], words[0] == "add")
        elif words:
            if len(words) != 2 or words[0] not in ("on", "off"):
                print("usage: homerack models sources [on|off SOURCE]", file=sys.stderr)
                return 2
            other_models().choose(words[1], enabled=words[0] == "on")
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    _ask_the_engine(lambda client: client.choose_source(), None)  # it reads them again
    for source in other_models().describe():
        state = "on " if source["enabled"] else "off"
        count = f"{source['models']} models" if source["enabled"] else ""
        print(f"{state} {source['label']:<24} {count:<11} "
              f"{', '.join(source['present']) or 'not on this machine'}")
        for problem in source["problems"]:
            print(f"      ! {problem['name']}: {problem['problem']}")
    return 0


def _loaded() -> list[dict]:
    """What this user's running engine holds; nothing when none runs."""
    return _ask_the_engine(lambda client: client.loaded(), [])


def _ask_the_engine(ask, otherwise):
    """`ask(client)` of this user's running engine; `otherwise` when none runs or it
    cannot answer (the command's own work is done either way)."""
    from ..client import EngineClient, EngineError
    from ..engine_proc import find_running

    address = find_running(paths().engine_file)
    if address is None:
        return otherwise
    client = EngineClient(address)
    try:
        return ask(client)
    except (EngineError, OSError):
        return otherwise
    finally:
        client.close()


def held_text(entry: dict) -> str:
    """A loaded model in words: "loaded, 1.1 GiB, idle 3 min, unloads after 15 min idle"."""
    size = sum(entry["memory"].values()) / 2**30
    keep = "pinned" if entry["pinned"] else "stays loaded" if entry["ttl_s"] is None else \
        f"unloads after {entry['ttl_s'] / 60:g} min idle"
    busy = f"{entry['running']} running, {entry['queued']} queued" \
        if entry["running"] or entry["queued"] else f"idle {entry['idle_s'] / 60:.0f} min"
    default = ", the default" if entry["default"] else ""
    return f"{entry['state']}{default}, {size:.1f} GiB, {busy}, {keep}"


def _in_the_engine(args) -> int:
    """`models loaded`, `unload ID`, `keep ID`: asked of this user's running engine."""
    from ..client import EngineClient, EngineError
    from ..engine_proc import find_running

    address = find_running(paths().engine_file)
    if address is None:
        print("no engine is running (start one with `homerack serve` or the app)",
              file=sys.stderr)
        return 1
    client = EngineClient(address)
    try:
        if args.action == "unload":
            client.unload(args.target)
            print(f"unloaded {args.target}")
        elif args.action == "keep":
            ttl = None if not args.ttl else args.ttl * 60
            preset = client.keep(args.target, args.pin, ttl)["keep"]
            print(f"{args.target}: " + ("pinned" if preset["pinned"] else "never unloaded for "
                  "idleness" if preset["ttl_s"] is None else
                  f"unloaded after {preset['ttl_s'] / 60:g} min idle"))
        for entry in client.loaded():
            print(f"{entry['id']:<32} {held_text(entry)}")
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def cmd_pull(args) -> int:
    """A GGUF model from the Hub: every quant's verdict on this machine, then the
    recommended one (or --quant) downloaded, verified and added to the models."""
    from engine.errors import HomerackError
    from engine.llama.probe import probe
    from engine.hub.repos import download, repo_verdicts
    from engine.machine.planner import Preferences

    token = os.environ.get("HF_TOKEN")
    store = open_store(quiet=True)
    try:
        _, verdicts, _ = repo_verdicts(args.repo, probe(), Preferences(ctx=args.ctx), token=token)
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
        model = store.resolve(str(files[0]), paths=True)
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    print(f"ready: {model.id}")
    return 0


def add_commands(sub) -> None:
    """Adds `models`, `pull` to the parser."""
    models = sub.add_parser("models", help="list local models (other apps' too), add one, "
                                           "choose where models are found, or see and "
                                           "control those a running engine holds")
    models.add_argument("action", nargs="?", default="list",
                        choices=["list", "add", "loaded", "unload", "keep", "sources",
                                 "folder"])
    models.add_argument("target", nargs="?",
                        help="add: a .gguf file; unload, keep: a model id; sources: on or "
                             "off; folder: add or remove")
    models.add_argument("more", nargs="*",
                        help="sources on|off: a source (ollama, lmstudio, huggingface, "
                             "llama.cpp, jan, gpt4all); folder add|remove: a folder")
    models.add_argument("--pin", action="store_true",
                        help="keep: never unload it to make room or for idleness")
    models.add_argument("--ttl", type=float, metavar="MIN",
                        help="keep: unload it after this many idle minutes (0: never)")
    models.add_argument("--quiet", action="store_true", help="only install the starters")
    models.set_defaults(func=cmd_models)

    pull = sub.add_parser("pull", help="download a GGUF model from the Hugging Face Hub")
    pull.add_argument("repo", help="a Hub repository, e.g. bartowski/SmolLM2-135M-Instruct-GGUF")
    pull.add_argument("--quant", help="this quant (default: the recommended one)")
    pull.add_argument("--ctx", type=int, default=4096, help="wanted context, for the verdicts")
    pull.set_defaults(func=cmd_pull)
