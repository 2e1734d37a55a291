"""Images as requests carry them: every format the engine reads, decoded upright, and
anything else (cut short, disguised, too large, a decompression bomb, random bytes)
refused with a 400 naming the part, never a crash."""

from __future__ import annotations

import base64
from dataclasses import replace
import io
import struct
import zlib

import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from engine.conversation.images import (MAX_PICTURES, MAX_PIXELS, MAX_REQUEST_PIXELS, check_request,
                                 decoded, from_base64, from_data_url, read_image)
from engine.errors import InvalidRequest
from support.crafted import one_bit_png


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_each_format_is_read_as_rgb_pixels(fmt):
    read = read_image(encoded(Image.new("RGB", (40, 30), (250, 10, 10)), fmt), "image")
    assert (read.width, read.height) == (40, 30) and read.rgb == b""  # the header alone
    picture = decoded(read)
    assert (picture.width, picture.height) == (40, 30)
    assert len(picture.rgb) == 40 * 30 * 3
    assert picture.rgb[0] > 200 and picture.rgb[1] < 60  # red stays red


def test_a_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    assert decoded(read_image(out.getvalue(), "image")).rgb[:3] == bytes((255, 0, 0))


def test_exif_orientation_is_applied():
    """A phone's portrait photo: stored landscape, EXIF says rotate."""
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to view
    data = encoded(Image.new("RGB", (60, 20)), "JPEG", exif=exif.tobytes())
    picture = read_image(data, "image")
    assert (picture.width, picture.height) == (20, 60)  # known from the header
    picture = decoded(picture)
    assert (picture.width, picture.height) == (20, 60)
    assert len(picture.rgb) == 20 * 60 * 3


def test_the_same_file_has_the_same_identity():
    data = encoded(Image.new("RGB", (5, 5)), "PNG")
    assert read_image(data, "a").digest == read_image(data, "b").digest
    assert read_image(encoded(Image.new("RGB", (5, 6)), "PNG"), "c").digest != \
        read_image(data, "a").digest


def _bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header claims a huge image and holds almost nothing."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(
        b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("data, says", [
    (b"", "empty"),
    (b"hello, this is text named photo.png", "not an image"),
    (encoded(Image.new("RGB", (64, 64)), "PNG")[:60], "cannot be decoded"),
    (_bomb_png(100_000, 100_000), "megapixels"),
    (_bomb_png(MAX_PIXELS, 2), "megapixels"),
    (b"%PDF-1.4\n" + b"0" * 100, "not an image"),
    (encoded(Image.new("RGB", (8, 8)), "TIFF"), "not an image"),  # Pillow reads it: not offered
])
def test_bad_images_are_refused_naming_the_part(data, says):
    with pytest.raises(InvalidRequest) as caught:  # by its header, or as it decodes
        decoded(read_image(data, "messages[0].content[1]"))
    assert says in caught.value.message
    assert caught.value.param == "messages[0].content[1]"


def test_bad_encodings_are_refused():
    with pytest.raises(InvalidRequest, match="base64"):
        from_base64("not base64 at all!", "images[0]")
    with pytest.raises(InvalidRequest, match="data URL"):
        from_data_url("file:///etc/passwd", "image_url")
    png = base64.b64encode(encoded(Image.new("RGB", (3, 3)), "PNG")).decode()
    assert from_data_url(f"data:image/png;base64,{png}", "x").width == 3


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_are_an_image_or_a_400(data):
    try:
        picture = decoded(read_image(data, "image"))
    except InvalidRequest:
        return
    assert len(picture.rgb) == picture.width * picture.height * 3


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.binary(min_size=1, max_size=64))
def test_a_real_image_damaged_anywhere_is_an_image_or_a_400(at, garbage):
    data = bytearray(encoded(Image.new("RGB", (32, 24), (1, 2, 3)), "PNG"))
    data[at:at + len(garbage)] = garbage
    try:
        decoded(read_image(bytes(data), "image"))
    except InvalidRequest:
        pass


def test_a_small_file_of_many_pixels_is_read_by_its_header_and_decoded_to_the_size_asked():
    data = one_bit_png(7000)
    assert len(data) < 20_000  # 14 KB on the wire, 147 MB as RGB
    pictures = [read_image(data, f"images[{i}]") for i in range(12)]
    assert all((p.width, p.height, p.rgb, p.data) == (7000, 7000, b"", data) for p in pictures)
    small = decoded(pictures[0], 512)
    assert (small.width, small.height) == (512, 512) and len(small.rgb) == 512 * 512 * 3
    assert small.data == b"" and small.digest == pictures[0].digest


def test_a_request_is_capped_in_pictures_and_in_pixels():
    one = read_image(encoded(Image.new("RGB", (8, 8)), "PNG"), "x")
    check_request((one,) * MAX_PICTURES)
    many = tuple(read_image(encoded(Image.new("RGB", (8, 8)), "PNG"), f"messages[0].content[{i}]")
                 for i in range(MAX_PICTURES + 1))
    with pytest.raises(InvalidRequest, match=f"at most {MAX_PICTURES} new images") as caught:
        check_request(many)
    assert caught.value.param == f"messages[0].content[{MAX_PICTURES}]"
    big = read_image(one_bit_png(7000), "images[0]")
    count = MAX_REQUEST_PIXELS // (7000 * 7000) + 1
    with pytest.raises(InvalidRequest, match="megapixels in all"):
        check_request((big,) * count)


def test_pictures_the_engine_encoded_before_do_not_count_against_the_caps():
    """A conversation resends its history's pictures every turn: those the encode cache
    knows by hash cost no tower pass, so its 17th picture, or a ninth 12-megapixel photo,
    is no 400; only the new ones are capped, and all of them at MAX_SEEN_PICTURES."""
    from engine.conversation.images import MAX_SEEN_PICTURES

    pictures = tuple(read_image(encoded(Image.new("RGB", (8, 8), (i, 0, 0)), "PNG"),
                                f"messages[{i}].content[1]") for i in range(MAX_PICTURES + 4))
    history = {p.digest for p in pictures[:-1]}
    check_request(pictures, known=history.__contains__)  # 20 in all, 1 new
    with pytest.raises(InvalidRequest, match="new images"):
        check_request(pictures)
    photo = read_image(one_bit_png(4000), "x")  # 16 MP each: the 7th passes 100 MP
    seen = tuple(replace(photo, digest=f"{i:064x}") for i in range(9))
    check_request(seen, known=lambda digest: digest != f"{8:064x}")
    with pytest.raises(InvalidRequest, match="megapixels in all"):
        check_request(seen)
    flood = tuple(replace(pictures[0], where=f"p{i}") for i in range(MAX_SEEN_PICTURES + 1))
    with pytest.raises(InvalidRequest, match=f"at most {MAX_SEEN_PICTURES} images") as caught:
        check_request(flood, known=lambda _d: True)
    assert caught.value.param == f"p{MAX_SEEN_PICTURES}"
    # known or not, each is decoded again every turn: all of them bounded in pixels
    from engine.conversation.images import MAX_SEEN_PIXELS

    photos = tuple(replace(photo, digest=f"{i:064x}", where=f"p{i}")
                   for i in range(MAX_SEEN_PIXELS // (4000 * 4000) + 1))
    check_request(photos[:-1], known=lambda _d: True)
    with pytest.raises(InvalidRequest, match="those sent before included") as caught:
        check_request(photos, known=lambda _d: True)
    assert caught.value.param == photos[-1].where


@pytest.fixture
def web(tmp_path):
    """A loopback HTTP server of the files in a folder."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *_a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_image_on_the_web_is_fetched_only_when_allowed(web):
    from engine.conversation.images import fetched, remote

    folder, url = web
    (folder / "cat.png").write_bytes(encoded(Image.new("RGB", (12, 7)), "PNG"))
    (folder / "big.png").write_bytes(b"\0" * (21 << 20))
    wanted = (remote(f"{url}/cat.png", "messages[0].content[0].image_url"),)
    with pytest.raises(InvalidRequest, match="--allow-image-urls") as refused:
        fetched(wanted, allowed=False)
    assert refused.value.param == "messages[0].content[0].image_url"
    with pytest.raises(InvalidRequest, match="127.0.0.1 is 127.0.0.1, a loopback address"):
        fetched(wanted, allowed=True)  # allowed: the web, not this machine's own services
    picture, = fetched(wanted, allowed=True, hosts=frozenset({"127.0.0.1"}))  # listed
    assert (picture.width, picture.height, picture.url) == (12, 7, "")
    for name, says in (("missing.png", "HTTP 404"), ("big.png", "over 20 MiB")):
        with pytest.raises(InvalidRequest, match=says):
            fetched((remote(f"{url}/{name}", "x"),), allowed=True,
                    hosts=frozenset({"127.0.0.1"}))


@pytest.mark.parametrize("address, says", [
    ("127.0.0.2", "loopback"), ("10.1.2.3", "private"), ("192.168.1.20", "private"),
    ("169.254.169.254", "link-local"), ("::1", "loopback"), ("fd00::1", "private"),
    ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"), ("100.64.0.1", "private"),
])
def test_addresses_a_request_may_not_reach(address, says):
    from engine.outbound import AddressRefused, checked_address

    with pytest.raises(AddressRefused, match=says):
        checked_address(address, 80)
    assert checked_address(address, 80, frozenset({address})) == address  # the user listed it
    assert checked_address("8.8.8.8", 443) == "8.8.8.8"


def test_a_name_is_checked_at_each_connection_and_the_address_checked_is_the_one_used(
        web, monkeypatch):
    """DNS rebinding: the name resolves to a public address when first looked at and to
    loopback at the connection; the connection's own resolution is the one checked."""
    import socket

    from engine.conversation.images import fetched, remote

    folder, url = web
    (folder / "cat.png").write_bytes(encoded(Image.new("RGB", (4, 4)), "PNG"))
    port = int(url.rsplit(":", 1)[1])
    real = socket.getaddrinfo
    answers = iter(["93.184.216.34", "127.0.0.1"])

    def rebinding(host, *args, **kwargs):
        if host == "pictures.example":
            return real(next(answers, "127.0.0.1"), *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    from engine.outbound import checked_address
    assert checked_address("pictures.example", port) == "93.184.216.34"
    with pytest.raises(InvalidRequest, match="loopback"):
        fetched((remote(f"http://pictures.example:{port}/cat.png", "x"),), allowed=True)
