"""The suite's table (bench.suite, `make bench`): every figure with its anchor and
ratio, an unanchored one without a ratio, and a failed bench said as failed."""

from bench.suite import table

HOST = {"cpu": "Test CPU", "cores": 2, "ram_gib": 24.0, "ram_gbs": 20.5, "threads": 2,
        "system": "Linux x86_64", "date": "2026-12-03"}


def figure(value, anchor=None, **more):
    return {"bench": "decode", "model": "qwen3-1.7b-random", "figure": "decode", "value": value,
            "unit": "tok/s", "anchor": anchor, "anchor_name": "llama-bench tg" if anchor else "",
            "target": ">= 0.97", "quick": False, "ratio": value / anchor if anchor else None,
            **more}


def test_the_table_has_each_figure_its_anchor_and_each_failure():
    runs = [{"bench": "decode", "exit": 0, "seconds": 60, "last_line": "",
             "figures": [figure(26.0, 28.9), figure(4.9)]},
            {"bench": "batching", "exit": 1, "seconds": 5, "figures": [],
             "last_line": "bench error: the engine did not load its model"}]
    lines = table(runs, HOST).splitlines()
    assert "Test CPU, 2 cores" in lines[0] and "20.5 GB/s" in lines[0]
    rows = [line for line in lines if line.startswith("| decode |")]
    assert "| 26 tok/s | 28.9 tok/s llama-bench tg | 0.90x | >= 0.97 |" in rows[0]
    assert rows[1].endswith("| 4.9 tok/s | — | — | >= 0.97 |")
    failed = next(line for line in lines if line.startswith("| batching |"))
    assert "**failed** (exit 1)" in failed and "did not load its model" in failed
