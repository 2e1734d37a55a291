"""Conversations exported as Markdown and JSON and imported again; files attached to a
message (app/transcripts.py, app/attachments.py)."""

import json

import pytest

from fixtures.documents import pdf_bytes, write_docx

from app.attachments import AttachmentError, fitted, read_text
from app.history import History
from app.transcripts import ImportError_, import_json, to_json, to_markdown


def test_export_and_import_round_trip_the_shown_branch(tmp_path):
    history = History(tmp_path / "a.sqlite3")
    chat = history.create("Paris", "Be brief.", "smol")
    history.update(chat.id, adapters=[("persona", 0.5)])
    history.add_message(chat.id, "user", "Capital of France?")
    old = history.add_message(chat.id, "assistant", "Lyon", model="smol")
    history.rewind(chat.id, old.id)
    history.add_message(chat.id, "assistant", "Paris", model="smol", detail="from the cache")
    exported = to_json(history, [history.get(chat.id)])
    markdown = to_markdown(history, [history.get(chat.id)])
    assert "# Paris" in markdown and "## Assistant (smol)" in markdown
    assert "Lyon" not in markdown and "Lyon" not in exported
    other = History(tmp_path / "b.sqlite3")
    (imported,) = import_json(other, exported)
    assert (imported.title, imported.system_prompt, imported.model) == ("Paris", "Be brief.",
                                                                        "smol")
    assert imported.adapters == (("persona", 0.5),)
    assert [(m.role, m.content, m.detail) for m in other.messages(imported.id)] == [
        ("user", "Capital of France?", ""), ("assistant", "Paris", "from the cache")]
    assert json.loads(to_json(other, other.conversations()))["conversations"][0]["title"] \
        == "Paris"


@pytest.mark.parametrize("text", ["not json", '{"conversations": []}',
                                  '{"format": "homerack-conversations", "conversations": [1]}'])
def test_importing_something_else_says_what_is_wrong(tmp_path, text):
    with pytest.raises(ImportError_):
        import_json(History(tmp_path / "h.sqlite3"), text)


def test_text_and_pdf_attachments_are_read_and_binaries_refused(tmp_path):
    """By the documents' reader (one reader of files to text): a DOCX is read too, and a
    link is not followed."""
    code = tmp_path / "hello.py"
    code.write_text("print('hello')\n")
    assert read_text(code) == "print('hello')\n"
    pdf = tmp_path / "note.pdf"
    pdf.write_bytes(pdf_bytes(["Homerack reads PDFs"]))
    assert "Homerack reads PDFs" in read_text(pdf)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\0\1\2" * 100)
    with pytest.raises(AttachmentError, match="blob.bin: binary, not text"):
        read_text(binary)
    docx = tmp_path / "plan.docx"
    write_docx(docx, [("Heading1", "The plan"), ("", "Bake at dawn.")])
    assert read_text(docx) == "The plan\nBake at dawn."
    (tmp_path / "link.txt").symlink_to(code)
    with pytest.raises(AttachmentError, match="a link"):
        read_text(tmp_path / "link.txt")
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4 nothing else")
    with pytest.raises(AttachmentError):
        read_text(broken)


def test_a_file_too_long_for_the_context_offers_its_start():
    whole = fitted("a.txt", "x" * 1000, tokens=500, budget=1000)
    assert not whole.truncated and whole.text == "x" * 1000
    cut = fitted("a.txt", "x" * 1000, tokens=500, budget=100)
    assert cut.truncated and len(cut.text) == 200 and "(the start of it)" in cut.as_context()
    fenced = fitted("r.md", "```py\nx\n```", tokens=5, budget=10).as_context()
    assert fenced.startswith("Attached file r.md:\n````\n") and fenced.endswith("\n````")


def test_a_pdf_is_read_in_a_child_with_a_timeout_and_a_memory_limit(tmp_path):
    """A parser's bug (a bomb, a loop) costs the child: the window's process never
    parses a PDF."""
    pdf = tmp_path / "note.pdf"
    pdf.write_bytes(pdf_bytes(["Homerack reads PDFs"]))
    with pytest.raises(AttachmentError, match="note.pdf: reading it took more than 0.01 s"):
        read_text(pdf, timeout=0.01)
    with pytest.raises(AttachmentError, match="needs more than 40 MiB"):
        read_text(pdf, memory=40 << 20)
    assert "Homerack reads PDFs" in read_text(pdf)


def test_an_import_is_all_or_nothing_and_bounded(tmp_path, monkeypatch):
    import sqlite3

    from app.transcripts import FORMAT, MAX_IMPORT_BYTES, import_file

    history = History(tmp_path / "h.sqlite3")
    good = {"title": "ok", "messages": [{"role": "user", "content": "hi"}]}
    wrong = {"title": "bad", "messages": [{"role": "user", "content": 42}]}
    with pytest.raises(ImportError_, match="conversations/1/messages/0/content"):
        import_json(history, json.dumps({"format": FORMAT, "conversations": [good, wrong]}))
    assert history.conversations() == []  # the good one was not kept alone
    calls = []

    def full(*args, **kwargs):  # the disk fills on the third message
        calls.append(args)
        if len(calls) == 3:
            raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kwargs)
    real = history.add_message
    monkeypatch.setattr(history, "add_message", full)
    with pytest.raises(ImportError_, match="disk is full"):
        import_json(history, json.dumps({"format": FORMAT, "conversations": [good] * 5}))
    assert history.conversations() == []
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_IMPORT_BYTES + 1)
    with pytest.raises(ImportError_, match="over 64 MiB"):
        import_file(history, big)
    deep = '{"format": "%s", "conversations": %s}' % (FORMAT, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ImportError_):
        import_json(history, deep)
