"""Routing between a small and a large chat model, for the model id "auto".

Two ways, chosen per pair: **rules** read the request (tools, code, length, depth of the
conversation) and pick a model before anything runs; a **cascade** lets the small model
answer first and, when its own token probabilities say the answer is unreliable (their
geometric mean under the threshold), has the large model answer instead (FrugalGPT).
Requests with tools or a grammar follow the rules only: a cascade cannot judge a tool
call by its probabilities, and constrained decoding inflates them.

Pure functions of the request: the engine applies the decision (engine.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidRequest
from .events import GenerationRequest
from .catalog.models import LocalModel, ModelStore

MODES = ("rules", "cascade")
# The small model's confidence (geometric-mean probability of its tokens) says how good
# its answer is: on bench/routing.py's 200 prompts, SmolLM2 135M scored 0.31 on the
# quarter it was least sure of (under 0.56) and 0.88 on the quarter it was surest of
# (over 0.78). 0.5 escalates roughly the least sure tenth; the bench's calibration table
# gives the best threshold for a given pair (docs/routing.md).
DEFAULT_THRESHOLD = 0.5

_CODE = re.compile(
    r"```|\b(def|class|import|return|lambda|const|let|var|fn|func|public|static|void|#include)"
    r"\s|\b(code|function|python|javascript|typescript|java|rust|golang|sql|regex|script|"
    r"program|compile|debug|bug|stack trace|traceback|algorithm|implement|refactor)\b|"
    r"[{};]\s*$|=>|\(\)\s*[:{]", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Rules:
    long_prompt_chars: int = 1500  # longer prompts (documents, long contexts) go large
    deep_turns: int = 4            # conversations past this many user turns go large


@dataclass(frozen=True)
class Routing:
    small: LocalModel
    large: LocalModel
    mode: str = "rules"
    threshold: float = DEFAULT_THRESHOLD
    rules: Rules = Rules()

    def as_dict(self) -> dict:
        return {"small": self.small.id, "large": self.large.id, "mode": self.mode,
                "threshold": self.threshold, "rules": {
                    "long_prompt_chars": self.rules.long_prompt_chars,
                    "deep_turns": self.rules.deep_turns}}


def route_between(store: ModelStore, small: str, large: str, mode: str = "rules",
         threshold: float = DEFAULT_THRESHOLD, paths: bool = False) -> Routing:
    """The routing pair of two model ids (or files, with `paths`: the command line),
    checked: two different files that can chat."""
    models = store.resolve(small, paths), store.resolve(large, paths)
    for model, param in zip(models, ("small", "large")):
        if store.kind_of(model) != "chat":
            raise InvalidRequest(f"{model.id} cannot chat (an embedding model or an "
                                 "unreadable file)", param=param)
    if models[0].path == models[1].path:
        raise InvalidRequest("the small and the large model are the same file", param="large")
    return Routing(*models, mode, threshold)


@dataclass(frozen=True)
class Decision:
    model: LocalModel
    reason: str
    escalate_to: LocalModel | None = None  # cascade: the model that answers unreliable ones
    threshold: float = 0.0  # cascade: the confidence under which it does

    def note(self) -> str:
        if self.escalate_to:
            return f"routing (cascade): {self.model.id} answers first; {self.reason}"
        return f"routing (rules): {self.model.id}, {self.reason}"


def texts(request: GenerationRequest) -> list[tuple[str, str]]:
    """(role, text) of each message, or the raw prompt as one user message."""
    if request.messages is None:
        return [("user", request.prompt or "")]
    out = []
    for message in request.messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        out.append((message.get("role", "user"), str(content)))
    return out


def by_rules(request: GenerationRequest, rules: Rules) -> tuple[bool, str]:
    """(large?, why)."""
    messages = texts(request)
    if request.tools:
        return True, "the request offers tools"
    chars = sum(len(text) for _role, text in messages)
    if chars > rules.long_prompt_chars:
        return True, f"a long prompt ({chars} characters > {rules.long_prompt_chars})"
    turns = sum(role == "user" for role, _text in messages)
    if turns > rules.deep_turns:
        return True, f"a deep conversation ({turns} user turns > {rules.deep_turns})"
    last_user = next((text for role, text in reversed(messages) if role == "user"), "")
    if _CODE.search(last_user):
        return True, "the question is about code"
    return False, "a short question without code or tools"


def decide(routing: Routing, request: GenerationRequest) -> Decision:
    large, why = by_rules(request, routing.rules)
    if routing.mode == "cascade" and not (request.tools or request.grammar):
        return Decision(routing.small, f"{routing.large.id} answers when the small answer's "
                        f"confidence is under {routing.threshold:g}", routing.large,
                        routing.threshold)
    return Decision(routing.large if large else routing.small, why)


def confident(confidence: float | None, threshold: float) -> bool:
    return confidence is not None and confidence >= threshold
