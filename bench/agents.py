"""The coding agents' own sessions, replayed: time to first token of each request an agent
made, Homerack against llama-server on the same requests, in one run.

Recorded here, at bench time, from the real clients (build/agents/, `make setup`; the
agents' prompt texts are never committed): each agent through a recording door in front
of a Homerack, three turns — a first question, the same session continued, and a new
agent process in the same folder (the same tools and instructions, a new client). Then
each recorded request is sent again, in order, asking for one token, to:

  homerack      `homerack serve` with its defaults (prompt cache on, RAM and disk tiers)
  llama-server  llama.cpp's (the vendored commit) with its defaults, and again with
                `--cache-reuse 256`; per request the faster of the two is the anchor
  restart       each engine stopped and started again, the first turn's requests sent
                again: Homerack from its disk tier, llama-server from nothing

The model is fixtures/agent_model.py's (a 32k context with tools; its answers mean
nothing; two layers 64 wide, so the prompt's length, not the model, decides the time).
Targets: every request of a later turn (2 and 3) at least 1.0x llama-server's; the first
turn after a restart at least 5x faster than llama-server's after its restart.

    python -m bench.agents [--agent claude-code] [--threads 2] [--quick]

--quick (make test): Claude Code only (its first turn and a new process), Homerack only,
no anchors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from .build_tools import build, llama_server
from .common import (BenchError, QUICK_NOTE, ROOT, arguments, donor, ratio, report,
                     start_engine)
from app.paths import paths
from fixtures.agent_model import HERMES, write_agent_model

MODEL = "agent-tiny"
AGENT_BIN = ROOT / "build" / "agents" / "node_modules" / ".bin"
ASK, AGAIN = "Reply with one word: hello", "Reply with one word: goodbye"
GENERATION = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


@dataclass(frozen=True)
class Recorded:
    """One request an agent made: the turn it belongs to (1 first, 2 continued, 3 a new
    process), the path it went to (query included) and its body."""
    turn: int
    path: str
    body: dict


# -- recording ---------------------------------------------------------------------------

class RecordingDoor:
    """A loopback HTTP server that passes every request on to `target` and keeps the
    generation requests' bodies (answers are passed on whole: the agents take an SSE
    stream that arrives at once)."""

    def __init__(self, target: str):
        self.target, self.turn, self.kept = target, 1, []
        door = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def _pass_on(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "POST" and self.path.split("?")[0] in GENERATION:
                    door.kept.append(Recorded(door.turn, self.path, json.loads(body)))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "accept-encoding")}
                reply = httpx.request(self.command, door.target + self.path, content=body,
                                      headers=headers, timeout=600)
                self.send_response(reply.status_code)
                for key, value in reply.headers.items():
                    if key.lower() not in ("transfer-encoding", "content-length",
                                           "connection", "content-encoding"):
                        self.send_header(key, value)
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = do_HEAD = do_DELETE = _pass_on

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _bin(name: str) -> str:
    return str(AGENT_BIN / name)


def claude_code(url: str, token: str, home: Path, _work: Path):
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
    ask = [_bin("claude"), "-p", "--model", MODEL, "--output-format", "json"]
    return env, [[*ask, ASK], [*ask, "--continue", AGAIN], [*ask, ASK]]


def codex(url: str, token: str, home: Path, _work: Path):
    (home / ".codex").mkdir(exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "homerack"\n\n[model_providers.homerack]\n'
        f'name = "Homerack"\nbase_url = "{url}/v1"\nenv_key = "HOMERACK_KEY"\n'
        'wire_api = "responses"\n')
    ask = [_bin("codex"), "exec", "--skip-git-repo-check", "--json"]
    resume = [_bin("codex"), "exec", "resume", "--last", "--skip-git-repo-check", "--json"]
    return {"HOMERACK_KEY": token}, [[*ask, ASK], [*resume, AGAIN], [*ask, ASK]]


def opencode(url: str, token: str, _home: Path, work: Path):
    (work / "opencode.json").write_text(json.dumps({"provider": {"homerack": {
        "npm": "@ai-sdk/openai-compatible", "name": "Homerack",
        "options": {"baseURL": f"{url}/v1", "apiKey": token},
        "models": {MODEL: {"name": MODEL}}}}}))
    ask = [_bin("opencode"), "run", "-m", f"homerack/{MODEL}"]
    return {}, [[*ask, ASK], [*ask, "--continue", AGAIN], [*ask, ASK]]


def qwen_code(url: str, token: str, _home: Path, _work: Path):
    env = {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": token, "OPENAI_MODEL": MODEL}
    ask = [_bin("qwen"), "--auth-type", "openai", "-m", MODEL, "--output-format", "json"]
    return env, [[*ask, "-p", ASK], [*ask, "--continue", "-p", AGAIN], [*ask, "-p", ASK]]


AGENTS = {"claude-code": (claude_code, "claude"), "codex": (codex, "codex"),
          "opencode": (opencode, "opencode"), "qwen-code": (qwen_code, "qwen")}


def record(agent: str, url: str, token: str, turns_kept=(1, 2, 3)) -> list[Recorded]:
    """The agent's turns (`turns_kept` of its three) through a recording door in front of
    `url`."""
    how, _ = AGENTS[agent]
    door = RecordingDoor(url)
    with tempfile.TemporaryDirectory(prefix=f"bench-{agent}-") as folder:
        home, work = Path(folder) / "home", Path(folder) / "work"
        home.mkdir()
        work.mkdir()
        env, turns = how(door.url, token, home, work)
        env = {**os.environ, **env, "HOME": str(home), "PWD": str(work)}
        try:
            for turn, argv in enumerate(turns, 1):
                if turn not in turns_kept:
                    continue
                door.turn = turn
                done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True,
                                      timeout=300, stdin=subprocess.DEVNULL)
                if done.returncode != 0:
                    raise BenchError(f"{agent}, turn {turn}: exit {done.returncode}\n"
                                     f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
        finally:
            door.close()
    if not any(r.turn == 1 for r in door.kept):
        raise BenchError(f"{agent} made no generation request")
    return door.kept


# -- replaying ---------------------------------------------------------------------------

def one_token(recorded: Recorded) -> dict:
    """The recorded body asking for one token, in one reply (not streamed): its time is the
    time to the first token. Anthropic's `thinking` goes (its budget must stay under
    max_tokens); nothing the prompt is made of changes."""
    body = {k: v for k, v in recorded.body.items()
            if k not in ("stream", "stream_options", "thinking", "max_completion_tokens")}
    body["stream"] = False
    if recorded.path.startswith("/v1/responses"):
        body["max_output_tokens"] = 1
    else:
        body["max_tokens"] = 1
    return body


def for_llama_server(recorded: Recorded) -> Recorded:
    """The same prompt for llama-server: it skips a Responses `namespace` tool (Codex's
    sub-agent tools) where Homerack flattens it into function tools, so its prompt would
    be 2-3k tokens shorter; it is sent them flattened, as Homerack serves them."""
    tools = recorded.body.get("tools")
    if not recorded.path.startswith("/v1/responses") or not isinstance(tools, list):
        return recorded
    flat = [inner for t in tools for inner in (
        t.get("tools", []) if t.get("type") == "namespace" else [t])]
    return Recorded(recorded.turn, recorded.path, {**recorded.body, "tools": flat})


def usage_of(path: str, answer: dict) -> tuple[int, int]:
    """(prompt tokens, of them from the cache) as each wire format reports them."""
    usage = answer.get("usage") or {}
    if path.startswith("/v1/messages"):  # Anthropic's input_tokens leave the cached out
        cached = usage.get("cache_read_input_tokens") or 0
        return usage.get("input_tokens", 0) + cached, cached
    if path.startswith("/v1/responses"):
        return usage.get("input_tokens", 0), \
            (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return usage.get("prompt_tokens", 0), \
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def send(client: httpx.Client, recorded: Recorded, checked: bool) -> tuple[float, int, int]:
    """Seconds to the one-token answer, and its (prompt, cached) tokens (Homerack's:
    `checked`, a generated answer with its usage)."""
    for attempt in (1, 2):  # llama-server closes a kept-alive connection now and then
        try:
            start = time.perf_counter()
            reply = client.post(recorded.path, json=one_token(recorded))
            seconds = time.perf_counter() - start
            break
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
    if reply.status_code != 200:
        raise BenchError(f"{client.base_url}{recorded.path} (turn {recorded.turn}): "
                         f"{reply.status_code} {reply.text[:400]}")
    prompt, cached = usage_of(recorded.path, reply.json())
    if checked and prompt <= 0:
        raise BenchError(f"{recorded.path}: no usage in Homerack's answer")
    return seconds, prompt, cached


def replay(url: str, token: str | None, session: list[Recorded], checked: bool) -> list:
    headers = {"Authorization": f"Bearer {token}", "x-api-key": token} if token else {}
    with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
        return [send(client, r, checked) for r in session]


# -- the engines -------------------------------------------------------------------------

def agent_model() -> None:
    path = paths().models / f"{MODEL}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_agent_model(path, donor(), HERMES)


def homerack(threads: int, *extra: str):
    return start_engine(["--threads", str(threads), "--model", MODEL, *extra])


def homerack_runs(sessions: dict, threads: int) -> tuple[dict, dict]:
    """Each session replayed on a Homerack with an empty prompt cache; then, after a
    restart, each agent's first turn again (from the disk tier)."""
    shutil.rmtree(paths().cache / "kv", ignore_errors=True)
    engine = homerack(threads)
    try:
        times = {agent: replay(engine.url, engine.token, s, True) for agent, s in sessions.items()}
        time.sleep(2)  # the disk tier's writer
    finally:
        engine.stop()
    engine = homerack(threads)
    try:
        again = {agent: first_turn(replay(engine.url, engine.token, first(s), True))
                 for agent, s in sessions.items()}
    finally:
        engine.stop()
    for agent, (_, prompt, cached) in again.items():
        if cached < 0.5 * prompt:
            raise BenchError(f"{agent} after a restart: {cached} of {prompt} prompt tokens "
                             "came from the disk tier")
    return times, again


def first(session: list[Recorded]) -> list[Recorded]:
    return [r for r in session if r.turn == 1]


def first_turn(times: list) -> tuple[float, int, int]:
    """A turn's requests added up: (seconds, prompt tokens, of them cached)."""
    return tuple(sum(column) for column in zip(*times))


def llama_server_runs(bins: Path, sessions: dict, threads: int, reuse: bool) -> tuple[dict, dict]:
    args = ["-m", str(paths().models / f"{MODEL}.gguf"), "-c", "32768", "-t", str(threads),
            "--jinja", *(["--cache-reuse", "256"] if reuse else [])]
    times, again = {}, {}
    for agent, session in sessions.items():  # a fresh server each: each session its own
        session = [for_llama_server(r) for r in session]
        with llama_server(bins, args) as url:
            times[agent] = replay(url, None, session, False)
        with llama_server(bins, args) as url:  # restarted
            again[agent] = first_turn(replay(url, None, first(session), False))
    return times, again


# -- the table ---------------------------------------------------------------------------

def table(agent: str, session, ours, plain, reused) -> float:
    """Prints one agent's requests; returns the worst ratio of its later turns (the first
    turn's requests are new prompts to both: their ratio is printed, not a target)."""
    print(f"\n{agent}: time to first token per request (one token asked), seconds")
    print(f"{'turn':>4}{'req':>5}{'prompt':>8}{'cached':>8}{'homerack':>10}"
          f"{'llama-server':>14}{'--cache-reuse':>15}{'x':>7}")
    worst = 1e9
    for i, recorded in enumerate(session):
        seconds, prompt, cached = ours[i]
        row = f"{recorded.turn:>4}{i + 1:>5}{prompt:>8}{cached:>8}{seconds:>10.3f}"
        if plain is None:
            print(row)
            continue
        anchor = min(plain[i][0], reused[i][0])
        speedup = ratio(anchor, seconds, f"{agent} request {i + 1}", 0.05, 10_000)
        print(f"{row}{plain[i][0]:>14.3f}{reused[i][0]:>15.3f}{speedup:>6.2f}x")
        if recorded.turn > 1:
            worst = min(worst, speedup)
    return worst


def main() -> int:
    args = arguments(__doc__, {}, more=lambda p: p.add_argument(
        "--agent", action="append", choices=sorted(AGENTS), default=[]))
    agents = args.agent or (["claude-code"] if args.quick else list(AGENTS))
    missing = [a for a in agents if not (AGENT_BIN / AGENTS[a][1]).exists()]
    if missing:
        print(f"not installed (make setup installs the agents with npm): {', '.join(missing)}")
        if len(missing) == len(agents):
            print(QUICK_NOTE if args.quick else "nothing to measure")
            return 0
        agents = [a for a in agents if a not in missing]
    agent_model()
    bins = None if args.quick else build()

    recorder = homerack(args.threads, "--no-prompt-cache")
    try:
        kept = (1, 3) if args.quick else (1, 2, 3)  # quick: the first, then a new process
        sessions = {agent: record(agent, recorder.url, recorder.token, kept) for agent in agents}
    finally:
        recorder.stop()
    ours, ours_again = homerack_runs(sessions, args.threads)
    if args.quick:
        for agent, session in sessions.items():
            table(agent, session, ours[agent], None, None)
            seconds, prompt, cached = ours_again[agent]
            print(f"{agent} after a restart: {seconds:.3f} s ({cached} of {prompt} cached)")
            report(MODEL, f"{agent}: a new agent process (turn 3), its last request", ours[agent][-1][0], "s")
        print(QUICK_NOTE)
        return 0

    plain, plain_again = llama_server_runs(bins, sessions, args.threads, reuse=False)
    reused, reused_again = llama_server_runs(bins, sessions, args.threads, reuse=True)
    worst, worst_restart = 1e9, 1e9
    for agent, session in sessions.items():
        worst = min(worst, table(agent, session, ours[agent], plain[agent], reused[agent]))
        anchor = min(plain_again[agent][0], reused_again[agent][0])
        restart = ratio(anchor, ours_again[agent][0], f"{agent} restart", 0.5, 100_000)
        worst_restart = min(worst_restart, restart)
        print(f"after a restart, the first turn: homerack {ours_again[agent][0]:.3f} s "
              f"({ours_again[agent][2]} of {ours_again[agent][1]} from the disk tier), "
              f"llama-server {anchor:.3f} s: {restart:.1f}x")
        last = len(session) - 1
        report(MODEL, f"{agent}: a new agent process (turn 3), its last request", ours[agent][last][0],
               "s", min(plain[agent][last][0], reused[agent][last][0]),
               "llama-server (faster of defaults and --cache-reuse 256)", "<= 1")
        report(MODEL, f"{agent}: first turn after a restart", ours_again[agent][0], "s",
               anchor, "llama-server after its restart", "<= 0.2")
    print(f"\nworst request of a later turn: {worst:.2f}x llama-server (target >= 1.0x); "
          f"first turn after a restart: {worst_restart:.1f}x (target >= 5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
