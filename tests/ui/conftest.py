"""The window over a real engine process it supervises, in a private HOMERACK_HOME."""

import pytest

from support.engines import seed_gguf_info
from support.models import STARTER


@pytest.fixture
def gui_home(tmp_path, home, monkeypatch):
    root = tmp_path / "gui-home"
    (root / "data").mkdir(parents=True)
    (root / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, root)
    monkeypatch.setenv("HOMERACK_HOME", str(root))
    return root


@pytest.fixture
def open_window(qtbot, gui_home, monkeypatch):
    """A window over its engine; `engine=False`: a window whose engine never starts, for
    what needs no model (layout, keys, conversations, names): a process start saved."""
    from ui.shell.engine_link import EngineLink
    from ui.shell.launch import create_window

    windows = []

    def make(serve_args=("--model", STARTER, "--ctx", "2048"), wait=True, engine=True):
        with monkeypatch.context() as patched:
            if not engine:
                patched.setattr(EngineLink, "start", lambda _link: None)
            window = create_window(list(serve_args))
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        if wait:
            qtbot.waitUntil(lambda: window.engine.client is not None, timeout=90_000)
        return window

    yield make
    for window in windows:
        window.close()


@pytest.fixture(scope="module")
def tiny_client(tmp_path_factory, tiny_model):
    """A real engine serving the tiny model (a module's own), and its client."""
    from app.client import EngineClient
    from support.engines import start_tiny_engine

    process, address = start_tiny_engine(tmp_path_factory.mktemp("tiny-engine"), "desk",
                                         tiny_model)
    client = EngineClient(address)
    yield client
    client.close()
    process.stop()
