"""The third hardening round through a real `homerack serve`, its memory watched with psutil:
a 62-byte GGUF whose header claims 2^62 items, pictures of 49 megapixels in 14 KB each
(through the OpenAI route and Ollama's tokenless port), a folder with a link out of it, a
FIFO, a link to /dev/zero, 8 MiB of newlines and a DOCX of a million empty paragraphs, a
pattern of nested repetitions, and chat templates that loop or ask for gigabytes. Each is
refused or listed with its reason, quickly, the engine's memory stays within 200 MB of
where it was, and it answers normally after."""

from __future__ import annotations

import base64
import os
import threading
import time
import zipfile

import httpx
import psutil
import pytest

from support.crafted import crafted_gguf, one_bit_png
from support.engines import api_client, models_once_read, start_engine
from support.models import linked_models, with_template

pytestmark = pytest.mark.slow
TINY = "tiny"
EMBEDDER = "all-minilm-l6-v2-f16"
BOUND = 200 << 20  # the most an engine may grow while it refuses one of these
TEMPLATES = {  # a model file's template is code from whoever made the file
    "looping-template": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
                        "{% endfor %}{{ messages[0]['content'] }}",
    "huge-template": "{{ 'a' * 3000000000 }}{{ messages[0]['content'] }}",
}


class PeakMemory:
    """The engine's resident memory, sampled every 20 ms while the block runs."""

    def __init__(self, pid: int):
        self.process, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self):
        self.before = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join(5)

    @property
    def grew(self) -> int:
        return self.peak - self.before


@pytest.fixture(scope="module")
def served(tmp_path_factory, starters_dir, tiny_model, door_port):
    home = tmp_path_factory.mktemp("bounded")
    models = linked_models(home, starters_dir, tiny_model)  # tiny.gguf: TINY
    for name, template in TEMPLATES.items():
        with_template(tiny_model, models / f"{name}.gguf", template)
    process, address, _ = start_engine(home, "bounded", [
        "--model", TINY, "--ctx", "256", "--parallel", "2",
        "--ollama-port", str(door_port)])
    with api_client(address) as http:
        models_once_read(http)  # every header read and the default model loaded: at rest
        alive((process, http))
        yield process, http, home, models
    process.stop()


def alive(served) -> None:
    process, http, *_ = served
    assert process.process.poll() is None, "the engine died"
    reply = http.post("/v1/completions", json={"model": TINY, "prompt": "the cat",
                                               "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text


def test_a_crafted_gguf_header_is_listed_unreadable_at_once(served):
    process, http, _, models = served
    data = crafted_gguf()
    assert len(data) == 62
    with PeakMemory(process.process.pid) as memory:
        (models / "crafted.gguf").write_bytes(data)
        deadline = time.monotonic() + 60
        while True:  # the folder's watch inspects it in the background
            listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
            if listed.get("crafted", {}).get("kind") == "unreadable" or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        started = time.monotonic()
        chat = http.post("/v1/chat/completions", json={
            "model": "crafted", "messages": [{"role": "user", "content": "hi"}]})
        took = time.monotonic() - started
    assert listed["crafted"]["kind"] == "unreadable"
    assert "4,611,686,018,427,387,904" in listed["crafted"]["problem"]  # the count, said
    assert 400 <= chat.status_code < 500 and "crafted" in chat.text and took < 10
    assert memory.grew < BOUND, f"grew {memory.grew >> 20} MiB"
    alive(served)


def test_pictures_are_counted_by_their_headers_and_never_decoded_for_a_blind_model(
        served, door_port):
    process, http, *_ = served
    png = base64.b64encode(one_bit_png(7000)).decode()  # 14 KB; 147 MB as RGB

    def chat(count: int):
        parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
                 for _ in range(count)]
        return http.post("/v1/chat/completions", json={"model": TINY, "max_tokens": 4,
                         "messages": [{"role": "user", "content": [
                             {"type": "text", "text": "What is this?"}, *parts]}]})

    with PeakMemory(process.process.pid) as memory:
        twelve = chat(12)  # 588 megapixels: took the engine to 3.9 GB
        two = chat(2)  # within the caps: refused for a model that cannot see, undecoded
        door = httpx.post(f"http://127.0.0.1:{door_port}/api/generate", timeout=60, json={
            "model": TINY, "prompt": "What is this?", "images": [png] * 24, "stream": False})
    assert twelve.status_code == 400 and "megapixels in all" in twelve.text
    assert twelve.json()["error"]["param"] == "messages[0].content[3].image_url"
    assert two.status_code == 400 and "cannot see images" in two.text
    assert door.status_code == 400 and "at most 16 new images" in door.text
    assert memory.grew < BOUND, f"grew {memory.grew >> 20} MiB"
    alive(served)


def _ready(http, name: str, limit_s: float = 240) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        state = http.get(f"/v1/collections/{name}").json()
        if state["state"] in ("ready", "failed") or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def dense_docx(path, paragraphs: int) -> None:
    """A DOCX of empty paragraphs: a few hundred kB that parse into millions of elements."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    body = "<w:p/>" * paragraphs
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        archive.writestr("word/document.xml", f'<?xml version="1.0"?><w:document xmlns:w="{w}">'
                         f"<w:body>{body}</w:body></w:document>")


def test_documents_keep_to_regular_files_under_their_folder_and_bounded_memory(served):
    process, http, home, _ = served
    (home / "secret.conf").write_text("password=hunter2 the launch code is zebra")
    warm = home / "warm"
    warm.mkdir()
    (warm / "good.md").write_text("# Garden\nWater the tomatoes every morning.\n")
    added = http.post("/v1/collections", json={"name": "warm", "paths": [str(warm)],
                                               "model": EMBEDDER})
    assert added.status_code == 200, added.text
    assert _ready(http, "warm")["state"] == "ready"  # the embedder loaded: the baseline
    folder = home / "hostile"
    folder.mkdir()
    (folder / "leak.txt").symlink_to(home / "secret.conf")  # a link out of the folder
    (folder / "zero.txt").symlink_to("/dev/zero")
    os.mkfifo(folder / "pipe.txt")  # would block the documents thread for good
    (folder / "newlines.txt").write_bytes(b"\n" * (8 << 20))
    dense_docx(folder / "dense.docx", 1_200_000)
    assert (folder / "dense.docx").stat().st_size < 100_000
    (folder / "notes.md").write_text("The oven needs twenty minutes to preheat.\n")
    with PeakMemory(process.process.pid) as memory:
        added = http.post("/v1/collections", json={"name": "hostile", "paths": [str(folder)],
                                                   "model": EMBEDDER})
        assert added.status_code == 200, added.text
        state = _ready(http, "hostile")
    assert state["state"] == "ready"
    failed = {os.path.basename(f["path"]): f["error"] for f in state["failed"]}
    assert "more than 1,000,000 lines" in failed["newlines.txt"]
    assert "more than 1,000,000 paragraphs" in failed["dense.docx"]
    assert not {"leak.txt", "zero.txt", "pipe.txt"} & set(failed)  # never listed as files
    found = http.post("/v1/collections/hostile/search",
                      json={"query": "launch code zebra password", "top_k": 10}).json()
    assert found["data"] and all("zebra" not in r["text"] for r in found["data"])
    assert memory.grew < BOUND, f"grew {memory.grew >> 20} MiB"
    later = home / "later"
    later.mkdir()
    (later / "a.md").write_text("A later collection is indexed too.\n")
    http.post("/v1/collections", json={"name": "later", "paths": [str(later)],
                                       "model": EMBEDDER}).raise_for_status()
    assert _ready(http, "later", 60)["state"] == "ready"  # the FIFO held nothing up
    alive(served)


def test_a_nested_repetition_is_refused_naming_the_pattern(served):
    _, http, *_ = served
    reply = http.post("/v1/chat/completions", json={
        "model": TINY, "messages": [{"role": "user", "content": "letters"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "string", "pattern": "^((a{9,99}){9,99}){9,99}$"}}}})
    assert reply.status_code == 400
    assert "970,299" in reply.text and "pattern" in reply.json()["error"]["param"]
    alive(served)


@pytest.mark.parametrize("model, says", [("looping-template", "steps"),
                                         ("huge-template", "3,000,000,000")])
def test_a_template_past_its_budget_is_a_400_naming_it_and_tried_once(served, model, says):
    process, http, *_ = served
    with PeakMemory(process.process.pid) as memory:
        started = time.monotonic()
        reply = http.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        took = time.monotonic() - started
    assert reply.status_code == 400, reply.text
    assert f"{model}: the chat template of the model file was stopped" in reply.text
    assert says in reply.text
    assert took < 30 and memory.grew < BOUND
    alive(served)
