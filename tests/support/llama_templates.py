"""llama.cpp's own test set of real chat templates (`models/templates/` in its
repository), taken from the llama-cpp-python source package this project pins (it vendors
llama.cpp whole): downloaded from PyPI once per machine, never copied into this project."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

from platformdirs import user_cache_dir

PACKAGE = "llama-cpp-python"


def llama_cpp_templates() -> dict[str, str]:
    """Template name (its file's stem) -> the template."""
    folder = _extracted()
    return {path.stem: path.read_text() for path in sorted(folder.glob("*.jinja"))}


def _extracted() -> Path:
    pinned = version(PACKAGE)
    cache = Path(user_cache_dir("homerack")) / "llama-cpp-templates" / pinned
    if cache.is_dir() and any(cache.glob("*.jinja")):
        return cache
    download = cache.parent / f"download-{pinned}"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", "--disable-pip-version-check", "-q", "-d", str(download),
                    f"{PACKAGE}=={pinned}"], check=True)
    archive = next(download.glob("llama_cpp_python-*.tar.gz"))
    prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/models/templates/"
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.name.endswith(".jinja") \
                    and member.isfile():
                data = tar.extractfile(member).read()
                (cache / Path(member.name).name).write_bytes(data)
    archive.unlink()
    return cache
