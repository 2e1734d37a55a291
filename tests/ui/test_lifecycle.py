"""The processes around the window: started from any folder, they run Homerack's own code
(not an `app/` package or an `httpx.py` lying there); a logout or a `kill` closes the app
as the user would, and its engine goes with it, even when the app is killed outright."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.spawn import module_command
from support.models import STARTER

pytestmark = pytest.mark.slow
HOMERACK = Path(sys.executable).with_name("homerack")  # the console script, as users start it


@pytest.fixture
def hostile_folder(tmp_path):
    """A folder whose `app` package and `httpx` module leave a mark when imported."""
    folder = tmp_path / "Downloads"
    mark = tmp_path / "hijacked"
    code = f"open({str(mark)!r}, 'w').write(__name__)\nprint('HIJACKED', flush=True)\n"
    (folder / "app").mkdir(parents=True)
    for name in ("app/__init__.py", "app/__main__.py", "httpx.py", "psutil.py"):
        (folder / name).write_text(code)
    return folder, mark


def engine_pid(engine_file: Path, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(engine_file.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError("the app's engine never announced itself")


def gone(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_sigterm_closes_the_app_and_its_engine_a_second_start_and_no_folder_code_runs(gui_home, hostile_folder):
    folder, mark = hostile_folder
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HOMERACK_HOME=str(gui_home))
    app = subprocess.Popen([str(HOMERACK)], cwd=folder, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        pid = engine_pid(gui_home / "run" / "engine.json")
        assert psutil.Process(pid).ppid() == app.pid
        second = subprocess.run([str(HOMERACK)], cwd=folder, env=env, capture_output=True,
                                text=True, timeout=60)  # one app per data folder
        assert second.returncode == 0 and "already open" in second.stderr, second.stderr
        assert engine_pid(gui_home / "run" / "engine.json") == pid  # no second engine
        app.send_signal(signal.SIGTERM)  # a logout
        assert app.wait(60) == 0
        assert gone(pid, 30), "the engine outlived the app"
    finally:
        app.kill()
    assert not mark.exists(), f"code from the current folder ran: {app.stdout.read()[-500:]}"


def test_an_engine_dies_with_the_process_that_started_it_even_killed_outright(home, tmp_path,
                                                                             hostile_folder):
    folder, mark = hostile_folder
    starter = (f"from app.engine_proc import EngineProcess\n"
               f"address = EngineProcess(['--model', {STARTER!r}, '--ctx', '512']).wait_ready()\n"
               f"print(address.pid, flush=True)\n"
               f"import time; time.sleep(600)\n")
    env = dict(os.environ, HOMERACK_HOME=str(home), PYTHONPATH=str(Path(__file__).parents[2]))
    parent = subprocess.Popen([sys.executable, "-P", "-c", starter], cwd=folder, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        parent.kill()  # SIGKILL: no handler runs, no child is stopped by the parent
        assert gone(pid, 15), "the engine outlived its parent"
    finally:
        parent.kill()
    assert not mark.exists()


def test_a_second_engine_on_the_same_folders_is_refused(server, home):
    env = dict(os.environ, HOMERACK_HOME=str(home / "server"))
    second = subprocess.run(module_command("app", "serve", "--model", STARTER), env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "already serves" in second.stderr, second.stderr


def test_a_stale_engine_file_is_checked_before_the_token_is_sent(tmp_path):
    """The engine died; its port is another program's now: it must not get the token."""
    import http.server
    import threading

    from app.engine_proc import EngineAddress, find_running, write_engine_file

    asked = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args):
            pass

    listener = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{listener.server_address[1]}"
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "30"])  # alive, listening nowhere
    try:
        for pid in (dead.pid, alive.pid):
            write_engine_file(tmp_path / "engine.json", EngineAddress(url, "secret", pid))
            assert find_running(tmp_path / "engine.json") is None
        assert asked == []
    finally:
        alive.kill()
        listener.shutdown()


class _Supervisor:
    """The supervisor's interface, counting what the link asks of it."""
    def __init__(self, owned: bool):
        self.owned, self.stops, self.starts = owned, 0, 0

    def stop(self):
        self.stops += 1

    def start(self):
        self.starts += 1
        raise RuntimeError("not started in this test")

    def check(self):
        return None


FETCHING = {"state": "fetching", "cuda": "13.5.37", "done_bytes": 120_000_000,
            "total_bytes": 430_000_000, "error": None}


def test_the_app_restarts_its_own_engine_once_the_cuda_runtime_is_fetched_and_idle(qtbot):
    """The packaged app's engine fetched NVIDIA's runtime in the background: the status bar
    says how far; once fetched and idle, the app's own engine is restarted (once), so the
    model loads on CUDA; one busy, or one the app only attached to, is left alone."""
    from ui.shell.engine_link import EngineLink, describe_gpu_runtime

    assert describe_gpu_runtime(FETCHING) == (
        "Fetching NVIDIA's CUDA 13.5.37 runtime for the GPU: 120 of 430 MB")
    ready = {**FETCHING, "state": "ready", "done_bytes": 430_000_000}
    busy = {"gpu_runtime": ready, "batching": {"active": 2}}
    idle = {"gpu_runtime": ready, "batching": {"active": 0}}
    for owned, health, restarts in ((True, busy, 0), (False, idle, 0), (True, idle, 1)):
        supervisor = _Supervisor(owned)
        link = EngineLink(supervisor)
        shown = []
        link.gpu_runtime.connect(shown.append)
        failed = []
        link.failed.connect(failed.append)
        link._on_checked((None, health))
        if restarts:
            qtbot.waitUntil(lambda: bool(failed), timeout=5000)
        assert (supervisor.stops, supervisor.starts) == (restarts, restarts)
        assert shown == [ready]
    assert "the engine restarts on it when idle" in describe_gpu_runtime(ready)
