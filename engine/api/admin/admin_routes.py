"""The engine's own routes: its status for machines and dashboards (/metrics,
/v1/cluster, /v1/hardware), the models and loading them by a plan the user may change
(/v1/models, /v1/plan, /v1/models/load), those loaded and unloading them
(/v1/models/loaded, /v1/models/unload), the user's presets per model (/v1/models/preset),
where models are found besides the models folder (/v1/sources),
and the routing pair behind model "auto" (/v1/routing). /health, which answers without the token, is the factory's."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ... import status as engine_status
from ...engine import Engine
from ...errors import InvalidRequest, ModelNotFound
from ...events import Failed
from ...metrics import prometheus_text
from ..channel import Channel
from ..schemas import (LoadRequest, PresetRequest, RoutingRequest, SourceRequest, TokenizeRequest,
                      UnloadRequest)


def router(engine: Engine) -> APIRouter:
    router = APIRouter()
    for add in (_status_routes, _model_routes, _routing_routes):
        add(router, engine)
    return router


def _status_routes(router: APIRouter, engine: Engine) -> None:
    @router.get("/metrics")
    async def metrics():
        """The engine's figures in Prometheus' text format (as llama.cpp's server has)."""
        body, content_type = prometheus_text(engine.status())
        return Response(body, media_type=content_type)

    @router.get("/v1/cluster")
    async def cluster():
        """The machines, their stages, links and figures, and the models this machine
        holds (the app's dashboard)."""
        status = engine.status()
        return {**(engine_status.cluster_status(engine) or {"workers": []}), "models": status["models"],
                "replicas": status["replicas"]}

    @router.get("/v1/hardware")
    async def hardware():
        return await asyncio.to_thread(engine.hardware)


def _model_routes(router: APIRouter, engine: Engine) -> None:
    @router.get("/v1/models")
    async def list_models():
        status = engine.status()
        loaded = (status["embedding_model"], *(m["id"] for m in status["models"]),
                  *status["adapters"]["loaded"])
        # kind: null for a file not inspected yet (parsing one can take seconds)
        shelf = engine.shelf
        models = [{**_entry(m, kind := shelf.kind_of(m)), "loaded": m.id in loaded,
                   **shelf.facts(m, kind)} for m in shelf.models()]
        models += [{**_entry(m, "unreadable"), "loaded": False} for m in shelf.unusable()]
        if engine.settings.voice is not None:  # the speech models, beside the files
            models += engine.voice.models()
        if pair := engine.router.pair:
            models.insert(0, {"id": "auto", "object": "model", "created": 0,
                              "owned_by": "homerack", "kind": "router",
                              "routing": pair.as_dict()})
        return {"object": "list", "data": models}

    @router.get("/v1/sources")
    async def sources():
        """Where models are found besides the models folder: other apps' folders and
        those the user added, each on or off, with its models and its problems."""
        return {"object": "list", "data": await asyncio.to_thread(engine.shelf.sources)}

    @router.put("/v1/sources")
    async def choose_source(body: SourceRequest):
        """A source turned on or off (and the user's choices read again: the app adds
        folders, as the API takes no paths)."""
        return {"object": "list", "data": await asyncio.to_thread(
            engine.shelf.choose_sources, body.source, body.enabled)}

    @router.get("/lora-adapters")
    async def lora_adapters():
        """llama-server's list: an adapter's index here is its numeric id in "lora"."""
        return [{"id": i, "name": a.id, "path": str(a.path), "scale": 0.0}
                for i, a in enumerate(engine.shelf.adapters())]

    @router.post("/v1/plan")
    async def preview_plan(body: LoadRequest):
        """What loading the model with these choices would use on this machine."""
        model = engine.resolve(body.model)
        planned = await asyncio.to_thread(engine.plan_for, model, body.override())
        if planned is None:
            raise InvalidRequest(f"{model.id}: the planner cannot read this model's shape",
                                 param="model")
        return planned.as_dict()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        """The text as the model's tokens (llama-server's route): the app counts an
        attachment's tokens with it before sending."""
        model = engine.resolve(body.model) if body.model else \
            engine.default_model() or engine.resolve(None)
        return {"tokens": await asyncio.to_thread(engine.tokenize, model, body.content)}

    @router.post("/v1/models/load")
    async def load_model(body: LoadRequest, http: Request):
        """Load (or reload) the model with these choices, kept as its preset; answers
        when it is loaded."""
        model = engine.resolve(body.model)
        channel = Channel()
        job = await asyncio.to_thread(engine.load, model, body.override(), channel.emit,
                                      body.default, body.keep())
        event = await channel.next(job, http.is_disconnected)
        if isinstance(event, Failed):
            raise event.error
        return engine.status()

    @router.get("/v1/models/loaded")
    async def loaded_models():
        """The chat models held in memory: where, how much, idle since, time to live."""
        return {"object": "list", "data": engine_status.loaded_models(engine)}

    @router.post("/v1/models/unload")
    async def unload_model(body: UnloadRequest):
        """Unload a model now: its running requests end with an error saying so."""
        if not await asyncio.to_thread(engine.unload, body.model):
            raise ModelNotFound(f"model '{body.model}' is not loaded", param="model")
        return {"unloaded": body.model, "loaded": engine_status.loaded_models(engine)}

    @router.put("/v1/models/preset")
    async def put_preset(body: PresetRequest):
        """The model's preset: how it loads, whoever loads it, and how long it stays (a
        field left out keeps its value; loading settings apply at its next load)."""
        model = engine.resolve(body.model)
        changes = {}
        if {"n_ctx", "gpu_layers", "cpu_moe_layers", "vision"} & body.model_fields_set:
            changes["load"] = body.override()
        if body.keep() is not None:
            changes["keep"] = body.keep()
        return {"model": model.id, **engine.presets.set(model.id, **changes).as_dict()}

    @router.get("/v1/models/preset")
    async def get_preset(model: str):
        found = engine.resolve(model)
        return {"model": found.id, **engine.presets.get(found.id).as_dict()}


def _entry(model, kind: str | None) -> dict:
    """A model as OpenAI's list shows one, with what Homerack knows of it."""
    try:
        created = int(model.path.stat().st_mtime)
    except OSError:  # an unusable model's file may be gone
        created = 0
    return {"id": model.id, "object": "model", "created": created, "owned_by": "local",
            **model.as_dict(), "kind": kind}


def _routing_routes(router: APIRouter, engine: Engine) -> None:
    @router.get("/v1/routing")
    async def get_routing():
        """The pair behind model "auto" (null when off), and whether it fits together."""
        routing = engine.router.pair
        if routing is None:
            return {"routing": None}
        plan = await asyncio.to_thread(engine.router.plan, routing.small, routing.large)
        return {"routing": routing.as_dict(), "plan": plan}

    @router.put("/v1/routing")
    async def put_routing(body: RoutingRequest):
        """Turn routing on with this pair: both models load when they fit together; the
        answer's plan says whether they do (when not, each switch swaps the model)."""
        routing = await asyncio.to_thread(engine.router.between, body.small, body.large,
                                          body.mode, body.threshold)
        plan = await asyncio.to_thread(engine.router.set, routing)
        return {"routing": routing.as_dict(), "plan": plan}

    @router.delete("/v1/routing")
    async def delete_routing():
        await asyncio.to_thread(engine.router.set, None)
        return {"routing": None}

