"""Messages to the HTML the chat view shows: Markdown (CommonMark with tables, through
markdown-it-py), code highlighted by pygments with a copy link, and each message's
actions as links the view handles (copy, edit, regenerate, ‹ 2/3 ›). Raw HTML in a
message is shown as text, never rendered, and an image is only its alt text and a link,
unless it is a picture the user attached (a row beside the message, shown as a thumbnail):
model output, imported conversations and Hub cards are untrusted (ui/safe_text.py)."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from .theme import Colors, colors

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATUS_NOTES = {"interrupted": "interrupted: the engine stopped", "stopped": "stopped",
                "failed": "failed: the engine could not answer it (the banner says why)",
                "unsaved": "not saved: the history could not be written"}


@dataclass(frozen=True)
class Shown:
    """One message as the view shows it."""
    key: str
    role: str
    content: str
    status: str = "complete"
    meta: str = ""  # who answered and how: the model, "from the response cache"
    stats: str = ""  # its figures, shown on hover
    variant: tuple[int, int] = (1, 1)  # ‹ n/m ›
    last: bool = False  # the last answer can be regenerated
    reasoning: str = ""  # a reasoning model's thinking, shown apart above the answer
    thought_s: float | None = None  # how long it thought
    thinking: bool = False  # still thinking: the section is open, live
    tools: tuple = ()  # its tool calls (app/tool_rounds.py's ToolRound JSON), collapsed
    sources: tuple = ()  # the documents' passages it was given: listed, each a link
    attached: tuple = ()  # its attachments above it: (Markdown, is a picture) each


@dataclass
class Rendered:
    html: str
    codes: list[str]  # the code blocks, by the index their copy link carries
    texts: dict[str, str]  # message texts by key
    stats: dict[str, str]  # figures by key


def render(messages: list[Shown], colors: Colors, opened: frozenset[str] = frozenset()
           ) -> Rendered:
    """`opened`: the messages whose Thinking section the reader opened."""
    out = Rendered("", [], {}, {})
    parts = []
    for message in messages:
        out.texts[message.key] = message.content
        out.stats[message.key] = message.stats
        body = ""
        for text, picture in (*message.attached, (message.content, False)):
            html_, codes = _body(text, colors, len(out.codes), picture)
            body += html_
            out.codes += codes
        if message.reasoning:
            body = _thinking(message, message.thinking or message.key in opened,
                             colors) + body
        if message.tools:
            body += _tool_calls(message, f"tools:{message.key}" in opened, colors)
        if message.sources:
            body += _sources(message, colors)
        parts.append(_frame(message, body, colors))
    out.html = (f'<body style="color:{colors.text}">' + "".join(parts) + "</body>")
    return out


def document(text: str) -> str:
    """Untrusted Markdown (a Hub model card) as HTML for a SafeBrowser."""
    return f'<body style="color:{colors().text}">{_body(text, colors(), 0)[0]}</body>'


def _frame(message: Shown, body: str, colors: Colors) -> str:
    """A message: who, its actions, the text, and under an answer who answered."""
    key, muted = message.key, f'style="color:{colors.muted}"'
    actions = [f'<a href="copymsg:{key}">Copy</a>']
    if message.role == "user":
        actions.append(f'<a href="edit:{key}">Edit</a>')
    if message.role == "assistant":
        actions.append(f'<a href="speak:{key}">Read aloud</a>')
    if message.role == "assistant" and message.last:
        actions.append(f'<a href="regen:{key}">Regenerate</a>')
    index, count = message.variant
    if count > 1:
        actions.append(f'<a href="prev:{key}">‹</a> {index}/{count} <a href="next:{key}">›</a>')
    head = (f'<p><b>{ROLE_NAMES.get(message.role, message.role)}</b>&nbsp;&nbsp;'
            f'<span {muted}>{" · ".join(actions)}</span></p>')
    notes = [STATUS_NOTES[message.status]] if message.status in STATUS_NOTES else []
    foot = " · ".join(([message.meta] if message.meta else []) + notes)
    tail = (f'<p {muted}><small><a href="stats:{key}" style="color:{colors.muted}; '
            f'text-decoration:none">{html.escape(foot)}</a></small></p>') if foot else ""
    shade = f' bgcolor="{colors.user_bubble}"' if message.role == "user" else ""
    return (f'<table width="100%" cellspacing="0" cellpadding="10"{shade} '
            f'style="margin-bottom:6px"><tr><td>{head}{body}{tail}</td></tr></table>')


def _thinking(message: Shown, open_: bool, colors: Colors) -> str:
    """The collapsible Thinking section: a link that opens or closes it ("think:KEY"),
    and, open, the thinking as plain text (inert: it is the model's)."""
    if message.thinking:
        title = "Thinking…"
    elif message.thought_s is not None:
        title = f"Thought for {_duration(message.thought_s)}"
    else:
        title = "Thinking"
    arrow = "▾" if open_ else "▸"
    link = (f'<p style="color:{colors.muted}"><a href="think:{message.key}" '
            f'style="color:{colors.muted}; text-decoration:none">{arrow} {title}</a></p>')
    if not open_:
        return link
    text = html.escape(message.reasoning.strip()).replace("\n", "<br>")
    return (link + f'<table width="100%" cellspacing="0" cellpadding="6" '
            f'style="margin-bottom:6px"><tr><td width="2" bgcolor="{colors.border}"></td>'
            f'<td style="color:{colors.muted}"><small>{text}</small></td></tr></table>')


TOOL_SHOWN = 4000  # characters of a result shown (all of it went to the model)
TOOL_STATUS = {"ran": "✓", "denied": "(denied)", "failed": "(failed)"}


def _tool_calls(message: Shown, open_: bool, colors: Colors) -> str:
    """The answer's tool calls, collapsed ("tools:KEY" opens them): each server and tool,
    how it ended, and, open, its arguments and result as plain text (inert)."""
    names = ", ".join(f"{c['server']} · {c['tool']} {TOOL_STATUS.get(c['status'], '')}"
                      for c in message.tools)
    arrow = "▾" if open_ else "▸"
    count = len(message.tools)
    link = (f'<p style="color:{colors.muted}"><a href="tools:{message.key}" '
            f'style="color:{colors.muted}; text-decoration:none">{arrow} '
            f'{count} tool call{"s" if count > 1 else ""}: {html.escape(names)}</a></p>')
    if not open_:
        return link
    rows = []
    for call in message.tools:
        result = call["result"] if len(call["result"]) <= TOOL_SHOWN else \
            call["result"][:TOOL_SHOWN] + f"… ({len(call['result']):,} characters)"
        how = f"approved {call['approved']}" if call.get("approved") else call["status"]
        rows.append(
            f"<b>{html.escape(call['server'])} · {html.escape(call['tool'])}</b> "
            f"({html.escape(how)}, {call.get('seconds', 0):.2f} s)<br>"
            f"<tt>{html.escape(json.dumps(call['arguments'], ensure_ascii=False))}</tt><br>"
            + html.escape(result).replace("\n", "<br>"))
    return (link + f'<table width="100%" cellspacing="0" cellpadding="6" '
            f'style="margin-bottom:6px"><tr><td width="2" bgcolor="{colors.border}"></td>'
            f'<td style="color:{colors.muted}"><small>{"<br><br>".join(rows)}</small>'
            f'</td></tr></table>')


def _sources(message: Shown, colors: Colors) -> str:
    """"Sources: [1] manual.pdf, page 2 · …", each a link ("source:KEY:N") that opens the
    file; its folder and the passage on hover."""
    links = []
    for n, source in enumerate(message.sources):
        name = html.escape(source["path"].rsplit("/", 1)[-1])
        place = "the whole file" if source.get("whole") else \
            f"page {source['page']}" if source.get("page") is not None else \
            f"lines {source.get('start_line')}-{source.get('end_line')}"
        links.append(f'<a href="source:{message.key}:{n}" style="color:{colors.muted}">'
                     f"[{source.get('index', n + 1)}] {name}, {place}</a>")
    return f'<p style="color:{colors.muted}"><small>Sources: {" · ".join(links)}</small></p>'


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    return f"{int(seconds // 60)} min {round(seconds % 60)} s"


def _body(text: str, colors: Colors, first_code: int,
          pictures: bool = False) -> tuple[str, list[str]]:
    """`pictures`: the text is a picture the user attached, an inline image shown."""
    if not text:
        return f'<p style="color:{colors.muted}">…</p>', []
    codes: list[str] = []
    parser = _parser()
    tokens = parser.parse(text)
    env = {"codes": codes, "first": first_code, "colors": colors, "pictures": pictures}
    markup = parser.renderer.render(tokens, parser.options, env)
    markup = markup.replace("<table>", f'<table border="1" cellspacing="0" cellpadding="5" '
                                       f'style="border-color:{colors.border}">')
    return markup, codes


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    parser = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(
        ["table", "strikethrough"])
    parser.add_render_rule("fence", _fence)
    parser.add_render_rule("code_block", _fence)
    parser.add_render_rule("image", _image)
    return parser


THUMBNAIL = 240  # pixels wide: an attached picture in the conversation
_INLINE = re.compile(r"data:image/(png|jpeg|webp|gif|bmp);base64,[A-Za-z0-9+/=]+")


def _image(renderer, tokens, index, options, env) -> str:
    """An <img> only for an attached picture (inline: Qt decodes it, within its allocation
    limit); any other source Qt would read, a local path included, on the UI thread, and
    any image in a message's own text: its alt text instead, a link where it points at
    the web."""
    token = tokens[index]
    alt = html.escape(renderer.renderInlineAsText(token.children or [], options, env)
                      or "image")
    src = token.attrGet("src") or ""
    if env["pictures"] and _INLINE.fullmatch(src):
        return f'<img src="{src}" width="{THUMBNAIL}" alt="{alt}"><br>'
    if src.startswith(("http://", "https://")):
        return f'[image: <a href="{html.escape(src)}">{alt}</a>]'
    return f"[image: {alt}]"


def _fence(renderer, tokens, index, options, env) -> str:
    token = tokens[index]
    code, language = token.content, (token.info or "").split(" ")[0]
    colors: Colors = env["colors"]
    number = env["first"] + len(env["codes"])
    env["codes"].append(code)
    label = html.escape(language) + " · " if language else ""
    return (f'<table width="100%" cellspacing="0" cellpadding="8" bgcolor="{colors.code_bg}">'
            f'<tr><td><p style="color:{colors.muted}"><small>{label}'
            f'<a href="copycode:{number}">Copy code</a></small></p>'
            f"<pre>{_highlighted(code, language, colors.code_style)}</pre></td></tr></table>")


@lru_cache(maxsize=512)
def _highlighted(code: str, language: str, style: str) -> str:
    try:
        lexer = get_lexer_by_name(language) if language else guess_lexer(code)
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(code, lexer, HtmlFormatter(nowrap=True, noclasses=True, style=style))
