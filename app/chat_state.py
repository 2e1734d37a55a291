"""What the desktop app's window shows and sends with, as one frozen value: the open
conversation, the chosen model, the engine's models and health, the user's sampling,
routing pair and reasoning choice. Pure: the window holds it (ui/state.py) and every page
reads it; what a request asks for (`request_options`) is worked out here, not in widgets."""

from __future__ import annotations

from dataclasses import dataclass, field

from .history import SavedConversation
from .settings import RoutingChoice, Sampling

REGENERATE_TEMPERATURE = 0.6
# models of these kinds are not offered in the picker: embedding models cannot chat,
# "auto" is the conversation's Auto-route box, adapters are chosen over their base model,
# speech models hear and speak (voice.py), they do not answer
NOT_PICKED = ("embedding", "router", "adapter", "transcription", "speech")


@dataclass(frozen=True)
class ChatState:
    conversation: SavedConversation | None = None
    model: str | None = None  # the picker's choice
    models: tuple[dict, ...] = ()  # the chat models the engine lists
    adapters: tuple[dict, ...] = ()  # LoRA adapters, with the models they fit
    health: dict = field(default_factory=dict)  # the engine's /health
    sampling: Sampling = Sampling()
    routing: RoutingChoice = RoutingChoice()
    reasoning: str | None = None  # the effort chosen; None: the model's default
    tool_servers: tuple[str, ...] = ()  # the MCP servers whose tools chats are offered
    forced_tool: str | None = None  # "server/tool" the next reply must call (small models)
    collections: tuple[str, ...] = ()  # the document collections replies are grounded in

    @property
    def routed(self) -> bool:
        """Each reply of the conversation goes to model "auto" (the routing pair)."""
        return bool(self.conversation and self.conversation.routed and self.routing.on)

    def entry(self, model: str | None = None) -> dict:
        """The listing of `model` (default: the chosen one); {} when it is not listed."""
        wanted = self.model if model is None else model
        return next((m for m in self.models if m["id"] == wanted), {})

    def is_loaded(self, model: str | None) -> bool:
        """The model is held and ready, as the default one or beside it (one still
        loading when the health was read is not: the next refresh says more)."""
        return any(m["id"] == model and m["state"] == "ready"
                   for m in self.health.get("models") or ())

    def adapters_for(self, model: str | None) -> list[str]:
        """The adapters that fit `model`."""
        return [a["id"] for a in self.adapters if model in (a.get("bases") or ())]

    def context_size(self) -> int:
        return int(self.health.get("n_ctx") or 4096)

    def request_options(self, another: bool = False) -> dict:
        """The request's model and sampling. `another`: Regenerate, which asks for a
        different answer: where the model decodes greedily by default (the smallest do)
        and the user chose no temperature, that one answer is sampled at 0.6."""
        routed = self.routed
        options = {**self.sampling.as_request(), "model": "auto" if routed else self.model}
        fitting = self.adapters_for(options["model"])
        adapters = self.conversation.adapters if self.conversation else ()
        chosen = [{"id": n, "scale": s} for n, s in adapters if n in fitting]
        if chosen and not routed:
            options["lora"] = chosen
        if not routed and self.reasoning:
            options["reasoning_effort"] = self.reasoning
        if self.collections:
            options["collections"] = list(self.collections)
        greedy = (self.entry(options["model"]).get("sampling_defaults") or {}) \
            .get("temperature") == 0
        if another and greedy and "temperature" not in options:
            options["temperature"] = REGENERATE_TEMPERATURE
        return options


def listed(models: list[dict]) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """The engine's /v1/models split into the picker's chat models and the adapters."""
    return (tuple(m for m in models if m.get("kind") not in NOT_PICKED
                  and not m.get("problem")),  # another app's model that cannot be used
            tuple(m for m in models if m.get("kind") == "adapter"))
