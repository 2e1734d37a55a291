"""The engine API's Hub routes: search, a repository's quants with the planner's verdict
for this machine, its model card, draft suggestions, and downloads that run in the
engine process (so they continue while the app's windows come and go)."""

from __future__ import annotations

import asyncio
import os
from typing import Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ...engine import Engine
from ...catalog.other_apps import LABELS
from ...hub.downloads import Downloads
from ...errors import InvalidRequest
from ...hub.repos import model_card, repo_quants, search, suggest_drafts


class DownloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str = Field(min_length=3)
    quant: str


def _token() -> str | None:
    return os.environ.get("HF_TOKEN")


def _quants_with_verdicts(engine: Engine, repo: str, ctx: int) -> dict:
    base, verdicts, can = engine.judge_repo(repo, ctx, _token())
    return {"repo": repo, "n_layers": base.n_layers if base else None, "capabilities": list(can),
            "kind": "model" if base else "adapter", "quants": [
                {"quant": v.quant.quant, "files": list(v.quant.files),
                 "size_bytes": v.quant.size, "fit": v.fit, "verdict": v.words,
                 "recommended": v.recommended,
                 "n_ctx": v.plan.n_ctx if v.plan else None,
                 "n_gpu_layers": v.plan.n_gpu_layers if v.plan else None,
                 "on_this_machine": _here(engine.shelf.on_this_machine(repo, v.quant.files,
                                                                 v.quant.sha256))}
                for v in verdicts]}


def _here(model) -> dict | None:
    """The model on this machine that is this quant's file, and where it lies."""
    return None if model is None else {"id": model.id, "source": model.source,
                                       "source_label": LABELS[model.source]}


def hub_routes(engine: Engine, downloads: Downloads) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/hub/search")
    async def hub_search(q: str = "", sort: Literal["downloads", "recent"] = "downloads",
                         limit: int = Query(20, ge=1, le=100)):
        order = "last_modified" if sort == "recent" else "downloads"
        found = await asyncio.to_thread(search, q, order, limit, None, _token())
        return {"data": [{"id": r.id, "downloads": r.downloads, "likes": r.likes,
                          "last_modified": r.last_modified, "gated": r.gated,
                          "license": r.license, "size_min": r.size_range[0],
                          "size_max": r.size_range[1], "embedding": r.embedding,
                          "adapter": r.adapter}
                         for r in found]}

    @router.get("/v1/hub/repos/{repo:path}/quants")
    async def hub_quants(repo: str, ctx: int = 4096):
        return await asyncio.to_thread(_quants_with_verdicts, engine, repo, ctx)

    @router.get("/v1/hub/repos/{repo:path}/card")
    async def hub_card(repo: str):
        return {"repo": repo, "text": await asyncio.to_thread(model_card, repo, None, _token())}

    @router.get("/v1/hub/repos/{repo:path}/drafts")
    async def hub_drafts(repo: str):
        def find():
            return suggest_drafts(repo, repo_quants(repo, token=_token()), token=_token())
        return {"data": [{"repo": other, "quant": q.quant, "size_bytes": q.size}
                         for other, q in await asyncio.to_thread(find)]}

    @router.get("/v1/downloads")
    async def list_downloads():
        return {"data": [d.as_dict() for d in downloads.list()]}

    @router.post("/v1/downloads")
    async def start_download(body: DownloadRequest):
        quants = await asyncio.to_thread(repo_quants, body.repo, None, _token())
        quant = next((q for q in quants if q.quant.upper() == body.quant.upper()), None)
        if quant is None:
            raise InvalidRequest(f"{body.repo} has no {body.quant} file; it has "
                                 + ", ".join(q.quant for q in quants), param="quant")
        return downloads.start(body.repo, quant).as_dict()

    @router.post("/v1/downloads/{download_id}/{action}")
    async def control_download(download_id: int, action: Literal["pause", "resume", "cancel"]):
        act = {"pause": downloads.pause, "resume": downloads.resume,
               "cancel": downloads.cancel}[action]
        return (await asyncio.to_thread(act, download_id)).as_dict()

    return router
