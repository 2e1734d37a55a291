"""Request bodies of Ollama's API (pydantic names a bad field, as the other APIs'), and
what they mean here: `options` as the sampling fields every API shares, `format` as a
JSON Schema, `keep_alive` as how long the model stays loaded."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import InvalidRequest
from ...presets import Keep
from ...sampling_limits import MinP, Penalty, Temperature, TopK, TopP
from ..schemas import ChatCompletionRequest, FunctionDef, Groundable

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns))+$")
_UNIT_S = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class Options(BaseModel):
    """Ollama's runtime options; those a GGUF engine has no use for (numa, use_mmap,
    mirostat…) are accepted and ignored, as Ollama does with ones it does not know."""
    model_config = ConfigDict(extra="ignore")
    num_ctx: int | None = Field(None, ge=256)
    num_predict: int | None = None  # -1: until the context ends, as Ollama
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Call(BaseModel):
    model_config = ConfigDict(extra="ignore")
    function: Function


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[Call] | None = None
    tool_name: str | None = None


class ToolDef(BaseModel):
    """OpenAI's tool definition, its `type` optional (Ollama's clients may leave it out)."""
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionDef


class Generating(Groundable):
    """What /api/chat and /api/generate share."""
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=1024)
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options = Field(default_factory=Options)
    stream: bool | None = None  # Ollama streams unless told not to
    keep_alive: float | str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None

    def schema(self) -> dict | None:
        if not self.format:
            return None
        return {"type": "object"} if self.format == "json" else self.format


class OllamaChat(Generating):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[ToolDef] | None = None


class OllamaGenerate(Generating):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None


class OllamaEmbed(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=1024)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    keep_alive: float | str | None = None


class OllamaEmbeddings(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=1024)
    prompt: str


class OllamaShow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = Field(None, max_length=1024)
    name: str | None = Field(None, max_length=1024)  # its older field

    def named(self) -> str:
        if not (self.model or self.name):
            raise InvalidRequest("model is required", param="model")
        return self.model or self.name


def openai_body(body: Generating) -> ChatCompletionRequest:
    """The OpenAI chat body with the same sampling (what its asked value reads)."""
    o = body.options
    limit = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    stop = [o.stop] if isinstance(o.stop, str) else o.stop
    if stop is not None and len(stop) > 4:
        raise InvalidRequest("options.stop: at most 4 stop sequences", param="options.stop")
    fields = {"model": body.model, "max_tokens": limit, "temperature": o.temperature,
              "top_p": o.top_p, "top_k": o.top_k, "min_p": o.min_p, "seed": o.seed,
              "stop": stop, "frequency_penalty": o.frequency_penalty,
              "presence_penalty": o.presence_penalty or 0.0, "collections": body.collections}
    # built, not validated: Options checked every value, and the messages go apart
    return ChatCompletionRequest.model_construct(
        messages=[], **{k: v for k, v in fields.items() if v is not None})


def keep_of(keep_alive: float | str | None) -> Keep | None:
    """Ollama's keep_alive as how long the model stays loaded once idle: seconds, or a
    Go duration ("5m", "1h30m"); 0 unloads it when idle, a negative value keeps it."""
    if keep_alive is None:
        return None
    seconds = keep_alive if isinstance(keep_alive, (int, float)) else _duration(keep_alive)
    if seconds < 0:
        return Keep(pinned=True)
    return Keep(ttl_s=float(seconds))


def _duration(text: str) -> float:
    text = text.strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text)
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("-")
    if not _DURATION.match(text):
        raise InvalidRequest(f"keep_alive: {text!r} is not a duration (\"5m\", \"1h\", 300)",
                             param="keep_alive")
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)", text)
    return sign * sum(float(n) * _UNIT_S[unit] for n, unit in parts)
