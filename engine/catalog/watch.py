"""The models folders watched while the engine runs: a file that appears (a download
finishing in Ollama, an adapter dropped into Homerack's folder) is found and inspected
within seconds, so the list shows its kind (chat, embedding, adapter) before anything
uses it; one that goes is dropped.

watchdog reports changes in the folders that exist; a slow look every `every_s` catches
what it cannot see (a folder that appears later, a disk mounted or unmounted). One thread,
`homerack-models`, does the looking and the inspecting, after a short quiet time so that
a download's many writes cost one look."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from .other_models import is_dir

log = logging.getLogger("homerack.models")


class ModelWatch:
    def __init__(self, store, quiet_s: float = 0.5, every_s: float = 30.0):
        self.store, self.quiet_s, self.every_s = store, quiet_s, every_s
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._observer = None
        self._watched: set[Path] = set()
        self._thread = threading.Thread(target=self._run, name="homerack-models", daemon=True)

    def start(self) -> "ModelWatch":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._observer is not None:
            self._observer.stop()
        self._thread.join(timeout=5)

    def changed(self) -> None:
        """Something changed (a setting, an event): look again soon."""
        self._changed.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._look()
            except Exception:  # a bug here must not stop the next look
                log.exception("looking for models failed")
            self._changed.wait(self.every_s)
            if self._stop.wait(self.quiet_s):
                return
            self._changed.clear()

    def _look(self) -> None:
        if self.store.other_apps is not None:
            self.store.other_apps.refresh()
        self._watch(self._folders())
        for model in self.store.list():
            if self._stop.is_set():
                return
            self.store.kind_of(model)  # read once; later listings know its kind

    def _folders(self) -> set[Path]:
        roots = self.store.other_apps.roots() if self.store.other_apps is not None else []
        return {folder for folder in (self.store.folder, *roots) if is_dir(folder)}

    def _watch(self, folders: set[Path]) -> None:
        """Watch `folders` (with watchdog's observer of this platform) from now on."""
        if folders == self._watched:
            return
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watch = self

        class Changed(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type != "opened" and event.event_type != "closed_no_write":
                    watch.changed()

        if self._observer is not None:
            self._observer.stop()
        observer = Observer()
        for folder in folders:
            try:
                # the folder itself, not a link to it (inotify does not follow one)
                observer.schedule(Changed(), str(folder.resolve()), recursive=True)
            except OSError as exc:  # too many watches, a folder gone meanwhile
                log.warning("cannot watch %s (%s): looking every %.0f s", folder, exc,
                            self.every_s)
        observer.daemon = True
        observer.start()
        self._observer, self._watched = observer, folders

