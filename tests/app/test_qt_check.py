"""The desktop window on a Linux desktop without a library Qt's X11 plugin needs
(libxcb-cursor0 above all, which PySide6 >= 6.5 requires): one plain sentence naming the
package and its install command, then the terminal chat instead of Qt's abort."""

import os
import shutil
import subprocess
import sys

import pytest

from app.qt_check import distro_family, explain, missing_libraries, platform_problem, xcb_plugin
from support import ROOT


@pytest.fixture
def no_xcb_cursor(tmp_path, monkeypatch):
    """An `ldd` first on PATH that reports libxcb-cursor.so.0 as not found, as on a
    desktop without libxcb-cursor0 (the real ldd answers for everything else)."""
    real = shutil.which("ldd")
    if real is None or xcb_plugin() is None:
        pytest.skip("needs ldd and PySide6's xcb plugin")
    fake = tmp_path / "bin" / "ldd"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{real} \"$@\" | sed "
                    "'s|libxcb-cursor.so.0 => .*|libxcb-cursor.so.0 => not found|'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return fake


def test_a_missing_library_is_named_with_its_package_and_command(no_xcb_cursor):
    assert "libxcb-cursor.so.0" in missing_libraries(xcb_plugin())
    problem = platform_problem({"DISPLAY": ":99"})
    assert problem and "libxcb-cursor.so.0" in problem and "then run homerack again" in problem
    assert problem.count(".") >= 1 and "\n" not in problem  # one sentence, one line


def test_other_platforms_are_not_checked(no_xcb_cursor):
    assert platform_problem({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":99"}) is None
    assert platform_problem({"WAYLAND_DISPLAY": "wayland-0"}) is None


@pytest.mark.parametrize("os_release, family, command", [
    ('ID=ubuntu\nID_LIKE=debian\n', "debian", "`sudo apt install libxcb-cursor0`"),
    ('ID="fedora"\n', "fedora", "`sudo dnf install xcb-util-cursor`"),
    ('ID=manjaro\nID_LIKE=arch\n', "arch", "`sudo pacman -S xcb-util-cursor`"),
    ('ID="opensuse-tumbleweed"\nID_LIKE="opensuse suse"\n', "suse",
     "`sudo zypper install libxcb-cursor0`"),
])
def test_the_command_fits_the_distribution(os_release, family, command):
    assert distro_family(os_release) == family
    assert command in explain(["libxcb-cursor.so.0"], family)


def test_an_unknown_distribution_gets_every_command():
    message = explain(["libxcb-cursor.so.0", "libxcb-icccm.so.4"], distro_family("ID=nixos\n"))
    assert "`sudo apt install libxcb-cursor0 libxcb-icccm4` (debian)" in message
    assert "`sudo dnf install xcb-util-cursor xcb-util-wm` (fedora)" in message


@pytest.mark.slow
def test_homerack_falls_back_to_the_terminal_chat(no_xcb_cursor, home):
    """`homerack` on a desktop (DISPLAY set) without the library: the sentence, then the
    terminal chat (here given no input: it says goodbye), never Qt's abort."""
    env = dict(os.environ, DISPLAY=":99", HOMERACK_HOME=str(home))
    env.pop("QT_QPA_PLATFORM", None)
    done = subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "needs libxcb-cursor.so.0" in done.stderr
    assert "chatting in the terminal" in done.stderr and "Homerack chat" in done.stderr
    assert "Qt platform plugin" not in done.stderr.replace("Qt's X11 platform plugin", "")
