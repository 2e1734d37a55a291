"""`homerack docs`: the user's document collections, through this user's running engine
(or one started for the command, which then waits until the indexing is done): add a
collection of folders and files, list them with their progress, search one."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .chat import engine_client


def cmd_docs(args) -> int:
    with engine_client(None) as client:
        if args.action == "add":
            return _add(client, args)
        if args.action == "list":
            listed = client.collections()
            if args.json:
                print(json.dumps(listed, indent=2))
            else:
                for c in listed["data"]:
                    print(_line(c))
                print(f"index: {listed['index_bytes'] / 2**20:.1f} MiB")
            return 0
        found = client.search_collection(args.name, args.rest[0], args.top_k)
        if args.json:
            print(json.dumps(found, indent=2))
        for n, passage in enumerate(found if not args.json else (), 1):
            place = f"page {passage['page']}" if "page" in passage else \
                f"lines {passage['start_line']}-{passage['end_line']}"
            print(f"[{n}] {passage['path']} ({place}) score {passage['score']:.4f}\n"
                  f"    {passage['text'][:300].replace(chr(10), ' ')}")
        return 0


def _add(client, args) -> int:
    paths = [str(Path(p).expanduser().resolve()) for p in args.rest]
    client.add_collection(args.name, paths)
    while True:  # progress until it is indexed (an engine started for us stops after)
        state = client.collection(args.name)
        print(f"\r{_line(state)}", end="", flush=True)
        if state["state"] in ("ready", "failed"):
            break
        time.sleep(0.5)
    print()
    for failure in state.get("failed", ()):
        print(f"  not indexed: {failure['path']}: {failure['error']}")
    return 0 if state["state"] == "ready" else 1


def _line(c: dict) -> str:
    doing = f" {c['files_done']}/{c['files_total']} files" if c["state"] == "indexing" else ""
    left = f", about {c['seconds_left']:.0f} s left" if c.get("seconds_left") else ""
    return (f"{c['name']}: {c['state']}{doing}{left} · {c['files_indexed']} files, "
            f"{c['passages']} passages, {c['files_failed']} not readable")


def add_commands(sub) -> None:
    docs = sub.add_parser("docs", help="document collections: add folders, list, search")
    docs.add_argument("action", choices=["add", "list", "search"])
    docs.add_argument("name", nargs="?", help="the collection")
    docs.add_argument("rest", nargs="*", help="add: folders and files; search: the query")
    docs.add_argument("--top-k", type=int, default=5)
    docs.add_argument("--json", action="store_true")
    docs.set_defaults(func=cmd_docs)
