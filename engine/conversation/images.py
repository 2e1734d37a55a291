"""Images in a conversation: read from what a request carries (a data URL, base64, a URL
when the user allows it), checked and decoded by Pillow before anything native sees them.

libmtmd would decode a buffer itself with stb_image, in the engine's process; here only
pixels reach it. Pillow reads PNG, JPEG, WebP, GIF (its first frame) and BMP; the EXIF
orientation a phone writes is applied; anything else, a file cut short, a file that
claims to be what it is not, or one too large (in bytes, or in pixels before a single
one is decoded: a decompression bomb) is refused with a message naming the part.

A request's pictures are read in two steps, so that a small file cannot take memory it
has no use for (a 6 KB 1-bit PNG of 7000×7000 is 150 MB of RGB): `read_image` reads the
header alone (format, size, orientation) where the request arrives, and `decoded`
decodes one picture, straight to the size its projector takes, when the model that sees
it tokenizes the prompt; a model that cannot see refuses the request before any is
decoded. A request carries at most MAX_PICTURES pictures the engine has not encoded, of
MAX_REQUEST_PIXELS in all (a conversation's earlier pictures, encoded, do not count)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import re
import secrets
import time
import warnings
from dataclasses import dataclass, replace

from ..errors import InvalidRequest

# Where an image goes in a message's text, until the prompt is split there for libmtmd:
# a name no client knows, so that no text a request carries can stand for an image.
MARKER = f"<__image_{secrets.token_hex(8)}__>"
MAX_BYTES = 20 * 1024 * 1024   # one image's file (OpenAI's limit)
MAX_PIXELS = 50_000_000         # one image's pixels (Pillow warns at 89 M, refuses at 179 M)
MAX_PICTURES = 16               # in one request, not encoded before
MAX_SEEN_PICTURES = 256         # in one request, those encoded before included
MAX_REQUEST_PIXELS = 100_000_000  # all of one request's pictures, as their headers say
# Those encoded before included: each is decoded again every turn to be tokenized (a
# 12-MP photo in 0.09-0.22 s here): 33 such photos, ~7 s of one turn.
MAX_SEEN_PIXELS = 400_000_000
DECODED_SIDE = 2048             # the longest side decoded when a projector names no size
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,(?P<data>.*)",
                       re.DOTALL)


@dataclass(frozen=True)
class Picture:
    """An image and the hash of the file it came from (its identity: the same file is
    encoded once). As read from a request it holds the file (`data`) and its upright size
    from the header; `decoded` gives it RGB pixels, row by row (`rgb`), at the size
    decoded."""
    digest: str
    width: int
    height: int
    rgb: bytes = b""
    url: str = ""    # an http(s) image not fetched yet (fetched() brings it, when allowed)
    where: str = ""  # its part in the request, for errors
    data: bytes = b""  # the image file, until it is decoded
    format: str = ""  # as its header says (one of FORMATS)
    upright: bool = True  # no EXIF orientation to apply: shown as stored, it stands

    def __repr__(self) -> str:  # never the pixels in a log
        return f"Picture({self.digest[:12]}, {self.width}x{self.height})"


def from_data_url(url: str, where: str) -> Picture:
    """An image given as `data:image/png;base64,...`."""
    match = _DATA_URL.fullmatch(url.strip())
    if not match:
        raise InvalidRequest(f"{where}: an image must be a data URL "
                             "(data:image/png;base64,...)", param=where)
    return from_base64(match.group("data"), where)


def from_base64(text: str, where: str) -> Picture:
    if len(text) > MAX_BYTES * 4 // 3 + 4:
        raise InvalidRequest(f"{where}: the image is over {MAX_BYTES // 2**20} MiB", param=where)
    try:
        data = base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: the image's base64 is not valid", param=where) from None
    return read_image(data, where)


def read_image(data: bytes, where: str) -> Picture:
    """The image in `data`, its header checked (a format read here, its pixels under the
    cap) and nothing decoded; a 400 naming `where` when it is no such image."""
    if not data:
        raise InvalidRequest(f"{where}: the image is empty", param=where)
    if len(data) > MAX_BYTES:
        raise InvalidRequest(f"{where}: the image is {len(data) / 2**20:.1f} MiB; at most "
                             f"{MAX_BYTES // 2**20} MiB", param=where)
    with _opened(data, where) as image:
        width, height = image.size
        orientation = image.getexif().get(_ORIENTATION, 1)
        if orientation in (5, 6, 7, 8):  # turned a quarter
            width, height = height, width
        kind = image.format
    return Picture(hashlib.sha256(data).hexdigest(), width, height, where=where, data=data,
                   format=kind, upright=orientation in (1, None))


def decoded(picture: Picture, longest: int = DECODED_SIDE) -> Picture:
    """`picture` as upright RGB pixels, its longest side at most `longest` (a JPEG is
    decoded at the reduced scale itself); a 400 naming its part when the file turns out
    damaged past its header."""
    if picture.rgb:
        return picture
    from PIL import Image, ImageOps

    with _opened(picture.data, picture.where) as image:  # its errors: a 400 as it reads
        image.seek(0)  # an animation's first frame
        image.draft("RGB", (longest, longest))  # JPEG: decoded at 1/2, 1/4 or 1/8
        image.thumbnail((longest, longest), Image.Resampling.BICUBIC, reducing_gap=2.0)
        upright = ImageOps.exif_transpose(image).convert("RGB")
    return replace(picture, width=upright.width, height=upright.height,
                   rgb=upright.tobytes(), data=b"")


def check_request(pictures: tuple[Picture, ...], known=lambda _digest: False) -> None:
    """A request's pictures within the caps, in number and in pixels (as their headers
    say), before any is decoded. The caps bound the encoding work: pictures the engine
    has encoded before (`known(digest)`: a conversation's history, resent every turn) do
    not count, up to MAX_SEEN_PICTURES and MAX_SEEN_PIXELS in all (each is still decoded
    to be tokenized, and takes its tokens of context)."""
    if len(pictures) > MAX_SEEN_PICTURES:
        raise InvalidRequest(f"{pictures[MAX_SEEN_PICTURES].where}: at most "
                             f"{MAX_SEEN_PICTURES} images in one request",
                             param=pictures[MAX_SEEN_PICTURES].where)
    new = tuple(p for p in pictures if not (p.digest and known(p.digest)))
    if len(new) > MAX_PICTURES:
        raise InvalidRequest(f"{new[MAX_PICTURES].where}: at most {MAX_PICTURES} new "
                             f"images in one request", param=new[MAX_PICTURES].where)
    _pixels_within(new, MAX_REQUEST_PIXELS, "the request's images pass {} megapixels in all")
    # each is decoded again to be tokenized, known or new
    _pixels_within(pictures, MAX_SEEN_PIXELS,
                   "the request's images, those sent before included, pass {} megapixels")


def _pixels_within(pictures: tuple[Picture, ...], cap: int, says: str) -> None:
    """A 400 naming the picture at which their pixels pass `cap`."""
    total = 0
    for picture in pictures:
        total += picture.width * picture.height
        if total > cap:
            raise InvalidRequest(f"{picture.where}: {says.format(cap // 1_000_000)}",
                                 param=picture.where)


_ORIENTATION = 0x0112  # EXIF


@contextlib.contextmanager
def _opened(data: bytes, where: str):
    """Pillow's image over `data`, its header read and its pixels refused past MAX_PIXELS
    before any is decoded; its errors a 400 naming `where`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:  # known from the header: nothing decoded yet
                    raise InvalidRequest(
                        f"{where}: the image is {width}×{height} pixels; at most "
                        f"{MAX_PIXELS // 1_000_000} megapixels", param=where)
                yield image
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest(f"{where}: the image has too many pixels; at most "
                             f"{MAX_PIXELS // 1_000_000} megapixels", param=where) from None
    except UnidentifiedImageError:
        raise InvalidRequest(f"{where}: not an image this engine reads "
                             f"({', '.join(FORMATS)})", param=where) from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as exc:
        raise InvalidRequest(f"{where}: the image cannot be decoded ({exc})", param=where) \
            from None


FETCH_TIMEOUT_S = 20


def remote(url: str, where: str) -> Picture:
    """An image on the web, to fetch when the request reaches the engine."""
    return Picture("", 0, 0, url=url, where=where)


def fetched(pictures: tuple[Picture, ...], allowed: bool,
            hosts: frozenset[str] = frozenset()) -> tuple[Picture, ...]:
    """The pictures with those on the web brought here: only when the user allows it
    (`serve --allow-image-urls`; off by default), and only from public addresses or the
    `hosts` the user listed (`serve --image-hosts`): the engine would otherwise reach any
    address a request names, its own network's included."""
    return tuple(_fetch(p, allowed, hosts) if p.url else p for p in pictures)


def _fetch(picture: Picture, allowed: bool, hosts: frozenset[str]) -> Picture:
    """The picture's URL fetched within FETCH_TIMEOUT_S in all, from a public address only
    (engine/outbound.py: checked at each connection, redirects included)."""
    import httpx

    from ..outbound import AddressRefused, client

    where = picture.where
    if not allowed:
        raise InvalidRequest(f"{where}: this engine does not fetch images from the web; send "
                             "the image as a data URL (data:image/png;base64,...), or start it "
                             "with --allow-image-urls", param=where)
    data = bytearray()
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    try:
        with client(hosts, timeout=FETCH_TIMEOUT_S, follow_redirects=True, max_redirects=3
                    ) as web, web.stream("GET", picture.url) as reply:
            if reply.status_code != 200:
                raise InvalidRequest(f"{where}: fetching the image got HTTP {reply.status_code}",
                                     param=where)
            for block in reply.iter_bytes():
                data += block
                if len(data) > MAX_BYTES:
                    raise InvalidRequest(f"{where}: the image is over {MAX_BYTES // 2**20} MiB",
                                         param=where)
                if time.monotonic() > deadline:  # a server that trickles bytes
                    raise InvalidRequest(f"{where}: the image did not arrive within "
                                         f"{FETCH_TIMEOUT_S} s", param=where)
    except AddressRefused as exc:
        raise InvalidRequest(f"{where}: {exc}", param=where) from None
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"{where}: the image could not be fetched ({exc})",
                             param=where) from None
    return read_image(bytes(data), where)
