"""`homerack install-desktop`: the desktop entry and icon for the current user (XDG)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from engine.spawn import frozen

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def _launcher() -> str:
    """The command that starts this installation's app, absolute so menus find it."""
    if frozen():
        return sys.executable  # the packaged app's own executable
    script = shutil.which("homerack") or str(Path(sys.executable).with_name("homerack"))
    return script if Path(script).exists() else f"{sys.executable} -m app"


def install_desktop(data_home: Path | None = None) -> tuple[Path, Path]:
    data_home = data_home or Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share"))
    entry = data_home / "applications" / "homerack.desktop"
    icon = data_home / "icons" / "hicolor" / "scalable" / "apps" / "homerack.svg"
    entry.parent.mkdir(parents=True, exist_ok=True)
    icon.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ASSETS / "homerack.svg", icon)
    text = (ASSETS / "homerack.desktop").read_text()
    entry.write_text(text.replace("Exec=homerack", f"Exec={_launcher()}"))
    return entry, icon
