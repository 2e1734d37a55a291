"""The coding agents people run, headless, against a real `homerack serve`: Claude Code
(Anthropic's Messages API as it speaks it: system messages among the messages, its
tools' schemas, `thinking`, `context_management`, `?beta=true`) and Codex through Ollama's
door (`--oss`: it probes `/v1/models` and `/api/version` there, then the Responses API with
`developer` messages, a `namespace` tool and the hosted `web_search`). Each answers with
no 4xx or 5xx; a second agent process finds the first one's prompt in the cache, and so
does that session's second turn.

The model is fixtures/agent_model.py's: the starter's vocabulary in a 32k context that
holds an agent's 9-20k-token prompt, a chat template with tools, answers that end by
themselves (they mean nothing). The agents come from npm's registry (make setup,
tests/agents/package.json); without npm these tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fixtures.agent_model import write_agent_model
from fixtures.network import free_port
from support import ROOT
from support.agent_templates import HERMES
from support.engines import api_client, start_engine
from support.models import STARTER

pytestmark = pytest.mark.slow
AGENTS = ROOT / "build" / "agents" / "node_modules" / ".bin"
ASK = "Reply with one word: hello"


def _agent(name: str):
    path = AGENTS / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (make setup installs it with npm)")
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory, starters_dir):
    home = tmp_path_factory.mktemp("agents")
    models = home / "data" / "models"
    models.mkdir(parents=True)
    write_agent_model(models / "agent-tiny.gguf", starters_dir / f"{STARTER}.gguf", HERMES)
    port = free_port()
    process, address, _ = start_engine(home, "agents", [
        "--model", "agent-tiny", "--ollama-port", str(port)])
    yield address, port, home
    process.stop()


def _run(argv: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    # PWD too: opencode takes its project folder from it, not from the working directory
    done = subprocess.run(argv, env={**os.environ, **env, "PWD": str(cwd)}, cwd=cwd,
                          capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done


def test_claude_code_answers_and_a_second_process_reads_the_cache(served, tmp_path):
    address, _, _ = served
    env = {"ANTHROPIC_BASE_URL": address.url, "ANTHROPIC_AUTH_TOKEN": address.token,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "HOME": str(tmp_path)}
    reports = []
    # two agent processes with the same system prompt and tools, then the second's
    # session continued (its second turn)
    for more in ([], [], ["--continue"]):
        done = _run([_agent("claude"), "-p", *more, ASK, "--model", "agent-tiny",
                     "--output-format", "json"], env, tmp_path)
        reports.append(json.loads(done.stdout))
    for report in reports:
        assert report["is_error"] is False and report.get("api_error_status") is None, report
    first, *later = (r["usage"] for r in reports)
    for usage in later:  # as the agent itself reports it
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert prompt > 9000  # an agent's prompt: its tools and instructions
        assert usage["cache_read_input_tokens"] > 0.9 * prompt, (first, later)


def test_codex_through_ollamas_door_answers(served, tmp_path):
    _, port, _ = served
    env = {"CODEX_OSS_BASE_URL": f"http://127.0.0.1:{port}/v1", "HOME": str(tmp_path)}
    done = _run([_agent("codex"), "exec", "--oss", "--local-provider", "ollama", "-m",
                 "agent-tiny", "--skip-git-repo-check", "--json", ASK], env, tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert "turn.completed" in kinds and "turn.failed" not in kinds, events
    usage = next(e["usage"] for e in events if e["type"] == "turn.completed")
    assert usage["input_tokens"] > 5000, usage
    with api_client(served[0]) as owner:  # the engine saw no refused request
        health = owner.get("/health").json()
    assert health["batching"]["requests"] >= 3


def test_opencode_answers_through_the_openai_compatible_api(served, tmp_path):
    address, _, _ = served
    (tmp_path / "opencode.json").write_text(json.dumps({"provider": {"homerack": {
        "npm": "@ai-sdk/openai-compatible", "name": "Homerack",
        "options": {"baseURL": f"{address.url}/v1", "apiKey": address.token},
        "models": {"agent-tiny": {"name": "agent-tiny"}}}}}))
    done = _run([_agent("opencode"), "run", "-m", "homerack/agent-tiny", ASK],
                {"HOME": str(tmp_path)}, tmp_path)
    assert "agent-tiny" in done.stdout + done.stderr


def test_qwen_code_answers_and_reads_its_prompt_from_the_cache(served, tmp_path):
    address, _, _ = served
    env = {"HOME": str(tmp_path), "OPENAI_BASE_URL": f"{address.url}/v1",
           "OPENAI_API_KEY": address.token, "OPENAI_MODEL": "agent-tiny"}
    done = _run([_agent("qwen"), "-p", ASK, "--auth-type", "openai", "-m", "agent-tiny",
                 "--output-format", "json"], env, tmp_path)
    report = json.loads(done.stdout)
    stats = report[-1]["stats"]["models"]["agent-tiny"] if isinstance(report, list) else \
        report["stats"]["models"]["agent-tiny"]
    assert stats["api"]["totalErrors"] == 0 and stats["api"]["totalRequests"] >= 1
    assert stats["tokens"]["prompt"] > 5000


def test_codex_with_a_responses_provider_answers(served, tmp_path):
    """Codex pointed at the owner's API (with the token) as a `model_providers` entry that
    speaks the Responses API."""
    address, _, _ = served
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(
        'model = "agent-tiny"\nmodel_provider = "homerack"\n\n[model_providers.homerack]\n'
        f'name = "Homerack"\nbase_url = "{address.url}/v1"\nenv_key = "HOMERACK_KEY"\n'
        'wire_api = "responses"\n')
    env = {"HOME": str(tmp_path), "HOMERACK_KEY": address.token}
    done = _run([_agent("codex"), "exec", "--skip-git-repo-check", "--json", ASK], env,
                tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert "turn.completed" in [e["type"] for e in events], events
