"""A PDF's text, page by page, extracted in a child process with a memory limit and a
timeout: a PDF is untrusted input, and a parser's bug (a decompression bomb, a loop in a
page tree) must cost the child, never the engine or the window.
`python -m engine.documents.pdf_pages PATH MEMORY_BYTES` prints {"pages": [...]} or
{"error": ...} as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..spawn import module_command

TIMEOUT_S = 60.0
MEMORY_BYTES = 1 << 30


class PdfError(ValueError):
    """What went wrong, in words."""


def pdf_pages(path: Path, timeout: float = TIMEOUT_S, memory: int = MEMORY_BYTES) -> list[str]:
    """The text of each page, in a child; PdfError when the child says it cannot, uses
    too much memory, dies or takes longer than `timeout`."""
    try:
        done = subprocess.run(module_command("engine.documents.pdf_pages", str(path),
                                             str(memory)),
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # run() kills the child
        raise PdfError(f"reading it took more than {timeout:g} s") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        raise PdfError(f"its reader stopped (exit status {done.returncode})") from None
    if "error" in answer:
        raise PdfError(answer["error"])
    return answer["pages"]


def _limit_memory(memory: int) -> None:
    try:
        import resource
    except ImportError:  # Windows: the timeout still holds
        return
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def _extract(path: Path) -> dict:
    from pypdf import PdfReader

    try:
        pages = [page.extract_text() or "" for page in PdfReader(path).pages]
    except MemoryError:
        return {"error": f"reading it needs more than {int(sys.argv[2]) >> 20} MiB"}
    except Exception as exc:  # noqa: BLE001 (any failure of the parser: the file's fault)
        return {"error": f"not a readable PDF ({type(exc).__name__}: {exc})"}
    return {"pages": pages}


if __name__ == "__main__":
    _limit_memory(int(sys.argv[2]))
    try:
        result = _extract(Path(sys.argv[1]))
    except MemoryError:  # even importing the parser did not fit
        result = {"error": f"reading it needs more than {int(sys.argv[2]) >> 20} MiB"}
    sys.stdout.write(json.dumps(result))
