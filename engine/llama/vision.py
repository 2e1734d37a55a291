"""A vision projector on libmtmd: images into a sequence of the loaded model's context.

llama-cpp-python's `MTMDChatHandler` clears the KV memory on every image request and uses
sequence 0 only; this calls mtmd directly so that images go into any sequence the
scheduler gives them, between its other steps, and so that an image's embedding, once
encoded, can be kept and decoded again without the tower (model/vision.py's ImageCache).

A prompt with images is a token list like any other: each image chunk takes as many
entries as the positions it occupies, filled with negative ids derived from the image's
hash. Two prompts holding the same image share those entries, so the prefix matching of
the scheduler and the prompt cache works across images unchanged; a negative id is never
given to llama_decode (the image's span goes through `decode`)."""

from __future__ import annotations

import ctypes
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as llama
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from ..conversation.images import DECODED_SIDE, Picture, decoded
from ..errors import InvalidRequest, ModelLoadFailed
from .backend import _log, measured_load
from .runtime import Chunk, DecodeFailed, LlamaModel, NoKVSlot

TEXT, IMAGE = 0, 1  # mtmd_input_chunk_type
_SPAN = 2**31 - 2  # the negative ids an image's entries take: -1 .. -(2**31 - 1)
_REFUSALS = {2: "one is too narrow or too flat for its tiles; crop it closer to a square"}


@dataclass(frozen=True)
class ImagePiece:
    """One image chunk of a prompt (an idefics3 image is several: its tiles, its overview)."""
    chunk: object  # mtmd_input_chunk_p, owned by its ImagePrompt
    key: str       # the image's hash and the chunk's place among that image's chunks
    n_tokens: int  # embeddings it decodes into
    n_pos: int     # positions it takes (fewer than its tokens under M-RoPE)


class ImagePrompt:
    """A prompt's tokens with its images' spans, and the mtmd chunks they come from."""

    def __init__(self, chunks, tokens: list[int], images: dict[int, ImagePiece]):
        self._chunks, self.tokens, self.images = chunks, tokens, images

    def close(self) -> None:
        if self._chunks is not None:
            mtmd.mtmd_input_chunks_free(self._chunks)
            self._chunks = None


def image_ids(key: str, n: int) -> list[int]:
    """The token entries of an image chunk's span: the same image, the same entries."""
    base = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
    return [-1 - (base + i) % _SPAN for i in range(n)]


class Projector:
    """A loaded mmproj file beside its text model. Worker thread only, as the model."""

    def __init__(self, path: Path, model: LlamaModel, n_threads: int, device: str,
                 min_tokens: int = -1, max_tokens: int = -1, longest: int = DECODED_SIDE):
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = device != "CPU", n_threads, False
        params.warmup = True  # the compute buffer is reserved now, and measured with the load
        params.image_min_tokens, params.image_max_tokens = min_tokens, max_tokens
        mtmd.mtmd_log_set(_log, None)
        mtmd.mtmd_helper_log_set(_log, None)
        with measured_load() as log:
            self._ctx = mtmd.mtmd_init_from_file(str(path).encode(), model.model, params)
        if not self._ctx:
            raise ModelLoadFailed(f"libmtmd could not load the projector {path.name} with "
                                  f"{model.path.name} (does it belong to this model?)")
        if not mtmd.mtmd_support_vision(self._ctx):
            self.close()
            raise ModelLoadFailed(f"{path.name} is not a vision projector")
        self.path, self.n_vocab, self.n_embd = path, model.n_vocab, model.n_embd
        self.longest = longest  # a picture's longest side as decoded for it
        #: bytes libmtmd allocated, by (device, kind): the weights are "model"
        self.buffers = {(device if where == "projector" else where, kind): size
                        for (where, kind), size in log.totals().items()}

    def close(self) -> None:
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None

    # -- a prompt -----------------------------------------------------------------------

    def tokenize(self, texts: list[str], pictures: list[Picture], bos: int | None) -> ImagePrompt:
        """The prompt `texts[0] picture[0] texts[1] … texts[-1]` as tokens and image
        spans, each image wrapped in the model's own markers by libmtmd."""
        keep, bitmaps, parts = [], [], []  # what the parts point into, alive until the call
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            for i, text in enumerate(texts):
                if text:
                    data = text.encode()
                    piece = mtmd.mtmd_input_text(data, len(data), False, True)
                    keep += [data, piece]
                    parts.append(mtmd.mtmd_input_part(ctypes.pointer(piece), None))
                if i < len(pictures):
                    bitmaps.append(self._bitmap(pictures[i]))
                    parts.append(mtmd.mtmd_input_part(None, bitmaps[-1]))
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(parts))(
                *[ctypes.pointer(part) for part in parts])
            failed = mtmd.mtmd_tokenize_from_parts(self._ctx, chunks, array, len(parts), False)
        except BaseException:
            mtmd.mtmd_input_chunks_free(chunks)
            raise
        finally:
            for bitmap in bitmaps:  # the chunks hold copies
                mtmd.mtmd_bitmap_free(bitmap)
        if failed:
            mtmd.mtmd_input_chunks_free(chunks)
            sizes = ", ".join(f"{p.width}×{p.height}" for p in pictures)
            raise InvalidRequest(f"the projector cannot take these images ({sizes}): "
                                 + _REFUSALS.get(failed, f"libmtmd's error {failed}"),
                                 param="messages")
        prompt = self._walk(chunks, Counter(p.digest for p in pictures))
        if bos is not None and (not prompt.tokens or prompt.tokens[0] != bos):
            prompt.tokens.insert(0, bos)
            prompt.images = {start + 1: piece for start, piece in prompt.images.items()}
        return prompt

    def _bitmap(self, picture: Picture):
        picture = decoded(picture, self.longest)  # one at a time, at the size it takes
        data = (ctypes.c_uint8 * len(picture.rgb)).from_buffer_copy(picture.rgb)
        bitmap = mtmd.mtmd_bitmap_init(picture.width, picture.height, data)
        if not bitmap:
            raise InvalidRequest(f"libmtmd refused the {picture.width}×{picture.height} image",
                                 param="messages")
        mtmd.mtmd_bitmap_set_id(bitmap, picture.digest.encode())
        return bitmap

    def _walk(self, chunks, occurrences: Counter) -> ImagePrompt:
        """Tokens and image spans of tokenized chunks; an image marker the model's
        vocabulary lacks is refused here (llama_decode would abort on it). A picture's
        chunks (idefics3: its tiles and the overview) are keyed by its hash and their
        place in it, the same wherever it occurs (`occurrences`: each picture's in the
        request), so a picture sent twice is encoded once."""
        prompt, seen = ImagePrompt(chunks, [], {}), {}
        per_picture = _chunks_per_picture(chunks, occurrences)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == TEXT:
                count = ctypes.c_size_t()
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens = [ids[j] for j in range(count.value)]
                if any(not 0 <= t < self.n_vocab for t in tokens):
                    prompt.close()
                    raise InvalidRequest(
                        f"the projector {self.path.name} marks images with tokens this "
                        "model's vocabulary lacks: it belongs to another model",
                        param="model")
                prompt.tokens.extend(tokens)
            elif kind == IMAGE:
                digest = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
                n = seen[digest] = seen.get(digest, -1) + 1
                key = f"{digest}:{n % per_picture[digest]}"
                piece = ImagePiece(chunk, key, mtmd.mtmd_input_chunk_get_n_tokens(chunk),
                                   mtmd.mtmd_input_chunk_get_n_pos(chunk))
                prompt.images[len(prompt.tokens)] = piece
                prompt.tokens.extend(image_ids(piece.key, piece.n_pos))
            else:
                prompt.close()
                raise InvalidRequest("only images are supported, not audio", param="messages")
        return prompt

    # -- evaluation ---------------------------------------------------------------------

    def encode(self, piece: ImagePiece) -> np.ndarray:
        """The image chunk through the vision tower: its embeddings, a copy."""
        if mtmd.mtmd_encode_chunk(self._ctx, piece.chunk) != 0:
            raise DecodeFailed("the vision tower failed to encode an image")
        out = mtmd.mtmd_get_output_embd(self._ctx)
        return np.ctypeslib.as_array(out, shape=(piece.n_tokens * self.n_embd,)).copy()

    def decode(self, model: LlamaModel, chunk: Chunk, embeddings: np.ndarray) -> int:
        """An image chunk's encoded embeddings into its sequence from its start (M-RoPE
        positions and non-causal attention as the model needs); the position after them."""
        piece = chunk.image
        if embeddings.size != piece.n_tokens * self.n_embd:
            raise DecodeFailed("an image's embeddings do not match its chunk")
        new_pos = llama.llama_pos(0)
        data = np.ascontiguousarray(embeddings, dtype=np.float32)
        failed = mtmd.mtmd_helper_decode_image_chunk(
            self._ctx, model.ctx, piece.chunk, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            chunk.start, chunk.seq_id, model.settings.n_batch, ctypes.byref(new_pos),
            mtmd.mtmd_helper_post_decode_callback(), None)
        if failed:  # its cells so far stay in the sequence: the scheduler drops it whole
            raise NoKVSlot("llama.cpp could not decode an image's embeddings into the KV "
                           "memory")
        model.held.evaluated(chunk.seq_id, chunk.start, chunk.tokens)
        return new_pos.value


def _chunks_per_picture(chunks, occurrences: Counter) -> dict[str, int]:
    """How many image chunks one occurrence of each picture made (its total over the
    times it occurs; all of them, where that does not divide evenly)."""
    total: Counter = Counter()
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == IMAGE:
            total[(mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()] += 1
    return {digest: count // occurrences[digest]
            if occurrences.get(digest) and count % occurrences[digest] == 0 else count
            for digest, count in total.items()}
