"""The benchmarks, each a module run as `python -m bench.NAME` from the repository root,
printing its ratio against an anchor measured in the same run (bench/common.py says what
they share). BENCHES is the one table of them: the suite (`make bench`, suite.py) runs
those with models at realistic scale, the quick-mode test (tests/packaging/test_benches.py)
runs every one, and docs/benchmarks.md lists them as `python -m bench` prints them
(a test compares). The models they run that no one can download here are fixtures/'s.

`python -m bench` (__main__.py) prints that list. Helpers, not benches: common.py (engines, checks, figures), build_tools.py (llama.cpp's
llama-bench, llama-server and rpc-server from the vendored commit: `build`,
`llama_bench`, `llama_server`), suite.py (the table of figures), routing_prompts.jsonl
(routing.py's labelled prompts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bench:
    name: str  # its module: python -m bench.NAME
    measures: str  # against its anchor, in a line
    suite_models: tuple[str, ...] = ()  # what `make bench` runs it on; none: not in the suite
    suite_options: tuple[str, ...] = ()
    takes_model: bool = True  # --model NAME (a models folder id or a shape of fixtures/)


BENCHES = (
    Bench("decode", "API vs llama-cpp-python vs llama-bench decode speed",
          ("qwen3-1.7b", "llama-3.2-3b", "qwen3-8b")),
    Bench("depth", "decode at 4k and 16k tokens of context vs llama-bench -d"),
    Bench("batching", "1/2/4/8 concurrent streams vs one by one, vs llama-server -np",
          ("qwen3-1.7b",), ("--tokens", "64")),
    Bench("prompt_cache", "follow-up TTFT: cold / RAM / disk vs llama-server; a new "
          "conversation's TTFT in turn with llama-server", ("qwen3-1.7b",)),
    Bench("agents", "coding agents' recorded sessions: TTFT per request vs llama-server "
          "(defaults, --cache-reuse 256); the first turn after a restart", takes_model=False),
    Bench("grammar", "JSON-schema-constrained vs free decode, vs llama-server", ("qwen3-1.7b",)),
    Bench("response_cache", "a cache hit against a cold request of the same length",
          ("qwen3-1.7b",)),
    Bench("lora", "an adapter's decode cost vs llama-server's, a switch vs a reload, mixed "
          "traffic", ("qwen3-1.7b",)),
    Bench("moe", "experts in RAM: API decode and prompt vs llama-bench and llama-server",
          ("qwen3-30b-a3b-8l",)),
    Bench("cluster", "0/1/2 RPC stages vs llama.cpp's rpc-server; gateway cost; cached load; "
          "a simulated 1 Gbit LAN (as root); a lost worker", ("qwen3-1.7b",)),
    Bench("fleet", "an agent's mix with models kept vs swapped; replicas: 8 streams, "
          "follow-ups cache-aware vs round-robin", ("smollm2-135m-instruct-q4_1",)),
    Bench("speculative", "draft and prompt lookup vs plain decoding, vs llama-server -md",
          takes_model=False),
    Bench("routing", "always small / always large / rules / cascade on 200 labelled prompts",
          takes_model=False),
    Bench("moe_split", "experts in RAM vs a whole-layer split at the same GPU memory "
          "(a GPU's llama-bench)", takes_model=False),
    Bench("vision", "first token with a 1024x768 picture, new and seen again, vs llama-server "
          "--mmproj; the image encode cache's gain", takes_model=False),
    Bench("documents", "retrieval hit@1/hit@5 (BM25, embeddings, hybrid) on the standard "
          "library; indexing vs llama-server --embedding; bytes written; search at 100k",
          takes_model=False),
    Bench("portable", "the packaged app's portable llama.cpp vs this machine's native build",
          takes_model=False),
    Bench("gpu", "the plan, 1/4/16 streams, a 3,000-token prompt and TTFT at 16 clients "
          "with the defaults vs llama-server -np 16 and llama-bench; GPU memory vs the plan"),
    Bench("voice", "Whisper's real-time factor through the API vs faster-whisper's own "
          "transcribe; first audio of a spoken answer vs eSpeak NG's own call; Piper's "
          "real-time factor through the API vs piper-onnx's own call, and Talk's first "
          "audio (docs/voice.md)",
          takes_model=False),
)
SUITE = tuple(b for b in BENCHES if b.suite_models)


def listing() -> str:
    """The benches as docs/benchmarks.md shows them."""
    lines = []
    for b in BENCHES:
        model = " [--model M]" if b.takes_model else ""
        suite = " (in make bench)" if b.suite_models else ""
        lines.append(f"    python -m bench.{b.name}{model}\n        {b.measures}{suite}")
    return "\n".join(lines) + "\n"
