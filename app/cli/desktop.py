"""The desktop app from the command line: `homerack` alone opens the window (or a terminal chat
where it cannot), `self-test` checks an installation, `install-desktop` adds the menu entry."""

from __future__ import annotations

import os
import sys
from typing import Callable


def cmd_install_desktop(_args) -> int:
    from ..desktop import install_desktop

    entry, icon = install_desktop()
    print(f"installed {entry}\ninstalled {icon}")
    return 0


def launch_desktop(terminal_chat: Callable[[], int]) -> int:
    """The window, or `terminal_chat()` where it cannot open (a server install, Qt or one
    of the system libraries its platform plugin needs missing)."""
    from ..qt_check import platform_problem

    headless = (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
                and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")))
    try:
        if headless:
            raise ImportError("no display")
        problem = platform_problem()
        if problem:
            print(problem, file=sys.stderr)
            raise ImportError("a system library is missing")
        from ui.shell.launch import main as gui_main  # composition: the CLI starts the app
    except ImportError as exc:
        print(f"the desktop app is unavailable ({exc}); chatting in the terminal",
              file=sys.stderr)
        return terminal_chat()
    return gui_main()


def cmd_self_test(args) -> int:
    from ..self_test import PROMPT, check_engine

    prompt = args.prompt or PROMPT
    if args.gui:
        from ui.shell.self_test import check_window  # composition: the CLI starts the app

        return check_window(args.gui, prompt, args.timeout)
    return check_engine(prompt, args.timeout)


def add_commands(sub) -> None:
    """Adds `self-test`, `install-desktop` to the parser."""
    check = sub.add_parser("self-test", help="start the engine, load the starter model and "
                                             "answer a question (checks an installation)")
    check.add_argument("--gui", metavar="PNG", help="through the desktop window; save it here")
    check.add_argument("--prompt", help="the question (default: the capital of France)")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds")
    check.set_defaults(func=cmd_self_test)

    desktop = sub.add_parser("install-desktop", help="add Homerack to the desktop menu")
    desktop.set_defaults(func=cmd_install_desktop)
