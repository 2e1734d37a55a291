"""`homerack chat`: a terminal chat with this user's engine (started for the command when
none runs)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from ..history import DEFAULT_SYSTEM_PROMPT
from ..paths import paths
from ..local_models import model_id, open_store


@contextmanager
def engine_client(model: str | None):
    """A client of this user's running engine, or of one started for this command."""
    from ..client import EngineClient
    from ..engine_proc import EngineProcess, find_running

    address = find_running(paths().engine_file)
    process = None
    if address is None:
        open_store()  # install the starter models first, with visible progress
        process = EngineProcess(["--model", model] if model else [])
        address = process.wait_ready()
    client = EngineClient(address)
    try:
        yield client
    finally:
        client.close()
        if process:
            process.stop(timeout=100)  # it may be finishing a draft's cut (Engine.close)


def print_reply(client, messages, args) -> str:
    from ..client import StreamedReply

    reply = StreamedReply()
    for piece in client.stream_chat(messages, reply, model=args.model,
                                    max_tokens=args.max_tokens, seed=args.seed,
                                    temperature=args.temperature, draft_model=args.draft,
                                    speculation="lookup" if args.lookup else None,
                                    lora=args.lora or None,
                                    reasoning_effort=args.reasoning):
        kind, text = piece
        if kind == "reasoning":  # thinking, dimmed on a terminal, apart from the answer
            sys.stderr.write(f"\x1b[2m{text}\x1b[0m" if sys.stderr.isatty() else text)
            sys.stderr.flush()
            continue
        sys.stdout.write(text)
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


def _adapter(text: str) -> dict:
    """--lora ID or ID=SCALE."""
    name, _, scale = text.partition("=")
    return {"id": name, "scale": float(scale) if scale else 1.0}


def cmd_chat(args) -> int:
    from engine.errors import HomerackError

    from ..client import EngineError

    messages = [{"role": "system", "content": args.system}] if args.system else []
    try:
        args.model, args.draft = model_id(args.model), model_id(args.draft)
        with engine_client(args.model) as client:
            if args.prompt is not None:
                messages.append({"role": "user", "content": args.prompt})
                print_reply(client, messages, args)
                return 0
            return _interactive(client, messages, args)
    except HomerackError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
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
        messages.append({"role": "assistant", "content": print_reply(client, messages, args)})


def add_commands(sub) -> None:
    """Adds `chat` to the parser."""
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
    chat.add_argument("--reasoning", choices=("none", "low", "medium", "high"),
                      help="how much a reasoning model thinks (its thinking goes to stderr, "
                           "dimmed; the answer to stdout)")
    chat.add_argument("--lora", action="append", default=[], metavar="ADAPTER[=SCALE]",
                      type=_adapter,
                      help="a LoRA adapter over the model (repeatable; scale 1 by default)")
    chat.add_argument("-v", "--verbose", action="store_true", help="print speed figures")
    chat.set_defaults(func=cmd_chat)
