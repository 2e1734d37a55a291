"""A GGUF header is bounded before gguf's reader sees it (engine/catalog/gguf_bounds.py):
every count against the bytes left and against ceilings above any real model's; the
62-byte file that looped is refused at once; a header cut short is told from an absurd
one (a Hub file's first megabytes: fetch more); any header whatever is a model or an
InvalidModelFile with its reason, quickly, never a hang or another error."""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings

from engine.catalog.gguf_bounds import MAX_ELEMENTS, MAX_TENSORS, HeaderProblem, check_file, walk
from engine.catalog.gguf_file import GGUFInspector
from engine.errors import InvalidModelFile
from support.crafted import crafted_gguf, gguf_headers


def test_the_62_byte_file_is_refused_at_once(tmp_path):
    path = tmp_path / "crafted.gguf"
    path.write_bytes(crafted_gguf())
    started = time.monotonic()
    with pytest.raises(InvalidModelFile, match="4,611,686,018,427,387,904 array elements") as caught:
        GGUFInspector().inspect(path)
    assert time.monotonic() - started < 1
    assert "crafted.gguf" in caught.value.message


def test_a_failed_file_is_remembered_with_its_reason(tmp_path):
    path = tmp_path / "crafted.gguf"
    path.write_bytes(crafted_gguf())
    inspector = GGUFInspector()
    assert not inspector.known(path)
    with pytest.raises(InvalidModelFile):
        inspector.inspect(path)
    assert inspector.known(path) and "elements" in inspector.failure(path)
    path.write_bytes(crafted_gguf()[:30])  # changed: read again
    assert inspector.failure(path) is None


def test_a_header_cut_short_is_told_from_an_absurd_one():
    whole = crafted_gguf()[:-8] + (3).to_bytes(8, "little") + b"abc"  # an honest 3-byte array
    assert walk(whole) == len(whole)
    with pytest.raises(HeaderProblem) as cut:
        walk(whole[:-2])
    assert cut.value.truncated
    with pytest.raises(HeaderProblem) as absurd:
        walk(crafted_gguf() + bytes(1 << 16))  # 2^62 items are absurd whatever follows
    assert not absurd.value.truncated and f"at most {MAX_ELEMENTS:,}" in str(absurd.value)


def _header(tensors: int = 0, arrays: dict[str, int] = {}) -> bytes:
    """A GGUF v3 header: uint8 arrays under the given keys, `tensors` one-byte tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(arrays))
    for key, count in arrays.items():
        name = key.encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<IIQ", 9, 0, count)
        out += bytes(count)
    for i in range(tensors):
        name = f"t{i}".encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 1, 0, 0)
    return out


def test_the_ceilings_are_what_real_models_need():
    """Tensors in the tens of thousands, the vocabulary's arrays apart from the rest: a
    header at the old ceilings (999,000 tensor infos: 2.5 GB in the reader) is refused,
    one shaped as a real model's passes."""
    assert walk(_header(2_000, {"tokenizer.ggml.tokens": 262_144,
                                "tokenizer.ggml.scores": 262_144,
                                "tokenizer.ggml.token_type": 262_144,
                                "general.layers": 64})) > 0
    for absurd in (_header(MAX_TENSORS + 1), _header(arrays={"general.list": MAX_ELEMENTS + 1}),
                   _header(arrays={"tokenizer.ggml.merges": 2_000_000})):
        with pytest.raises(HeaderProblem) as refused:
            walk(absurd)
        assert not refused.value.truncated and "at most" in str(refused.value)


def test_the_starters_headers_pass_as_they_are(starters_dir):
    for path in starters_dir.glob("*.gguf"):
        started = time.monotonic()
        assert check_file(path) > 24
        assert time.monotonic() - started < 5  # Gemma's 262k-token vocabulary walked


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gguf_headers())
def test_any_header_is_a_model_or_a_reason_quickly(tmp_path_factory, header):
    path = tmp_path_factory.mktemp("h") / "fuzzed.gguf"
    path.write_bytes(header)
    started = time.monotonic()
    try:
        GGUFInspector().inspect(path)
    except InvalidModelFile as exc:
        assert exc.message
    assert time.monotonic() - started < 2


def test_a_wait_for_another_threads_parse_is_bounded(tmp_path, monkeypatch):
    """A request that finds the file being parsed by another thread waits at most
    WAIT_S, then is told so; it never waits for ever on a parse that does not end."""
    import threading

    import engine.catalog.gguf_file as gguf_file

    stuck, release = threading.Event(), threading.Event()

    def parse(path):
        stuck.set()
        release.wait(30)
        raise InvalidModelFile(f"{path.name}: released")

    monkeypatch.setattr(gguf_file, "_parse", parse)
    inspector = GGUFInspector()
    inspector.WAIT_S = 0.5
    path = tmp_path / "slow.gguf"
    path.write_bytes(crafted_gguf())
    first = threading.Thread(target=lambda: pytest.raises(InvalidModelFile, inspector.inspect,
                                                          path))
    first.start()
    assert stuck.wait(10)
    started = time.monotonic()
    with pytest.raises(InvalidModelFile, match="still being read"):
        inspector.inspect(path)
    assert time.monotonic() - started < 5
    release.set()
    first.join(10)
