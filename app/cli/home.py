"""`homerack share` and `homerack devices`: sharing this engine with the home's phones and
laptops, through the running engine (pairing codes are the engine's: a code made by an
engine started for the command would die with it)."""

from __future__ import annotations

import json
import sys
from contextlib import closing

from ..paths import paths


def _running_client():
    from ..client import EngineClient
    from ..engine_proc import find_running

    address = find_running(paths().engine_file)
    if address is None:
        print("error: no engine is running; start the app, or `homerack serve --share-home`",
              file=sys.stderr)
        return None
    return EngineClient(address)


def said(command):
    """The engine's refusal in words (exit 1), not a traceback."""
    def run(args) -> int:
        from ..client import EngineError

        try:
            return command(args)
        except EngineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return run


def cmd_share(args) -> int:
    client = _running_client()
    if client is None:
        return 1
    with closing(client):
        state = client.share(args.on, args.host, args.port) if args.on or args.off \
            else client.home()
    out = {"enabled": state["enabled"], "url": state["url"], "devices": state["devices"]}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"shared with this home on {out['url']}" if out["enabled"] else
              "not shared with this home (homerack share --on)")
        print(f"{len(out['devices'])} paired devices")
    return 0


def cmd_devices(args) -> int:
    client = _running_client()
    if client is None:
        return 1
    with closing(client):
        if args.action == "add":
            if not args.name:
                print("error: devices add needs a NAME", file=sys.stderr)
                return 2
            made = client.add_device(args.name)
            if args.json:
                print(json.dumps(made, indent=2))
            else:
                where = made["url"] or "the sharing address (sharing is off: homerack share --on)"
                print(f"on {args.name}, open {where} and enter {made['code']} "
                      f"(valid {made['expires_s'] // 60} minutes, once)")
            return 0
        if args.action == "remove":
            client.remove_device(args.name)
            print(f"{args.name} removed: its key no longer works")
            return 0
        devices = client.home()["devices"]
    if args.json:
        print(json.dumps(devices, indent=2))
    for d in devices if not args.json else ():
        print(f"{d['name']}: {d['in_flight']} requests now, {d['requests_today']} today, "
              f"{d['tokens_today']:,} tokens today")
    return 0


def add_commands(sub) -> None:
    share = sub.add_parser("share", help="sharing this engine with the home's devices")
    toggle = share.add_mutually_exclusive_group()
    toggle.add_argument("--on", action="store_true", help="open the sharing listener")
    toggle.add_argument("--off", action="store_true", help="close it (open streams end)")
    share.add_argument("--host", help="with --on: the address it binds (default: the LAN's)")
    share.add_argument("--port", type=int, help="with --on: its port (default 8580)")
    share.add_argument("--json", action="store_true")
    share.set_defaults(func=said(cmd_share))
    devices = sub.add_parser("devices", help="the home's paired devices: add (a pairing "
                             "code), list, remove")
    devices.add_argument("action", choices=["add", "list", "remove"])
    devices.add_argument("name", nargs="?")
    devices.add_argument("--json", action="store_true")
    devices.set_defaults(func=said(cmd_devices))
