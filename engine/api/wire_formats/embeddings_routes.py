"""OpenAI's /v1/embeddings, from an embedding model served next to the chat model; and
llama-server's /v1/rerank (also /rerank), from a reranker (an encoder whose pooling is
rank): each document's relevance to the query."""

from __future__ import annotations

import base64
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ...engine import Engine
from ...errors import InvalidRequest
from ..side_work import embedded, off_loop


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    query: str = Field(min_length=1, max_length=1 << 16)
    documents: list[str] = Field(min_length=1, max_length=1000)
    top_n: int | None = Field(None, ge=1)


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/rerank")
    @api.post("/rerank")
    async def rerank(body: RerankRequest):
        model = engine.resolve(body.model)
        scores = await off_loop("embedding", engine.embedder.rank, model, body.query, body.documents)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n]
        return {"object": "list", "model": model.id,
                "results": [{"index": i, "relevance_score": float(scores[i]),
                             "document": {"text": body.documents[i]}} for i in order]}

    @api.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, http: Request):
        model = engine.resolve(body.model)
        inputs = body.input
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        vectors, tokens = await embedded(engine, model, list(inputs), http)
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise InvalidRequest(f"{model.id} gives {vectors.shape[1]} dimensions; it cannot "
                                 f"give {body.dimensions}", param="dimensions")
        return {"object": "list", "model": model.id,
                "data": [{"object": "embedding", "index": i,
                          "embedding": _encoded(vector, body.encoding_format)}
                         for i, vector in enumerate(vectors)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return api


def _encoded(vector, encoding: str):
    if encoding == "base64":  # little-endian float32, as OpenAI's clients decode it
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
