"""Can Qt's X11 platform plugin load on this desktop? Asked before Qt is started.

PySide6 from 6.5 on needs libxcb-cursor0 (and a few other xcb libraries) for its xcb
plugin; many desktop installs lack them, and Qt then aborts the whole process with
"no Qt platform plugin could be initialized". The plugin's missing libraries are read
with `ldd` (without importing Qt) and named with the package and command that install
them on this distribution, so the CLI can say so and chat in the terminal instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

# the package that ships each library, per distribution family
FAMILIES = ("debian", "fedora", "arch", "suse")
PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor", "libxcb-cursor0"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm", "libxcb-icccm4"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms",
                            "libxcb-keysyms1"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image", "libxcb-image0"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil",
                                "xcb-util-renderutil", "libxcb-render-util0"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11",
                              "libxkbcommon-x11-0"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb", "libxcb-xkb1"),
}
INSTALL = dict(zip(FAMILIES, ("sudo apt install", "sudo dnf install", "sudo pacman -S",
                              "sudo zypper install")))
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


def distro_family(os_release: str) -> str | None:
    """"debian", "fedora", "arch" or "suse" from the text of /etc/os-release."""
    fields = dict(re.findall(r'^(ID|ID_LIKE)="?([^"\n]*)"?$', os_release, re.MULTILINE))
    names = f"{fields.get('ID', '')} {fields.get('ID_LIKE', '')}".split()
    for name in names:
        for family, members in (("debian", ("debian", "ubuntu")), ("fedora", ("fedora", "rhel", "centos")),
                                ("arch", ("arch",)), ("suse", ("suse", "opensuse"))):
            if any(name.startswith(member) for member in members):
                return family
    return None


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, found without importing PySide6."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    plugin = Path(list(spec.submodule_search_locations)[0]) / "Qt/plugins/platforms/libqxcb.so"
    return plugin if plugin.exists() else None


def missing_libraries(plugin: Path) -> list[str]:
    """The shared libraries `plugin` needs that the dynamic loader cannot find."""
    try:
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []  # no ldd: let Qt try
    return sorted(set(_NOT_FOUND.findall(out.stdout)))


def explain(missing: list[str], family: str | None) -> str:
    """One sentence: what is missing and the command that installs it here."""
    families = [family] if family in INSTALL else list(INSTALL)
    commands = []
    for fam in families:
        packages = [PACKAGES[lib][FAMILIES.index(fam)] if lib in PACKAGES else None
                    for lib in missing]
        if all(packages):
            commands.append(f"`{INSTALL[fam]} {' '.join(dict.fromkeys(packages))}`"
                            + ("" if family in INSTALL else f" ({fam})"))
    it, are = ("it", "is") if len(missing) == 1 else ("them", "are")
    fix = (f"install {it} with {' or '.join(commands)}" if commands
           else f"install the packages that provide {it}")
    what = " and ".join(missing)
    return (f"The desktop window cannot open because Qt's X11 platform plugin needs {what}, "
            f"which {are} not installed on this system: {fix}, then run homerack again.")


def platform_problem(env: dict | None = None) -> str | None:
    """None when Qt's platform plugin can load (or another platform is in use);
    otherwise the sentence that says what to install."""
    env = os.environ if env is None else env
    wanted = env.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (wanted and not wanted.startswith("xcb")):
        return None
    if not wanted and env.get("WAYLAND_DISPLAY"):
        return None  # Qt picks its Wayland plugin
    plugin = xcb_plugin()
    missing = missing_libraries(plugin) if plugin else []
    if not missing:
        return None
    try:
        family = distro_family(Path("/etc/os-release").read_text())
    except OSError:
        family = None
    return explain(missing, family)
