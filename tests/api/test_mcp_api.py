"""MCP through the API of a real `homerack serve`, with the official `openai` client: the
Responses API's `mcp` tool against server-everything over Streamable HTTP (by label from
mcp.json, and by server_url where the user allowed it: a 403 saying how otherwise), with
approval asked and answered; the configured servers, their tools and their size in
tokens; a call the user approved; decisions kept and revoked.

The starter model is too small to choose tools: the calls are forced with tool_choice,
and the tests read the items, never the model's prose."""

from __future__ import annotations

import json

import openai
import pytest

from support.engines import api_client, start_engine
from support.mcp_servers import everything_http, time_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def everything():
    with everything_http() as url:
        yield url


def _engine(tmp_path_factory, starters_dir, name: str, mcp: dict, args=()):
    home = tmp_path_factory.mktemp(name)
    (home / "data" / "models").mkdir(parents=True)
    for path in starters_dir.iterdir():
        (home / "data" / "models" / path.name).symlink_to(path)
    (home / name / "data").mkdir(parents=True)
    (home / name / "data" / "mcp.json").write_text(json.dumps({"mcpServers": mcp}))
    process, address, _ = start_engine(home, name, ["--parallel", "1", *args])
    return process, address, home / name / "data"


@pytest.fixture(scope="module")
def engine_at(tmp_path_factory, starters_dir, everything):
    process, address, data = _engine(tmp_path_factory, starters_dir, "tools", {
        "everything": {"url": everything}, "time": time_server(),
        "broken": {"command": 42}})
    yield address, data
    process.stop()


@pytest.fixture(scope="module")
def engine(engine_at):
    return engine_at[0]


def _allow_in_app(http, data, label: str, tools: list[str]) -> None:
    """What the app writes when the user clicks "Always allow" (app/tool_config.py)."""
    from app.tool_config import allow_for_good

    server = next(s for s in http.get("/v1/mcp/servers").json()["servers"]
                  if s["label"] == label)
    for tool in tools:
        allow_for_good(data / "tool-approvals.json", server, tool)


@pytest.fixture(scope="module")
def http(engine):
    with api_client(engine) as client:
        yield client


@pytest.fixture(scope="module")
def client(engine):
    return openai.OpenAI(base_url=engine.url + "/v1", api_key=engine.token, timeout=300)


def _mcp(**extra) -> dict:
    return {"type": "mcp", "server_label": "everything", **extra}


def _items(response, kind: str) -> list:
    return [item for item in response.output if item.type == kind]


def test_a_responses_mcp_tool_runs_a_call_on_server_everything(client, http, engine_at):
    _allow_in_app(http, engine_at[1], "everything", ["echo", "get-sum"])
    response = client.responses.create(
        model="smollm2-135m-instruct-q4_1", input="Say hello through the echo tool.",
        tools=[_mcp(allowed_tools=["echo", "get-sum"], require_approval="never")],
        tool_choice={"type": "mcp", "server_label": "everything", "name": "echo"},
        max_output_tokens=48, temperature=0, max_tool_calls=1)
    listed = _items(response, "mcp_list_tools")[0]
    assert {t.name for t in listed.tools} == {"echo", "get-sum"}  # allowed_tools honoured
    call = _items(response, "mcp_call")[0]
    assert call.server_label == "everything" and call.name == "echo"
    assert call.error is None and call.output.startswith("Echo: ")
    assert call.output == "Echo: " + json.loads(call.arguments)["message"]
    assert len(_items(response, "mcp_call")) == 1  # max_tool_calls
    assert response.output[-1].type == "message", "the model answers after the result"


def test_an_mcp_response_streams_its_items(client):
    stream = client.responses.create(
        model="smollm2-135m-instruct-q4_1", input="Add 2 and 40.", stream=True,
        tools=[_mcp(allowed_tools=["get-sum"], require_approval="never")],
        tool_choice={"type": "mcp", "server_label": "everything", "name": "get-sum"},
        max_output_tokens=32, max_tool_calls=1)
    events = list(stream)
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done[:2] == ["mcp_list_tools", "mcp_call"] and done[-1] == "message"
    assert events[-1].type == "response.completed"
    assert "The sum of" in events[-1].response.output[1].output


def test_approval_is_asked_then_answered(client, http):
    tools = [_mcp(allowed_tools=["toggle-simulated-logging"], require_approval="always")]
    first = client.responses.create(
        model="smollm2-135m-instruct-q4_1", input="Turn logging on.", tools=tools,
        tool_choice={"type": "mcp", "server_label": "everything",
                     "name": "toggle-simulated-logging"}, max_output_tokens=32)
    asked = _items(first, "mcp_approval_request")[0]
    assert asked.name == "toggle-simulated-logging" and not _items(first, "mcp_call")
    previous = [item.model_dump(exclude_none=True) for item in first.output]
    approved = client.responses.create(
        model="smollm2-135m-instruct-q4_1", tools=tools, max_output_tokens=24,
        input=[{"role": "user", "content": "Turn logging on."}, *previous,
            {"type": "mcp_approval_response", "approval_request_id": asked.id,
             "approve": True}])
    call = _items(approved, "mcp_call")[0]
    assert call.name == "toggle-simulated-logging" and "logging" in call.output.lower()
    kept = http.get("/v1/mcp/servers").json()["approvals"]
    assert all(a["tool"] != "toggle-simulated-logging" for a in kept)  # a call, not for good
    denied = client.responses.create(
        model="smollm2-135m-instruct-q4_1", tools=tools, max_output_tokens=24,
        input=[{"role": "user", "content": "Turn logging on."}, *previous,
               {"type": "mcp_approval_response", "approval_request_id": asked.id,
                "approve": False}])
    assert not _items(denied, "mcp_call")


def test_a_request_may_not_name_a_server_url_unless_allowed(client, everything):
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.responses.create(model="smollm2-135m-instruct-q4_1", input="hi",
                                tools=[{"type": "mcp", "server_label": "mine",
                                        "server_url": everything}])
    assert "--allow-request-mcp" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="smollm2-135m-instruct-q4_1", input="hi",
                                tools=[{"type": "mcp", "server_label": "nowhere"}])
    assert "nowhere" in str(unknown.value)


def test_a_requests_waiver_does_not_run_the_users_own_servers_tools_unasked(client):
    """`require_approval: never` on a server of mcp.json: its tool says it only reads,
    which is the server's word, not the user's; the call waits for an approval."""
    response = client.responses.create(
        model="smollm2-135m-instruct-q4_1", input="What time is it in Tokyo?",
        tools=[{"type": "mcp", "server_label": "time", "allowed_tools": ["get_current_time"],
                "require_approval": "never"}],
        tool_choice={"type": "mcp", "server_label": "time", "name": "get_current_time"},
        max_output_tokens=32)
    assert _items(response, "mcp_approval_request") and not _items(response, "mcp_call")


def test_only_the_app_writes_a_lasting_allow(http):
    """The API runs a call approved "always", and writes nothing: an allow for good is the
    user's click in the app; a request may make a tool stricter, never looser."""
    ran = http.post("/v1/mcp/servers/time/tools/get_current_time/call",
                    json={"arguments": {"timezone": "UTC"}, "approved": "always"})
    assert ran.status_code == 200 and not ran.json()["is_error"]
    policies = {t["name"]: t["policy"] for t in
                http.get("/v1/mcp/servers/time/tools").json()["tools"]}
    assert policies["get_current_time"] == "ask"
    refused = http.put("/v1/mcp/approvals", json={"server": "time", "tool": "get_current_time",
                                                  "decision": "allow"})
    assert refused.status_code == 403 and "in the app" in refused.text
    unasked = http.post("/v1/mcp/servers/time/tools/get_current_time/call",
                        json={"arguments": {"timezone": "UTC"}, "approved": "policy"})
    assert unasked.status_code == 403


def test_stdio_servers_are_never_started_from_a_request(http):
    response = http.post("/v1/responses", json={
        "model": "smollm2-135m-instruct-q4_1", "input": "hi",
        "tools": [{"type": "mcp", "server_label": "evil", "command": "touch",
                   "args": ["/tmp/owned"]}]})
    assert response.status_code == 400  # a label only: "evil" is not configured


def test_configured_servers_and_their_tools(http):
    listing = http.get("/v1/mcp/servers").json()
    by_label = {s["label"]: s for s in listing["servers"]}
    assert by_label["time"]["kind"] == "stdio" and by_label["everything"]["kind"] == "http"
    assert "broken" in listing["problems"]  # a bad entry is listed, the others serve
    tools = http.get("/v1/mcp/servers/time/tools").json()
    assert {t["name"] for t in tools["tools"]} == {"get_current_time", "convert_time"}
    assert all(t["policy"] == "ask" and t["read_only"] for t in tools["tools"])
    assert 100 < tools["tokens"] < 1000  # the definitions' size in the model's tokens


def test_a_call_approved_in_the_app_runs_and_is_logged(http):
    result = http.post("/v1/mcp/servers/time/tools/get_current_time/call",
                       json={"arguments": {"timezone": "Asia/Tokyo"}, "approved": "once"})
    assert result.status_code == 200 and "+09:00" in result.json()["text"]
    unasked = http.post("/v1/mcp/servers/time/tools/get_current_time/call",
                        json={"arguments": {"timezone": "UTC"}, "approved": "policy"})
    assert unasked.status_code == 403  # "policy": only what the user allowed for good
    logged = http.get("/v1/mcp/calls").json()["calls"]
    assert logged[-1]["arguments"] == {"timezone": "Asia/Tokyo"}
    assert "+09:00" in logged[-1]["result"]


def test_decisions_persist_bind_to_the_server_and_can_be_revoked(http):
    http.put("/v1/mcp/approvals", json={"server": "time", "tool": "convert_time",
                                        "decision": "deny"}).raise_for_status()
    tools = {t["name"]: t for t in http.get("/v1/mcp/servers/time/tools").json()["tools"]}
    assert tools["convert_time"]["policy"] == "deny"
    denied = http.post("/v1/mcp/servers/time/tools/convert_time/call", json={
        "arguments": {"source_timezone": "UTC", "time": "12:00",
                      "target_timezone": "Asia/Tokyo"}, "approved": "once"}).json()
    assert denied["is_error"] and "does not allow" in denied["text"]
    entry = next(a for a in http.get("/v1/mcp/servers").json()["approvals"]
                 if a["server"] == "time")
    assert entry["tool"] == "convert_time" and entry["decision"] == "deny"
    http.delete(f"/v1/mcp/approvals/{entry['identity']}",
                params={"tool": "convert_time"}).raise_for_status()
    tools = {t["name"]: t for t in http.get("/v1/mcp/servers/time/tools").json()["tools"]}
    assert tools["convert_time"]["policy"] == "ask"
    bad = http.put("/v1/mcp/approvals", json={"server": "time", "tool": "x",
                                              "decision": "maybe"})
    assert bad.status_code == 400 and "decision" in bad.text


def test_request_servers_when_allowed_and_no_server_outlives_a_killed_engine(
        tmp_path_factory, starters_dir, everything):
    import psutil

    from urllib.parse import urlsplit

    process, address, _ = _engine(tmp_path_factory, starters_dir, "open",
                                  {"time": time_server()}, ["--allow-request-mcp"])
    try:
        client = openai.OpenAI(base_url=address.url + "/v1", api_key=address.token)
        port = urlsplit(everything).port
        for url, says in ((everything, "loopback"),  # this machine's own services
                          (f"http://localhost:{port}/mcp", "loopback"),
                          (f"http://169.254.169.254:{port}/mcp", "link-local"),
                          (f"http://10.0.0.1:{port}/mcp", "private")):
            with pytest.raises(openai.PermissionDeniedError, match=says):
                client.responses.create(
                    model="smollm2-135m-instruct-q4_1", input="hi",
                    tools=[{"type": "mcp", "server_label": "calc", "server_url": url}])
        with pytest.raises(openai.BadRequestError, match="Host"):
            client.responses.create(
                model="smollm2-135m-instruct-q4_1", input="hi",
                tools=[{"type": "mcp", "server_label": "calc", "server_url": everything,
                        "headers": {"Host": "internal"}}])
    finally:
        process.stop()
    # the user lists the host in mcp.json: a request may name it, and waive approval there
    process, address, _ = _engine(tmp_path_factory, starters_dir, "listed",
                                  {"time": time_server(), "mine": {"url": everything}},
                                  ["--allow-request-mcp"])
    try:
        client = openai.OpenAI(base_url=address.url + "/v1", api_key=address.token)
        response = client.responses.create(
            model="smollm2-135m-instruct-q4_1", input="Add 2 and 3.",
            tools=[{"type": "mcp", "server_label": "calc", "server_url": everything,
                    "allowed_tools": ["get-sum"], "require_approval": "never"},
                   {"type": "mcp", "server_label": "time",
                    "allowed_tools": ["get_current_time"]}],
            tool_choice={"type": "mcp", "server_label": "calc", "name": "get-sum"},
            max_output_tokens=32, max_tool_calls=1)
        call = _items(response, "mcp_call")[0]
        assert call.server_label == "calc" and "The sum of" in call.output
        engine = psutil.Process(process.process.pid)
        servers = [p for p in engine.children(recursive=True)
                   if "mcp-server-time" in " ".join(p.cmdline())]
        assert len(servers) == 1  # started to list its tools
        engine.kill()  # no cleanup runs: the server sees its stdin close
        psutil.wait_procs(servers, timeout=15)
        assert not servers[0].is_running() or servers[0].status() == psutil.STATUS_ZOMBIE
    finally:
        process.stop()


@pytest.mark.parametrize("tool, field", [
    ({"type": "mcp"}, "server_label"),
    ({"type": "mcp", "server_label": "everything", "allowed_tools": 5}, "allowed_tools"),
    ({"type": "mcp", "server_label": "everything", "require_approval": "sometimes"},
     "require_approval"),
    ({"type": "mcp", "server_label": "bad label!"}, "server_label"),
])
def test_bad_mcp_tools_are_a_400_naming_the_field(http, tool, field):
    response = http.post("/v1/responses", json={
        "model": "smollm2-135m-instruct-q4_1", "input": "hi", "tools": [tool]})
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]


def test_bad_mcp_input_items_are_a_400(http):
    base = {"model": "smollm2-135m-instruct-q4_1",
            "tools": [{"type": "mcp", "server_label": "everything",
                       "allowed_tools": ["echo"]}]}
    orphan = http.post("/v1/responses", json={**base, "input": [
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}]})
    assert orphan.status_code == 400 and "approval_request_id" in orphan.text
    unknown = http.post("/v1/responses", json={**base, "input": "hi", "tool_choice": {
        "type": "mcp", "server_label": "everything", "name": "get-env"}})
    assert unknown.status_code == 400 and "tool_choice" in unknown.text  # not allowed here
    assert http.get("/health").status_code == 200
