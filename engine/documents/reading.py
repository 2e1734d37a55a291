"""A file as sections of text that keep where they came from: a page (PDF), a line range
and the heading above them (text, Markdown, code, HTML, DOCX). What cannot be read says
why in words (`Unreadable`); the indexer lists it and goes on."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

MAX_FILE_BYTES = 256 << 20  # a larger file is listed as too large, never read
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


def read_lines(path: Path) -> list[Line]:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise Unreadable(f"{suffix or 'no suffix'}: not a kind of file indexed here")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    if size > MAX_FILE_BYTES:
        raise Unreadable(f"{size >> 20} MiB: larger than {MAX_FILE_BYTES >> 20} MiB")
    if suffix == ".pdf":
        from .pdf_pages import PdfError, pdf_pages
        try:
            pages = pdf_pages(path)
        except PdfError as exc:
            raise Unreadable(str(exc)) from None
        return [line for number, page in enumerate(pages, 1)
                for line in _plain(page, page=number)]
    if suffix == ".docx":
        return _docx(path)
    text = _text(path)
    if suffix in HTML_SUFFIXES:
        return _plain(_html_text(text))
    return _markdown(text) if suffix in (".md", ".markdown") else _plain(text)


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
    if b"\0" in data[:8192]:
        raise Unreadable("binary, not text")
    return data.decode("utf-8", errors="replace")


def _plain(text: str, page: int | None = None) -> list[Line]:
    return [Line(line, number, page) for number, line in enumerate(text.splitlines(), 1)]


def _markdown(text: str) -> list[Line]:
    """Lines with the heading they fall under (# titles; fenced code is not a heading)."""
    lines, heading, fenced = [], "", False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        found = None if fenced else _HEADING.match(line)
        if found:
            heading = found.group(2)
        lines.append(Line(line, number, None, heading))
    return lines


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
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "noscript", "template"):
            self.hidden = max(0, self.hidden - 1)
        elif tag in self.BLOCKS:
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


def _docx(path: Path) -> list[Line]:
    """A Word document's paragraphs (numbered as lines), headings from their styles."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo("word/document.xml")
            if info.file_size > MAX_FILE_BYTES:
                raise Unreadable("its text part is too large to read")
            root = ElementTree.fromstring(archive.read(info))
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, OSError) as exc:
        raise Unreadable(f"not a readable DOCX ({type(exc).__name__})") from None
    lines, heading = [], ""
    for number, paragraph in enumerate(root.iter(f"{_W}p"), 1):
        text = "".join(node.text or "" for node in paragraph.iter(f"{_W}t"))
        style = paragraph.find(f"{_W}pPr/{_W}pStyle")
        if style is not None and style.get(f"{_W}val", "").lower().startswith("heading"):
            heading = text
        lines.append(Line(text, number, None, heading))
    return lines
