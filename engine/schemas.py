"""Request bodies of the OpenAI-compatible API (pydantic validates and names bad fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .llama_runtime import SamplingParams


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    n: int = Field(1, ge=1, le=1, description="only one choice per request is supported")
    ignore_eos: bool = False  # llama-server's extension: generate exactly max_tokens
    speculation: Literal["off", "lookup", "draft"] | None = None  # None: the engine default
    draft_model: str | None = None  # a model id, or "auto"; implies speculation "draft"
    cache_prompt: bool = True  # llama-server's extension: False evaluates the prompt afresh

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, value):
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self) -> SamplingParams:
        defaults = SamplingParams()
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=self.top_p or defaults.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            min_p=defaults.min_p if self.min_p is None else self.min_p,
            seed=self.seed,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("exactly one prompt per request is supported")
            return value[0]
        return value

    def token_limit(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else 16


class LoadRequest(BaseModel):
    """A model to plan or load, with the user's choices over the planner's."""
    model_config = ConfigDict(extra="forbid")
    model: str
    n_ctx: int | None = Field(None, ge=256)
    gpu_layers: int | None = Field(None, ge=0)
