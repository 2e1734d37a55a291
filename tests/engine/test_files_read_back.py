"""Every small file the program reads back is checked against the shape it wrote: valid
JSON of the wrong shape (a hand edit, another version, a disk error) falls back to the
defaults with a warning in the log, and never crashes the engine, disables it, or stops
one of its threads later."""

import json
import logging

import pytest

from engine.files import read_json, write_atomic

WRONG = [[], "text", 3, None, {"x": [1, 2]}, {"memory": "lots"}, [{"id": "one"}],
         {"m": {"load": {"n_ctx": "big"}, "keep": {"pinned": "yes", "ttl_s": "soon"}}},
         [{"id": 1, "repo": 2, "quant": {}, "status": None}], {"version": "10", "entries": []},
         {"model": 3, "used": {"CPU": -1}, "stage": "flying"}, {"url": 1, "token": [], "pid": "x"},
         [{"name": 1, "address": None, "fingerprint": {}, "token": 2}],
         [{"host": "h", "token_sha256": 5}], {"code": 123456, "expires": "later"},
         {"temperature": "hot", "max_tokens": "many", "zoom": "big", "small": 7}]


@pytest.mark.parametrize("content", [json.dumps(w) for w in WRONG] + ["{not json", "\udcff"])
def test_files_of_the_wrong_shape_give_defaults(tmp_path, content, caplog):
    from app.engine_proc import read_engine_file
    from app.settings import RoutingChoice, Sampling, UiState, load_settings
    from engine.catalog.gguf_file import GGUFInspector
    from engine.cluster.pairing import Grants, Pairings, PairingWindow
    from engine.hub.downloads import Downloads
    from engine.machine.calibration import Calibration
    from engine.model.loader import LoadJournal
    from engine.presets import Keep, LoadOverride, Presets

    path = tmp_path / "file.json"
    path.write_text(content, errors="surrogateescape")
    with caplog.at_level(logging.WARNING, logger="homerack"):
        calibration = Calibration(path)
        assert calibration.for_architecture("llama") == () and calibration.speeds() == ()
        presets = Presets(path)
        assert presets.get("m").load is None and presets.get("m").keep is None
        presets.set("m", LoadOverride(n_ctx=4096), Keep(ttl_s=60.0))  # still works
        for kind in (Sampling, UiState, RoutingChoice):
            assert load_settings(path, kind) == kind()
        path.write_text(content, errors="surrogateescape")
        assert Downloads(tmp_path / "models", path).list() == []
        assert GGUFInspector(path).known(path) is False
        journal = LoadJournal(path, path)
        assert journal.unfinished(path) is None and not journal.repack_is_unsafe(path)
        assert read_engine_file(path) is None
        assert Pairings(path).all() == [] and Grants(path).admits("t") is None
        window = PairingWindow(path)
        window.refresh()
        assert window.code is None
    if content.startswith("{not") or content in ("{}",):
        assert "not what Homerack wrote" in caplog.text


def test_a_file_is_written_whole_private_and_read_back(tmp_path):
    path = tmp_path / "deep" / "f.json"
    write_atomic(path, json.dumps({"a": 1}))
    assert read_json(path, {"type": "object"}) == {"a": 1}
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_json(tmp_path / "missing.json", {}) is None
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]  # no temporary left


def test_a_file_reaches_the_disk_before_its_name_points_at_it(tmp_path, monkeypatch):
    """A power cut after the rename must not leave an empty settings, approvals or
    mcp.json: the text is synced before the rename, and the folder's entry after it."""
    import os
    import stat

    steps = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        steps.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda *a: steps.append("rename") or real_replace(*a))
    write_atomic(tmp_path / "mcp.json", '{"mcpServers": {}}')
    assert steps == ["file", "rename", "folder"]
    assert json.loads((tmp_path / "mcp.json").read_text()) == {"mcpServers": {}}
