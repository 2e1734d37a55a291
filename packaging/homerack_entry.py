"""The packaged app's executable (PyInstaller runs this as its main script).

Its first argument decides what this process is, before anything else is imported (Qt
above all): `-m MODULE ARGS...` runs one of the app's modules as `python -m` would (how
the app starts its engine, a worker or an RPC server: engine/spawn.py); anything else is
the `homerack` command line, whose default is the desktop app.
"""

import multiprocessing
import sys


def main() -> int:
    multiprocessing.freeze_support()  # first: a multiprocessing child never gets further
    if len(sys.argv) >= 3 and sys.argv[1] == "-m":
        import runpy

        module = sys.argv[2]
        sys.argv = [sys.argv[0], *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    from app.cli import main as cli

    return cli()


if __name__ == "__main__":
    sys.exit(main())
