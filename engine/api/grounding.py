"""A chat request's `collections`: the passages its question finds in them go to the model
with their sources, numbered, and the answer carries them as `citations`. When nothing
relevant is found the request says so (a note, and no citations) rather than letting the
model answer as if its documents had spoken."""

from __future__ import annotations

from ..engine import Engine
from ..errors import InvalidRequest

TOP_K = 5
# cosine similarity below which a passage is not relevant (MiniLM's unrelated pairs sit
# under 0.2, a passage that answers the question above 0.35)
MIN_SIMILARITY = 0.3
WHOLE_CHARS = 6000  # a file this short goes in whole (about 1,500 tokens)
INSTRUCTION = ("Passages from the user's documents follow, numbered. Answer from them when "
               "they hold the answer and cite each passage you use as [n]. If they do not "
               "hold it, say so.")


def ground(engine: Engine, collections: list[str], question: str
           ) -> tuple[str | None, list[dict], list[str]]:
    """(the text for the system message or None, the citations, notes)."""
    if not question.strip():
        raise InvalidRequest("collections: the last user message has no text to search "
                             "with", param="collections")
    found = []
    for i, name in enumerate(collections):
        try:
            found += engine.documents.search(name, question[:4000], TOP_K)
        except InvalidRequest as exc:
            raise InvalidRequest(f"collections[{i}]: {exc.message}",
                                 param=f"collections[{i}]") from None
    relevant = sorted((f for f in found if f["similarity"] >= MIN_SIMILARITY),
                      key=lambda f: -f["similarity"])[:TOP_K]
    if not relevant:
        return None, [], [f"nothing in {', '.join(collections)} matched the question: "
                          "answered without the documents"]
    relevant, notes = _whole(engine, relevant)
    citations = [{"index": n, **passage} for n, passage in enumerate(relevant, 1)]
    blocks = [f"[{c['index']}] {c['path']}{_place(c)}:\n{c['text']}" for c in citations]
    return INSTRUCTION + "\n\n" + "\n\n".join(blocks), citations, notes


def _whole(engine: Engine, relevant: list[dict]) -> tuple[list[dict], list[str]]:
    """The best passage's file put in whole when it is short (its other passages then
    go): the model reads it all, and the answer says so. A paged document (a PDF) keeps
    its passages: their pages are what the answer cites."""
    best = relevant[0]
    if best.get("page") is not None:
        return relevant, []
    text = engine.documents.index.file_text(best["collection"], best["path"])
    if len(text) > WHOLE_CHARS or text == best["text"]:
        return relevant, []
    whole = {**best, "text": text, "whole": True}
    for key in ("page", "start_line", "end_line"):
        whole.pop(key, None)
    rest = [p for p in relevant[1:] if p["path"] != best["path"]]
    return [whole, *rest], [f"{best['path'].rsplit('/', 1)[-1]} was given whole "
                            f"({len(text):,} characters)"]


def _place(citation: dict) -> str:
    if citation.get("whole"):
        return " (the whole file)"
    if citation.get("page") is not None:
        return f", page {citation['page']}"
    return f", lines {citation['start_line']}-{citation['end_line']}"
