"""The Responses API's `mcp` tool, as OpenAI's API has it: a request names a server (one in
mcp.json by its label, or any by `server_url` when the user allowed that), the engine lists
its tools (`mcp_list_tools`), offers them to the model as functions, runs each call
(`mcp_call`) or, where approval is required, stops with an `mcp_approval_request` that the
client answers with an `mcp_approval_response` in its next request's input; then the model
goes on with the results, up to MAX_ROUNDS. Stateless as the rest of the route: the
earlier items travel in the input."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ...engine import Engine
from ...errors import InvalidRequest

MAX_ROUNDS = 8
RESULT_CHARS = 32_000  # of a result, for the model (cut saying so)


class McpTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["mcp"]
    server_label: str
    server_url: str | None = None
    headers: dict[str, str] | None = None
    allowed_tools: list[str] | dict[str, Any] | None = None
    require_approval: Literal["always", "never"] | dict[str, Any] | None = None

    def allows(self, name: str) -> bool:
        chosen = self.allowed_tools
        if isinstance(chosen, dict):
            chosen = chosen.get("tool_names")
        return chosen is None or name in chosen

    def waived(self, name: str) -> bool:
        """The request says this tool needs no approval."""
        rule = self.require_approval
        if rule == "never":
            return True
        never = rule.get("never") if isinstance(rule, dict) else None
        return bool(never and name in (never.get("tool_names") or ()))


@dataclass
class _Offered:
    server: McpTool
    spec: object  # the ServerSpec, opaque here
    tool: object  # the ToolInfo
    function: str  # its name for the model


@dataclass
class McpRun:
    offered: dict[str, _Offered] = field(default_factory=dict)
    listed: list[dict] = field(default_factory=list)  # the mcp_list_tools items
    functions: list[dict] = field(default_factory=list)  # the request's tools, as functions
    items: list[dict] = field(default_factory=list)  # the input, as function items
    output: list[dict] = field(default_factory=list)


def uses_mcp(body) -> bool:
    return any(t.type == "mcp" for t in body.tools or ())


def prepare(engine: Engine, body) -> McpRun:
    """Servers resolved, their tools listed, the input's MCP items read (approvals run).
    Blocking: on a worker thread."""
    run = McpRun()
    for i, entry in enumerate(body.tools or ()):
        if entry.type != "mcp":
            run.functions.append(entry.model_dump(exclude_none=True))
            continue
        where = f"tools[{i}]"
        server = _mcp_tool(entry.model_dump(exclude_none=True), where)
        spec = engine.tools.request_spec(server.server_label, server.server_url, server.headers,
                                         f"{where}.server_url") if server.server_url \
            else engine.tools.spec(server.server_label, f"{where}.server_label")
        listed = []
        for tool in engine.tools.offered(spec):
            if tool.policy == "deny" or not server.allows(tool.name):
                continue
            function = tool.name if tool.name not in run.offered \
                else f"{server.server_label}__{tool.name}"
            run.offered[function] = _Offered(server, spec, tool, function)
            run.functions.append({"type": "function", "name": function,
                                  "description": tool.description[:1024],
                                  "parameters": tool.parameters})
            listed.append({"name": tool.name, "description": tool.description,
                           "input_schema": tool.parameters,
                           "annotations": {"read_only": tool.hints.read_only,
                                           "destructive": tool.hints.destructive}})
        run.listed.append({"type": "mcp_list_tools", "id": _id("mcpl"),
                           "server_label": server.server_label, "tools": listed})
    run.output += run.listed
    _read_input(engine, body, run)
    return run


def _mcp_tool(entry: dict, where: str) -> McpTool:
    try:
        return McpTool.model_validate(entry)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][:1])
        raise InvalidRequest(f"{where}.{field}: {first['msg']}",
                             param=f"{where}.{field}") from None


def _read_input(engine: Engine, body, run: McpRun) -> None:
    """Earlier MCP items become function calls and outputs the model reads; an approval
    answered now runs (or is reported denied)."""
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) \
        else list(body.input)
    asked = {item.get("id"): item for item in items if item.get("type") == "mcp_approval_request"}
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind in ("mcp_list_tools", "mcp_approval_request"):
            continue
        if kind == "mcp_call":
            run.items += _as_function(item, _function_of(run, item),
                                      item.get("output") or item.get("error") or "")
        elif kind == "mcp_approval_response":
            request = asked.get(item.get("approval_request_id"))
            if request is None:
                raise InvalidRequest(f"input[{i}].approval_request_id names no "
                                     "mcp_approval_request in the input: send that item too",
                                     param=f"input[{i}].approval_request_id")
            run.items += _answer(engine, run, request, bool(item.get("approve")),
                                 f"input[{i}]")
        else:
            run.items.append(item)


def _function_of(run: McpRun, item: dict) -> str:
    name = item.get("name")
    return next((f for f, o in run.offered.items() if o.tool.name == name and
                 o.server.server_label == item.get("server_label")), str(name))


def _answer(engine: Engine, run: McpRun, request: dict, approve: bool, where: str) -> list[dict]:
    function = _function_of(run, request)
    offered = run.offered.get(function)
    if offered is None:
        raise InvalidRequest(f"{where}: the approved tool {request.get('name')!r} is not "
                             f"offered by {request.get('server_label')!r} in this request",
                             param=where)
    if not approve:
        return _as_function(request, function, "The user denied this call.")
    call = _run_call(engine, offered, request.get("arguments") or "{}", "request")
    run.output.append(call)
    return _as_function(call, function, call["output"] or call["error"])


def _run_call(engine: Engine, offered: _Offered, arguments: str, approved: str) -> dict:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = None
    result = engine.tools.run(offered.spec, offered.tool.name, parsed, approved, RESULT_CHARS)
    return {"type": "mcp_call", "id": _id("mcp"), "server_label": offered.server.server_label,
            "name": offered.tool.name, "arguments": arguments,
            "output": None if result.is_error else result.text,
            "error": result.text if result.is_error else None}


def _as_function(item: dict, function: str, output: str) -> list[dict]:
    call_id = item.get("id") or _id("mcp")
    return [{"type": "function_call", "call_id": call_id, "name": function,
             "arguments": item.get("arguments") or "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": output}]


def needs_approval(engine: Engine, offered: _Offered) -> bool:
    """What the user allows runs unasked (an "always", or read-only tools when the user
    lets them run unasked). A request's waiver (`require_approval: never`) covers only the
    tools of a server the request itself named by URL, and of those only the ones the
    server does not mark destructive: the user's own servers run on this machine with
    the user's credentials, and their hints (read-only) are the server's word, not the
    user's."""
    if offered.tool.policy == "allow":
        return False
    return not offered.spec.from_request or offered.tool.hints.destructive or \
        not offered.server.waived(offered.tool.name)


Round = Callable[[Any], Awaitable[tuple[Any, Any]]]  # a body -> (Started, Collected)


async def respond(engine: Engine, body, run_round: Round):
    """The rounds: (the output items, the last Started, the last Done, usage summed)."""
    run = await asyncio.to_thread(prepare, engine, body)
    choice = _first_choice(body, run)
    usage = [0, 0, 0]
    cap = min(body.max_tool_calls or MAX_ROUNDS, MAX_ROUNDS)
    for round_ in range(MAX_ROUNDS + 1):
        if _calls_run(run) >= cap or round_ == MAX_ROUNDS:
            choice = "none"  # the calls allowed are spent: the model answers now
        round_body = body.model_copy(update={
            "input": run.items, "tools": [type(body.tools[0]).model_validate(f)
                                          for f in run.functions] or None,
            "tool_choice": choice})
        started, got = await run_round(round_body)
        choice = None if choice != "none" else "none"  # a forced call is forced once
        usage = [usage[0] + got.done.usage.prompt_tokens,
                 usage[1] + got.done.usage.completion_tokens, got.done.usage.cached_tokens]
        if got.reasoning:
            run.output.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                               "content": [{"type": "reasoning_text", "text": got.reasoning}]})
        if got.text or not got.calls:
            run.output.append({"type": "message", "id": _id("msg"), "status": "completed",
                               "role": "assistant", "content": [
                                   {"type": "output_text", "text": got.text, "annotations": []}]})
        if not got.calls or not await _calls(engine, run, got.calls):
            break
    return run.output, started, got.done, usage


def _calls_run(run: McpRun) -> int:
    return sum(item["type"] == "mcp_call" for item in run.output)


async def _calls(engine: Engine, run: McpRun, calls) -> bool:
    """Run the round's calls; False when the response ends here (an approval to ask, or
    a function call of the client's own)."""
    going_on = True
    for start, arguments in calls:
        offered = run.offered.get(start.name)
        if offered is None:
            run.output.append({"type": "function_call", "id": f"fc_{start.id}",
                               "call_id": start.id, "name": start.name,
                               "arguments": arguments, "status": "completed"})
            going_on = False
        elif needs_approval(engine, offered):
            run.output.append({"type": "mcp_approval_request", "id": _id("mcpr"),
                               "server_label": offered.server.server_label,
                               "name": offered.tool.name, "arguments": arguments})
            going_on = False
        else:
            call = await asyncio.to_thread(_run_call, engine, offered, arguments, "request")
            run.output.append(call)
            run.items += _as_function(call, start.name, call["output"] or call["error"])
    return going_on


def _first_choice(body, run: McpRun):
    """OpenAI's {"type": "mcp", "server_label", "name"} as the function it names."""
    choice = body.tool_choice
    if not isinstance(choice, dict) or choice.get("type") != "mcp":
        return choice
    wanted = (choice.get("server_label"), choice.get("name"))
    for function, offered in run.offered.items():
        if (offered.server.server_label, offered.tool.name) == wanted:
            return {"type": "function", "name": function}
    raise InvalidRequest(f"tool_choice names {wanted[1]!r} of {wanted[0]!r}, which this "
                         "request does not offer", param="tool_choice")


def streamed(response: dict):
    """A finished response as the Responses stream's events, item by item."""
    numbers = iter(range(1 << 30))

    def event(kind: str, **data) -> str:
        payload = {"type": kind, "sequence_number": next(numbers), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    yield event("response.created", response={**response, "status": "in_progress",
                                              "output": []})
    for index, item in enumerate(response["output"]):
        yield event("response.output_item.added", output_index=index, item=item)
        if item["type"] == "message":
            text = item["content"][0]["text"]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.output_text.delta", **where, delta=text)
            yield event("response.output_text.done", **where, text=text)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
