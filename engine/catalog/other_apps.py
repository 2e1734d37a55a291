"""Models other apps downloaded, found where those apps keep them and used in place:
never copied, moved or changed (a person's 20-70 GB are not downloaded twice).

Each app's layout, as it documents or writes it:

- Ollama: `manifests/<registry>/<namespace>/<name>/<tag>` (JSON); the layer of media type
  `application/vnd.ollama.image.model` names the GGUF blob `blobs/sha256-<hex>`, the
  `…projector` layer a vision projector, and the `…params`, `…system` and `…template`
  layers the model's sampling parameters, system prompt and (Go) chat template.
- LM Studio: `<publisher>/<repo>/*.gguf`, with its `mmproj` files beside.
- The Hugging Face cache: `models--<org>--<repo>/snapshots/<rev>/*.gguf`, symlinks into
  `blobs/` named by the file's sha256.
- llama.cpp's `-hf` cache, Jan's and GPT4All's folders, and folders the user adds: the
  GGUF files under them.

A scan only reads: directory listings, manifests, each file's first four bytes. What
cannot be used (a manifest that is not JSON, a missing blob, a file that is not a GGUF, a
symlink loop, a split model missing a part, an unreadable folder) is found with its
problem in words, and the rest is found as usual. Files still downloading are skipped:
Ollama writes its manifest last, the Hub's cache links a snapshot last, and the others
write under names that do not end in `.gguf` (GPT4All: `incomplete-*.gguf`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from .projectors import is_projector, projector_for

# every source, in the order the same model found twice is credited to
SOURCES = {"ollama": "Ollama", "lmstudio": "LM Studio", "huggingface": "the Hugging Face cache",
           "llama.cpp": "llama.cpp's cache", "jan": "Jan", "gpt4all": "GPT4All"}
FOLDER = "folder"  # a folder the user added
LABELS = {"homerack": "Homerack", **SOURCES, FOLDER: "a folder you added"}

OLLAMA_MEDIA = "application/vnd.ollama.image."
OLLAMA_REGISTRY, OLLAMA_NAMESPACE = "registry.ollama.ai", "library"
MAX_SIDE_FILE = 1 << 20  # a manifest, params, system prompt or template larger is refused
MAX_DEPTH = 6  # folders below a root that are walked
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Found:
    """A model file another app keeps (or, with `problem`, one it keeps that cannot be
    used, and why)."""
    source: str                   # a key of LABELS
    name: str                     # as that app names it: "qwen3:30b-a3b", "org/repo/f.gguf"
    path: Path                    # the GGUF (a split model's first part)
    size_bytes: int = 0           # every part
    digest: str | None = None     # its sha256, where the layout names it
    projector: Path | None = None  # a vision projector kept with it
    params: tuple = ()            # Ollama's params layer, as (key, value) pairs
    system: str | None = None     # Ollama's system layer
    template: str | None = None   # Ollama's template layer (Go text/template)
    problem: str | None = None


# -- where the apps keep their models ----------------------------------------------

def known_places(env: Mapping[str, str], system: str, root: Path = Path("/")
                 ) -> dict[str, tuple[Path, ...]]:
    """Each source's folders on a platform ("linux", "darwin", "win32"), as the apps
    document them and their environment variables move them. `root`: the file system's
    root (tests build one); a home folder comes from HOME (or USERPROFILE)."""
    home = Path(env.get("HOME") or env.get("USERPROFILE") or root / "home")
    mac, windows = system == "darwin", system.startswith("win")
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else home / ".local/share"
    support = home / "Library" / "Application Support"
    local = Path(env.get("LOCALAPPDATA") or home / "AppData" / "Local")
    roaming = Path(env.get("APPDATA") or home / "AppData" / "Roaming")
    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else \
        [home / ".ollama" / "models"]
    if system == "linux":  # the install script's system service keeps them in its own home
        ollama += [root / "usr/share/ollama/.ollama/models"]
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else cache / "huggingface"
    llama = home / "Library" / "Caches" if mac else local if windows else cache
    app_data = support if mac else roaming if windows else data
    return {
        "ollama": tuple(ollama),
        "lmstudio": (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"),
        "huggingface": (Path(env.get("HF_HUB_CACHE") or hf_home / "hub"),),
        "llama.cpp": (Path(env.get("LLAMA_CACHE") or llama / "llama.cpp"),),
        "jan": (app_data / "Jan" / "data" / "llamacpp" / "models", home / "jan" / "models"),
        "gpt4all": ((support if mac else local if windows else data) / "nomic.ai" / "GPT4All",),
    }


# -- finding ------------------------------------------------------------------------

def find(places: Mapping[str, tuple[Path, ...]], folders: tuple[Path, ...] = ()) -> list[Found]:
    """Every model in `places` (source: its folders) and in the user's `folders`. A folder
    that does not exist (an app not installed, a disk unmounted) holds nothing."""
    found: list[Found] = []
    for source, roots in places.items():
        for root in roots:
            found += _find_in(source, root)
    for folder in folders:
        found += _find_in(FOLDER, folder)
    return found


def _find_in(source: str, root: Path) -> list[Found]:
    try:
        if not root.is_dir():
            return []
        if source == "ollama":
            return list(ollama_models(root))
        if source == "huggingface":
            return list(hub_cache_models(root))
        return list(gguf_files(source, root, lambda path: path.relative_to(root).as_posix()))
    except OSError as exc:  # an unreadable folder: said, and the other sources go on
        return [Found(source, str(root), root, problem=f"cannot read {root}: {exc.strerror}")]


def ollama_models(root: Path) -> Iterator[Found]:
    manifests = root / "manifests"
    for path in _files_under(manifests, depth=4):
        if isinstance(path, Unreadable):
            yield _unreadable("ollama", path)
            continue
        parts = path.relative_to(manifests).parts
        if len(parts) == 4:
            yield _ollama_model(root, ollama_name(*parts), path)


def ollama_name(registry: str, namespace: str, name: str, tag: str) -> str:
    """The name Ollama shows: "qwen3:30b-a3b", "user/model:tag", "hf.co/org/repo:Q4_K_M"."""
    if registry == OLLAMA_REGISTRY:
        return f"{name}:{tag}" if namespace == OLLAMA_NAMESPACE else f"{namespace}/{name}:{tag}"
    return f"{registry}/{namespace}/{name}:{tag}"


def _ollama_model(root: Path, name: str, manifest: Path) -> Found:
    try:
        layers = _layers(json.loads(_small_text(manifest)), root / "blobs")
    except (OSError, ValueError) as exc:
        return Found("ollama", name, manifest, problem=f"its manifest is not readable JSON ({exc})")
    model = layers.get("model")
    if model is None:
        return Found("ollama", name, manifest, problem="its manifest names no model layer")
    blob, digest = model
    extras = {}
    for kind in ("params", "system", "template"):
        if kind in layers:
            try:
                extras[kind] = _small_text(layers[kind][0])
            except (OSError, ValueError):
                pass  # a model without its defaults still runs
    params = _params(extras.get("params"))
    projector = layers["projector"][0] if "projector" in layers else None
    return _checked(Found("ollama", name, blob, _size(blob), digest, projector, params,
                          extras.get("system"), extras.get("template")))


def _layers(manifest, blobs: Path) -> dict[str, tuple[Path, str]]:
    """{kind ("model", "projector", …): (its blob, its sha256)} of a parsed manifest."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise ValueError("it has no layers")
    out = {}
    for layer in manifest["layers"]:
        media, digest = (layer.get("mediaType"), layer.get("digest")) \
            if isinstance(layer, dict) else (None, None)
        if not (isinstance(media, str) and isinstance(digest, str)
                and media.startswith(OLLAMA_MEDIA) and digest.startswith("sha256:")):
            continue
        hexdigest = digest.removeprefix("sha256:")
        if _SHA256.match(hexdigest):  # never a path: "sha256:../../x" names no blob
            out.setdefault(media.removeprefix(OLLAMA_MEDIA),
                           (blobs / f"sha256-{hexdigest}", hexdigest))
    return out


def _params(text: str | None) -> tuple:
    try:
        params = json.loads(text) if text else {}
    except ValueError:
        return ()
    if not isinstance(params, dict):
        return ()
    scalar = (str, int, float, bool)
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in params.items()
                        if isinstance(v, scalar) or isinstance(v, list)
                        and all(isinstance(x, scalar) for x in v)))


def hub_cache_models(root: Path) -> Iterator[Found]:
    """GGUF files of the Hub cache's model repositories, named "org/repo/file.gguf"."""
    for repo in sorted(root.glob("models--*")):
        org_repo = repo.name.removeprefix("models--").replace("--", "/")
        snapshots = repo / "snapshots"
        if snapshots.is_dir():
            yield from gguf_files("huggingface", snapshots, lambda path, r=org_repo, s=snapshots:
                                  f"{r}/{Path(*path.relative_to(s).parts[1:]).as_posix()}")


def gguf_files(source: str, root: Path, name_of) -> Iterator[Found]:
    """The GGUF models under `root`, each named by `name_of(path)`; a folder's `mmproj`
    file is the projector of the models beside it; a split model is its first part, found
    only with every part."""
    by_folder: dict[Path, list[Path]] = {}
    for path in _files_under(root, MAX_DEPTH):
        if isinstance(path, Unreadable):
            yield _unreadable(source, path)
        elif path.name.lower().endswith(".gguf") and not path.name.startswith("incomplete-"):
            by_folder.setdefault(path.parent, []).append(path)
    for paths in by_folder.values():
        projectors = [p for p in paths if is_projector(p)]
        for path in paths:
            if path in projectors:
                continue
            split = SPLIT_PART.search(path.name)
            if split and split.group(1) != "00001":
                continue  # a split model is found at its first part
            parts = _parts(path, split)
            missing = [p.name for p in parts[1:] if not p.exists()]
            found = Found(source, name_of(path), path, sum(_size(p) for p in parts),
                          _blob_digest(path), projector_for(path, projectors, flat=source == FOLDER))
            yield Found(source, found.name, path, problem=f"{missing[0]} is missing (a split "
                        "model needs every part)") if missing else _checked(found)


def _unreadable(source: str, error: Unreadable) -> Found:
    return Found(source, str(error.path), error.path, problem=str(error))


def _parts(path: Path, split) -> list[Path]:
    if not split:
        return [path]
    count = int(split.group(2))
    stem = path.name[:split.start()]
    return [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _checked(found: Found) -> Found:
    """`found` as it is when its file is there and starts like a GGUF; else with why not."""
    try:
        with found.path.open("rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        return _with_problem(found, "its file is missing" if found.source != "ollama" else
                             f"its blob {found.path.name} is missing")
    except OSError as exc:  # a symlink loop, a permission
        return _with_problem(found, f"cannot open it: {exc.strerror}")
    if magic != b"GGUF":
        return _with_problem(found, "it is not a GGUF file")
    return found


def _with_problem(found: Found, problem: str) -> Found:
    return Found(found.source, found.name, found.path, problem=problem)


class Unreadable(Exception):
    """A folder under a root that cannot be listed."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"cannot read {path}: {why}")
        self.path = path


def _files_under(root: Path, depth: int) -> Iterator[Path | Unreadable]:
    """Files (and links to files) at most `depth` folders below `root`, in name order,
    and each folder that cannot be listed; links to folders are not followed (no loops)."""
    unreadable: list[Unreadable] = []

    def note(error: OSError) -> None:
        if isinstance(error, FileNotFoundError):
            return  # not there (yet, or any more): nothing to say
        unreadable.append(Unreadable(Path(error.filename or root), error.strerror or str(error)))

    for folder, dirs, files in os.walk(root, followlinks=False, onerror=note):
        yield from unreadable
        unreadable.clear()
        dirs.sort()
        if len(Path(folder).relative_to(root).parts) >= depth:
            dirs.clear()
        for name in sorted(files):
            yield Path(folder) / name
    yield from unreadable


def _blob_digest(path: Path) -> str | None:
    """The sha256 a Hub cache blob is named by, when `path` links to one."""
    try:
        target = Path(os.readlink(path)) if path.is_symlink() else None
    except OSError:
        return None
    return target.name if target is not None and _SHA256.match(target.name) else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _small_text(path: Path) -> str:
    with path.open("rb") as handle:
        data = handle.read(MAX_SIDE_FILE + 1)
    if len(data) > MAX_SIDE_FILE:
        raise ValueError(f"{path.name} is over {MAX_SIDE_FILE >> 20} MiB")
    return data.decode("utf-8", errors="replace")
