"""The engine's MCP routes, for the app and for scripts: the configured servers and their
state, a server's tools with the user's policy for each and their size in the model's
tokens, running one call the user approved, the user's lasting decisions (set and
revoked), and the log of calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ...engine import Engine
from ...errors import Forbidden, InvalidRequest

# how a call was approved: by the card (once, this chat, always: the app writes that
# lasting allow itself), or by the user's lasting "allow" (policy)
Approved = Literal["once", "chat", "always", "policy"]


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arguments: dict[str, Any] = Field(default_factory=dict)
    approved: Approved
    max_chars: int = Field(1 << 20, ge=256, le=1 << 20)


class DecisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: str
    tool: str = Field(min_length=1, max_length=128)
    decision: Literal["allow", "ask", "deny"]


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/mcp/servers")
    async def servers():
        return await asyncio.to_thread(engine.tools.listing)

    @api.get("/v1/mcp/servers/{label}/tools")
    async def server_tools(label: str, model: str | None = None):
        """Its tools (the server is started if needed), and what offering them costs in
        the model's tokens: a small context is not overflowed unawares."""
        offered = await asyncio.to_thread(engine.tools.tools_of, label)
        definitions = [t.definition() for t in offered if t.policy != "deny"]
        chosen = engine.resolve(model) if model else engine.default_model()
        tokens = len(await asyncio.to_thread(engine.tokenize, chosen, json.dumps(
            definitions))) if chosen and definitions else 0
        return {"server": label, "tools": [t.as_json() for t in offered], "tokens": tokens}

    @api.post("/v1/mcp/servers/{label}/tools/{tool}/call")
    async def call(label: str, tool: str, body: CallRequest):
        spec = engine.tools.spec(label, "server")
        if body.approved == "policy" and \
                await asyncio.to_thread(engine.tools.policy, spec, tool) != "allow":
            raise Forbidden(f"{tool} of {label} runs only when the user approves it",
                            param="approved")
        # "always" runs this call; the lasting allow is the app's to write (approvals.py)
        result = await asyncio.to_thread(engine.tools.run, spec, tool, body.arguments, body.approved,
                                         body.max_chars)
        return result.as_json()

    @api.post("/v1/mcp/servers/{label}/stop")
    async def stop(label: str):
        engine.tools.spec(label, "server")
        await asyncio.to_thread(engine.tools.servers.stop, label)
        return {"stopped": label}

    @api.put("/v1/mcp/approvals")
    async def decide(body: DecisionRequest):
        engine.tools.remember(engine.tools.spec(body.server, "server"), body.tool, body.decision)
        return {"approvals": engine.tools.decisions()}

    @api.delete("/v1/mcp/approvals/{identity}")
    async def revoke(identity: str, tool: str | None = None):
        if not engine.tools.approvals.revoke(identity, tool):
            raise InvalidRequest(f"no decision for {tool or 'any tool'} of server {identity}",
                                 param="identity")
        return {"approvals": engine.tools.decisions()}

    @api.get("/v1/mcp/calls")
    async def calls(count: int = 100):
        return {"calls": engine.tools.calls.recent(max(1, min(count, 1000)))}

    return api
