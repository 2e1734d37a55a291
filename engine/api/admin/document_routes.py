"""The documents API (docs/documents.md): collections added, listed with their progress,
searched (hybrid: BM25 and embeddings) and removed. Paths are the user's own folders: the
token is the user's authority, and the engine reads them only to index them."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ...engine import Engine


class CollectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=64)
    paths: list[str] = Field(min_length=1, max_length=256)
    model: str | None = None  # an embedding model's id (default: the MiniLM starter)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(max_length=1 << 20)  # longer ones: the collection's own 400
    top_k: int = Field(5, ge=1, le=50)
    mode: Literal["hybrid", "keyword", "embedding"] = "hybrid"
    reranker: str | None = None  # a reranker's id: orders the first 20 again


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/collections")
    async def add(body: CollectionRequest):
        return await asyncio.to_thread(engine.documents.add, body.name, body.paths, body.model)

    @api.get("/v1/collections")
    async def listing():
        documents = engine.documents
        collections = await asyncio.to_thread(documents.status)
        return {"object": "list", "data": collections,
                "index_bytes": await asyncio.to_thread(documents.index.size_bytes)}

    @api.get("/v1/collections/{name}")
    async def one(name: str):
        return await asyncio.to_thread(engine.documents.status, name)

    @api.delete("/v1/collections/{name}")
    async def remove(name: str):
        await asyncio.to_thread(engine.documents.remove, name)
        return {"removed": name}

    @api.post("/v1/collections/{name}/search")
    async def search(name: str, body: SearchRequest):
        found = await asyncio.to_thread(engine.documents.search, name, body.query, body.top_k,
                                        body.mode, body.reranker)
        return {"object": "list", "collection": name, "data": found}

    return api
