"""How this installation starts one of its modules in a child process (the engine, an
RPC server, a worker): `python -m MODULE` from a source tree or a virtual environment;
in the packaged app, whose executable is no Python, the app itself, which takes the same
`-m MODULE ARGS` (packaging/homerack_entry.py) before it imports anything else.

`python -m` puts the current folder first on the child's import path: started from a
downloads folder holding an `app/` package or an `httpx.py`, the child would run that
code as the engine. So the child never gets the current folder on its path.

A child started here follows its parent: it stops itself when the process that started
it is gone, however that died (a SIGKILL, a crash), so an engine never holds its model
for nobody. `homerack serve` started by a person has no such parent and stays.
"""

from __future__ import annotations

import os
import sys
import threading

PARENT = "HOMERACK_PARENT_PID"  # set in a child's environment: the pid it follows
PARENT_POLL_S = 0.5
# Python 3.10 has no -P: drop the current folder from the path, then run the module.
_SAFE_RUN = ("import runpy, sys; del sys.path[0]; del sys.argv[0]; "
             "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def frozen() -> bool:
    """True inside the packaged app (PyInstaller sets sys.frozen)."""
    return bool(getattr(sys, "frozen", False))


def module_command(module: str, *args: str) -> list[str]:
    """The argv that runs `module` as __main__ with `args`, in a child of this process,
    without the current folder on its import path."""
    if frozen():  # the bundle's path holds only the bundle
        return [sys.executable, "-m", module, *args]
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _SAFE_RUN, module, *args]


def listens(pid: int, port: int, denied: bool = False) -> bool:
    """Whether process `pid` is alive and listens on TCP `port`; `denied`: the answer
    where the system will not list that process's sockets."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        sockets = process.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return denied
    except psutil.Error:
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port
               for s in sockets)


def child_env(env: dict | None = None, **more: str) -> dict:
    """The environment for a child that should die with this process."""
    return {**(os.environ if env is None else env), **more, PARENT: str(os.getpid())}


def follow_parent(stop) -> None:
    """If this process was started by one of ours (PARENT), call `stop` once that process
    is gone. Not through PR_SET_PDEATHSIG: it fires when the parent's *thread* ends, and
    the app starts its engine from a pool thread that ends when idle."""
    value = os.environ.pop(PARENT, "")  # a grandchild follows its own parent, not ours
    if not value.isdigit():
        return
    import psutil

    try:
        parent = psutil.Process(int(value))  # its start time is kept: a reused pid is not it
    except psutil.Error:
        stop()
        return

    def watch() -> None:
        while parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE:
            threading.Event().wait(PARENT_POLL_S)
        stop()

    threading.Thread(target=watch, name="homerack-parent-watch", daemon=True).start()
