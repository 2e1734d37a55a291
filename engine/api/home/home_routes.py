"""What a paired device reaches on the sharing listener besides the generation routes:
pairing, the web chat's page, and its own conversations (`engine.home`).

A reply belongs to the engine, not to the page that asked for it: it runs as a task of
its own and is kept as it grows, so a phone that sleeps mid-answer finds the answer
finished when it wakes (GET the conversation, or follow `/reply` again). Stop ends it.
"""

from __future__ import annotations

import asyncio
import mimetypes
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from ...engine import Engine
from ...errors import HomerackError, InvalidRequest
from ...formats.parsed import Reasoning, Text
from ...conversation import images
from ...conversation.conversation import Conversation, Message
from ...events import Asked
from ...home.conversations import Attachment
from ..turns import Done, Turn, asked_turn
from ..wire import Caller, device_of, sse

WEB = Path(__file__).with_name("web")
PAGES = {"/": "index.html", "/app.js": "app.js", "/app.css": "app.css",
         "/manifest.webmanifest": "manifest.webmanifest", "/icon.svg": "icon.svg"}
MEDIA = {".webmanifest": "application/manifest+json", ".js": "text/javascript",
         ".svg": "image/svg+xml"}
KEY_COOKIE = "homerack_key"
COOKIE_DAYS = 30  # from the last visit (it was 400 from pairing)
MAX_TURNS = 200  # messages of a conversation given to the model, the latest
KEEP_FINISHED_S = 60.0  # a finished reply stays in memory this long for its followers


class PairBody(BaseModel):
    code: str = Field(max_length=12)
    name: str | None = Field(None, max_length=40)  # accepted, unused: the owner named it


class TitleBody(BaseModel):
    title: str = Field("New chat", max_length=400)


class MessageBody(BaseModel):
    content: str = Field(max_length=200_000)
    model: str | None = Field(None, max_length=300)
    picture: str | None = Field(None, max_length=12_000_000)  # a data: URL from the phone


class Reply:
    """One answer being made: its text so far, and the pages following it."""

    def __init__(self, message_id: int):
        self.message_id, self.text, self.reasoning = message_id, [], []
        self.done: str | None = None  # the finish reason, or "error"
        self.error = ""
        self.turn: Turn | None = None
        self.notes: list[str] = []  # shown with it: what was left out for the context
        self.task: asyncio.Task | None = None
        self.version = 0
        self.changed = asyncio.Condition()

    async def change(self) -> None:
        async with self.changed:
            self.version += 1
            self.changed.notify_all()

    async def after(self, version: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.version != version)

    def stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel()


def router(engine: Engine) -> APIRouter:
    api, replies, starting = APIRouter(), {}, {}  # conversation id -> Reply, Turn
    home = engine.home

    @api.post("/pair")
    async def pair(body: PairBody):
        device, key = home.devices.pair(body.code)  # named by the owner, with the code
        response = JSONResponse({"key": key, "name": device.name})
        _keep(response, key)
        return response

    def page(name: str):
        async def serve_page() -> FileResponse:
            return FileResponse(WEB / name, media_type=MEDIA.get(Path(name).suffix))
        return serve_page

    for path, name in PAGES.items():
        api.add_api_route(path, page(name), methods=["GET"], include_in_schema=False)

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": shared_models(engine)}

    @api.get("/home/api/me")
    async def me(http: Request):
        models = [{"id": m["id"], "vision": "vision" in m.get("capabilities", ())}
                  for m in shared_models(engine)]
        response = JSONResponse({"device": device_of(http), "models": models,
                                 "default": default_model(engine) if models else None})
        key = http.cookies.get(KEY_COOKIE)
        if key:  # each visit renews the page's cookie
            _keep(response, key)
        return response

    @api.get("/home/api/conversations")
    async def listed(http: Request):
        return {"data": home.conversations.listed(device_of(http))}

    @api.post("/home/api/conversations")
    async def create(http: Request, body: TitleBody | None = None):
        return home.conversations.create(device_of(http), (body or TitleBody()).title)

    @api.get("/home/api/conversations/{conv_id}")
    async def one(conv_id: str, http: Request):
        conv = await asyncio.to_thread(home.conversations.get, device_of(http), conv_id)
        reply = replies.get(conv_id)
        return {**_for_the_page(conv), "replying": reply is not None and reply.done is None}

    @api.get("/home/api/conversations/{conv_id}/pictures/{sha256}")
    async def picture(conv_id: str, sha256: str, http: Request):
        """A picture of the device's own conversation, by its hash (the page's <img>)."""
        kept = await asyncio.to_thread(home.conversations.attachment, device_of(http),
                                       conv_id, sha256)
        # a kept picture's name ends in its format (picture.png, picture.jpeg, ...)
        media = mimetypes.guess_type(kept.name)[0] or "application/octet-stream"
        return Response(kept.data, media_type=media,
                        headers={"cache-control": "private, max-age=86400"})

    @api.patch("/home/api/conversations/{conv_id}")
    async def rename(conv_id: str, body: TitleBody, http: Request):
        home.conversations.rename(device_of(http), conv_id, body.title)
        return {"id": conv_id, "title": body.title}

    @api.delete("/home/api/conversations/{conv_id}")
    async def delete(conv_id: str, http: Request):
        home.conversations.delete(device_of(http), conv_id)
        if (reply := replies.pop(conv_id, None)) is not None:
            reply.stop()
        return {"id": conv_id, "deleted": True}

    @api.post("/home/api/conversations/{conv_id}/messages")
    async def ask(conv_id: str, body: MessageBody, http: Request):
        device = device_of(http)
        # first: another device's is absent
        conv = await asyncio.to_thread(home.conversations.get, device, conv_id)
        if conv_id in starting or (running := replies.get(conv_id)) is not None and \
                running.done is None:
            raise InvalidRequest("an answer is still coming in this conversation; stop it "
                                 "first", param="conversation")
        model = body.model or default_model(engine)
        home.check_shared(model)
        if not body.content.strip() and not body.picture:
            raise InvalidRequest("content: say something", param="content")
        # read, checked and taken before anything is kept (the phone's data URL decoded
        # once, here); the reply outlives the page, so its caller never goes
        turn, picture = await asyncio.to_thread(_asked_turn, engine, device, conv, body, model)
        # admitted (a device over its limits is refused here) before anything is kept;
        # meanwhile a Stop reaches it through `starting`
        starting[conv_id] = turn
        try:
            await turn.start()
        finally:
            starting.pop(conv_id, None)
        try:
            await asyncio.to_thread(keep_ask, home, device, conv_id, conv, body, picture,
                                    model)
            reply = Reply(home.conversations.add(device, conv_id, "assistant", ""))
        except HomerackError:
            turn.cancel()
            raise
        reply.turn, replies[conv_id] = turn, reply
        reply.notes = [note for note in turn.notes if note.startswith("left out:")]
        # held by the reply (the loop keeps only a weak reference to a task)
        reply.task = asyncio.get_running_loop().create_task(_run(
            reply, home, lambda: replies.pop(conv_id, None) if replies.get(conv_id) is reply
            else None))
        return _follow(reply)

    @api.get("/home/api/conversations/{conv_id}/reply")
    async def follow(conv_id: str, http: Request):
        home.conversations.get(device_of(http), conv_id)
        reply = replies.get(conv_id)
        if reply is None:
            raise InvalidRequest("no answer is coming in this conversation",
                                 param="conversation")
        return _follow(reply)

    @api.post("/home/api/conversations/{conv_id}/stop")
    async def stop(conv_id: str, http: Request):
        home.conversations.get(device_of(http), conv_id)
        if (turn := starting.get(conv_id)) is not None:
            turn.cancel()
        if (reply := replies.get(conv_id)) is not None:
            reply.stop()
        return {"id": conv_id, "stopped": reply is not None or turn is not None}

    return api


def _keep(response, key: str) -> None:
    """The page's key in its cookie for COOKIE_DAYS from now: a phone left unused that
    long pairs again."""
    response.set_cookie(KEY_COOKIE, key, max_age=COOKIE_DAYS * 86400, httponly=True,
                        samesite="strict", path="/")


def shared_models(engine: Engine) -> list[dict]:
    """The chat models this home's devices may use, as /v1/models lists them."""
    shared, shelf = engine.home.choices.shared, engine.shelf
    return [{"id": m.id, "object": "model", "created": 0, "owned_by": "homerack",
             "capabilities": shelf.facts(m, "chat").get("capabilities", [])}
            for m in shelf.models() if shelf.kind_of(m) == "chat"
            and (shared is None or m.id in shared)]


def default_model(engine: Engine) -> str:
    models = shared_models(engine)
    if not models:
        raise InvalidRequest("the owner shares no chat model with this home", param="model")
    default = engine.default_model()
    ids = [m["id"] for m in models]
    return default.id if default is not None and default.id in ids else ids[0]


def _asked_turn(engine: Engine, device: str, conv: dict, body: MessageBody,
                model: str) -> tuple[Turn, Attachment | None]:
    """The ask's turn over the stored conversation, and its picture as it will be kept."""
    picture = images.from_data_url(body.picture, "picture") if body.picture else None
    asked = Message("user", body.content + (images.MARKER if picture else ""),
                    where="content", pictures=(picture,) if picture else ())
    stored = stored_conversation(engine.home.conversations, device, conv)
    turn = asked_turn(engine, Asked(model=model, fit_pictures=True),
                      Conversation((*stored.messages, asked)), Caller(device))
    kept = Attachment("picture", f"picture.{picture.format.lower()}", picture.digest,
                      picture.data) if picture else None
    return turn, kept


def stored_conversation(store, device: str, conv: dict) -> Conversation:
    """The stored messages as the conversation the model continues (the latest
    MAX_TURNS, the ask to come among them; an empty answer left out), a message's picture
    after its text, read from its attachment."""
    kept = [m for m in conv["messages"] if m["content"] or m["picture"]][1 - MAX_TURNS:]
    return Conversation(tuple(_message(store, device, conv["id"], m, f"messages[{i}]")
                              for i, m in enumerate(kept)))


def _message(store, device: str, conv_id: str, row: dict, where: str) -> Message:
    if not row["picture"]:
        return Message(row["role"], row["content"], where=where)
    kept = store.attachment(device, conv_id, row["picture"])
    picture = images.read_image(kept.data, f"{where}.picture")
    return Message(row["role"], row["content"] + images.MARKER, where=where,
                   pictures=(picture,))


def _for_the_page(conv: dict) -> dict:
    """A conversation as the page shows it: each picture as the URL it is served at."""
    return {**conv, "messages": [
        {**m, "picture": f"/home/api/conversations/{conv['id']}/pictures/{m['picture']}"
         if m["picture"] else None} for m in conv["messages"]]}


def keep_ask(home, device: str, conv_id: str, conv: dict, body: MessageBody,
             picture: Attachment | None, model: str) -> None:
    """An admitted ask kept in its conversation (named after it, if the first)."""
    if not conv["messages"] and body.content.strip():
        home.conversations.rename(device, conv_id, body.content[:60])
    home.conversations.add(device, conv_id, "user", body.content, picture, model)


async def _run(reply: Reply, home, forget) -> None:
    """The answer made and kept, whoever follows it (its turn started: the first token
    is out); `forget` drops it from memory."""
    try:
        async for event in reply.turn.events():
            if isinstance(event, Text):
                reply.text.append(event.text)
            elif isinstance(event, Reasoning):
                reply.reasoning.append(event.text)
            elif isinstance(event, Done):
                reply.done = event.reason
            await reply.change()
    except HomerackError as error:
        reply.done, reply.error = "error", error.message
    except asyncio.CancelledError:
        reply.done = "cancelled"
    finally:
        reply.done = reply.done or "cancelled"
        home.conversations.finish(reply.message_id, "".join(reply.text),
                                  "".join(reply.reasoning), reply.done)
        await reply.change()
        # kept a while for pages still following it; then the conversation holds it
        asyncio.get_running_loop().call_later(KEEP_FINISHED_S, forget)


def _follow(reply: Reply) -> StreamingResponse:
    """The reply as server-sent events: what it holds so far, then each change, then
    how it ended."""
    async def events():
        sent_text = sent_thought = 0
        for note in reply.notes:
            yield sse({"type": "note", "text": note})
        while True:
            version = reply.version
            text, thought = "".join(reply.text), "".join(reply.reasoning)
            if len(thought) > sent_thought:
                yield sse({"type": "reasoning", "text": thought[sent_thought:]})
                sent_thought = len(thought)
            if len(text) > sent_text:
                yield sse({"type": "text", "text": text[sent_text:]})
                sent_text = len(text)
            if reply.done is not None:
                yield sse({"type": "done", "finish": reply.done, "error": reply.error})
                return
            await reply.after(version)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
