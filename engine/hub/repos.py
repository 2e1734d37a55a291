"""Models from the Hugging Face Hub, through huggingface_hub: search GGUF repositories,
list a repository's GGUF files grouped by quant (split files as one), judge each quant
with the planner on this machine before downloading it, and download one: resumable
(huggingface_hub keeps the partial file and continues it), checked against the Hub's
sha256, moved into the models folder atomically — a half-written file is never a model.

`endpoint` is the Hub's address (HF_ENDPOINT, read at call time: tests point it at a
local Hub-compatible server).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..catalog.drafts import MAX_DRAFT_SIZE_RATIO
from ..errors import HomerackError, InvalidRequest
from ..catalog.gguf_bounds import HeaderProblem, walk
from ..catalog.gguf_file import read_facts, read_header
from ..formats.families import capabilities
from ..catalog.projectors import is_projector, projector_for
from ..catalog.shape import ModelShape
from ..machine.hardware import Hardware
from ..catalog.models import git_blob_sha1_of, sha256_of
from ..machine.planner import Plan, Preferences, choose_quant, plan


class HubError(HomerackError):
    """The Hub failed or could not be reached (502: the engine's upstream)."""
    status = 502
    kind = "hub_error"


class HubNotFound(HubError):
    """What was asked for is not on the Hub: the request's fault, not the Hub's."""
    status = 404
    kind = "not_found_error"


class HubGated(HubError):
    status = 403
    kind = "permission_error"


_QUANT = re.compile(r"(?i)(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32))"
                    r"(?=[-_.])")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
GGUF_MAGIC = b"GGUF"
# A header's probe stops here: the largest real ones (a 262k vocabulary with its merges)
# are under 16 MiB; a file that says no more by then is not worth reading further.
MAX_HEADER = 64 << 20
MAX_CARD = 1 << 20  # a model card's bytes shown (a real one is tens of KiB)


@dataclass(frozen=True)
class RepoSummary:
    id: str
    downloads: int
    likes: int
    last_modified: str
    gated: bool
    license: str
    size_range: tuple[int, int] = (0, 0)  # smallest and largest quant, in bytes
    embedding: bool = False  # an embedding model (for /v1/embeddings), not a chat model
    adapter: bool = False  # LoRA adapters for a base model, not a model


@dataclass(frozen=True)
class QuantFiles:
    quant: str
    files: tuple[str, ...]       # one, or the parts of a split model in order
    size: int
    sha256: tuple[str, ...]      # per file, from the Hub's LFS metadata
    projector: str | None = None  # the repository's vision projector, downloaded with it
    projector_size: int = 0
    projector_sha256: str = ""


@dataclass(frozen=True)
class Verdict:
    quant: QuantFiles
    fit: str                     # "gpu", "partial", "cpu" or "no"
    words: str                   # "fully on GPU", "partial (10 of 32 layers on GPU)", ...
    plan: Plan | None  # None for an adapter
    recommended: bool = False


def _endpoint(endpoint: str | None) -> str | None:
    return endpoint or os.environ.get("HF_ENDPOINT")


def _api(endpoint: str | None, token: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=_endpoint(endpoint), token=token)


def _plain(call: Callable, what: str):
    """Run a huggingface_hub call; its failures become errors in plain words."""
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                        HFValidationError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        return call()
    except HFValidationError as exc:
        raise InvalidRequest(f"{what}: not a Hub repository or file name ({exc})",
                             param="repo") from None
    except GatedRepoError:
        raise HubGated(f"{what} is gated: accept its terms on the Hub, then give Homerack an "
                       "access token (HF_TOKEN, or `hf auth login`)") from None
    except (RepositoryNotFoundError, EntryNotFoundError, RevisionNotFoundError):
        raise HubNotFound(f"{what} was not found on the Hub (or it is private)") from None
    except HfHubHTTPError as exc:
        raise HubError(f"the Hub answered an error for {what}: {exc}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise HubError(f"the disk is full (or over quota) while downloading {what}: "
                           "free some space and resume; the part already downloaded is kept"
                           ) from None
        raise _unreachable(exc) from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            raise _unreachable(exc) from None  # connection refused, dropped, timed out
        raise


def _unreachable(exc: Exception) -> HubError:
    return HubError(f"cannot reach the Hub ({exc.__class__.__name__}: {exc}); check the "
                    "network and try again: a download resumes where it stopped")


def search(text: str, sort: str = "downloads", limit: int = 20, endpoint: str | None = None,
           token: str | None = None, sizes: bool = True) -> list[RepoSummary]:
    """GGUF repositories matching `text`, by downloads or by recency ("last_modified");
    with `sizes`, each repository's quant size range (its file list, fetched in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    api = _api(endpoint, token)
    found = _plain(lambda: list(api.list_models(search=text, filter="gguf", sort=sort,
                                                limit=limit)), f"the search {text!r}")

    def size_range(repo: str) -> tuple[int, int]:
        try:
            quants = repo_quants(repo, endpoint, token)
        except HubError:
            return (0, 0)
        return (quants[0].size, quants[-1].size) if quants else (0, 0)

    with ThreadPoolExecutor(8) as pool:
        ranges = list(pool.map(size_range, [m.id for m in found])) if sizes else \
            [(0, 0)] * len(found)
    return [RepoSummary(m.id, m.downloads or 0, m.likes or 0,
                        str(m.last_modified or ""), bool(m.gated),
                        next((t.split(":", 1)[1] for t in (m.tags or ())
                              if t.startswith("license:")), ""), sizes_, _embedding(m),
                        _adapter(m))
            for m, sizes_ in zip(found, ranges)]


EMBEDDING_TAGS = {"sentence-similarity", "feature-extraction", "sentence-transformers",
                  "text-embeddings-inference"}


def _embedding(info) -> bool:
    """The Hub's own word for it: the pipeline tag or library of an embedding model."""
    tags = {info.pipeline_tag or "", *(info.tags or ())}
    return bool(tags & EMBEDDING_TAGS)


def _adapter(info) -> bool:
    """The Hub's word for adapters: a "lora" tag, or a base_model:adapter: relation."""
    tags = set(info.tags or ())
    return "lora" in tags or any(t.startswith("base_model:adapter:") for t in tags)


def quant_of(filename: str) -> str:
    match = _QUANT.search(Path(filename).name)
    return match.group(1).upper() if match else Path(filename).stem


def repo_quants(repo: str, endpoint: str | None = None, token: str | None = None
                ) -> list[QuantFiles]:
    """The repository's GGUF files grouped by quant, smallest first."""
    api = _api(endpoint, token)
    info = _plain(lambda: api.model_info(repo, files_metadata=True), repo)
    groups: dict[str, list] = {}
    projectors = []
    for sibling in info.siblings or ():
        name = sibling.rfilename
        if not name.endswith(".gguf"):
            continue
        if is_projector(Path(name)):  # downloaded with every quant, never a quant
            projectors.append(sibling)
            continue
        split = _SPLIT.search(name)
        key = _SPLIT.sub(".gguf", name) if split else name
        groups.setdefault(key, []).append(sibling)
    quants = []
    for key, files in groups.items():
        files.sort(key=lambda s: s.rfilename)
        quants.append(QuantFiles(quant_of(key), tuple(s.rfilename for s in files),
                                 sum(s.size or 0 for s in files),
                                 tuple(s.lfs.sha256 if s.lfs else "" for s in files),
                                 *_projector(projectors)))
    return sorted(quants, key=lambda q: q.size)


_PRECISION = ("f16", "bf16", "q8_0", "f32")  # a projector's, best first (llama-server's -hf: f16)


def _projector(siblings: list) -> tuple:
    """(name, size, sha256) of the repository's projector; () when it has none."""
    if not siblings:
        return ()
    def rank(sibling) -> int:
        name = sibling.rfilename.lower()
        return next((i for i, p in enumerate(_PRECISION)
                     if re.search(rf"(?<![a-z0-9]){p}(?![a-z0-9])", name)), len(_PRECISION))
    best = min(siblings, key=rank)
    return best.rfilename, best.size or 0, best.lfs.sha256 if best.lfs else ""


def projector_name(model_file: str, projector: str) -> str:
    """The projector's name in the flat models folder: its own when it names the model
    (mmproj-SmolVLM-256M-Instruct-f16.gguf beside SmolVLM-256M-Instruct-Q8_0.gguf),
    else mmproj-MODEL.gguf, which pairs by name (unsloth's mmproj-F16.gguf names none)."""
    own = Path(projector).name
    model = Path(model_file)
    if projector_for(model, [Path(own)], flat=True):
        return own
    return f"mmproj-{model.stem}.gguf"


def model_card(repo: str, endpoint: str | None = None, token: str | None = None) -> str:
    """The card's first MAX_CARD bytes (a card is untrusted text of any size)."""
    from huggingface_hub import hf_hub_url

    data = _plain(lambda: _first_bytes(hf_hub_url(repo, "README.md", endpoint=_endpoint(endpoint)),
                                       MAX_CARD + 1, token), f"{repo}'s model card")
    cut = "\n\n… (the rest of the card is not shown)" if len(data) > MAX_CARD else ""
    return data[:MAX_CARD].decode(errors="replace") + cut


def header_shape(repo: str, quant: QuantFiles, endpoint: str | None = None,
                 token: str | None = None) -> ModelShape:
    return header(repo, quant, endpoint, token)[0]


def header(repo: str, quant: QuantFiles, endpoint: str | None = None,
           token: str | None = None) -> tuple[ModelShape, str]:
    """The model's shape and vocabulary hash from one file's header."""
    return read_remote(repo, quant, read_header, endpoint, token)


def read_remote(repo: str, quant: QuantFiles, read: Callable, endpoint: str | None = None,
                token: str | None = None):
    """`read` of one file's first megabytes (its GGUF header, re-read with 4x more until
    `read` answers, up to MAX_HEADER), written into a sparse file of the full size: the
    weights are never downloaded. HubError when the file is no GGUF or `read` never
    answers."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, quant.files[0], endpoint=_endpoint(endpoint))
    size = quant.size if len(quant.files) == 1 else 0
    wanted = 8 << 20
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "header.gguf"
        while True:
            data = _plain(lambda: _first_bytes(url, wanted, token), f"{repo}/{quant.files[0]}")
            if not data.startswith(GGUF_MAGIC):
                raise HubError(f"{quant.files[0]} is not a GGUF file")
            try:  # bounded before any reader sees it: a crafted header loops or takes GBs
                walk(data)
            except HeaderProblem as problem:
                if not problem.truncated:
                    raise HubError(f"{quant.files[0]}: {problem}") from None
                if len(data) < wanted or wanted >= MAX_HEADER:
                    found = None
                    break
                wanted = min(wanted * 4, MAX_HEADER)
                continue
            with path.open("wb") as handle:
                handle.write(data)
                handle.truncate(max(size, len(data)))
            found = read(path)
            if found is not None or len(data) < wanted or wanted >= MAX_HEADER:
                break
            wanted = min(wanted * 4, MAX_HEADER)
    if found is None:
        raise HubError(f"cannot read the GGUF header of {quant.files[0]} (not in its first "
                       f"{wanted >> 20} MiB)")
    return found


def _first_bytes(url: str, count: int, token: str | None) -> bytes:
    """At most `count` bytes from the start of `url`: a Range request through
    huggingface_hub's session and error mapping, read no further where a server ignores
    the range."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = {**build_hf_headers(token=token), "Range": f"bytes=0-{count - 1}"}
    data = bytearray()
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=60) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        for chunk in response.iter_bytes():
            data += chunk[:count - len(data)]
            if len(data) >= count:
                break
    return bytes(data)


_SIZE_LABEL = re.compile(r"(?i)[-_.](\d+(?:\.\d+)?[MB])(?:[-_.]|$)")


def family(repo: str) -> str:
    """The model family in a repository name: "SmolLM2" of "x/SmolLM2-135M-Instruct-GGUF"."""
    name = repo.split("/")[-1]
    match = _SIZE_LABEL.search(name)
    return name[:match.start()] if match else name.removesuffix("-GGUF")


def suggest_drafts(repo: str, quants: list[QuantFiles], endpoint: str | None = None,
                   token: str | None = None, limit: int = 4) -> list[tuple[str, QuantFiles]]:
    """Hub models that can draft for `repo` (speculative decoding): the same family,
    a smallest quant under MAX_DRAFT_SIZE_RATIO of `repo`'s smallest, and exactly the same vocabulary
    (compared from the GGUF headers). Smallest first."""
    single = [q for q in quants if len(q.files) == 1]
    if not single:
        return []
    _, vocab = header(repo, single[0], endpoint, token)
    found = []
    for other in search(family(repo), limit=20, endpoint=endpoint, token=token, sizes=False):
        if other.id == repo or len(found) >= limit or other.gated:
            continue
        try:
            theirs = [q for q in repo_quants(other.id, endpoint, token) if len(q.files) == 1]
            if theirs and theirs[0].size <= MAX_DRAFT_SIZE_RATIO * single[0].size \
                    and header(other.id, theirs[0], endpoint, token)[1] == vocab:
                found.append((other.id, theirs[0]))
        except HubError:
            continue
    return sorted(found, key=lambda pair: pair[1].size)


def judge(hardware: Hardware, base: ModelShape, quants: list[QuantFiles],
          prefs: Preferences = Preferences()) -> list[Verdict]:
    """The planner's verdict for every quant on this machine, the recommended one marked
    (the best quality that runs with the most layers on the GPU and full context)."""
    best = choose_quant(hardware, base, [(q.quant, q.size) for q in quants], prefs)
    verdicts = []
    for q in quants:
        p = plan(hardware, base.scaled(q.quant, q.size), prefs)
        gpu_layers = max(p.n_gpu_layers - 1, 0)
        if not p.fits:
            fit, words = "no", "will not fit"
        elif not hardware.gpus or p.n_gpu_layers == 0:
            fit, words = "cpu", "CPU only"
        elif gpu_layers == base.n_layers and not p.cpu_moe_layers:
            fit, words = "gpu", "fully on GPU"
        elif p.cpu_moe_layers:
            fit, words = "partial", f"experts of {p.cpu_moe_layers} of {base.n_layers} layers in RAM"
        else:
            fit, words = "partial", f"partial ({gpu_layers} of {base.n_layers} layers on GPU)"
        if p.fits:
            words += f", {p.n_ctx:,} tokens of context"
            words += f", about {p.forecast.decode_tps:.0f} tok/s" if p.forecast else ""
        verdicts.append(Verdict(q, fit, words, p, best is not None and best[0] == q.quant))
    return verdicts


def repo_verdicts(repo: str, hardware: Hardware, prefs: Preferences,
                  endpoint: str | None = None, token: str | None = None,
                  fitting: Callable[[str, dict], list[str]] = lambda _a, _f: []
                  ) -> tuple[ModelShape | None, list[Verdict], tuple[str, ...]]:
    """A repository's quants judged for `hardware`, from one file's header (a single-file
    quant's: a split file's first part holds only some layers). A repository of LoRA
    adapters gets each file with the local models it fits (`fitting(architecture, facts)`
    names them), and no shape. Last, what the model's chat template says it can do
    (formats.families.capabilities)."""
    quants = repo_quants(repo, endpoint, token)
    if not quants:
        raise InvalidRequest(f"{repo} has no GGUF files", param="repo")
    single = [q for q in quants if len(q.files) == 1] or quants
    found, template = read_remote(repo, single[0], read_facts, endpoint, token)
    if isinstance(found[1], dict):  # an adapter: (architecture, facts)
        return None, _adapter_verdicts(quants, *found, fitting), ()
    sees = ("vision",) if any(q.projector for q in quants) else ()
    return found[0], judge(hardware, found[0], quants, prefs), capabilities(template) + sees


def _adapter_verdicts(quants: list[QuantFiles], arch: str, facts: dict,
                      fitting: Callable[[str, dict], list[str]]) -> list[Verdict]:
    bases = fitting(arch, facts)
    declared = ", ".join(facts["base_names"]) or f"a {arch} model of its shape"
    words = (f"LoRA adapter (rank {facts['rank']}) for {', '.join(bases)}" if bases else
             f"LoRA adapter (rank {facts['rank']}) for {declared}: none of your models fits "
             "it yet; get its base model too")
    return [Verdict(q, "adapter", words, None, i == len(quants) - 1)
            for i, q in enumerate(quants)]


def staging_folder(models: Path, repo: str) -> Path:
    """Where a repository's partial files wait (never listed as models)."""
    return models / ".downloads" / repo.replace("/", "--")


def partial_bytes(folder: Path) -> int:
    """Bytes already downloaded into a staging folder."""
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def download(repo: str, quant: QuantFiles, models: Path, endpoint: str | None = None,
             token: str | None = None, progress=None) -> list[Path]:
    """Download a quant's files into `models`: each continues from the partial data an
    earlier attempt left (huggingface_hub's own transfer, which also retries a dropped
    connection from where it stopped), is verified against its sha256, then moved into
    place. `progress` is a tqdm-compatible class for huggingface_hub's reports."""
    staging = staging_folder(models, repo)
    staging.mkdir(parents=True, exist_ok=True)
    have = partial_bytes(staging)
    free = shutil.disk_usage(staging).free
    if quant.size + quant.projector_size - have > free:
        raise HubError(f"not enough disk space for {quant.quant}: it needs "
                       f"{(quant.size - have) / 2**30:.1f} GiB more, "
                       f"{free / 2**30:.1f} GiB are free in {models}")
    done = []
    files = list(zip(quant.files, quant.sha256, [Path(n).name for n in quant.files]))
    if quant.projector:  # after the model: the model is usable while it comes
        files.append((quant.projector, quant.projector_sha256,
                      projector_name(quant.files[0], quant.projector)))
    for name, sha, local in files:
        partial = staging / (local + ".part")
        meta = _plain(lambda: _fetch(repo, name, partial, endpoint, token, progress),
                      f"{repo}/{name}")
        if not _verified(partial, sha, meta):
            partial.unlink()
            raise HubError(f"{name} does not match the Hub's checksum (corrupted in "
                           "transit?): the file was deleted; download it again")
        target = models / local
        os.replace(partial, target)  # same filesystem: the model appears whole or not at all
        done.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    return done


def _verified(path: Path, sha256: str, meta) -> bool:
    """The file against the Hub's LFS sha256; a file kept in git (no LFS entry) against
    its size and ETag, which is then its git blob id."""
    if sha256:
        return sha256_of(path) == sha256
    etag = (meta.etag or "").strip('"')
    return bool(re.fullmatch(r"[0-9a-f]{40}", etag)) and meta.size == path.stat().st_size \
        and git_blob_sha1_of(path) == etag


def _fetch(repo: str, name: str, partial: Path, endpoint: str | None, token: str | None,
           progress, max_bytes: int | None = None):
    """Bring `partial` up to the whole file, continuing after what it holds; the file's
    metadata (size, ETag). HubError before any byte when the file is over `max_bytes`
    (or does not say its size)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, name, endpoint=_endpoint(endpoint))
    meta = get_hf_file_metadata(url, token=token)
    if max_bytes is not None and (meta.size is None or meta.size > max_bytes):
        raise HubError(f"{repo}/{name} is {meta.size or 'of unknown size'} bytes; "
                       f"at most {max_bytes:,} are read")
    have = partial.stat().st_size if partial.exists() else 0
    if meta.size is not None and have > meta.size:
        have = 0  # not a prefix of this file: start again
    if meta.size is not None and have == meta.size:
        if progress:  # complete from an earlier attempt: report it as done
            progress(initial=have, total=meta.size).close()
        return meta
    # The Hub redirects large files to its CDN: the token stays with the Hub (as
    # huggingface_hub's own downloads do), never sent to another host.
    same_host = urlsplit(meta.location).netloc == urlsplit(url).netloc
    with partial.open("r+b" if have else "wb") as handle:
        handle.truncate(have)
        handle.seek(have)
        http_get(meta.location, handle, resume_size=have, expected_size=meta.size,
                 headers=build_hf_headers(token=token if same_host else False),
                 tqdm_class=progress)
    return meta
