"""A GGUF header walked and bounded before the `gguf` package's reader sees it.

The reader trusts the counts a file declares: an array element that lies past the end of
the file is an empty slice, its offset never advances, and 62 bytes claiming 2^62 items
loop for ever while memory grows. The reader also keeps a numpy view per array element
(about 150 bytes each), so even an honest count costs memory in proportion. Here every
count is checked against the bytes that are really there, and against ceilings above any
real model's and low enough that a header costs the reader a few hundred MB at most:
the vocabulary's arrays (`tokenizer.ggml.*`: Gemma 3's 262,144 tokens with their scores
and types are 786k elements, Qwen's 151k tokens and their merges about 450k) apart from
every other array (a few layer lists: thousands), and tensors in the tens of thousands
(DeepSeek V3's 671B is about 1,200). The ceilings were 2 M elements and 1 M tensors: one
38 MB header of 999,000 tensor infos cost 2.5 GB and 26 s. A plain `struct` walk
allocates nothing per element.

`HeaderProblem.truncated` tells a header that merely runs past the bytes given (a Hub
file's first megabytes: fetch more) from one that is absurd (refuse it).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

MAX_VOCABULARY = 1_600_000  # elements of the tokenizer.ggml.* arrays together
MAX_ELEMENTS = 65_536  # elements of every other array together
MAX_STRING = 16 << 20  # one string: chat templates are tens of kB
MAX_NAME = 4096  # a key or a tensor's name (llama.cpp's own limit is 64 for tensors)
MAX_TENSORS = 65_536
VOCABULARY = b"tokenizer.ggml."
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 2  # arrays of arrays (the format allows them; no model uses more)

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class HeaderProblem(ValueError):
    """A header the reader must not see; `truncated` when only the bytes ran out."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


class _Walk:
    def __init__(self, data, order: str):
        self.data, self.size, self.offset = data, len(data), 0
        self.order, self.elements, self.vocabulary = order, 0, 0
        self.in_vocabulary = False  # the key being walked is the vocabulary's

    def take(self, count: int, what: str) -> int:
        if count > self.size - self.offset:
            raise HeaderProblem(f"{what} needs {count:,} bytes at offset {self.offset:,} but "
                                f"the file has {self.size - self.offset:,} left", truncated=True)
        start = self.offset
        self.offset += count
        return start

    def number(self, fmt: str, what: str) -> int:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(self.order + fmt, self.data, start)[0]

    def string(self, what: str, limit: int = MAX_STRING) -> int:
        """Walks a string; where it starts."""
        length = self.number("Q", what)
        if length > limit:
            raise HeaderProblem(f"{what} claims {length:,} bytes (at most {limit:,})")
        return self.take(length, what)

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind in _FIXED:
            self.take(_FIXED[kind], what)
        elif kind == _STRING:
            self.string(what)
        elif kind == _ARRAY:
            self.array(what, depth + 1)
        else:
            raise HeaderProblem(f"{what} has an unknown value type {kind}")

    def array(self, what: str, depth: int) -> None:
        if depth > MAX_NESTING:
            raise HeaderProblem(f"{what} nests arrays more than {MAX_NESTING} deep")
        kind = self.number("I", what)
        count = self.number("Q", what)
        if self.in_vocabulary:
            self.vocabulary += count
            if self.vocabulary > MAX_VOCABULARY:
                raise HeaderProblem(f"{what} brings the vocabulary's arrays to "
                                    f"{self.vocabulary:,} array elements (at most "
                                    f"{MAX_VOCABULARY:,})")
        else:
            self.elements += count
            if self.elements > MAX_ELEMENTS:
                raise HeaderProblem(f"{what} brings the metadata's other arrays to "
                                    f"{self.elements:,} array elements (at most "
                                    f"{MAX_ELEMENTS:,})")
        # every element takes at least one byte (a string its 8-byte length): a count the
        # remaining bytes cannot hold is refused before anything is walked
        least = _FIXED.get(kind, 8 if kind == _STRING else 12)
        if count * least > self.size - self.offset:
            raise HeaderProblem(f"{what} claims {count:,} elements but the file has "
                                f"{self.size - self.offset:,} bytes left", truncated=True)
        if kind in _FIXED:
            self.take(count * _FIXED[kind], what)
        elif kind == _STRING:
            self.strings(count, what)
        else:
            for _ in range(count):
                self.value(kind, what, depth)

    def strings(self, count: int, what: str) -> None:
        """`count` strings in a row (a vocabulary: hundreds of thousands), walked inline."""
        data, offset, size = self.data, self.offset, self.size
        length_at = struct.Struct(self.order + "Q").unpack_from
        for _ in range(count):
            if offset + 8 > size:
                raise HeaderProblem(f"{what} runs past the end of the file", truncated=True)
            length = length_at(data, offset)[0]
            if length > MAX_STRING:
                raise HeaderProblem(f"{what} holds a string of {length:,} bytes "
                                    f"(at most {MAX_STRING:,})")
            offset += 8 + length
        if offset > size:
            raise HeaderProblem(f"{what} runs past the end of the file", truncated=True)
        self.offset = offset


def walk(data) -> int:
    """The length of the header in `data` (a bytes-like object or a memory map), every
    count checked; HeaderProblem when it is absurd or runs past the bytes given."""
    if len(data) < 24 or bytes(data[:4]) != b"GGUF":
        raise HeaderProblem("not a GGUF header", truncated=len(data) < 24)
    version = struct.unpack_from("<I", data, 4)[0]
    order = ">" if version & 0xFFFF == 0 else "<"  # as the reader tells a swapped file
    version = struct.unpack_from(order + "I", data, 4)[0]
    if version not in (2, 3):
        raise HeaderProblem(f"GGUF version {version} is not supported (2 or 3)")
    tensors, keys = struct.unpack_from(order + "QQ", data, 8)
    if tensors > MAX_TENSORS:
        raise HeaderProblem(f"the header claims {tensors:,} tensors (at most {MAX_TENSORS:,})")
    cursor = _Walk(data, order)
    cursor.offset = 24
    if keys * 13 > cursor.size - 24:  # a key: its length, a name byte, its type, a value byte
        raise HeaderProblem(f"the header claims {keys:,} metadata keys in "
                            f"{cursor.size - 24:,} bytes", truncated=True)
    for index in range(keys):
        start = cursor.string(f"metadata key {index}", MAX_NAME)
        cursor.in_vocabulary = bytes(data[start:start + len(VOCABULARY)]) == VOCABULARY
        cursor.value(cursor.number("I", f"metadata key {index}"), f"metadata key {index}")
    if tensors * 24 > cursor.size - cursor.offset:
        raise HeaderProblem(f"the header claims {tensors:,} tensors in "
                            f"{cursor.size - cursor.offset:,} bytes", truncated=True)
    for index in range(tensors):
        what = f"tensor {index}"
        cursor.string(what, MAX_NAME)
        dims = cursor.number("I", what)
        if not 1 <= dims <= MAX_DIMS:
            raise HeaderProblem(f"{what} has {dims:,} dimensions (1 to {MAX_DIMS})")
        cursor.take(8 * dims + 4 + 8, what)
    return cursor.offset


def check_file(path: str | os.PathLike) -> int:
    """`walk` over a file's bytes, through a read-only map (a header may be megabytes)."""
    with Path(path).open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 24:
            return walk(handle.read())
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return walk(mapped)
