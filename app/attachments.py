"""Files attached to a message: text, Markdown, code, HTML, DOCX and PDF, read to text for
the context by the documents' one reader, and pictures. The history keeps them as rows
beside their message (kind, name, sha256, bytes: app/history.py), and a request's parts
are built from the rows (`content_parts`); the picture's bytes are the file the engine
decodes and hashes, so one sha256 names it from the history to the encode cache.
Qt-free: the window asks, shows what came back, and offers the start of a file too long
for the context."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

MAX_PICTURE_BYTES = 20 << 20
PICTURE, FILE = "picture", "file"  # an attachment's kinds


class AttachmentError(ValueError):
    """A file that cannot be attached, said in words."""


@dataclass(frozen=True)
class Attachment:
    kind: str  # PICTURE (`data`: an image file) or FILE (`data`: its text, UTF-8)
    name: str
    data: bytes
    truncated: bool = False  # a file's start only
    tokens: int = field(default=0, compare=False)  # as the model's vocabulary counts them

    @classmethod
    def file(cls, name: str, text: str, tokens: int = 0, truncated: bool = False):
        return cls(FILE, name, text.encode(), truncated, tokens)

    @property
    def image(self) -> bool:
        return self.kind == PICTURE

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")

    @cached_property
    def data_url(self) -> str:
        """A picture as a data URL: the one encoding, at the HTTP and HTML boundaries."""
        import io

        from PIL import Image

        with Image.open(io.BytesIO(self.data)) as image:  # its header: what it is
            mime = Image.MIME.get(image.format, "image/jpeg")
        return f"data:{mime};base64,{base64.b64encode(self.data).decode()}"

    def as_context(self) -> str:
        """How a file's text goes to the model: fenced, named, so the model sees its
        edges and the answer can refer to it."""
        cut = " (the start of it)" if self.truncated else ""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)  # a fence inside the file cannot close this one
        return f"Attached file {self.name}{cut}:\n{fence}\n{self.text}\n{fence}"

    def as_markdown(self) -> str:
        """As shown and exported: a file fenced, a picture as a Markdown image."""
        if not self.image:
            return self.as_context()
        label = re.sub(r"[\[\]\n]", "", self.name)
        return f"![{label}]({self.data_url})"

    def part(self) -> dict:
        """As a request carries it (OpenAI's content parts)."""
        if self.image:
            return {"type": "image_url", "image_url": {"url": self.data_url}}
        return {"type": "text", "text": self.as_context()}


def read_text(path: Path, **pdf_limits) -> str:
    """A file's text, read by the documents' reader (engine/documents/reading.py: text,
    code, HTML, DOCX; PDFs page by page with pypdf in a child process, `pdf_limits` its
    timeout and memory); a file it cannot read is an AttachmentError saying why."""
    from engine.documents.reading import Unreadable, read_text as read

    try:
        text = read(path, **pdf_limits)
    except Unreadable as exc:
        raise AttachmentError(f"{path.name}: {exc}") from None
    if path.suffix.lower() == ".pdf" and not text:
        raise AttachmentError(f"{path.name} has no text to read (a scanned PDF?): "
                              "Homerack does not read images yet")
    return text


def _check_size(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AttachmentError(f"{path.name} cannot be read: {exc.strerror}") from None
    if size > MAX_PICTURE_BYTES:
        raise AttachmentError(f"{path.name} is {size / 2**20:.0f} MiB: attach a picture "
                              f"under {MAX_PICTURE_BYTES >> 20} MiB")


def fitted(name: str, text: str, tokens: int, budget: int) -> Attachment:
    """The file whole, or its start cut to about `budget` tokens."""
    if tokens <= budget:
        return Attachment.file(name, text, tokens)
    keep = int(len(text) * budget / tokens)
    return Attachment.file(name, text[:keep], budget, truncated=True)


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
IMAGE_SIDE = 2048  # longest side kept: what vision models' preprocessing reads at most
KEPT_AS_IS = ("JPEG", "PNG", "WEBP")  # formats every model's reader and Qt's view take


def read_picture(path: Path) -> Attachment:
    """A picture file attached (read_image)."""
    _check_size(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"{path.name} cannot be read: {exc.strerror}") from None
    return read_image(path.name, data)


def read_image(name: str, data: bytes) -> Attachment:
    """A picture, its header read as the engine reads one (engine/conversation/images.py:
    no bomb, a format it takes) and kept as it is when it is a JPEG, PNG or WebP standing
    upright within IMAGE_SIDE pixels; anything else (a turned phone photo, a huge one, a
    GIF, a BMP) decoded once, upright, its first frame, and kept as a JPEG. A file that is
    no image is refused."""
    from engine.conversation import images
    from engine.errors import InvalidRequest

    try:
        picture = images.read_image(data, name)
        if picture.format in KEPT_AS_IS and picture.upright \
                and max(picture.width, picture.height) <= IMAGE_SIDE:
            return Attachment(PICTURE, name, data)
        return Attachment(PICTURE, name, _as_jpeg(images.decoded(picture, IMAGE_SIDE)))
    except InvalidRequest as exc:
        raise AttachmentError(exc.message) from None


def _as_jpeg(picture) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (picture.width, picture.height), picture.rgb).save(out, "JPEG",
                                                                              quality=90)
    return out.getvalue()


def content_parts(text: str, attachments: tuple[Attachment, ...]) -> str | list[dict]:
    """A message's content as the API takes it: the text alone, or its attachments' parts
    (each file's text, each picture) in their order and then the text; neighbouring texts
    joined into one part as they would be read."""
    if not any(a.image for a in attachments):
        return "\n\n".join([a.as_context() for a in attachments] + [text])
    parts: list[dict] = []
    for part in [a.part() for a in attachments] + [{"type": "text", "text": text}]:
        if part["type"] == "text" and parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n\n" + part["text"]}
        elif part["type"] != "text" or part["text"].strip():
            parts.append(part)
    return parts


# -- histories written before attachments were rows: their Markdown read back ---------

_LEGACY_PICTURE = re.compile(
    r"!\[(?P<name>[^\]\n]*)\]\(data:image/[\w.+-]+;base64,(?P<data>[A-Za-z0-9+/=]+)\)(?:\n\n)?")
_LEGACY_FILE = re.compile(r"Attached file (?P<name>[^\n]+?)(?P<cut> \(the start of it\))?:\n"
                          r"(?P<fence>`{3,})\n(?P<text>.*?)\n(?P=fence)(?:\n\n|\Z)", re.DOTALL)


def from_markdown(content: str) -> tuple[str, tuple[Attachment, ...]]:
    """A message as the app stored it before (its files fenced and its pictures as data
    URL images at its start, the question after them; any picture further on was sent as
    one too) split into its text and its attachments."""
    found, at = [], 0
    while match := _LEGACY_PICTURE.match(content, at) or _LEGACY_FILE.match(content, at):
        if "fence" in match.groupdict():
            found.append(Attachment.file(match["name"], match["text"],
                                         truncated=bool(match["cut"])))
        else:
            found.append(_legacy_picture(match))
        at = match.end()
    rest = content[at:]
    found += [_legacy_picture(match) for match in _LEGACY_PICTURE.finditer(rest)]
    return _LEGACY_PICTURE.sub("", rest), tuple(a for a in found if a.data)


def _legacy_picture(match: re.Match) -> Attachment:
    """A data URL image's file (none, when its base64 is broken: it was never readable)."""
    try:
        data = base64.b64decode(match["data"])
    except ValueError:
        data = b""
    return Attachment(PICTURE, match["name"] or "picture", data)
