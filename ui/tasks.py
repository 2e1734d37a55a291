"""The one way the app runs long work: off the UI thread, reporting back by signals.

A task function receives its Task first, so it can report progress (streamed text) and
see whether it was cancelled. Results, progress and errors arrive on the UI thread.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal
from shiboken6 import isValid


class TaskSignals(QObject):
    progress = Signal(object)
    done = Signal(object)
    failed = Signal(object)
    ended = Signal()  # after done or failed: the task may go (on the UI thread)


class Task(QRunnable):
    """Kept alive (`_running`) until its end has reached the UI thread: let go on the pool
    thread as soon as it returned, a task and its signals' QObject were freed there, a Qt
    object deleted outside its thread while its queued results were still on their way,
    and a garbage collection then aborted the app ("deallocating None": a refcount
    error; every few seconds with Speak's partial recognitions, one task each 1.5 s)."""
    _running: set["Task"] = set()

    def __init__(self, fn: Callable[..., Any], *args):
        super().__init__()
        self.setAutoDelete(False)
        self.signals = TaskSignals()
        self.signals.ended.connect(self._release)  # queued to the signals' thread
        self.cancelled = threading.Event()
        self._fn, self._args = fn, args

    def _release(self) -> None:
        Task._running.discard(self)

    def report(self, value) -> None:
        self.signals.progress.emit(value)

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self) -> None:
        try:
            result = self._fn(self, *self._args)
        except Exception as exc:  # delivered to the UI thread, shown in one place
            self.signals.failed.emit(exc)
        else:
            self.signals.done.emit(result)
        finally:
            self.signals.ended.emit()


# The tasks wait on the engine (HTTP), not on the CPU, but Qt's global pool has one
# thread a core: on a 2-core machine a streaming reply and the downloads watcher filled
# it, and the wizard's requests queued behind them.
MAX_TASKS = 32


def start_task(fn: Callable[..., Any], *args, on_done=None, on_progress=None,
               on_error=None, owner: QObject | None = None,
               pool: QThreadPool | None = None) -> Task:
    """Run `fn` off the UI thread. The callbacks reach `owner` only while it lives: a
    task can outlast the window that started it (closed while a request was out), and a
    closure over its deleted widgets would raise in Qt's event loop."""
    task = Task(fn, *args)
    for signal, callback in ((task.signals.done, on_done),
                             (task.signals.progress, on_progress),
                             (task.signals.failed, on_error)):
        if callback:
            signal.connect(callback if owner is None else _while_alive(owner, callback))
    Task._running.add(task)
    if pool is None:
        pool = QThreadPool.globalInstance()
        pool.setMaxThreadCount(max(pool.maxThreadCount(), MAX_TASKS))
    pool.start(task)
    return task


def _while_alive(owner: QObject, callback: Callable[[Any], Any]) -> Callable[[Any], None]:
    def deliver(value) -> None:
        if isValid(owner):
            callback(value)
    return deliver
