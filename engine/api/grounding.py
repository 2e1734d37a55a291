"""A conversation's `collections`, in any wire format (OpenAI's chat, Anthropic's Messages,
the Responses API, Ollama's chat and generate): the passages its last question finds in
them go to the model with their sources, numbered, in its system message, and the answer
carries them as `citations`. When nothing relevant is found the request says so (a note,
and no citations) rather than letting the model answer as if its documents had spoken.
The owner's documents are not shared with the home's devices."""

from __future__ import annotations

from dataclasses import dataclass, replace


from ..conversation.conversation import Conversation, Message
from ..conversation.images import MARKER
from ..engine import Engine
from ..errors import Forbidden, InvalidRequest
from ..events import LOCAL_DOOR

TOP_K = 5
# cosine similarity below which a passage is not relevant (MiniLM's unrelated pairs sit
# under 0.2, a passage that answers the question above 0.35)
MIN_SIMILARITY = 0.3
# A search embeds its query whole, and embedders read 512 tokens (MiniLM, BERT): about
# 2,000 characters of English
QUERY_CHARS = 1500
WHOLE_CHARS = 6000  # a file this short goes in whole (about 1,500 tokens)
INSTRUCTION = ("Passages from the user's documents follow, numbered. Answer from them when "
               "they hold the answer and cite each passage you use as [n]. If they do not "
               "hold it, say so.")


@dataclass(frozen=True)
class Grounded:
    conversation: Conversation  # with the passages in its system message, if any matched
    citations: list[dict]
    notes: list[str]


def ground(engine: Engine, collections: list[str], conversation: Conversation,
           client: str | None) -> Grounded:
    if client == LOCAL_DOOR:
        raise Forbidden("collections: the owner's documents are not offered through "
                        "Ollama's API without the token", param="collections")
    if client:
        raise Forbidden("the owner's documents are not shared with this home's devices",
                        param="collections")
    question = _question(conversation)
    if not question.strip():
        raise InvalidRequest("collections: the last user message has no text to search "
                             "with", param="collections")
    query, notes = _query(question)
    found = []
    for i, name in enumerate(collections):
        try:
            found += engine.documents.search(name, query, TOP_K, cut=True)
        except InvalidRequest as exc:
            raise InvalidRequest(f"collections[{i}]: {exc.message}",
                                 param=f"collections[{i}]") from None
    relevant = sorted((f for f in found if f["similarity"] >= MIN_SIMILARITY),
                      key=lambda f: -f["similarity"])[:TOP_K]
    if not relevant:
        return Grounded(conversation, [], notes + [
            f"nothing in {', '.join(collections)} matched the question: answered without "
            "the documents"])
    relevant, whole = _whole(engine, relevant)
    notes += whole
    citations = [{"index": n, **passage} for n, passage in enumerate(relevant, 1)]
    blocks = [f"[{c['index']}] {c['path']}{_place(c)}:\n{c['text']}" for c in citations]
    text = INSTRUCTION + "\n\n" + "\n\n".join(blocks)
    return Grounded(_with_passages(conversation, text), citations, notes)


def _query(question: str) -> tuple[str, list[str]]:
    """What the documents are searched with: a long message's last QUERY_CHARS (a
    question asked about a paste comes after it), which the embedder takes whole or, in a
    script of many tokens a character, cut to its context (the search's `cut`)."""
    question = question.strip()
    if len(question) <= QUERY_CHARS:
        return question, []
    return question[-QUERY_CHARS:], [
        f"the message is {len(question):,} characters: the documents were searched with its "
        f"last {QUERY_CHARS:,} (what the embedder reads at once)"]


def _question(conversation: Conversation) -> str:
    """The last user message's text (its pictures' markers left out)."""
    last = next((m for m in reversed(conversation.messages) if m.role == "user"), None)
    return last.content.replace(MARKER, " ") if last is not None else ""


def _with_passages(conversation: Conversation, text: str) -> Conversation:
    """`text` in the system message: the first one's extended, or one added (some
    templates refuse a second system message)."""
    messages = list(conversation.messages)
    if messages and messages[0].role == "system":
        messages[0] = replace(messages[0], content=messages[0].content + "\n\n" + text)
    else:
        messages.insert(0, Message("system", text, where="collections"))
    return replace(conversation, messages=tuple(messages))


def _whole(engine: Engine, relevant: list[dict]) -> tuple[list[dict], list[str]]:
    """The best passage's file put in whole when it is short (its other passages then
    go): the model reads it all, and the answer says so. A paged document (a PDF) keeps
    its passages: their pages are what the answer cites."""
    best = relevant[0]
    if best.get("page") is not None:
        return relevant, []
    text = engine.documents.file_text(best["collection"], best["path"])
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
