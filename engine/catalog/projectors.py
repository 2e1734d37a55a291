"""Vision projectors (`mmproj` GGUFs): which model each belongs to, and what its header
says (its architecture, its output size, its weights, the memory and time an image
takes), read without llama.cpp.

A projector is found beside its model, as LM Studio and llama-server's `-hf` find it: in
a model's own folder (a repository's), the one `mmproj` file there; in a flat folder of
many models (Homerack's), by name: `mmproj-NAME-f16.gguf` or `NAME-mmproj.gguf` beside
`NAME.gguf`. Either way its output must be the model's hidden size, or it is not used."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidModelFile
from .gguf_file import open_gguf

# what a projector's file name adds to its model's: the word, a precision, separators
_NOISE = re.compile(r"mmproj|model|vision|projector|\b(?:f16|f32|bf16|q8_0|q4_k_m|q6_k)\b|[-_.\s]+")
FLOAT = 4


def is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def _stem(name: str) -> str:
    return _NOISE.sub("", name.lower().removesuffix(".gguf"))


def projector_for(model: Path, projectors: list[Path], flat: bool) -> Path | None:
    """The projector of `model` among those in its folder: by name (the longest that
    the model's name starts with), or in a folder of one model's files the only one."""
    stem = _stem(model.name)
    named = [p for p in projectors if _stem(p.name) and stem.startswith(_stem(p.name))]
    if named:
        return max(named, key=lambda p: len(_stem(p.name)))
    return projectors[0] if not flat and len(projectors) == 1 else None


@dataclass(frozen=True)
class ProjectorFacts:
    path: str
    projector_type: str
    image_size: int     # the tower's input tile, in pixels
    patch_size: int
    n_embd: int         # the tower's width
    n_ff: int
    n_out: int | None   # its embeddings' size: the decoder's hidden size (None: unknown)
    preproc_size: int   # an image's longest side before tiling (0: one tile)
    scale_factor: int   # idefics3's pixel shuffle
    weight_bytes: int   # its tensors, as they load
    tower_params: int

    @property
    def patches(self) -> int:
        return (self.image_size // max(self.patch_size, 1)) ** 2

    @property
    def compute_bytes(self) -> int:
        """The compute buffer libmtmd reserves for one tile: with flash attention the
        graph's peak is a tile's FFN activations plus three of its hidden states
        (measured exact on SigLIP-B/16 at 512 px: 21.0 MiB)."""
        return self.patches * (self.n_ff + 3 * self.n_embd) * FLOAT

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.compute_bytes

    @property
    def tokens_per_tile(self) -> int:
        side = self.image_size // max(self.patch_size, 1) // max(self.scale_factor, 1)
        return side * side

    def tiles(self, width: int, height: int) -> int:
        """Tiles the tower encodes for an image: idefics3's resized to `preproc_size` on
        its longest side, cut into tiles, plus the whole image as an overview; other
        projectors one."""
        if self.projector_type != "idefics3" or not self.preproc_size:
            return 1
        scale = self.preproc_size / max(width, height, 1)
        cols = -(-round(width * scale) // self.image_size)
        rows = -(-round(height * scale) // self.image_size)
        return cols * rows + 1  # libmtmd adds the overview even to a single tile

    def image_flops(self, width: int, height: int) -> float:
        """The tower's work for a picture: two FLOPs per weight per patch, per tile."""
        return 2.0 * self.tower_params * self.patches * self.tiles(width, height)

    def misfit(self, hidden: int) -> str | None:
        if self.n_out is not None and self.n_out != hidden:
            return (f"its output is {self.n_out} wide and the model's hidden size is "
                    f"{hidden}: it belongs to another model")
        return None

    def as_dict(self) -> dict:
        return {"file": Path(self.path).name, "type": self.projector_type,
                "image_size": self.image_size, "bytes": self.total_bytes,
                "tokens_per_tile": self.tokens_per_tile}


def read_projector(path: Path) -> ProjectorFacts:
    """A projector's header; InvalidModelFile when it is none."""
    try:
        reader = open_gguf(path)
    except (OSError, ValueError) as exc:
        raise InvalidModelFile(f"{path.name} is not a readable GGUF: {exc}") from None

    def value(key, default=None):
        field = reader.fields.get(key)
        return field.contents() if field is not None else default

    if value("general.architecture") != "clip" or not value("clip.has_vision_encoder"):
        raise InvalidModelFile(f"{path.name} is not a vision projector")
    tensors = {t.name: t for t in reader.tensors}
    mm = [t for name, t in sorted(tensors.items()) if name.startswith("mm.") and
          len(t.shape) == 2]
    n_out = value("clip.vision.projection_dim") or (int(mm[-1].shape[1]) if mm else None)
    return ProjectorFacts(
        str(path), str(value("clip.projector_type") or value("clip.vision.projector_type") or "?"),
        int(value("clip.vision.image_size", 0)), int(value("clip.vision.patch_size", 0)),
        int(value("clip.vision.embedding_length", 0)), int(value("clip.vision.feed_forward_length", 0)),
        int(n_out) if n_out else None, int(value("clip.vision.preproc_image_size", 0)),
        int(value("clip.vision.projector.scale_factor", 1)),
        sum(int(t.n_bytes) for t in reader.tensors),
        sum(int(t.n_elements) for name, t in tensors.items() if name.startswith("v.")))
