"""Documents without a model: files read into lines that keep their page, line and
heading (text, Markdown, HTML, DOCX, PDF through its child); passages sized by a token
counter, never over its limit, never across a page; the SQLite index replacing a file
whole, keyword search by BM25, nearest vectors, and what it keeps across a reopen."""

from __future__ import annotations

import numpy as np
import pytest

from engine.documents.chunking import passages
from engine.documents.index import DocumentIndex
from engine.documents.reading import Line, Unreadable, read_lines
from fixtures.documents import pdf_bytes, write_docx


def words(text: str) -> int:
    """A token counter: one per word (the real one is the embedder's vocabulary)."""
    return len(text.split())


def test_each_kind_of_file_keeps_where_its_lines_are(tmp_path):
    (tmp_path / "guide.md").write_text("# Setup\nInstall it.\n```\n# not a heading\n```\n"
                                       "## Use\nRun it.\n")
    lines = list(read_lines(tmp_path / "guide.md"))
    assert [(l.number, l.heading) for l in lines if l.text == "Run it."] == [(7, "Use")]
    assert next(l for l in lines if l.text == "# not a heading").heading == "Setup"
    (tmp_path / "page.html").write_text("<html><head><style>p{}</style><script>evil()</script>"
                                        "</head><body><h1>Title</h1><p>First &amp; "
                                        "second</p></body></html>")
    assert [l.text for l in read_lines(tmp_path / "page.html")] == ["Title", "First & second"]
    (tmp_path / "manual.pdf").write_bytes(pdf_bytes(["Cover", "Torque is 12 Nm\nTighten it"]))
    pdf = list(read_lines(tmp_path / "manual.pdf"))
    assert any(l.page == 2 and "Torque is 12 Nm" in l.text for l in pdf)
    write_docx(tmp_path / "thesis.docx", [("Heading1", "Methods"), ("", "We measured.")])
    docx = list(read_lines(tmp_path / "thesis.docx"))
    assert docx[-1] == Line("We measured.", 2, None, "Methods")


def test_what_cannot_be_read_says_why(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "blob.txt").write_bytes(b"\0\1\2binary")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 nothing")
    (tmp_path / "broken.docx").write_bytes(b"PK not a zip")
    for name, why in (("photo.jpg", "not a kind"), ("blob.txt", "binary"),
                      ("broken.pdf", "PDF"), ("broken.docx", "DOCX"), ("gone.md", "cannot")):
        with pytest.raises(Unreadable, match=why):
            list(read_lines(tmp_path / name))  # some say so at once, some as they are read


def test_passages_fit_the_embedder_and_keep_their_place():
    lines = [Line(f"word{i} " * 30, i + 1, 1 + i // 20) for i in range(60)]
    lines.append(Line("x " * 1000, 61, 3))  # one line far over the limit
    found = passages(lines, words, max_tokens=100)
    assert all(words(p.text) <= 100 for p in found)
    assert all(p.page in (1, 2, 3) and p.start_line <= p.end_line for p in found)
    assert not any("word19" in p.text and "word20" in p.text for p in found)  # a page break
    assert sum(p.text.count("x") for p in found) >= 1000 - 20  # the long line is all there


def test_the_index_replaces_files_whole_and_searches(tmp_path):
    index = DocumentIndex(tmp_path / "documents.sqlite")
    index.add("manuals", [str(tmp_path)], "minilm")
    with pytest.raises(Exception, match="exists already"):
        index.add("manuals", [str(tmp_path)], "minilm")
    from engine.documents.chunking import Passage

    one = [Passage("The torque of the wheel bolts is 120 Nm", 4, 1, 1),
           Passage("Check the tyre pressure monthly", 5, 1, 1)]
    vectors = np.eye(2, 8, dtype=np.float32)
    index.put("manuals", "/m/car.pdf", 10, 1, one, vectors)
    index.fail("manuals", "/m/scan.pdf", 5, 1, "no text to read")
    assert index.keyword("manuals", "torque bolts", 5) == [index.keyword("manuals", "torque", 1)[0]]
    ids, cosine = index.similar("manuals", np.eye(1, 8, 1, dtype=np.float32)[0])
    nearest = int(ids[np.argmax(cosine)])
    assert list(cosine) == [0.0, 1.0]
    assert index.passages([nearest])[nearest].text.startswith("Check the tyre")
    index.put("manuals", "/m/car.pdf", 11, 2, one[:1], vectors[:1])  # changed: replaced
    listed = index.collections()[0]
    assert (listed["files_indexed"], listed["files_failed"], listed["passages"]) == (1, 1, 1)
    assert index.failures("manuals") == [{"path": "/m/scan.pdf", "error": "no text to read"}]
    assert index.keyword("manuals", 'tyre "OR pressure', 5) == []  # quoted: no FTS syntax
    index.close()
    again = DocumentIndex(tmp_path / "documents.sqlite")
    assert again.known("manuals") == {"/m/car.pdf": (11, 2, "done"),
                                      "/m/scan.pdf": (5, 1, "failed")}


def _collections(tmp_path):
    """Collections with a word-count embedder (the index's bookkeeping is the subject)."""
    from engine.documents.collections import Collections, Embedding

    def embed(texts, truncate=False):
        return np.array([[len(t.split()), 1.0] for t in texts], dtype=np.float32)

    return Collections(tmp_path / "docs.sqlite", lambda model: Embedding(
        "words", embed, lambda text: len(text.split()), lambda *_: np.zeros(0)))


def test_a_removed_collection_leaves_no_watch_or_timer_behind(tmp_path):
    """Two collections watch one folder; removing one drops its handler and its pending
    look, and a later change brings back only the other."""
    import time

    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "a.md").write_text("first words\n")
    documents = _collections(tmp_path)
    try:
        documents.add("one", [str(folder)])
        documents.add("two", [str(folder)])
        documents._changed("one")  # a look waiting for quiet when it is removed
        held = documents._pending["one"]
        documents.remove("one")
        assert "one" not in documents._watches and "one" not in documents._pending
        assert not held.is_alive() or held.finished.is_set()
        watch = documents._watches["two"][0][1]
        assert len(documents._observer._handlers[watch]) == 1  # only two's handler
        (folder / "a.md").write_text("changed words\n")
        deadline = time.monotonic() + 60
        while "changed" not in " ".join(r["text"] for r in documents.search("two", "changed")):
            assert time.monotonic() < deadline, "the change never reached collection two"
            time.sleep(0.1)
        assert "one" not in documents._progress  # its handler, had it stayed, fired as two's
        assert [c["name"] for c in documents.status()] == ["two"]
    finally:
        documents.close()


def test_a_folder_holds_only_its_regular_files(tmp_path):
    """Links (out of the folder, to a device, or to a file inside it), FIFOs: none is
    listed; the regular files are."""
    import os

    from engine.documents.collections import _files

    folder = tmp_path / "docs"
    folder.mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    (folder / "real.txt").write_text("inside")
    (folder / "out.txt").symlink_to(tmp_path / "secret.txt")
    (folder / "again.txt").symlink_to(folder / "real.txt")
    (folder / "zero.txt").symlink_to("/dev/zero")
    os.mkfifo(folder / "pipe.txt")
    (folder / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert list(_files([str(folder)])) == [str(folder / "real.txt")]
    for name in ("out.txt", "zero.txt", "pipe.txt"):  # and each refused when read by name
        with pytest.raises(Unreadable, match="link|regular"):
            list(read_lines(folder / name))
