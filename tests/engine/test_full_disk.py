"""A full disk (a small tmpfs filled to the last byte): the engine's bookkeeping (the load
journal, the header cache, the calibration) is written best effort, so a model still
loads and answers; a reply the history cannot store stays on screen with the reason,
never lost silently."""

import errno
import subprocess

import pytest

from support.engines import GREEDY, run


@pytest.fixture
def full_disk(tmp_path):
    """A 2 MiB tmpfs (root, as here and on CI), filled; where it cannot be mounted, the
    test is skipped."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    filler = mount / "filler"

    def fill():
        try:
            with filler.open("ab") as handle:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC

    fill.path = mount
    fill.free = lambda: filler.unlink(missing_ok=True)
    try:
        yield fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_model_loads_and_answers_with_no_room_for_its_bookkeeping(full_disk, tiny_model,
                                                                     tmp_path):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore
    from engine.engine import Engine
    from engine.events import Finished
    from engine.settings import LoadSettings
    from engine.settings import EngineSettings

    full = full_disk.path
    full_disk()
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").symlink_to(tiny_model)
    store = ModelStore(models, GGUFInspector(full / "gguf-info.json"))
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=256), calibration_file=full / "c.json",
                                          load_journal=full / "journal.json",
                                          no_repack_file=full / "no-repack.json"))
    try:
        _, text, end = run(engine, model=store.resolve("tiny"), prompt="the cat", max_tokens=4,
                           sampling=GREEDY)
    finally:
        engine.close()
    assert isinstance(end, Finished), end
    assert text and not [p for p in full.iterdir() if p.name != "filler"]


def test_a_reply_the_history_cannot_store_stays_with_the_reason(full_disk):
    from app.history import History
    from app.session import NotSaved, Sessions

    history = History(full_disk.path / "history.sqlite3")
    chat = history.create("Paris", "", "smol")
    history.add_message(chat.id, "user", "Capital of France?")
    sessions = Sessions(history)
    sessions.start(chat.id)
    sessions.feed(chat.id, "Paris, " + "which is lovely. " * 20_000)
    full_disk()
    with pytest.raises(NotSaved, match="could not be saved"):
        sessions.finish(chat.id, "complete")
    kept = sessions.unsaved(chat.id)
    assert kept.text.startswith("Paris, ") and not sessions.running()
    full_disk.free()
    sessions.start(chat.id)  # the conversation goes on
    sessions.feed(chat.id, "Yes.")
    assert sessions.finish(chat.id, "complete").content == "Yes."
    assert sessions.unsaved(chat.id) is None
    history.close()
