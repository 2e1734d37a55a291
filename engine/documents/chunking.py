"""Lines into passages sized by the embedding model's own tokenizer: a passage never holds
more tokens than the embedder takes, keeps its page, its first and last line and the
heading above it, and does not cross a page. A line too long for one passage is split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .reading import Line

MAX_TOKENS = 240  # of a passage; the embedders here take 512 (MiniLM) or more


@dataclass(frozen=True)
class Passage:
    text: str
    page: int | None
    start_line: int
    end_line: int
    heading: str = ""


def passages(lines: Iterable[Line], count: Callable[[str], int],
             max_tokens: int = MAX_TOKENS) -> list[Passage]:
    """`count`: a text's tokens in the embedding model's vocabulary. `lines` are taken one
    at a time, and each is tokenized once (a blank line not at all)."""
    out: list[Passage] = []
    held: list[Line] = []
    tokens = 0
    for line, size in _short_lines(lines, count, max_tokens):
        if held and (tokens + size > max_tokens or line.page != held[0].page
                     or (line.heading != held[0].heading and tokens > max_tokens // 4)):
            out.append(_passage(held))
            held, tokens = [], 0
        if line.text.strip() or held:
            held.append(line)
            tokens += size
    if held:
        out.append(_passage(held))
    return [p for p in out if p.text.strip()]


def _passage(lines: list[Line]) -> Passage:
    return Passage("\n".join(line.text for line in lines).strip(), lines[0].page,
                   lines[0].number, lines[-1].number, lines[0].heading)


def _short_lines(lines: Iterable[Line], count, max_tokens: int
                 ) -> Iterable[tuple[Line, int]]:
    """Each line with its tokens (and one for its line break), cut by words where it
    alone holds too many."""
    for line in lines:
        size = count(line.text) if line.text.strip() else 0
        if size < max_tokens:
            yield line, size + 1
            continue
        words, piece = line.text.split(" "), []
        for word in words:
            piece.append(word[:2000])
            if count(" ".join(piece)) >= max_tokens - 8:
                text = " ".join(piece[:-1]) or piece[-1]
                yield Line(text, line.number, line.page, line.heading), count(text) + 1
                piece = [] if len(piece) == 1 else piece[-1:]
        if piece:
            text = " ".join(piece)
            yield Line(text, line.number, line.page, line.heading), count(text) + 1
