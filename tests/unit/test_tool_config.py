"""The user's MCP configuration without any server running: mcp.json entries in the
notations of Claude Desktop, Cursor, LM Studio and VS Code, each bad entry with its
reason; an import that moves secrets into a keyring (keyring's real backend interface,
held in memory here: a headless machine has no system keyring); approvals bound to a
server's identity; results cut saying so."""

from __future__ import annotations

import json

import pytest
from keyring.backend import KeyringBackend

from engine.errors import InvalidRequest
from engine.tools.approvals import ALLOW, ASK, DENY, Approvals, Hints
from engine.tools.calls import ToolResult, cut
from engine.tools.config import (IN_KEYRING, import_servers, read_config, spec_of,
                                 with_secrets)


class MemoryKeyring(KeyringBackend):
    priority = 1

    def __init__(self):
        super().__init__()
        self.saved: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.saved.get((service, username))

    def set_password(self, service, username, password):
        self.saved[(service, username)] = password

    def delete_password(self, service, username):
        self.saved.pop((service, username), None)


def test_entries_of_every_notation_and_bad_ones_apart(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "remote": {"url": "https://example.com/mcp", "headers": {"X-Team": "a"},
                   "timeout": 5000},
        "windsurf": {"serverUrl": "http://127.0.0.1:9/mcp"},
        "both": {"command": "x", "url": "http://a/mcp"},
        "old": {"url": "http://127.0.0.1:9/sse"},
        "bad name!": {"command": "x"},
        "args": {"command": "x", "args": "not a list"}}}))
    config = read_config(path)
    assert set(config.servers) == {"time", "remote", "windsurf"}
    assert config.servers["time"].env == (("TZ", "UTC"),)
    assert config.servers["remote"].timeout_s == 5.0  # milliseconds, as Cursor writes
    assert "a command (stdio) or a url" in config.problems["both"]
    assert "SSE" in config.problems["old"]
    assert "must be a list" in config.problems["args"]
    assert "bad name!" in config.problems
    path.write_text(json.dumps({"servers": {"vscode": {"command": "x"}}}))
    assert set(read_config(path).servers) == {"vscode"}
    path.write_text("{not json")
    assert "cannot be read" in read_config(path).problems["mcp.json"]
    assert read_config(tmp_path / "none.json").servers == {}


def test_identity_is_the_program_its_arguments_environment_and_folder_or_the_url():
    one = spec_of("a", {"command": "node", "args": ["server.js"], "env": {"K": "1"}})
    assert one.identity == spec_of("b", {"command": "node", "args": ["server.js"],
                                         "env": {"K": "1"}}).identity  # the name is not it
    assert one.identity != spec_of("a", {"command": "node", "args": ["other.js"],
                                         "env": {"K": "1"}}).identity
    # the same program told to do another thing: another server, asked again
    assert one.identity != spec_of("a", {"command": "node", "args": ["server.js"],
                                         "env": {"K": "2"}}).identity
    assert one.identity != spec_of("a", {"command": "node", "args": ["server.js"],
                                         "env": {"K": "1"}, "cwd": "/tmp"}).identity
    assert spec_of("u", {"url": "http://h/mcp"}).identity != \
        spec_of("u", {"url": "http://h2/mcp"}).identity


def test_import_moves_secrets_to_the_keyring(tmp_path):
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(json.dumps({"mcpServers": {
        "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_secret", "DEBUG": "1"}},
        "remote": {"url": "https://example.com/mcp",
                   "headers": {"Authorization": "Bearer abc"}}}}))
    target = tmp_path / "mcp.json"
    target.write_text(json.dumps({"mcpServers": {"github": {"command": "mine"}}}))
    keys = MemoryKeyring()
    assert import_servers(claude, target, keys) == ["remote"]  # a name kept is not replaced
    written = json.loads(target.read_text())
    assert written["mcpServers"]["github"] == {"command": "mine"}
    assert written["mcpServers"]["remote"]["headers"]["Authorization"] == IN_KEYRING
    assert "abc" not in target.read_text()
    spec = read_config(target).servers["remote"]
    assert with_secrets(spec, keys).headers == (("Authorization", "Bearer abc"),)
    keys.saved.clear()
    with pytest.raises(InvalidRequest, match="not in the keyring"):
        with_secrets(spec, keys)
    target.unlink()
    import_servers(claude, target, keys)
    assert "ghp_secret" not in target.read_text() and '"DEBUG": "1"' in target.read_text()


def test_a_bad_import_changes_nothing(tmp_path):
    source = tmp_path / "cursor.json"
    source.write_text(json.dumps({"mcpServers": {"ok": {"command": "x"},
                                                 "bad": {"args": []}}}))
    target = tmp_path / "mcp.json"
    with pytest.raises(InvalidRequest, match="bad"):
        import_servers(source, target, MemoryKeyring())
    assert not target.exists()
    source.write_text("[]")
    with pytest.raises(InvalidRequest, match="no mcpServers"):
        import_servers(source, target, MemoryKeyring())


def test_approvals_are_bound_to_the_server_and_revocable(tmp_path):
    approvals = Approvals(tmp_path / "approvals.json")
    time_server = spec_of("time", {"command": "mcp-server-time"})
    assert approvals.policy(time_server, "get_current_time") == ASK
    approvals.decide(time_server, "get_current_time", ALLOW)
    approvals.decide(time_server, "convert_time", DENY)
    assert approvals.policy(time_server, "get_current_time") == ALLOW
    swapped = spec_of("time", {"command": "evil-time"})  # same name, another program
    assert approvals.policy(swapped, "get_current_time") == ASK
    assert [(a.tool, a.decision) for a in approvals.entries()] == \
        [("convert_time", DENY), ("get_current_time", ALLOW)]
    assert approvals.revoke(time_server.identity, "get_current_time")
    assert approvals.policy(time_server, "get_current_time") == ASK
    assert not approvals.revoke("nobody")
    assert (tmp_path / "approvals.json").stat().st_mode & 0o077 == 0


def test_read_only_tools_may_run_unasked_destructive_ones_never():
    spec = spec_of("fs", {"command": "x"})
    relaxed = Approvals(None, read_only_unasked=True)
    assert relaxed.policy(spec, "read", Hints(read_only=True, destructive=False)) == ALLOW
    assert relaxed.policy(spec, "write", Hints(read_only=False, destructive=True)) == ASK
    assert Approvals(None).policy(spec, "read", Hints(True, False)) == ASK


def test_a_long_result_is_cut_saying_so():
    result = cut(ToolResult("y" * 5000), 1000)
    assert result.cut_from == 5000 and result.text.startswith("y" * 1000)
    assert "5,000 characters" in result.text and "first 1,000" in result.text
    assert cut(ToolResult("short"), 1000).cut_from is None
