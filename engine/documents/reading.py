"""A file as sections of text that keep where they came from: a page (PDF), a line range
and the heading above them (text, Markdown, code, HTML, DOCX). What cannot be read says
why in words (`Unreadable`); the indexer lists it and goes on. The one reader of files to
text: a file attached to a message is read by `read_text` here too.

A file is opened without following a link and without blocking, and read only when it
is a regular file (a FIFO named `.txt` or a link to /dev/zero is refused, not read).
Lines are yielded one at a time, never held as a list: 8 MiB of newlines is 8 million
lines. A file may hold MAX_LINES lines (paragraphs, for a DOCX) and MAX_TEXT_BYTES of
text (a DOCX's text part as it inflates); a PDF, read in a child with its own limits,
MAX_FILE_BYTES."""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO, Iterator
from xml.etree import ElementTree

from .pdf_pages import PdfError, pdf_pages

MAX_FILE_BYTES = 256 << 20  # a larger file is listed as too large, never read
MAX_TEXT_BYTES = 32 << 20  # of text, HTML or a DOCX's text part
MAX_LINES = 1_000_000  # of one file
TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".org", ".csv", ".tsv", ".log", ".tex",
                 ".py", ".js", ".ts", ".tsx", ".jsx", ".java", ".c", ".h", ".cpp", ".hpp",
                 ".cc", ".rs", ".go", ".rb", ".php", ".swift", ".kt", ".scala", ".sh",
                 ".sql", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".xml", ".css"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | {".pdf", ".docx"}
_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")


class Unreadable(ValueError):
    """Why a file cannot be indexed, in words."""


@dataclass(frozen=True)
class Line:
    """One line of a document, where it is."""
    text: str
    number: int  # 1-based, within its page for a PDF
    page: int | None = None
    heading: str = ""


def read_lines(path: Path) -> Iterator[Line]:
    """The file's lines, one at a time; Unreadable (at once, or as it is read) when it
    cannot be indexed."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise Unreadable(f"{suffix or 'no suffix'}: not a kind of file indexed here")
    handle = _opened(path, suffix)
    if suffix == ".pdf":
        handle.close()
        return _pdf(path)
    if suffix == ".docx":
        return _docx(handle)
    with handle:
        text = _text(handle)
    if suffix in HTML_SUFFIXES:
        return _numbered(_html_text(text))
    return _markdown(text) if suffix in (".md", ".markdown") else _numbered(text)


def read_text(path: Path, **pdf_limits) -> str:
    """A file's whole text, for a message it is attached to: by the same reader and under
    the same limits as a document indexed (`pdf_limits`: the PDF child's timeout and
    memory); a file of another suffix is read as plain text unless it is binary."""
    suffix = path.suffix.lower()
    handle = _opened(path, suffix)
    if suffix == ".pdf":
        handle.close()
        try:
            pages = pdf_pages(path, **pdf_limits)
        except PdfError as exc:
            raise Unreadable(str(exc)) from None
        return "\n\n".join(page.strip() for page in pages if page.strip())
    if suffix == ".docx":
        return "\n".join(line.text for line in _docx(handle))
    with handle:
        text = _text(handle)
    return _html_text(text) if suffix in HTML_SUFFIXES else text


def _opened(path: Path, suffix: str) -> BinaryIO:
    handle = open_regular(path)
    size = os.fstat(handle.fileno()).st_size
    limit = MAX_FILE_BYTES if suffix == ".pdf" else MAX_TEXT_BYTES
    if size > limit:
        handle.close()
        raise Unreadable(f"{size >> 20} MiB: larger than {limit >> 20} MiB")
    return handle


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file itself: a link is not followed
    and a FIFO or device does not block (checked on the open file, not by name)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        reason = "a link" if exc.errno == 40 else exc.strerror or exc  # ELOOP
        raise Unreadable(f"cannot be read ({reason})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable("not a regular file")
    return os.fdopen(fd, "rb")


def _pdf(path: Path) -> Iterator[Line]:
    try:
        pages = pdf_pages(path)
    except PdfError as exc:
        raise Unreadable(str(exc)) from None
    for number, page in enumerate(pages, 1):
        yield from _numbered(page, page=number)


def _text(handle: BinaryIO) -> str:
    try:
        data = handle.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_TEXT_BYTES:  # it grew since it was measured
        raise Unreadable(f"larger than {MAX_TEXT_BYTES >> 20} MiB")
    if b"\0" in data[:8192]:
        raise Unreadable("binary, not text")
    return data.decode("utf-8", errors="replace")


def _split(text: str) -> Iterator[tuple[int, str]]:
    """The text's lines, numbered, at most MAX_LINES of them (without a list of them all)."""
    for number, line in enumerate(io.StringIO(text, newline=None), 1):
        if number > MAX_LINES:
            raise Unreadable(f"more than {MAX_LINES:,} lines")
        yield number, line.rstrip("\n")


def _numbered(text: str, page: int | None = None) -> Iterator[Line]:
    for number, line in _split(text):
        yield Line(line, number, page)


def _markdown(text: str) -> Iterator[Line]:
    """Lines with the heading they fall under (# titles; fenced code is not a heading)."""
    heading, fenced = "", False
    for number, line in _split(text):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        found = None if fenced else _HEADING.match(line)
        if found:
            heading = found.group(2)
        yield Line(line, number, None, heading)


class _HtmlText(HTMLParser):
    """Visible text, one block per line; scripts and styles left out."""
    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
              "section", "article", "table", "dt", "dd", "blockquote", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "noscript", "template"):
            self.hidden += 1
        elif tag in self.BLOCKS:
            self._break()

    def handle_endtag(self, tag):
        if tag in ("script", "style", "noscript", "template"):
            self.hidden = max(0, self.hidden - 1)
        elif tag in self.BLOCKS:
            self._break()

    def _break(self):
        if not self.parts or self.parts[-1] != "\n":  # a run of empty blocks is one break
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def _html_text(text: str) -> str:
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


class _Capped(io.RawIOBase):
    """A stream that refuses to give more than `limit` bytes (a zip member may inflate
    past what it declares)."""

    def __init__(self, stream: BinaryIO, limit: int):
        self._stream, self._left = stream, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._stream.read(min(len(buffer), self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise Unreadable(f"its text part is larger than {MAX_TEXT_BYTES >> 20} MiB")
        buffer[:len(data)] = data
        return len(data)


def _docx(handle: BinaryIO) -> Iterator[Line]:
    """A Word document's paragraphs (numbered as lines), headings from their styles,
    parsed as they stream (each paragraph dropped once read)."""
    with handle:
        try:
            archive = zipfile.ZipFile(handle)
            info = archive.getinfo("word/document.xml")
            if info.file_size > MAX_TEXT_BYTES:
                raise Unreadable("its text part is too large to read")
            with archive.open(info) as member:
                yield from _paragraphs(_Capped(member, MAX_TEXT_BYTES))
        except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, OSError,
                EOFError, RuntimeError, NotImplementedError) as exc:
            raise Unreadable(f"not a readable DOCX ({type(exc).__name__})") from None


def _paragraphs(stream) -> Iterator[Line]:
    heading, number, open_ = "", 0, []  # the elements open around the parser's place
    for event, element in ElementTree.iterparse(io.BufferedReader(stream), ("start", "end")):
        if event == "start":
            open_.append(element)
            continue
        open_.pop()
        if element.tag != f"{_W}p":
            continue
        number += 1
        if number > MAX_LINES:
            raise Unreadable(f"more than {MAX_LINES:,} paragraphs")
        text = "".join(node.text or "" for node in element.iter(f"{_W}t"))
        style = element.find(f"{_W}pPr/{_W}pStyle")
        if style is not None and style.get(f"{_W}val", "").lower().startswith("heading"):
            heading = text
        if open_:
            open_[-1].remove(element)  # read: the tree keeps no paragraph
        yield Line(text, number, None, heading)
