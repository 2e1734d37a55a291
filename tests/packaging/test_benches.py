"""Every bench runs in its quick mode (a few tokens, one repetition, no anchors), so that
no change breaks one unnoticed: each must finish, time only answers the engine generated
(bench/common.py stops it otherwise), and print no ratio against an anchor it skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import bench
from support import ROOT
from support.engines import seed_gguf_info

pytestmark = pytest.mark.slow

# compared within one engine's run only: no anchor to skip
NO_ANCHOR = {"response_cache", "routing", "fleet"}
SUITE = {b.name for b in bench.SUITE}  # they report figures for its table
BENCHES = [b.name for b in bench.BENCHES]


@pytest.mark.parametrize("bench", BENCHES)
def test_the_bench_runs_quick_and_measures_generation(bench, home, request):
    env = dict(os.environ, HOMERACK_HOME=str(home / f"bench-{bench}"), PYTHONUNBUFFERED="1")
    models = home / f"bench-{bench}" / "data" / "models"  # the starters linked; what a
    models.mkdir(parents=True, exist_ok=True)              # bench makes stays its own
    for starter in (home / "data" / "models").glob("*.gguf"):
        if not (models / starter.name).exists():
            (models / starter.name).symlink_to(starter.resolve())
    seed_gguf_info(home, home / f"bench-{bench}")
    if bench == "speculative":  # the draft cut once for the suite: its engine finds it made
        shutil.copytree(request.getfixturevalue("cut_drafts"),
                        home / f"bench-{bench}" / "cache" / "drafts", dirs_exist_ok=True)
    figures = home / f"bench-{bench}.json"
    done = subprocess.run([sys.executable, "-m", f"bench.{bench}", "--quick",
                           "--threads", "2", "--json", str(figures)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "bench error" not in done.stderr
    if bench not in NO_ANCHOR:
        assert "quick mode: anchors not measured" in done.stdout, done.stdout[-2000:]
    assert "tok/s" in done.stdout or " s" in done.stdout or "t/s" in done.stdout
    if bench in SUITE:  # its figures, for the suite's table, measured (not anchored) here
        reported = json.loads(figures.read_text())
        assert reported and all(f["quick"] and f["value"] > 0 and
                                (f["anchor"] is None or bench in NO_ANCHOR)
                                for f in reported), reported


def test_the_benches_are_all_here():
    """The table names every bench on disk, and docs/benchmarks.md lists the table."""
    helpers = {"__init__", "__main__", "common", "build_tools", "suite"}
    on_disk = {p.stem for p in (ROOT / "bench").glob("*.py")} - helpers
    assert on_disk == set(BENCHES)
    assert bench.listing() in (ROOT / "docs" / "benchmarks.md").read_text()


def test_a_gpu_machine_names_its_own_tools_and_tokenizer_donor(monkeypatch, tmp_path):
    """../shared/device/run.sh builds llama-bench and llama-server for CUDA and brings a
    vocabulary-only donor (the starters cannot be installed there): the benches take them."""
    from bench.build_tools import build
    from bench.common import donor

    monkeypatch.setenv("HOMERACK_DEVICE_BINS", str(tmp_path / "bin"))
    monkeypatch.setenv("HOMERACK_SHAPE_DONOR", str(tmp_path / "vocab.gguf"))
    assert build() == tmp_path / "bin" and donor() == tmp_path / "vocab.gguf"
