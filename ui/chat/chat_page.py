"""The chat in the centre: the welcome or the conversation, and the composer; sending,
streaming, stopping, regenerating, editing, the alternatives ‹ n/m ›, and attachments.
Replies stream in tasks (ui.tasks); what each has so far lives Qt-free in app.session.
The open conversation is the window's state's (ui/state.py): the page shows it and
writes what it changes there."""

from __future__ import annotations

import sqlite3
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtGui import QAccessible, QAccessibleAnnouncementEvent, QGuiApplication
from PySide6.QtWidgets import QStackedWidget, QVBoxLayout, QWidget

from app.attachments import (IMAGE_SUFFIXES, Attachment, AttachmentError, fitted,
                             read_image, read_picture, read_text)
from app.client import EngineClient, EngineError, StreamedReply
from app.history import History, SavedConversation
from app.session import NotSaved, Sessions
from app.paths import TOOL_APPROVALS
from app.tool_rounds import Approval, converse, function_names, offered_tools, wait_for

from ..markdown import Shown
from ..safe_text import ask
from ..state import WindowState
from ..tasks import Task, start_task
from .approval_card import ApprovalCard
from .chat_view import ChatView
from .composer import ComposerBar
from .voice import VoiceControls
from .documents_menu import DocumentsButton
from .tools_menu import ToolsButton
from .welcome import Welcome

STREAM_KEY = "streaming"
CONTEXT_SHARE = 0.75  # of the context an attachment may take: the rest for the chat


def _receive_reply(task: Task, client: EngineClient, messages: list[dict],
                   options: dict, tools: dict | None = None) -> StreamedReply:
    """The reply's pieces, reported as they come; with `tools` (the servers, the model's
    context, the chat's allowed calls, a forced tool), in rounds of tool calls, each
    asking the window's approval card first unless the user allowed it."""
    reply = StreamedReply()  # the client's record of the stream: finish reason, usage
    stop = task.cancelled.is_set
    if not tools:
        pieces = client.stream_chat(messages, reply, should_stop=stop, **options)
    else:
        offered, _tokens, problems = offered_tools(client, tools["servers"], options["model"])
        reply.remarks += [f"tool server not reachable: {p}" for p in problems]
        named = function_names(offered)
        forced = next((f for f, t in named.items()
                       if f"{t.server}/{t.name}" == tools["forced"]), None)

        def ask(tool, arguments) -> Approval:
            approval = Approval(tool, arguments, tools["conversation"])
            task.report(("approval", approval))
            return wait_for(approval, stop)

        pieces = converse(client, messages, reply, named, ask, stop, tools["n_ctx"],
                          task.report, tools["allowed"], forced, tools.get("approvals"),
                          **options)
    for piece in pieces:
        task.report(piece)
    return reply


def _read_attachments(_task: Task, client: EngineClient, paths: list[str], model: str | None,
                      budget: int) -> list[tuple[Attachment, int]]:
    """Each file's text, its tokens counted by the model's vocabulary, cut to `budget`."""
    from pathlib import Path

    read = []
    for path in paths:
        if Path(path).suffix.lower() in IMAGE_SUFFIXES:
            read.append((read_picture(Path(path)), 0))
            continue
        text = read_text(Path(path))
        tokens = client.count_tokens(text, model)
        read.append((fitted(Path(path).name, text, tokens, budget), tokens))
    return read


class ChatPage(QWidget):
    error = Signal(str)
    copied = Signal(str)  # what was copied, in words
    finished = Signal(object)  # StreamedReply, of the conversation shown
    changed = Signal()  # messages or state changed: the window updates titles, buttons

    def __init__(self, history: History, state: WindowState, engine,
                 new_conversation: Callable[[], SavedConversation], data, parent=None):
        super().__init__(parent)
        # engine: the window's link to it (its client, and why it last died)
        self.history, self.state, self.engine = history, state, engine
        self.new_conversation = new_conversation
        self.sessions = Sessions(history)  # replies being generated, by conversation
        self.attachments: list[Attachment] = []
        self.chat_allowed: dict[int, set] = {}  # per conversation: tools allowed in it
        self.welcome = Welcome()
        self.welcome.suggestion.connect(self.send)
        self.view = ChatView()
        self.view.action.connect(self._on_action)
        self.view.copied.connect(lambda _text: self.copied.emit("Copied"))
        self.stack = QStackedWidget()
        self.stack.addWidget(self.welcome)
        self.stack.addWidget(self.view)
        self.bar = ComposerBar()
        self.composer = self.bar.edit
        self.composer.submitted.connect(self.send)
        self.bar.send.clicked.connect(lambda: self.send(self.composer.toPlainText().strip()))
        self.bar.stop.clicked.connect(self.stop)
        self.bar.attach_requested.connect(self.attach)
        self.composer.image_pasted.connect(self.attach_picture)
        self.bar.detach_requested.connect(lambda: self._set_attachments([]))
        self.tools = ToolsButton(state, engine, data)
        self.approvals = data / TOOL_APPROVALS  # where the card's "Always allow" is written
        self.bar.add_button(self.tools)
        self.documents = DocumentsButton(state)
        self.bar.add_button(self.documents)
        self.voice = VoiceControls(self.composer, lambda: self.engine.client, parent=self)
        self.voice.error.connect(self.error)
        self.voice.said.connect(self._said)
        for button in (self.voice.talk, self.voice.speak):
            self.bar.add_button(button)
        self.cards = QVBoxLayout()  # approval cards of the conversation shown
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack, 1)
        layout.addLayout(self.cards)
        layout.addWidget(self.bar)

    # -- what is shown ----------------------------------------------------------------

    @property
    def conversation(self) -> SavedConversation | None:
        return self.state.now.conversation

    def show_conversation(self, conversation: SavedConversation | None) -> None:
        self.state.update(conversation=conversation)
        self.refresh()

    def refresh(self) -> None:
        saved = self.history.messages(self.conversation.id) if self.conversation else []
        last_answer = saved[-1].id if saved and saved[-1].role == "assistant" else None
        shown = [Shown(str(m.id), m.role, m.content, m.status,
                       " · ".join(p for p in (m.model, m.detail) if p), m.stats, m.variant,
                       m.id == last_answer, m.reasoning, m.thought_s, tools=tuple(m.tools),
                       sources=tuple(m.sources),
                       attached=tuple((a.as_markdown(), a.image) for a in m.attachments))
                 for m in saved]
        reply = self.current_reply()
        if reply:
            shown.append(_streaming(reply))
        elif kept := self.sessions.unsaved(self.conversation.id if self.conversation else None):
            shown.append(Shown(STREAM_KEY, "assistant", kept.text, status="unsaved",
                               reasoning=kept.reasoning))
        self.view.show_messages(shown)
        self._show_cards()
        self.stack.setCurrentWidget(self.view if shown else self.welcome)
        self.update_buttons()
        self.changed.emit()

    def update_buttons(self) -> None:
        streaming = self.current_reply() is not None
        self.bar.send.setEnabled(self.engine.client is not None and not streaming)
        self.bar.stop.setEnabled(streaming)

    def current_reply(self):
        return self.sessions.reply(self.conversation.id if self.conversation else None)

    # -- chatting: each conversation can have a reply on its way, all at once ----------

    def send(self, text: str) -> None:
        if not text or self.engine.client is None or self.current_reply():
            return
        conversation = self.conversation or self.new_conversation()
        try:
            self.history.add_message(conversation.id, "user", text,
                                     attachments=tuple(self.attachments))
            if conversation.title == "New chat":
                self.history.update(conversation.id, title=text.splitlines()[0][:48])
        except (OSError, sqlite3.Error) as exc:  # a full disk: the question stays typed
            self.error.emit(f"The message could not be saved ({exc}): it is still in the box.")
            return
        self.state.update(conversation=self.history.get(conversation.id))
        self.composer.clear()
        self._set_attachments([])
        self.generate()

    def _said(self, text: str) -> None:
        """A hands-free question: sent as if typed; listening resumes at once if it was
        not (a reply already on its way)."""
        self.send(text)
        if not self.current_reply():
            self.voice.reply_ended("")

    def generate(self, fresh: bool = False) -> None:
        """Ask for the conversation's next reply; `fresh`: another answer, never the
        cached one."""
        conversation = self.conversation
        options = {**self.state.now.request_options(another=fresh),
                   "response_cache": "refresh" if fresh else None}
        reply = self.sessions.start(conversation.id)
        key = conversation.id
        reply.task = start_task(_receive_reply, self.engine.client,
                                self.sessions.request(conversation), options,
                                self._tool_plan(key),
                                on_progress=lambda piece: self._on_piece(key, piece),
                                on_done=lambda done: self._on_reply(key, done),
                                on_error=lambda error: self._on_failed(key, error), owner=self)
        self.refresh()

    def _tool_plan(self, conversation_id: int) -> dict | None:
        """What a reply with tools needs (None: no servers on); a forced tool is forced
        for this one reply."""
        now = self.state.now
        if not now.tool_servers:
            return None
        plan = {"servers": list(now.tool_servers), "forced": now.forced_tool,
                "n_ctx": now.context_size(), "conversation": conversation_id,
                "approvals": self.approvals,
                "allowed": self.chat_allowed.setdefault(conversation_id, set())}
        self.state.update(forced_tool=None)
        return plan

    def _on_piece(self, conversation_id: int, piece: tuple) -> None:
        kind, text = piece
        if kind == "approval":
            reply = self.sessions.reply(conversation_id)
            if reply is not None:
                reply.approvals.append(text)
                self._show_cards()
            return
        if kind == "tool":
            reply = self.sessions.add_tool(conversation_id, text.as_json())
        else:
            reply = self.sessions.feed(conversation_id, text, kind)
        if reply and self.conversation and self.conversation.id == conversation_id:
            self.view.set_last(_streaming(reply))
            self.voice.reply_grew(reply.text)

    def _on_reply(self, conversation_id: int, done: StreamedReply) -> None:
        status = "stopped" if done.finish_reason == "stopped" else "complete"
        self._finish(conversation_id, status, done.model, done.detail(), _stats(done),
                     done.thought_s, done.citations or [])
        if self.conversation and self.conversation.id == conversation_id:
            self.voice.reply_ended(done.text)
            self.finished.emit(done)
            QAccessible.updateAccessibility(QAccessibleAnnouncementEvent(
                self.view, "The reply is complete: " + done.text[:300]))

    def _on_failed(self, conversation_id: int, error) -> None:
        alive = self.engine.client is not None and self.engine.last_death is None
        # "interrupted" says the engine stopped: only when the answer was cut off (a
        # request the engine answered with an error failed, and the banner says why)
        self._finish(conversation_id, "failed" if isinstance(error, EngineError)
                     else "interrupted")
        if self.conversation and self.conversation.id == conversation_id:
            self.voice.reply_ended("")
        if alive:
            self.error.emit(f"The reply failed: {error}")

    def _finish(self, conversation_id: int, status: str, model: str | None = None,
                detail: str = "", stats: str = "", thought_s: float | None = None,
                sources: list[dict] = ()) -> None:
        try:
            self.sessions.finish(conversation_id, status, model, detail, stats, thought_s,
                                 sources)
        except NotSaved as exc:  # a full disk: the answer stays on screen, said why
            self.error.emit(str(exc))
        if self.conversation and self.conversation.id == conversation_id:
            self.refresh()

    def _show_cards(self) -> None:
        """The approval cards of the conversation shown: one per call waiting."""
        while self.cards.count():
            card = self.cards.takeAt(0).widget()
            card.hide()  # at once: deleteLater waits for the event loop
            card.deleteLater()
        reply = self.current_reply()
        for approval in reply.approvals if reply else ():
            card = ApprovalCard(approval)
            card.decided.connect(self._on_decided)
            self.cards.addWidget(card)

    def _on_decided(self, approval: Approval, choice: str, arguments) -> None:
        reply = self.sessions.reply(approval.conversation_id)
        if reply is not None and approval in reply.approvals:
            reply.approvals.remove(approval)
        approval.decide(choice, arguments)
        self._show_cards()

    def stop(self) -> bool:
        reply = self.current_reply()
        if reply:
            reply.task.cancel()
        return reply is not None

    def regenerate(self) -> None:
        """A new answer beside the last one (kept: ‹ 1/2 ›)."""
        if not self.conversation or self.current_reply() or self.engine.client is None:
            return
        messages = self.history.messages(self.conversation.id)
        if messages and messages[-1].role == "assistant":
            self.history.rewind(self.conversation.id, messages[-1].id)
        if self.history.messages(self.conversation.id):
            self.generate(fresh=True)  # a new answer, not the cached one

    def edit(self, message_id: int | None = None) -> None:
        """Put a question (the last one by default) back into the composer, its
        attachments attached again; what is sent next goes beside it, the old branch kept."""
        if not self.conversation or self.current_reply():
            return
        users = [m for m in self.history.messages(self.conversation.id) if m.role == "user"]
        chosen = next((m for m in users if m.id == message_id), users[-1] if users else None)
        if chosen:
            self.history.rewind(self.conversation.id, chosen.id)
            self.composer.setPlainText(chosen.content)
            self._set_attachments(list(chosen.attachments))  # sent again with it
            self.composer.setFocus()
            self.refresh()

    def _on_action(self, action: str, key: str) -> None:
        if action == "speak":
            self.voice.read_aloud(self.view.text_of(key))
            return
        if not key.isdigit() or self.current_reply():
            return
        if action == "edit":
            self.edit(int(key))
        elif action == "regen":
            self.regenerate()
        else:
            self.history.switch(self.conversation.id, int(key), -1 if action == "prev" else 1)
            self.refresh()

    def copy_last_answer(self) -> None:
        saved = self.history.messages(self.conversation.id) if self.conversation else []
        answer = next((m.content for m in reversed(saved) if m.role == "assistant"), "")
        if answer:
            QGuiApplication.clipboard().setText(answer)
            self.copied.emit("Copied the last answer")

    # -- attachments ---------------------------------------------------------------------

    def attach(self, paths: list[str]) -> None:
        client = self.engine.client
        if client is None:
            return
        budget = int(self.state.now.context_size() * CONTEXT_SHARE)
        start_task(_read_attachments, client, paths, self.state.now.model, budget,
                   on_done=self._on_read, on_error=lambda e: self.error.emit(
                       str(e) if isinstance(e, AttachmentError) else f"Attaching failed: {e}"),
                   owner=self)

    def attach_picture(self, data: bytes) -> None:
        """A picture pasted into the composer."""
        start_task(lambda _task: [(read_image("pasted picture", data), 0)],
                   on_done=self._on_read, on_error=lambda e: self.error.emit(str(e)), owner=self)

    def _on_read(self, read: list[tuple[Attachment, int]]) -> None:
        kept = []
        for attachment, tokens in read:
            if attachment.truncated and not ask(
                    self, "Too long for the context",
                    f"{attachment.name} has {tokens:,} tokens; the model's context holds "
                    f"{self.state.now.context_size():,}. Attach its first {attachment.tokens:,} "
                    "tokens?"):
                continue
            kept.append(attachment)
        self._set_attachments(self.attachments + kept)

    def _set_attachments(self, attachments: list[Attachment]) -> None:
        self.attachments = attachments
        self.bar.show_attached(" · ".join(
            f"{a.name} (picture)" if a.image else
            f"{a.name} ({a.tokens:,} tokens{', its start' if a.truncated else ''})" if a.tokens
            else f"{a.name}{' (its start)' if a.truncated else ''}"
            for a in attachments))


def _streaming(reply) -> Shown:
    """The reply on its way: its thinking shown open until its answer begins."""
    return Shown(STREAM_KEY, "assistant", reply.text, reasoning=reply.reasoning,
                 thinking=bool(reply.reasoning) and not reply.text, tools=tuple(reply.tools))


def _stats(done: StreamedReply) -> str:
    """An answer's figures, for the tooltip on its model line."""
    usage = done.usage or {}
    timings = usage.get("timings") or {}
    parts = [f"{usage['completion_tokens']} tokens"] if usage.get("completion_tokens") else []
    if timings.get("decode_tokens_per_s"):
        parts.append(f"{timings['decode_tokens_per_s']:.1f} tokens/s")
    if timings.get("time_to_first_token_s") is not None:
        parts.append(f"first token after {timings['time_to_first_token_s']:.2f} s")
    return " · ".join(parts)
