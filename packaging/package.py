"""`make package`: the double-click app, as a folder and what installs it: a .tar.gz and
a .deb on Linux (built and tested here), a .dmg on macOS and a setup .exe on Windows
(packaging/build_macos.sh, packaging/build_windows.ps1; not built here).

    .venv/bin/python packaging/package.py

1. llama.cpp built portable (packaging/portable_llama.py: every CPU variant but AMX,
   and the GPU backends as modules: Vulkan, and CUDA without its runtime, which the app
   fetches once on an NVIDIA machine);
2. the starter models installed into a folder of their own, to ship inside;
3. PyInstaller (packaging/homerack.spec) makes dist/homerack/, its log kept in
   build/package/pyinstaller.log; a "Library not found" line there fails the build;
4. the folder is checked: every native library and Qt's xcb platform plugin find all
   they need (`ldd`), no AMX variant, the starter models present;
5. Linux: dist/homerack-VERSION-linux-ARCH.tar.gz and dist/homerack_VERSION_ARCH.deb
   (the folder under /opt/homerack, /usr/bin/homerack, the desktop entry and hicolor
   icons); macOS: dist/Homerack-VERSION-macos-ARCH.dmg (hdiutil); Windows:
   dist/homerack-VERSION-windows-x64-setup.exe (Inno Setup's iscc, packaging/homerack.iss).

Sizes are printed at the end. `make package-test` then runs the result.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "packaging"), str(ROOT)]

from app.qt_check import missing_libraries  # noqa: E402
from portable_llama import EXCLUDED_VARIANTS, MODULE_PREFIX, MODULE_SUFFIX  # noqa: E402
from portable_llama import CUDA_MODULE, RUNTIME_MANIFEST  # noqa: E402
from portable_llama import ensure as portable_libs  # noqa: E402
from portable_llama import ensure_cuda  # noqa: E402

WORK = ROOT / "build" / "package"
DIST = ROOT / "dist"
BUNDLE = DIST / "homerack"
VERSION = "0.1.0"
# what Qt's xcb plugin and PySide6 need from the system (PyInstaller leaves these to it)
DEB_DEPENDS = ("libc6", "libgomp1", "libgl1", "libegl1", "libfontconfig1", "libfreetype6",
               "libxkbcommon0", "libxkbcommon-x11-0", "libdbus-1-3", "libxcb-cursor0",
               "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0", "libxcb-render-util0",
               "libxcb-shape0", "libxcb-randr0", "libxcb-xkb1")
ICON_SIZES = (48, 128, 256)
# Libraries that may rightly be absent here: Qt's GTK platform theme is loaded only on a
# GTK desktop, and then uses that desktop's own GTK (it is never bundled).
SYSTEM_PROVIDED = ("platformthemes/libqgtk3.so",)
# What the CUDA module links and the bundle does not carry: the driver's own library, and
# NVIDIA's runtime, fetched at first use (its manifest, beside the module, names it).
DRIVER_LIBRARY = "libcuda.so.1"


def fetched_at_first_use(lib: Path) -> set[str]:
    """The libraries the CUDA module in `lib` may rightly miss here."""
    import json

    manifest = lib / RUNTIME_MANIFEST
    if not manifest.exists():
        return set()
    return {DRIVER_LIBRARY} | {name for wheel in json.loads(manifest.read_text())["wheels"]
                               for name in wheel["libraries"]}


def starter_models() -> Path:
    """The starter models, installed as a user's first run would (checked by sha256)."""
    home = WORK / "starters"
    subprocess.run([sys.executable, "-m", "app", "models", "--quiet"], check=True, cwd=ROOT,
                   env=dict(os.environ, HOMERACK_HOME=str(home)))
    return home / "data" / "models"


def run_pyinstaller(libs: list[Path], starters: Path) -> None:
    log = WORK / "pyinstaller.log"
    env = dict(os.environ, HOMERACK_LLAMA_LIBS=os.pathsep.join(map(str, libs)),
               HOMERACK_STARTERS=str(starters))
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean",
             "--distpath", str(DIST), "--workpath", str(WORK / "pyinstaller"),
             str(ROOT / "packaging" / "homerack.spec")],
            stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    text = log.read_text()
    if done.returncode:
        raise SystemExit(f"PyInstaller failed ({done.returncode}):\n{text[-3000:]}")
    later = set().union(*(fetched_at_first_use(lib) for lib in libs))
    missing = [line for line in text.splitlines() if "Library not found" in line
               and not any(f"{plugin}'" in line for plugin in SYSTEM_PROVIDED)
               and not any(f"{name}'" in line or f"{name} " in line for name in later)]
    if missing:
        raise SystemExit("PyInstaller could not find libraries the app needs:\n"
                         + "\n".join(missing) + f"\n(full log: {log})")


def record_starters(models: Path) -> None:
    """What the app's first launch would read of each starter model (seconds for a large
    vocabulary), read now and shipped beside them."""
    import json

    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import BUNDLED_RECORDS

    inspector = GGUFInspector()
    records = {path.name: {"size": path.stat().st_size, "record": inspector.record(path)}
               for path in sorted(models.glob("*.gguf"))}
    (models / BUNDLED_RECORDS).write_text(json.dumps(records))


def check_bundle() -> list[str]:
    """What is wrong with the folder (empty: nothing)."""
    internal = BUNDLE / "_internal"
    problems = []
    lib = internal / "llama_cpp" / "lib"
    if any(name in path.name for path in lib.iterdir() for name in EXCLUDED_VARIANTS):
        problems.append(f"an excluded CPU variant ({', '.join(EXCLUDED_VARIANTS)}) is in {lib}")
    if not list(lib.glob(f"{MODULE_PREFIX}cpu-*{MODULE_SUFFIX}")):
        problems.append(f"no CPU backend variants in {lib}")
    if not list((internal / "models").glob("*.gguf")):
        problems.append("no starter models in the bundle")
    if sys.platform.startswith("linux"):
        problems += linux_libraries(internal)
    return problems


def linux_libraries(internal: Path) -> list[str]:
    """Every llama.cpp library and Qt's xcb platform plugin find all they need (`ldd`)."""
    problems = []
    lib = internal / "llama_cpp" / "lib"
    later = fetched_at_first_use(lib)
    for path in sorted(lib.glob("*.so*")):
        problems += [f"{path.name} needs {name}, not found" for name in missing_libraries(path)
                     if not (path.name == CUDA_MODULE and name in later)]
    plugin = internal / "PySide6" / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    if not plugin.exists():
        return problems + [f"Qt's xcb platform plugin is missing ({plugin})"]
    return problems + [f"Qt's xcb plugin needs {name}, not found on this machine (install it, "
                       "or the bundle shows a misleading 'no Qt platform plugin' error)"
                       for name in missing_libraries(plugin)]


def make_tarball(arch: str) -> Path:
    target = DIST / f"homerack-{VERSION}-linux-{arch}.tar.gz"
    with tarfile.open(target, "w:gz", compresslevel=6) as archive:
        archive.add(BUNDLE, arcname="homerack")
    return target


def render_icons(into: Path) -> None:
    """The SVG icon, plus PNGs of the usual sizes for menus that want them."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    QGuiApplication.instance() or QGuiApplication([])
    svg = ROOT / "assets" / "homerack.svg"
    scalable = into / "scalable" / "apps"
    scalable.mkdir(parents=True)
    shutil.copyfile(svg, scalable / "homerack.svg")
    renderer = QSvgRenderer(str(svg))
    for size in ICON_SIZES:
        image = QImage(size, size, QImage.Format_ARGB32)
        image.fill(Qt.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        folder = into / f"{size}x{size}" / "apps"
        folder.mkdir(parents=True)
        image.save(str(folder / "homerack.png"))


def make_deb(arch: str) -> Path:
    stage = WORK / "deb"
    shutil.rmtree(stage, ignore_errors=True)
    opt = stage / "opt" / "homerack"
    opt.parent.mkdir(parents=True)
    shutil.copytree(BUNDLE, opt, symlinks=True, copy_function=os.link)  # hard links: no copy
    (stage / "usr" / "bin").mkdir(parents=True)
    (stage / "usr" / "bin" / "homerack").symlink_to("/opt/homerack/homerack")
    applications = stage / "usr" / "share" / "applications"
    applications.mkdir(parents=True)
    shutil.copyfile(ROOT / "assets" / "homerack.desktop", applications / "homerack.desktop")
    render_icons(stage / "usr" / "share" / "icons" / "hicolor")
    size_kib = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file()) // 1024
    control = stage / "DEBIAN" / "control"
    control.parent.mkdir()
    control.write_text(
        f"Package: homerack\nVersion: {VERSION}\nArchitecture: {arch}\n"
        "Maintainer: Homerack developers <homerack@localhost>\n"
        f"Installed-Size: {size_kib}\nDepends: {', '.join(DEB_DEPENDS)}\n"
        # the Vulkan module's loader; the GPU's driver is the system's (Mesa's for AMD
        # and Intel, NVIDIA's own): without them the app runs on the CPU
        "Recommends: libvulkan1, mesa-vulkan-drivers\n"
        "Section: utils\nPriority: optional\n"
        "Description: Run large language models on the machines you already own\n"
        " A desktop app with its own engine (llama.cpp, every x86-64 CPU variant),\n"
        " an OpenAI- and Anthropic-compatible local API and the starter models.\n")
    target = DIST / f"homerack_{VERSION}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(stage),
                    str(target)], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(stage)
    return target


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def make_dmg() -> Path:
    arch = platform.machine()
    target = DIST / f"Homerack-{VERSION}-macos-{arch}.dmg"
    subprocess.run(["hdiutil", "create", "-volname", "Homerack", "-srcfolder",
                    str(DIST / "Homerack.app"), "-ov", "-format", "UDZO", str(target)], check=True)
    return target


def make_setup_exe() -> Path:
    iscc = shutil.which("iscc") or r"C:\Program Files (x86)\Inno Setup 6\ISCC.exe"
    subprocess.run([iscc, f"/DVersion={VERSION}", str(ROOT / "packaging" / "homerack.iss")],
                   check=True)
    return DIST / f"homerack-{VERSION}-windows-x64-setup.exe"


def installers() -> list[Path]:
    """What this platform ships."""
    if sys.platform == "darwin":
        return [make_dmg()]
    if sys.platform == "win32":
        return [make_setup_exe()]
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                          text=True).stdout.strip() if shutil.which("dpkg") else ""
    made = [make_tarball(platform.machine())]
    if shutil.which("dpkg-deb"):
        made.append(make_deb(arch or platform.machine()))
    else:
        print("no .deb: dpkg-deb is not installed here", flush=True)
    return made


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    libs = [portable_libs()]
    if cuda := ensure_cuda():
        libs.append(cuda)
    starters = starter_models()
    print("running PyInstaller (a few minutes) ...", flush=True)
    run_pyinstaller(libs, starters)
    record_starters(BUNDLE / "_internal" / "models")
    problems = check_bundle()
    if problems:
        raise SystemExit("the bundle is incomplete:\n  " + "\n  ".join(problems))
    print(f"bundle   {BUNDLE}  {folder_size(BUNDLE) / 2**20:.0f} MiB", flush=True)
    for made in installers():
        print(f"{made.suffix.lstrip('.') if made.suffix != '.gz' else 'tar.gz':<8} {made}  "
              f"{made.stat().st_size / 2**20:.0f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
