"""Hostile inputs shared by the hardening tests: GGUF headers whose counts lie (the one the
issue tried, and a hypothesis strategy of others) and pictures that are small files of
many pixels."""

from __future__ import annotations

import io
import struct

from hypothesis import strategies as st

_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q",
          12: "d"}


def crafted_gguf() -> bytes:
    """GGUF v3, no tensors, one key whose value is a UINT8 array of 2^62 items: 62 bytes
    that made gguf's reader loop while memory grew."""
    key = b"general.arrays"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<II", 9, 0) + struct.pack("<Q", 1 << 62))


def one_bit_png(side: int) -> bytes:
    """A white 1-bit PNG of side×side: 14 KB at 7000 that decode to 147 MB of RGB."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (side, side), 1).save(out, "PNG", optimize=True)
    return out.getvalue()


_COUNT = st.one_of(st.integers(0, 8), st.integers(0, 1 << 20), st.just(1 << 62),
                   st.just((1 << 64) - 1))


@st.composite
def _value(draw, depth: int = 0) -> bytes:
    kind = draw(st.sampled_from([*_FIXED, 8, 9] if depth < 2 else [*_FIXED, 8]))
    return struct.pack("<I", kind) + draw(_payload(kind, depth))


@st.composite
def _payload(draw, kind: int, depth: int) -> bytes:
    if kind in _FIXED:
        return draw(st.binary(min_size=struct.calcsize(_FIXED[kind]),
                              max_size=struct.calcsize(_FIXED[kind])))
    if kind == 8:
        text = draw(st.binary(max_size=16))
        return struct.pack("<Q", draw(st.one_of(st.just(len(text)), _COUNT))) + text
    item = draw(st.sampled_from([*_FIXED, 8] + ([9] if depth < 1 else [])))
    items = draw(st.lists(_payload(item, depth + 1), max_size=4))
    count = draw(st.one_of(st.just(len(items)), _COUNT))
    return struct.pack("<IQ", item, count) + b"".join(items)


@st.composite
def gguf_headers(draw) -> bytes:
    """A GGUF header of random keys, values and tensor entries whose every count may lie,
    cut anywhere."""
    version = draw(st.sampled_from([3, 3, 3, 2, 1, 0x03000000, 99]))
    keys = draw(st.lists(st.tuples(st.binary(min_size=1, max_size=20), _value()), max_size=5))
    tensors = draw(st.lists(st.tuples(st.binary(min_size=1, max_size=12),
                                      st.lists(_COUNT, max_size=5), st.integers(0, 40),
                                      _COUNT), max_size=3))
    data = b"GGUF" + struct.pack("<I", version)
    data += struct.pack("<QQ", draw(st.one_of(st.just(len(tensors)), _COUNT)),
                        draw(st.one_of(st.just(len(keys)), _COUNT)))
    for name, value in keys:
        data += struct.pack("<Q", len(name)) + name + value
    for name, dims, kind, offset in tensors:
        data += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        data += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset)
    return data[:draw(st.integers(0, len(data)))] if draw(st.booleans()) else data
