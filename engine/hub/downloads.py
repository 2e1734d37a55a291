"""Downloads from the Hub that outlive the window that started them: each runs in its
own thread in the engine process, reports bytes, speed and ETA, can be paused, resumed
and cancelled, and is remembered in a small JSON file so that an engine started later
(after a crash or a restart) carries on from the partial data.

Pausing and cancelling work through the progress hook huggingface_hub calls for every
chunk it writes: raising there stops the transfer; the partial file stays for a resume.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..errors import HomerackError, InvalidRequest
from .generation_config import keep_generation_config
from .repos import QuantFiles, download, partial_bytes, staging_folder
from ..files import STRINGS, read_json, write_atomic

ACTIVE = ("queued", "downloading")
_JOURNAL = {"type": "array", "items": {
    "type": "object", "required": ["id", "repo", "quant", "status"],
    "properties": {
        "id": {"type": "integer"}, "repo": {"type": "string"}, "status": {"type": "string"},
        "error": {"type": ["string", "null"]}, "files": STRINGS,
        "quant": {"type": "object", "required": ["quant", "files", "size", "sha256"],
                  "additionalProperties": False,
                  "properties": {"quant": {"type": "string"}, "files": STRINGS,
                                 "size": {"type": "integer"}, "sha256": STRINGS,
                                 "projector": {"type": ["string", "null"]},
                                 "projector_size": {"type": "integer"},
                                 "projector_sha256": {"type": "string"}}}}}}


class _Stopped(Exception):
    """Raised inside the transfer when the user pauses or cancels."""


@dataclass(frozen=True)
class DownloadState:
    id: int
    repo: str
    quant: QuantFiles
    status: str = "queued"  # queued, downloading, paused, done, failed, cancelled
    done_bytes: int = 0
    speed_bps: float = 0.0
    error: str | None = None
    files: tuple[str, ...] = ()  # where the finished files are

    @property
    def eta_s(self) -> float | None:
        left = self.quant.size - self.done_bytes
        return left / self.speed_bps if self.speed_bps > 0 else None

    def as_dict(self) -> dict:
        return {"id": self.id, "repo": self.repo, "quant": self.quant.quant,
                "files": list(self.files or self.quant.files), "size_bytes": self.quant.size,
                "done_bytes": self.done_bytes, "speed_bps": round(self.speed_bps),
                "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
                "status": self.status, "error": self.error}


@dataclass
class _Control:
    stop: str | None = None  # "pause" or "cancel"
    thread: threading.Thread | None = None
    finished: list = field(default_factory=list)  # bytes of files already complete


class Downloads:
    def __init__(self, models: Path, journal: Path | None, endpoint: str | None = None,
                 token: str | None = None, on_done: Callable[[list[Path]], None] = lambda _p: None):
        self.models, self.journal = models, journal
        self.endpoint, self.token, self.on_done = endpoint, token, on_done
        self._lock = threading.Lock()
        self._states: dict[int, DownloadState] = {}
        self._controls: dict[int, _Control] = {}
        self._ids = itertools.count(1)
        for state in self._read_journal():  # carry on with what an earlier engine began
            self._states[state.id] = state
            self._ids = itertools.count(max(self._states) + 1)
            if state.status in ACTIVE:
                self._launch(state.id)

    # -- called by the API -------------------------------------------------------

    def start(self, repo: str, quant: QuantFiles) -> DownloadState:
        with self._lock:
            for state in self._states.values():
                if (state.repo, state.quant.quant) == (repo, quant.quant) \
                        and state.status in (*ACTIVE, "paused"):
                    raise InvalidRequest(f"{repo} {quant.quant} is already being downloaded")
            state = DownloadState(next(self._ids), repo, quant,
                                  done_bytes=partial_bytes(staging_folder(self.models, repo)))
            self._states[state.id] = state
        self._launch(state.id)
        return self.get(state.id)

    def list(self) -> list[DownloadState]:
        with self._lock:
            return sorted(self._states.values(), key=lambda s: s.id)

    def get(self, download_id: int) -> DownloadState:
        with self._lock:
            state = self._states.get(download_id)
        if state is None:
            raise InvalidRequest(f"no download {download_id}", param="id")
        return state

    def pause(self, download_id: int) -> DownloadState:
        return self._stop(download_id, "pause")

    def cancel(self, download_id: int) -> DownloadState:
        state = self._stop(download_id, "cancel")
        shutil.rmtree(staging_folder(self.models, state.repo), ignore_errors=True)
        return state

    def resume(self, download_id: int) -> DownloadState:
        state = self.get(download_id)
        if state.status not in ("paused", "failed"):
            raise InvalidRequest(f"download {download_id} is {state.status}")
        self._update(download_id, status="queued", error=None)
        self._launch(download_id)
        return self.get(download_id)

    def wait(self, download_id: int, timeout: float | None = None) -> DownloadState:
        control = self._controls.get(download_id)
        if control and control.thread:
            control.thread.join(timeout)
        return self.get(download_id)

    # -- the transfer thread -----------------------------------------------------

    def _launch(self, download_id: int) -> None:
        control = self._controls[download_id] = _Control()
        control.thread = threading.Thread(target=self._run, args=(download_id, control),
                                          name=f"download-{download_id}", daemon=True)
        control.thread.start()

    def _run(self, download_id: int, control: _Control) -> None:
        state = self._update(download_id, status="downloading")
        try:
            files = download(state.repo, state.quant, self.models, self.endpoint, self.token,
                             progress=self._progress_class(download_id, control))
            keep_generation_config(state.repo, files[0], self.endpoint, self.token)
        except _Stopped:
            status = "paused" if control.stop == "pause" else "cancelled"
            self._update(download_id, status=status, speed_bps=0.0)
        except HomerackError as exc:
            self._update(download_id, status="failed", error=exc.message, speed_bps=0.0)
        else:
            self.on_done(files)  # first: a model is known (its kind, its defaults) once done
            self._update(download_id, status="done", done_bytes=state.quant.size,
                         speed_bps=0.0, files=tuple(str(f) for f in files))

    def _progress_class(self, download_id: int, control: _Control):
        """A tqdm-shaped class: huggingface_hub makes one per file and calls update(n)."""
        downloads = self

        class Progress:
            def __init__(self, *_args, initial: int = 0, **_kwargs):
                self.base = sum(control.finished)
                self.n = initial
                self.started, self.start_n = time.monotonic(), initial
                downloads._update(download_id, done_bytes=self.base + initial)

            def update(self, n: int = 1) -> None:
                if control.stop:
                    raise _Stopped()
                self.n += n
                elapsed = time.monotonic() - self.started
                speed = (self.n - self.start_n) / elapsed if elapsed > 0.2 else 0.0
                downloads._update(download_id, done_bytes=self.base + self.n, speed_bps=speed,
                                  persist=False)

            def close(self) -> None:
                control.finished.append(self.n)

            def __enter__(self):
                return self

            def __exit__(self, *_exc):
                self.close()

            def set_description(self, *_args, **_kwargs) -> None:
                pass

            def refresh(self) -> None:
                pass

        return Progress

    def _stop(self, download_id: int, how: str) -> DownloadState:
        state = self.get(download_id)
        control = self._controls.get(download_id)
        if state.status in ACTIVE and control:
            control.stop = how
            if control.thread:
                control.thread.join(30)
        if self.get(download_id).status in ("paused", "failed", "queued") or how == "cancel":
            self._update(download_id, status="cancelled" if how == "cancel" else "paused",
                         speed_bps=0.0)
        return self.get(download_id)

    # -- bookkeeping ---------------------------------------------------------------

    def _update(self, download_id: int, persist: bool = True, **changes) -> DownloadState:
        with self._lock:
            state = self._states[download_id] = replace(self._states[download_id], **changes)
            if persist:
                self._write_journal()
        return state

    def _write_journal(self) -> None:
        if not self.journal:
            return
        entries = [{"id": s.id, "repo": s.repo, "quant": asdict(s.quant), "status": s.status,
                    "error": s.error, "files": list(s.files)}
                   for s in self._states.values() if s.status != "cancelled"]
        write_atomic(self.journal, json.dumps(entries, indent=1))

    def _read_journal(self) -> list[DownloadState]:
        entries = read_json(self.journal, _JOURNAL) or []
        states = []
        for entry in entries:
            quant = QuantFiles(**{**entry["quant"], "files": tuple(entry["quant"]["files"]),
                                  "sha256": tuple(entry["quant"]["sha256"])})
            done = quant.size if entry["status"] == "done" else \
                partial_bytes(staging_folder(self.models, entry["repo"]))
            states.append(DownloadState(entry["id"], entry["repo"], quant, entry["status"],
                                        done, error=entry.get("error"),
                                        files=tuple(entry.get("files", ()))))
        return states

