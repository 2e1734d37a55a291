"""Real MCP servers from the package registries, driven by the engine's ToolServers as a
chat would: over stdio (mcp-server-time, mcp-server-git, server-everything,
server-filesystem) and Streamable HTTP (server-everything); and a server that crashes,
one that hangs, one that answers 10 MB: each an error result said in words, never a hung
or dead engine."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from engine.tools.config import spec_of
from engine.tools.servers import ToolServers
from support.mcp_servers import (everything_http, everything_stdio, filesystem, git_server,
                                 misbehaving, time_server)

pytestmark = pytest.mark.slow


@pytest.fixture
def servers(tmp_path):
    running = ToolServers(tmp_path / "logs", start_s=60)
    yield running
    running.close()


def test_time_server_over_stdio_says_the_time_in_tokyo(servers):
    spec = spec_of("time", time_server())
    names = {t.name for t in servers.tools(spec)}
    assert {"get_current_time", "convert_time"} <= names
    result = servers.call(spec, "get_current_time", {"timezone": "Asia/Tokyo"})
    assert not result.is_error
    said = json.loads(result.text)
    assert said["timezone"] == "Asia/Tokyo" and said["datetime"].endswith("+09:00")
    wrong = servers.call(spec, "get_current_time", {"timezone": "Mars/Olympus"})
    assert wrong.is_error and "Mars/Olympus" in wrong.text  # the model is told, no raise


def test_git_server_reads_a_repository(servers, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for command in (["init", "-q"], ["config", "user.email", "t@example.com"],
                    ["config", "user.name", "T"]):
        subprocess.run(["git", *command], cwd=repo, check=True)
    (repo / "notes.txt").write_text("first line\n")
    subprocess.run(["git", "add", "notes.txt"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "The first commit"], cwd=repo, check=True)
    (repo / "notes.txt").write_text("first line\nsecond line\n")
    spec = spec_of("git", git_server(repo))
    assert "git_status" in {t.name for t in servers.tools(spec)}
    status = servers.call(spec, "git_status", {"repo_path": str(repo)})
    assert not status.is_error and "notes.txt" in status.text
    history = servers.call(spec, "git_log", {"repo_path": str(repo)})
    assert "The first commit" in history.text
    diff = servers.call(spec, "git_diff_unstaged", {"repo_path": str(repo)})
    assert "+second line" in diff.text


def test_everything_over_streamable_http_and_stdio(servers):
    with everything_http() as url:
        remote = spec_of("everything", {"url": url})
        assert "echo" in {t.name for t in servers.tools(remote)}
        assert servers.call(remote, "echo", {"message": "over HTTP"}).text == "Echo: over HTTP"
    local = spec_of("everything-stdio", everything_stdio())
    assert servers.call(local, "get-sum", {"a": 2, "b": 40}).text.endswith("is 42.")
    picture = servers.call(local, "get-tiny-image", {})
    assert "[image: image/png" in picture.text  # named for a model that reads text


def test_filesystem_server_stays_in_its_folder(servers, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "plan.md").write_text("# The plan\nBuy a GPU.\n")
    (tmp_path / "secret.txt").write_text("not yours")
    spec = spec_of("files", filesystem(shared))
    read = servers.call(spec, "read_text_file", {"path": str(shared / "plan.md")})
    assert "Buy a GPU." in read.text
    outside = servers.call(spec, "read_text_file", {"path": str(tmp_path / "secret.txt")})
    assert outside.is_error and "not yours" not in outside.text


def test_a_crashed_server_is_reported_and_started_again(servers, tmp_path):
    spec = spec_of("bad", misbehaving())
    crashed = servers.call(spec, "crash", {})
    assert crashed.is_error and "bad" in crashed.text
    assert "crashing on purpose" in crashed.text  # its log's tail
    again = servers.call(spec, "fail", {})  # a new process answers the next call
    assert again.is_error and "always fails" in again.text
    assert servers.status()["bad"]["starts"] == 2
    assert (tmp_path / "logs" / "bad.log").exists()


def test_a_hanging_tool_times_out_and_the_server_restarts(servers):
    spec = spec_of("bad", {**misbehaving(), "timeout": 2})
    started = time.monotonic()
    hung = servers.call(spec, "hang", {})
    assert hung.is_error and "did not answer within 2 s" in hung.text
    assert time.monotonic() - started < 20
    assert servers.call(spec, "huge", {"megabytes": 0}).text == ""  # alive again


def test_a_10_mb_result_is_cut_saying_so(servers):
    spec = spec_of("bad", misbehaving())
    result = servers.call(spec, "huge", {"megabytes": 10}, max_chars=20_000)
    assert result.cut_from == 10 << 20
    assert len(result.text) < 20_200 and "10,485,760 characters" in result.text


def test_a_server_that_never_starts_is_reported(tmp_path):
    servers = ToolServers(tmp_path / "logs", start_s=2)
    try:
        spec = spec_of("mute", {"command": "sleep", "args": ["600"]})
        started = time.monotonic()
        result = servers.call(spec, "anything", {})
        assert result.is_error and "did not start within 2 s" in result.text
        assert time.monotonic() - started < 15
        missing = servers.call(spec_of("gone", {"command": "/nonexistent/mcp"}), "x", {})
        assert missing.is_error and "gone" in missing.text
    finally:
        servers.close()


def test_servers_start_with_an_allow_listed_environment(servers, monkeypatch):
    monkeypatch.setenv("HOMERACK_TEST_SECRET", "hunter2")
    spec = spec_of("bad", {**misbehaving(), "env": {"GIVEN": "1"}})
    names = servers.call(spec, "environment", {}).text.split()
    assert "GIVEN" in names and "PATH" in names
    assert "HOMERACK_TEST_SECRET" not in names


def test_an_idle_server_is_stopped(tmp_path):
    servers = ToolServers(tmp_path / "logs", idle_s=0.5)
    try:
        spec = spec_of("time", time_server())
        servers.tools(spec)
        deadline = time.monotonic() + 10
        while servers.status()["time"]["state"] == "ready" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert servers.status()["time"]["state"] == "stopped"
        assert servers.call(spec, "get_current_time", {"timezone": "UTC"}).is_error is False
    finally:
        servers.close()


def test_a_requests_server_that_fails_is_forgotten_and_connects_only_where_checked(servers):
    """A server a request names is not kept once it failed (each URL would stay for
    ever), and its connection goes through engine.outbound: loopback refused unless the
    user listed it."""
    import socket

    from engine.errors import ToolServerFailed
    from engine.tools.config import ServerSpec

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    dead = ServerSpec("calc", url=f"http://127.0.0.1:{port}/mcp", from_request=True,
                      allowed_hosts=frozenset({"127.0.0.1"}))
    with pytest.raises(ToolServerFailed):
        servers.tools(dead)
    assert servers.status() == {}  # not listed, not kept
    with everything_http() as url:
        refused = ServerSpec("calc", url=url, from_request=True)
        with pytest.raises(ToolServerFailed, match="loopback"):
            servers.tools(refused)
        listed = ServerSpec("calc", url=url, from_request=True,
                            allowed_hosts=frozenset({"127.0.0.1"}))
        assert "echo" in {t.name for t in servers.tools(listed)}
    assert list(servers.status()) == [f"request:{listed.identity}"]
