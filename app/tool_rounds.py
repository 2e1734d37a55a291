"""A reply with tools, Qt-free: the model calls, the user approves (or their lasting
choice does), the tool runs in the engine, the result goes back, the model goes on, up to
MAX_ROUNDS; the last round offers no tools, so an answer always comes. A denied call goes
back to the model as a denied result, a failed one as an error result. The window asks
for approval through `ask`, which blocks this (worker) thread until the user chose or the
reply was stopped."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .client import EngineClient, StreamedReply
from .tool_config import allow_for_good

MAX_ROUNDS = 6
RESULT_SHARE = 0.25  # of the context a tool's result may take (cut beyond, saying so)
CHARS_PER_TOKEN = 3  # a cautious count: results are cut in characters, before tokenizing


@dataclass(frozen=True)
class OfferedTool:
    """A tool of an enabled server, as the engine lists it."""
    server: str
    name: str
    description: str
    parameters: dict
    policy: str  # allow, ask or deny (the user's lasting choice, or the default)
    read_only: bool = False
    destructive: bool = True
    describe: str = ""  # the server: its command line or URL
    identity: str = ""  # the server's, as the engine binds decisions to it
    offered: dict = field(default_factory=dict)  # the engine's function definition of it

    def definition(self, function: str) -> dict:
        """The engine's definition, under the name the model calls it by."""
        return {**self.offered, "function": {**self.offered["function"], "name": function}}


@dataclass
class Approval:
    """One call waiting for the user: the card shows it and sets `choice` (once, chat,
    always, deny) and maybe edited `arguments`."""
    tool: OfferedTool
    arguments: dict
    conversation_id: int
    choice: str | None = None
    decided: threading.Event = field(default_factory=threading.Event)

    def decide(self, choice: str, arguments: dict | None = None) -> None:
        if arguments is not None:
            self.arguments = arguments
        self.choice = choice
        self.decided.set()


@dataclass
class ToolRound:
    """A call as kept with the answer: shown collapsed under it, sent again with later
    turns so the model remembers what it learned."""
    call_id: str
    server: str
    tool: str
    arguments: dict
    result: str
    status: str  # ran, denied, failed
    approved: str = ""  # once, chat, always, policy
    seconds: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)


def offered_tools(client: EngineClient, servers: list[str], model: str | None
                  ) -> tuple[list[OfferedTool], int, list[str]]:
    """The enabled servers' tools (denied ones left out), their size in the model's
    tokens, and the servers that could not be reached, in words."""
    tools, tokens, problems = [], 0, []
    known = {s["label"]: s for s in client.mcp_servers()["servers"]}
    for label in servers:
        try:
            listed = client.mcp_tools(label, model)
        except Exception as exc:  # noqa: BLE001 - one server's failure is said, not fatal
            problems.append(f"{label}: {exc}")
            continue
        tokens += listed["tokens"]
        describe = known.get(label, {}).get("describe", "")
        identity = known.get(label, {}).get("identity", "")
        tools += [OfferedTool(label, t["name"], t["description"], t["parameters"], t["policy"],
                              t["read_only"], t["destructive"], describe=describe,
                              identity=identity, offered=t["definition"])
                  for t in listed["tools"] if t["policy"] != "deny"]
    return tools, tokens, problems


def function_names(tools: list[OfferedTool]) -> dict[str, OfferedTool]:
    """The name the model calls each tool by: its own, or server__tool where two servers
    share one."""
    named: dict[str, OfferedTool] = {}
    for tool in tools:
        named[tool.name if tool.name not in named else f"{tool.server}__{tool.name}"] = tool
    return named


def converse(client: EngineClient, messages: list[dict], reply: StreamedReply,
             tools: dict[str, OfferedTool], ask: Callable[[OfferedTool, dict], Approval | None],
             should_stop: Callable[[], bool], n_ctx: int, report: Callable[[tuple], None],
             chat_allowed: set, forced: str | None = None, approvals: Path | None = None,
             **options) -> Iterator[tuple[str, str]]:
    """The reply's pieces across rounds; each finished call is reported as ("tool",
    ToolRound). `chat_allowed`: the conversation's (server, tool) pairs the user allowed
    for this chat (grows here). `forced`: the function the first round must call.
    `approvals`: the file an "Always allow" is written to (app/tool_config.py)."""
    messages = list(messages)
    definitions = [tool.definition(name) for name, tool in tools.items()]
    last = False
    for round_ in range(MAX_ROUNDS + 1):
        last = last or round_ == MAX_ROUNDS
        choice = {"type": "function", "function": {"name": forced}} if forced and round_ == 0 \
            else None
        reply.tool_calls = []
        # the last round offers no tools: the model answers with what it has
        yield from client.stream_chat(messages, reply, should_stop,
                                      tools=None if last else definitions or None,
                                      tool_choice=None if last else choice, **options)
        if not reply.tool_calls or should_stop() or last:
            return
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": _whole(c["arguments"])}}
            for c in reply.tool_calls]})
        statuses = []
        for call in reply.tool_calls:
            if should_stop():
                return
            done = _one_call(client, call, tools, ask, chat_allowed, n_ctx, approvals)
            report(("tool", done))
            statuses.append(done.status)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.result})
        # the user said no to all of it: the model answers now, asking nothing more
        last = all(status == "denied" for status in statuses)


def _whole(arguments: str) -> str:
    """A call's arguments as sent back: "{}" for ones cut short (max_tokens) or not an
    object, which the engine would refuse (the call's result says what was wrong)."""
    try:
        return arguments if isinstance(json.loads(arguments or "{}"), dict) else "{}"
    except ValueError:
        return "{}"


def _one_call(client: EngineClient, call: dict, tools: dict[str, OfferedTool], ask,
              chat_allowed: set, n_ctx: int, approvals: Path | None) -> ToolRound:
    tool = tools.get(call["name"])
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except ValueError:
        arguments = None
    if tool is None or not isinstance(arguments, dict):
        why = f"There is no tool {call['name']!r}." if tool is None else \
            "The arguments were not a JSON object."
        return ToolRound(call["id"], tool.server if tool else "", call["name"],
                         arguments if isinstance(arguments, dict) else {}, why, "failed")
    approved = "policy" if tool.policy == "allow" else \
        "chat" if (tool.server, tool.name) in chat_allowed else None
    if approved is None:
        approval = ask(tool, arguments)
        if approval is None or approval.choice in (None, "deny"):
            return ToolRound(call["id"], tool.server, tool.name, arguments,
                             "The user denied this call.", "denied")
        approved, arguments = approval.choice, approval.arguments
        if approved in ("chat", "always"):  # no more cards for it in this chat
            chat_allowed.add((tool.server, tool.name))
        if approved == "always" and approvals is not None and tool.identity:
            allow_for_good(approvals, {"identity": tool.identity, "label": tool.server,
                                       "describe": tool.describe}, tool.name)
    max_chars = max(1024, int(n_ctx * RESULT_SHARE * CHARS_PER_TOKEN))
    result = client.call_tool(tool.server, tool.name, arguments, approved, max_chars)
    return ToolRound(call["id"], tool.server, tool.name, arguments, result["text"],
                     "failed" if result["is_error"] else "ran", approved, result["seconds"])


def wait_for(approval: Approval, should_stop: Callable[[], bool]) -> Approval:
    """Block until the user decided or the reply was stopped (then: denied)."""
    while not approval.decided.wait(0.2):
        if should_stop():
            approval.decide("deny")
    return approval


def history_messages(rounds: list[dict]) -> list[dict]:
    """Kept rounds as the messages that carried them: the calls, then their results."""
    if not rounds:
        return []
    calls = [{"id": r["call_id"], "type": "function",
              "function": {"name": r["tool"], "arguments": json.dumps(r["arguments"])}}
             for r in rounds]
    return [{"role": "assistant", "content": "", "tool_calls": calls}] + \
        [{"role": "tool", "tool_call_id": r["call_id"], "content": r["result"]} for r in rounds]
