"""GGUF files: validation and the metadata the engine needs, read with the `gguf` package.

llama.cpp can abort the whole process on a malformed file, so every file is checked here
before llama.cpp opens it: the header must parse and every tensor's data must lie inside
the file (a truncated download fails that). Parsing a real model's vocabulary takes
seconds, so results are cached by (path, size, mtime), in memory and on disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InvalidModelFile
from .adapters import adapter_facts, matrix_shapes
from .gguf_bounds import check_file
from .shape import ModelShape, field_value, shape_or_none
from ..files import read_json, write_best_effort

GGUF_MAGIC = b"GGUF"
_CACHE_VERSION = 10  # 10: the shape's architecture
_CACHE_SCHEMA = {"type": "object", "properties": {
    "version": {"type": "integer"},
    "entries": {"type": "object", "additionalProperties": {"type": "object"}}}}
# Encoder architectures: their models embed text and cannot chat.
ENCODERS = {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
            "modern-bert", "neo-bert", "t5encoder"}


@dataclass(frozen=True)
class GGUFInfo:
    path: str
    size_bytes: int
    architecture: str
    name: str
    block_count: int
    context_length: int
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
    tensor_count: int
    tokenizer: str
    vocab_size: int
    vocab_hash: str  # tokenizer model, tokens, token types and special ids
    shape: "ModelShape | None" = None  # None for architectures it cannot describe
    embedding: bool = False  # an embedding model (pooled vectors), not a chat model
    sampling: dict | None = None  # the authors' general.sampling.* keys ("temp": 0.6, ...)
    matrices: dict | None = None  # weight shapes by tensor name (adapters.matrix_shapes)
    adapter: dict | None = None  # a LoRA adapter's facts (adapters.adapter_facts)


def _token_text(reader, token_id) -> str | None:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None or token_id is None or not 0 <= int(token_id) < len(tokens.data):
        return None
    return tokens.contents(int(token_id))


def _vocab_hash(reader) -> str:
    digest = hashlib.sha256()
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        field = reader.fields.get(key)
        digest.update(key.encode())
        for part in field.parts[2:] if field else ():  # type, lengths and data
            digest.update(part.tobytes())
    return digest.hexdigest()


def _check_extent(reader, path: Path, size: int) -> None:
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise InvalidModelFile(
                f"{path.name} is truncated: tensor {tensor.name} needs bytes up to {end:,} "
                f"but the file has {size:,} (an incomplete download?)"
            )


def open_gguf(path: str | os.PathLike, mode: str = "r"):
    """The `gguf` package's GGUFReader, its memory map seen as a plain array, over a header
    first bounded by `gguf_bounds.check_file` (HeaderProblem, a ValueError, when it is
    absurd or truncated: the reader itself would loop or take gigabytes). The reader
    slices the map once per element of every field, and each slice of numpy's memmap
    subclass pays bookkeeping that was two thirds of the parse: Gemma 3's 262k-token
    vocabulary took 13 s, now 4 s. The map stays open underneath the view."""
    check_file(path)
    return _plain_map_reader()(path, mode)


def write_whole(writer) -> None:
    """A `gguf` GGUFWriter's file written and closed: header, metadata, tensors (the
    writer's own steps, in its order)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@functools.cache
def _plain_map_reader():
    import numpy as np
    from gguf import GGUFReader  # imported late: it is only needed for new files

    class PlainMapReader(GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mapped):
            self._plain = mapped.view(np.ndarray)

    return PlainMapReader


def _parse(path: Path) -> GGUFInfo:
    size = path.stat().st_size
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InvalidModelFile(f"{path.name} is not a GGUF model file (wrong magic bytes)")
    try:
        return _read(path, size)
    except InvalidModelFile:
        raise
    except Exception as exc:  # the reader raises many kinds on damaged files
        raise InvalidModelFile(f"{path.name} is damaged or truncated: {exc}") from exc


def _read(path: Path, size: int) -> GGUFInfo:
    reader = open_gguf(path)
    _check_extent(reader, path, size)
    arch = field_value(reader, "general.architecture")
    if not arch:
        raise InvalidModelFile(f"{path.name} has no general.architecture: not a model file")
    adapter = adapter_facts(reader, path.name) if field_value(reader, "general.type") == "adapter" \
        else None
    return GGUFInfo(
        path=str(path),
        size_bytes=size,
        architecture=str(arch),
        name=str(field_value(reader, "general.name", path.stem)),
        block_count=int(field_value(reader, f"{arch}.block_count", 0)),
        context_length=int(field_value(reader, f"{arch}.context_length", 0)),
        chat_template=field_value(reader, "tokenizer.chat_template"),
        bos_token=_token_text(reader, field_value(reader, "tokenizer.ggml.bos_token_id")),
        eos_token=_token_text(reader, field_value(reader, "tokenizer.ggml.eos_token_id")),
        add_bos_token=bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
        tensor_count=len(reader.tensors),
        tokenizer=str(field_value(reader, "tokenizer.ggml.model", "")),
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data)
        if "tokenizer.ggml.tokens" in reader.fields else 0,
        vocab_hash=_vocab_hash(reader),
        shape=shape_or_none(reader, path.stem),
        embedding=_is_embedding(reader, str(arch)),
        sampling=_sampling_keys(reader),
        matrices=None if adapter else matrix_shapes(reader),
        adapter=adapter,
    )


def _sampling_keys(reader) -> dict:
    """llama.cpp's LLAMA_MODEL_META_KEY_SAMPLING_* keys the file carries, by short name."""
    prefix = "general.sampling."
    return {key[len(prefix):]: reader.fields[key].contents()
            for key in reader.fields if key.startswith(prefix)}


def _is_embedding(reader, arch: str) -> bool:
    """An encoder, or a model whose metadata asks for pooled outputs (Qwen3-Embedding:
    a causal model with pooling_type "last")."""
    return arch in ENCODERS or int(field_value(reader, f"{arch}.pooling_type", 0) or 0) > 0


def read_header(path: Path) -> tuple[ModelShape, str] | None:
    """The shape and vocabulary hash from a file's header alone (its tensor data is not
    read): None when the header is incomplete or the architecture unknown."""
    reader = _open_header(path)
    return reader and _model_header(reader, path)


def read_model_or_adapter(path: Path) -> tuple[ModelShape, str] | tuple[str, dict] | None:
    """From one parse of a file's header (seconds for a large vocabulary): an adapter's
    architecture and facts (adapters.adapter_facts), or a model's shape and vocabulary
    hash; None when the header is incomplete or the architecture unknown."""
    reader = _open_header(path)
    return None if reader is None else _model_or_adapter(reader, path)


def read_facts(path: Path) -> tuple[tuple, str | None] | None:
    """read_model_or_adapter's answer and the file's chat template, from one parse."""
    reader = _open_header(path)
    found = None if reader is None else _model_or_adapter(reader, path)
    if found is None:
        return None
    template = field_value(reader, "tokenizer.chat_template")
    return found, template if isinstance(template, str) else None


def _model_or_adapter(reader, path: Path):
    if field_value(reader, "general.type") == "adapter":
        return str(field_value(reader, "general.architecture", "")), adapter_facts(reader, path.name)
    return _model_header(reader, path)


def _open_header(path: Path):
    try:
        return open_gguf(path)
    except (ValueError, KeyError, IndexError, OSError):
        return None


def _model_header(reader, path: Path) -> tuple[ModelShape, str] | None:
    try:
        shape = shape_or_none(reader, path.stem)
        return (shape, _vocab_hash(reader)) if shape else None
    except (ValueError, KeyError, IndexError):
        return None


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _from_record(record: dict) -> GGUFInfo:
    shape = record.get("shape")
    if shape is not None:  # JSON gave lists where the shape holds tuples
        shape = ModelShape(**{key: _tuples(value) for key, value in shape.items()})
    return GGUFInfo(**{**record, "shape": shape})


class GGUFInspector:
    """Validates files and caches what it read, keyed by path, size and mtime; a file that
    failed is remembered with its reason (asked again, it fails at once)."""

    WAIT_S = 120.0  # for another thread's parse of the same file (a large vocabulary: 4 s)

    def __init__(self, cache_file: Path | None = None):
        self._cache_file = cache_file
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = self._load()
        self._failed: dict[str, str] = {}  # why each file that failed did, by key
        self._parsing: dict[str, threading.Event] = {}  # files being parsed, by key

    def inspect(self, path: str | os.PathLike) -> GGUFInfo:
        path = Path(path)
        key = self._key(path)
        with self._lock:
            cached = self._entries.get(key)
            if key in self._failed:
                raise InvalidModelFile(self._failed[key])
            flight = self._parsing.get(key) if cached is None else None
            first = cached is None and flight is None
            if first:
                flight = self._parsing[key] = threading.Event()
        if cached is not None:
            try:
                return _from_record(cached)
            except (TypeError, ValueError, AttributeError):  # a record of the wrong shape
                with self._lock:
                    self._entries.pop(key, None)
                return self.inspect(path)  # read again
        if not first:  # another request parses it: a 262k vocabulary takes seconds, once
            if not flight.wait(self.WAIT_S):
                raise InvalidModelFile(f"{path.name} is still being read after "
                                       f"{self.WAIT_S:.0f} s")
            return self.inspect(path)
        try:
            info = _parse(path)
            with self._lock:
                self._entries[key] = asdict(info)
                self._save()
            return info
        except InvalidModelFile as exc:
            with self._lock:
                self._failed[key] = exc.message
            raise
        finally:
            with self._lock:
                self._parsing.pop(key).set()

    def record(self, path: str | os.PathLike) -> dict:
        """What `inspect` read of `path`, as JSON data (a bundle ships it: `remember`)."""
        self.inspect(path)
        with self._lock:
            return self._entries[self._key(Path(path))]

    def remember(self, path: str | os.PathLike, record: dict) -> None:
        """Take `record` (from `record`, for a copy of this very file) as read from `path`:
        a large vocabulary takes seconds to parse, and a bundle's files are known."""
        key = self._key(Path(path))
        with self._lock:
            self._entries[key] = {**record, "path": str(path)}
            self._save()

    def known(self, path: str | os.PathLike) -> bool:
        """Whether `inspect` would answer at once (from the cache, not by parsing)."""
        try:
            key = self._key(Path(path))
        except InvalidModelFile:
            return False
        with self._lock:
            return key in self._entries or key in self._failed

    def failure(self, path: str | os.PathLike) -> str | None:
        """Why `path` could not be read, when it was tried and failed."""
        try:
            key = self._key(Path(path))
        except InvalidModelFile as exc:
            return exc.message
        with self._lock:
            return self._failed.get(key)

    @staticmethod
    def _key(path: Path) -> str:
        try:
            stat = path.stat()
        except OSError as exc:
            raise InvalidModelFile(f"cannot read {path}: {exc.strerror}") from exc
        return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"

    def _load(self) -> dict[str, dict]:
        data = read_json(self._cache_file, _CACHE_SCHEMA) or {}
        return data.get("entries", {}) if data.get("version") == _CACHE_VERSION else {}

    def _save(self) -> None:
        if self._cache_file is None:
            return
        write_best_effort(self._cache_file,
                          json.dumps({"version": _CACHE_VERSION, "entries": self._entries}))
