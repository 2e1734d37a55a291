"""Where an answer's reasoning is, token by token: for a reasoning budget (the thinking
ended after so many tokens by writing the family's closing marker for the model, as
llama.cpp's reasoning budget does), and for the cascade, which judges the small model by
its answer's tokens, not its thinking's."""

from __future__ import annotations


class ReasoningBudget:
    """Follows an answer's text token by token: `inside` while it reasons; `after` says
    when to force the closing marker's tokens (never without a `limit`)."""

    def __init__(self, limit: int | None, opening: str, closing: str, opened: bool,
                 closing_tokens: list[int]):
        self.limit, self.opening, self.closing = limit, opening, closing
        self.closing_tokens = closing_tokens
        self.state = "inside" if opened else "before"  # then "done"
        self.text, self.spent = "", 0

    @property
    def inside(self) -> bool:
        return self.state == "inside"

    def after(self, piece: str) -> list[int]:
        """`piece`: the text one token added. The tokens to write next (the closing marker)
        when this token spent the budget; else none."""
        if self.state == "done":
            return []
        self.text += piece
        if self.state == "before":
            head = self.text.lstrip()
            if head.startswith(self.opening):
                self.state, self.text = "inside", head[len(self.opening):]
            elif not self.opening.startswith(head):
                self.state = "done"  # the answer did not open with reasoning
            return []
        if self.closing in self.text:
            self.state = "done"
            return []
        self.text = self.text[-len(self.closing):]  # enough to see it arrive across pieces
        self.spent += 1
        if self.limit is None or self.spent < self.limit:
            return []
        self.state = "done"
        return list(self.closing_tokens)


def reasoning_budget(request, loaded) -> ReasoningBudget | None:
    """Where the answer reasons, over its model's reasoning markers, with the request's
    budget: when it has one, or measures its confidence (the cascade judges the answer
    alone); None for a model whose family has no markers."""
    think = loaded.chat_format.family.think
    wanted = request.thinking_budget is not None or request.measure_confidence
    if not wanted or request.messages is None or think is None:
        return None
    opening, closing = think
    tokens = loaded.llama.tokenize(closing, add_special=False, parse_special=True)
    opened = request.rendered.opens_thinking()
    return ReasoningBudget(request.thinking_budget, opening, closing, opened, tokens)
