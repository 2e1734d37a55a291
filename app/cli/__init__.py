"""The `homerack` command line (docs/cli.md). One module per group of commands, each
adding its own to the parser (`add_commands`); `main` runs one.

  serve.py    `serve`: the engine and its API
  workers.py  `worker`, `pair`, `workers`: the cluster's machines (workers)
  home.py     `share`, `devices`: sharing the engine with the home's phones and laptops
  chat.py     `chat`: a terminal chat
  models.py   `models`, `pull`: local models and the Hub's
  machine.py  `hardware`, `plan`, `gpu-runtime`: this machine, how a model would run on
              it, and the packaged app's CUDA runtime
  tools.py    `mcp`: the MCP servers, listed, imported, a tool called
  documents.py  `docs`: document collections, added, listed, searched
  desktop.py  no command (the window), `self-test`, `install-desktop`
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from engine.spawn import follow_parent

from ..paths import make_private, paths
from . import chat, desktop, documents, home, machine, models, serve, tools, workers

GROUPS = (serve, workers, home, chat, models, machine, tools, documents, desktop)  # the order of `homerack --help`


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="homerack", description="Large language models on the machines you own; with no "
        "command, the desktop app.")
    sub = parser.add_subparsers(dest="command")
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    follow_parent(lambda: os.kill(os.getpid(), signal.SIGTERM))  # a child of ours dies with us
    make_private(paths())
    from engine.llama.cuda_runtime import CUDA_RUNTIME_ENV  # no llama.cpp: the window runs this

    os.environ.setdefault(CUDA_RUNTIME_ENV, str(paths().gpu_runtime))
    if args.command is None:
        return desktop.launch_desktop(lambda: chat.cmd_chat(build_parser().parse_args(["chat"])))
    if args.command == "models" and args.action not in ("list", "loaded", "sources") \
            and not args.target:
        build_parser().error(f"models {args.action} needs a "
                             f"{'path' if args.action == 'add' else 'model id'}")
    if args.command == "mcp" and args.action == "call" and not (args.target and args.tool):
        build_parser().error("mcp call needs a server and a tool")
    if args.command == "docs" and args.action != "list" and not (args.name and args.rest):
        build_parser().error(f"docs {args.action} needs a collection and "
                             f"{'paths' if args.action == 'add' else 'a query'}")
    from engine.errors import HomerackError

    try:
        return args.func(args)
    except HomerackError as exc:  # what a command did not handle itself: said, not a traceback
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
