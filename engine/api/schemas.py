"""Request bodies of the OpenAI-compatible API (pydantic validates and names bad fields)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..conversation import images
from ..conversation.conversation import Choice, Conversation, Message, ToolCall, tool
from ..conversation.json_schema import MAX_GRAMMAR, MAX_NESTING, check, nesting
from ..conversation.images import MARKER, Picture
from ..errors import InvalidRequest
from ..events import Asked
from ..presets import Keep, LoadOverride
from ..routing import DEFAULT_THRESHOLD
from ..sampling_limits import MinP, Penalty, Temperature, TopK, TopP
from .thinking import Thinking


def text_of(content, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """The text of content that can hold text only (a system prompt, a tool's result)."""
    text, pictures = content_of(content, where, text_types)
    if pictures:
        raise InvalidRequest(f"{where}: images go in a user message, not here", param=where)
    return text


def content_of(content, where: str, text_types: tuple[str, ...] = ("text",)
               ) -> tuple[str, tuple[Picture, ...]]:
    """A message's content: a string, or a list of text and image parts. Each image
    becomes a marker in the text (where the model sees it) and a Picture, in order;
    anything else is refused, naming the part."""
    if content is None or isinstance(content, str):
        return content or "", ()
    parts, pictures = [], []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in text_types and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in _IMAGE_PARTS:
            pictures.append(_picture(part, kind, at))
            parts.append(MARKER)
        else:
            raise InvalidRequest(f"{at}: content of type {kind!r} is not supported (text "
                                 "and images)", param=at)
    return "".join(parts), tuple(pictures)


_IMAGE_PARTS = ("image_url", "input_image", "image")


def _picture(part: dict, kind: str, where: str) -> Picture:
    """An image part in any API's shape: OpenAI's `image_url` ({"url"} or a string),
    the Responses API's `input_image` (`image_url`), Anthropic's `image` (a base64 source)."""
    if kind == "image":
        source = part.get("source")
        if isinstance(source, dict) and source.get("type") == "url" \
                and str(source.get("url", "")).startswith(("http://", "https://")):
            return images.remote(source["url"], f"{where}.source.url")
        if not isinstance(source, dict) or source.get("type") != "base64" \
                or not isinstance(source.get("data"), str):
            raise InvalidRequest(f"{where}.source: an image needs a base64 or an http(s) "
                                 "url source", param=f"{where}.source")
        return images.from_base64(source["data"], f"{where}.source.data")
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str):
        raise InvalidRequest(f"{where}.image_url: an image needs a URL", param=f"{where}.image_url")
    if url.startswith(("http://", "https://")):
        return images.remote(url, f"{where}.image_url")  # fetched by the engine, if allowed
    return images.from_data_url(url, f"{where}.image_url")


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier answer's reasoning (llama-server's)

    def message(self, where: str) -> Message:
        role = "system" if self.role == "developer" else self.role
        if role == "tool" and not self.tool_call_id:
            raise InvalidRequest(f"{where}: a tool message needs tool_call_id",
                                 param=f"{where}.tool_call_id")
        calls = tuple(_call(c, f"{where}.tool_calls[{i}]")
                      for i, c in enumerate(self.tool_calls or ()))
        reader = content_of if role == "user" else text_of
        content = reader(self.content, f"{where}.content")
        text, pictures = content if role == "user" else (content, ())
        return Message(role, text, calls, self.tool_call_id, where,
                       self.reasoning_content or "", pictures)


def _call(call: ToolCallIn, where: str) -> ToolCall:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{where}.function.arguments must be a JSON object in a string",
                             param=f"{where}.function.arguments")
    return ToolCall(call.id, call.function.name, arguments)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, str]


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = "answer"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


def answer_schema(response_format: ResponseFormat | None, param: str) -> dict | None:
    """The JSON Schema the answer must follow, from an OpenAI response_format."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return {"type": "object"}
    if response_format.json_schema is None:
        raise InvalidRequest("response_format of type json_schema needs json_schema",
                             param=f"{param}.json_schema")
    return response_format.json_schema.schema_


def tool_choice(value, parallel: bool = True, param: str = "tool_choice") -> Choice:
    if value is None:
        return Choice(parallel=parallel)
    if isinstance(value, str):
        return Choice(value, parallel=parallel)
    name = value.function.get("name") if isinstance(value, NamedChoice) else None
    if not name:
        raise InvalidRequest("a named tool_choice needs function.name", param=param)
    return Choice("function", name, parallel)


class StreamOptions(BaseModel):
    include_usage: bool = False


class LoraChoice(BaseModel):
    """An adapter and its scale (llama-server's field: an id is also its index in
    GET /lora-adapters)."""
    model_config = ConfigDict(extra="forbid")
    id: str | int
    scale: float = Field(1.0, allow_inf_nan=False)


class SamplingFields(BaseModel):
    """The fields every generating request has (the chat, completion, Messages and
    Responses bodies extend it)."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty = 0.0
    n: int = Field(1, ge=1, le=1, description="only one choice per request is supported")
    ignore_eos: bool = False  # llama-server's extension: generate exactly max_tokens
    speculation: Literal["off", "lookup", "draft"] | None = None  # None: the engine default
    draft_model: str | None = None  # a model id, or "auto"; implies speculation "draft"
    cache_prompt: bool = True  # llama-server's extension: False evaluates the prompt afresh
    # Homerack's: "refresh" answers afresh (and keeps the new answer), "off" neither reads
    # nor writes the response cache (so do Cache-Control: no-cache / no-store)
    response_cache: Literal["use", "refresh", "off"] = "use"
    lora: list[LoraChoice] | None = None  # LoRA adapters over the model, with their scales
    grammar: str | None = None  # llama-server's: GBNF the whole output must match
    # Homerack's: older pictures left out (said so in their place and in the notes) where
    # the conversation with them leaves the answer no room in the context (the chats)
    fit_pictures: bool = False

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

    def asked(self, thinking: Thinking = Thinking(), choice_param: str = "tool_choice",
              id_prefix: str = "call_") -> Asked:
        """What the body asks, as one frozen value (intake.py resolves it): its own API's
        token limit and stops, its reasoning settings, the grammar checked for size."""
        return Asked(
            model=self.model, max_tokens=self.token_limit(), temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k, min_p=self.min_p, seed=self.seed,
            frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
            stop=self.stop_strings(), grammar=checked_grammar(self.grammar),
            ignore_eos=self.ignore_eos, speculation=self.speculation,
            draft_model=self.draft_model, cache_prompt=self.cache_prompt,
            response_cache=self.response_cache,
            lora=tuple((choice.id, choice.scale) for choice in self.lora or ()),
            separate_thinking=thinking.separate, template_kwargs=thinking.template_kwargs(),
            thinking_budget=thinking.budget, choice_param=choice_param, id_prefix=id_prefix,
            fit_pictures=self.fit_pictures)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class Groundable(BaseModel):
    """Homerack's, in every conversation's body: document collections searched for the
    last question (grounding.py); the answer carries `citations`."""
    collections: list[str] | None = Field(None, max_length=16)


class ChatCompletionRequest(SamplingFields, Groundable):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # llama-server's and DeepSeek's: "auto" answers reasoning apart (reasoning_content),
    # "none" leaves it in the content as the model wrote it
    reasoning_format: Literal["auto", "none", "deepseek", "deepseek-legacy"] = "auto"
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Homerack's: the model's reasoning ends after this many tokens (its closing marker is
    # written for it), as Anthropic's thinking.budget_tokens
    thinking_budget_tokens: int | None = Field(None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def thinking(self) -> Thinking:
        return Thinking(self.reasoning_format != "none", self.reasoning_effort,
                        dict(self.chat_template_kwargs or {}), self.thinking_budget_tokens)


class CompletionRequest(SamplingFields):
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


class RoutingRequest(BaseModel):
    """The routing pair behind the model id "auto" (engine/routing.py)."""
    model_config = ConfigDict(extra="forbid")
    small: str
    large: str
    mode: Literal["rules", "cascade"] = "rules"
    threshold: float = Field(DEFAULT_THRESHOLD, ge=0, le=1)


class TokenizeRequest(BaseModel):
    """llama-server's /tokenize body, with a model (the default one when left out)."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    content: str = Field(max_length=64 << 20)


class PresetRequest(BaseModel):
    """A model and the user's choices for it (presets.py): over the planner's, and
    how long it stays loaded."""
    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=1024)
    n_ctx: int | None = Field(None, ge=256)
    gpu_layers: int | None = Field(None, ge=0)
    cpu_moe_layers: int | None = Field(None, ge=0, le=1024)  # experts of N layers in RAM
    vision: bool | None = None  # false: its projector is not loaded
    pinned: bool | None = None
    ttl_s: float | None = Field(None, ge=0, le=366 * 86400, allow_inf_nan=False)  # null: never

    def override(self) -> LoadOverride | None:
        if self.n_ctx is None and self.gpu_layers is None and self.cpu_moe_layers is None \
                and self.vision is None:
            return None
        return LoadOverride(self.n_ctx, self.gpu_layers, self.cpu_moe_layers, self.vision)

    def keep(self) -> Keep | None:
        """The Keep asked for; None when neither field was sent (the engine's default:
        never unloaded for idleness as the default model, after a while beside it)."""
        if not {"pinned", "ttl_s"} & self.model_fields_set:
            return None
        return Keep(pinned=bool(self.pinned), ttl_s=self.ttl_s)


class LoadRequest(PresetRequest):
    """A model to plan or load: as the model of requests that name none (replacing the
    main one), or one more beside it."""
    default: bool = True


class SourceRequest(BaseModel):
    """A source of models (catalog/other_apps.py: "ollama", "lmstudio", …) on or off;
    with neither field, the user's choices read again."""
    model_config = ConfigDict(extra="forbid")
    source: str | None = Field(None, max_length=32)
    enabled: bool | None = None


class UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=1024)


def chat_conversation(body: ChatCompletionRequest) -> Conversation:
    """An OpenAI chat body as the conversation every wire format builds (OpenAI's routes
    and Ollama's, through the OpenAI body it makes)."""
    return Conversation(
        messages=tuple(m.message(f"messages[{i}]") for i, m in enumerate(body.messages)),
        tools=tuple(tool(t.function.name, t.function.description, t.function.parameters,
                         f"tools[{i}].function.parameters")
                    for i, t in enumerate(body.tools or ())),
        choice=tool_choice(body.tool_choice, body.parallel_tool_calls),
        schema=_checked_schema(body))


def _checked_schema(body: ChatCompletionRequest) -> dict | None:
    schema = answer_schema(body.response_format, "response_format")
    if schema is not None:
        check(schema, "response_format.json_schema.schema")
    return schema


def checked_grammar(text: str | None) -> str | None:
    """A request's own GBNF grammar (llama-server's `grammar`), bounded as the ones made
    from schemas are; llama.cpp's parser has the last word when it starts."""
    if text is None:
        return None
    if not text.strip():
        raise InvalidRequest("grammar is empty", param="grammar")
    if len(text) > MAX_GRAMMAR:
        raise InvalidRequest(f"grammar is {len(text):,} characters; at most {MAX_GRAMMAR:,}",
                             param="grammar")
    if (depth := nesting(text)) > MAX_NESTING:
        raise InvalidRequest(f"grammar nests {depth:,} groups deep; at most {MAX_NESTING:,}",
                             param="grammar")
    return text
