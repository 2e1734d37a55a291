"""A request's reasoning settings, as every chat API states them (OpenAI's
reasoning_format and reasoning_effort, Anthropic's thinking, the Responses API's
reasoning), in one shape."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Thinking:
    """A request's reasoning settings: apart from the answer or inline (reasoning_format),
    how hard (reasoning_effort: none, minimal, low, medium, high), and what else the
    chat template is given (chat_template_kwargs, which win)."""
    separate: bool = True
    effort: str | None = None
    kwargs: dict = field(default_factory=dict)
    budget: int | None = None  # reasoning tokens at most (then the closing marker)

    def template_kwargs(self) -> dict:
        out: dict = {"enable_thinking": self.effort != "none"}  # Qwen3, DeepSeek, SmolLM3
        if self.effort is not None:
            out["thinking"] = self.effort != "none"  # DeepSeek V3.1
            # gpt-oss cannot stop reasoning: "none" is its least
            out["reasoning_effort"] = {"none": "low", "minimal": "low"}.get(self.effort,
                                                                            self.effort)
        return {**out, **self.kwargs}
