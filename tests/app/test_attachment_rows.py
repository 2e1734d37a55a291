"""A message's pictures and files as rows beside it (app/history.py's attachments table):
the request's parts built from them, the same sha256 the engine gives the picture, a
history written by the version before (Markdown in the message) migrated in place, and an
export that still carries the pictures."""

from __future__ import annotations

import base64
import io
import json
import sqlite3

import pytest
from PIL import Image

from app.attachments import PICTURE, content_parts, fitted, read_image
from app.history import History
from app.session import Sessions
from app.transcripts import ImportError_, import_json, to_json, to_markdown
from engine.conversation.images import from_data_url


def _png(color=(200, 40, 40), size=(32, 24)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def test_a_picture_is_kept_as_its_file_and_the_engine_names_it_by_the_same_hash():
    picture = read_image("red.png", _png())
    assert picture.kind == PICTURE and picture.data == _png()  # no decode, no re-encode
    sent = content_parts("What colour?", (picture,))
    assert sent[0]["type"] == "image_url" and sent[1] == {"type": "text", "text": "What colour?"}
    assert from_data_url(sent[0]["image_url"]["url"], "x").digest == picture.sha256
    huge = io.BytesIO()
    Image.new("RGB", (3000, 100)).save(huge, "GIF")
    shrunk = read_image("wide.gif", huge.getvalue())  # a GIF past IMAGE_SIDE: a JPEG
    assert shrunk.data[:2] == b"\xff\xd8" and Image.open(io.BytesIO(shrunk.data)).width == 2048


def test_a_message_keeps_its_attachments_as_rows_and_sends_them_as_parts(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    chat = history.create("Pictures")
    notes = fitted("notes.md", "# Shopping\n- eggs", tokens=6, budget=100)
    picture = read_image("red.png", _png())
    history.add_message(chat.id, "user", "What is on the list?", attachments=(notes, picture))
    (message,) = history.messages(chat.id)
    assert message.content == "What is on the list?"
    assert message.attachments == (notes, picture)
    rows = sqlite3.connect(tmp_path / "h.sqlite3").execute(
        "SELECT position, kind, name, sha256, length(bytes) FROM attachments").fetchall()
    assert rows == [(0, "file", "notes.md", notes.sha256, len(notes.data)),
                    (1, "picture", "red.png", picture.sha256, len(_png()))]
    parts = Sessions(history).request(history.get(chat.id))[-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[0]["text"] == "Attached file notes.md:\n```\n# Shopping\n- eggs\n```"
    assert not history.conversations("iVBORw0K")  # no base64 in the search index
    history.delete(chat.id)
    history.purge()
    assert sqlite3.connect(tmp_path / "h.sqlite3").execute(
        "SELECT count(*) FROM attachments").fetchone() == (0,)


def _previous_version_history(path, content: str) -> None:
    """A history as the version before this one wrote it: its schema, no attachments
    table, the attachments in the message's text."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '', model TEXT, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL, content TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'complete');
        INSERT INTO conversations (id, title, updated) VALUES (1, 'Old', 0);""")
    db.execute("INSERT INTO messages (conversation_id, role, content) VALUES (1, 'user', ?)",
               (content,))
    db.execute("INSERT INTO messages (conversation_id, role, content) VALUES "
               "(1, 'assistant', 'Red. ![x](data:image/png;base64,AAAA)')")
    db.commit()
    db.close()


def test_a_history_written_by_the_previous_version_is_migrated_in_place(tmp_path):
    data = _png((10, 200, 10))
    old = ("![leaf.png](data:image/png;base64," + base64.b64encode(data).decode() + ")\n\n"
           "Attached file notes.md (the start of it):\n````\nuse ```x```\n````\n\n"
           "Which colour is it?")
    _previous_version_history(tmp_path / "h.sqlite3", old)
    history = History(tmp_path / "h.sqlite3")
    question, answer = history.messages(1)
    assert question.content == "Which colour is it?"
    picture, notes = question.attachments
    assert (picture.kind, picture.name, picture.data) == ("picture", "leaf.png", data)
    assert (notes.kind, notes.name, notes.text, notes.truncated) == (
        "file", "notes.md", "use ```x```", True)
    assert answer.attachments == () and "data:image" in answer.content  # answers untouched
    assert history.conversations("colour") and not history.conversations("iVBORw0K")
    history.close()
    again = History(tmp_path / "h.sqlite3")  # once: a second open changes nothing
    assert again.messages(1)[0].attachments == (picture, notes)
    assert sqlite3.connect(tmp_path / "h.sqlite3").execute(
        "SELECT count(*) FROM attachments").fetchone() == (2,)


def test_an_export_carries_the_pictures_and_an_old_export_is_imported(tmp_path):
    history = History(tmp_path / "a.sqlite3")
    chat = history.create("Leaf")
    picture = read_image("leaf.png", _png((10, 200, 10)))
    history.add_message(chat.id, "user", "Which colour?", attachments=(picture,))
    exported = to_json(history, [history.get(chat.id)])
    assert json.loads(exported)["version"] == 2
    markdown = to_markdown(history, [history.get(chat.id)])
    assert picture.data_url in markdown and "Which colour?" in markdown
    other = History(tmp_path / "b.sqlite3")
    (imported,) = import_json(other, exported)
    assert other.messages(imported.id)[0].attachments == (picture,)
    old = json.loads(exported)
    message = old["conversations"][0]["messages"][0]
    message["content"] = f"![leaf.png]({picture.data_url})\n\nWhich colour?"
    del message["attachments"]
    old["version"] = 1
    (from_old,) = import_json(other, json.dumps(old))
    (question,) = other.messages(from_old.id)
    assert (question.content, question.attachments) == ("Which colour?", (picture,))


def test_an_import_whose_picture_is_no_picture_is_refused_whole(tmp_path):
    history = History(tmp_path / "a.sqlite3")
    bad = {"format": "homerack-conversations", "version": 2, "conversations": [
        {"title": "ok", "messages": [{"role": "user", "content": "hi"}]},
        {"title": "bad", "messages": [{"role": "user", "content": "hi", "attachments": [
            {"kind": "picture", "name": "x.png",
             "data": base64.b64encode(b"<svg/>").decode()}]}]}]}
    with pytest.raises(ImportError_, match="conversations/1/messages/0/attachments/0"):
        import_json(history, json.dumps(bad))
    bad["conversations"][1]["messages"][0]["attachments"][0]["data"] = "not base64!"
    with pytest.raises(ImportError_, match="not base64"):
        import_json(history, json.dumps(bad))
    assert history.conversations() == []  # nothing of it was added
