"""Files attached to a message: text, Markdown, code, HTML, DOCX and PDF, read to text for
the context by the documents' one reader; images kept in the message itself as Markdown images with a data URL (shown as
thumbnails, sent to the model as image parts). Qt-free: the window asks, shows what came
back, and offers the start of a file too long for the context."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_PICTURE_BYTES = 20 << 20


class AttachmentError(ValueError):
    """A file that cannot be attached, said in words."""


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str
    tokens: int  # as the model's vocabulary counts them
    truncated: bool = False
    image: bool = False  # `text` is the image as Markdown, its pixels in a data URL

    def as_context(self) -> str:
        """How the text goes into the message: fenced, named, so the model sees its
        edges and the answer can refer to it; an image as it is."""
        if self.image:
            return self.text
        cut = " (the start of it)" if self.truncated else ""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)  # a fence inside the file cannot close this one
        return f"Attached file {self.name}{cut}:\n{fence}\n{self.text}\n{fence}"


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
    """The attachment whole, or its start cut to about `budget` tokens."""
    if tokens <= budget:
        return Attachment(name, text, tokens)
    keep = int(len(text) * budget / tokens)
    return Attachment(name, text[:keep], budget, truncated=True)


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"}
IMAGE_SIDE = 2048  # longest side kept: what vision models' preprocessing reads at most
_IMAGE = re.compile(r"!\[[^\]\n]*\]\((data:image/[\w.+-]+;base64,[A-Za-z0-9+/=]+)\)")


def read_picture(path: Path) -> Attachment:
    """A picture file attached (read_image)."""
    _check_size(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"{path.name} cannot be read: {exc.strerror}") from None
    return read_image(path.name, data)


def read_image(name: str, data: bytes) -> Attachment:
    """An image as a Markdown image whose URL holds it, read as the engine reads one
    (engine/conversation/images.py: upright, its first frame, no bomb), at most IMAGE_SIDE
    pixels on its longest side; a file that is no image is refused."""
    import base64
    import io

    from PIL import Image

    from engine.conversation import images
    from engine.errors import InvalidRequest

    try:
        picture = images.decoded(images.read_image(data, name), IMAGE_SIDE)
    except InvalidRequest as exc:
        raise AttachmentError(exc.message) from None
    upright = Image.frombytes("RGB", (picture.width, picture.height), picture.rgb)
    out = io.BytesIO()
    upright.save(out, "JPEG", quality=90)
    label = re.sub(r"[\[\]\n]", "", name)
    return Attachment(name, f"![{label}](data:image/jpeg;base64,"
                            f"{base64.b64encode(out.getvalue()).decode()})", 0, image=True)


def content_parts(text: str) -> str | list[dict]:
    """A message's content as the API takes it: the text alone, or, when it holds
    images, text and image parts in their order."""
    pieces = _IMAGE.split(text)
    if len(pieces) == 1:
        return text
    parts = []
    for i, piece in enumerate(pieces):
        if i % 2:
            parts.append({"type": "image_url", "image_url": {"url": piece}})
        elif piece.strip():
            parts.append({"type": "text", "text": piece})
    return parts
