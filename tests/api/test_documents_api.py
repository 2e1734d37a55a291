"""Document collections through a real `homerack serve` and the MiniLM starter: a folder
of a manual (PDF), notes (Markdown), a thesis (DOCX), a page (HTML) and a broken PDF is
indexed with progress, the broken file listed with its reason; a search and a chat with
the collection cite the right file and page; nothing relevant is said so; an index stopped
midway goes on after a restart, a changed file is re-read alone, a deleted one dropped;
bad input is a 400 naming the field. The official `openai` client carries `collections`
as an extra field, as a script would."""

from __future__ import annotations

import json
import stat
import time

import anthropic
import openai
import pytest

from fixtures.documents import pdf_bytes, write_docx, write_reranker
from support.engines import api_client, start_engine
from fixtures.network import sse_events

pytestmark = pytest.mark.slow
STARTER = "smollm2-135m-instruct-q4_1"


def corpus(folder):
    folder.mkdir()
    (folder / "manual.pdf").write_bytes(pdf_bytes([
        "Contents\nSafety\nWheels\nTyres",
        "Wheels\nThe wheel bolts are tightened to 120 Nm with a torque wrench.",
        "Tyres\nThe tyre pressure is 2.4 bar when the tyres are cold."]))
    (folder / "notes.md").write_text("# Garden\nWater the tomatoes every morning in summer."
                                     "\n\n# Kitchen\nThe oven needs twenty minutes to preheat."
                                     "\n")
    (folder / "sub").mkdir()
    write_docx(folder / "sub" / "thesis.docx", [("Heading1", "Results"),
                                                ("", "The catalyst raised the yield by 14%.")])
    (folder / "router.html").write_text("<h1>Router</h1><script>x()</script><p>Hold the reset "
                                        "button for ten seconds to restore the password.</p>")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 truncated")
    (folder / ".git").mkdir()
    (folder / ".git" / "config.txt").write_text("hidden folders are not indexed")
    return folder


RERANKER = "minilm-reranker"


def _engine(tmp_path_factory, starters_dir, name="docs"):
    home = tmp_path_factory.mktemp(name)
    (home / "data" / "models").mkdir(parents=True)
    for path in starters_dir.iterdir():
        (home / "data" / "models" / path.name).symlink_to(path)
    write_reranker(starters_dir / "all-minilm-l6-v2-f16.gguf",
                   home / "data" / "models" / f"{RERANKER}.gguf")
    return home, start_engine(home, name, ["--parallel", "1", "--ctx", "2048"])


def ready(http, name: str, limit_s: float = 180) -> dict:
    deadline = time.monotonic() + limit_s
    while True:
        state = http.get(f"/v1/collections/{name}").json()
        if state["state"] == "ready" or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


@pytest.fixture(scope="module")
def served(tmp_path_factory, starters_dir):
    home, (process, address, _) = _engine(tmp_path_factory, starters_dir)
    folder = corpus(home / "corpus")
    with api_client(address) as http:
        added = http.post("/v1/collections", json={"name": "home", "paths": [str(folder)]})
        assert added.status_code == 200, added.text
        yield http, address, folder, home
    process.stop()


def test_a_folder_is_indexed_and_unreadable_files_listed(served):
    http, _, _, home = served
    state = ready(http, "home")
    assert state["state"] == "ready" and state["files_indexed"] == 4
    assert [f["path"].rsplit("/", 1)[-1] for f in state["failed"]] == ["broken.pdf"]
    assert "PDF" in state["failed"][0]["error"]
    index = home / "docs" / "data" / "documents.sqlite"
    assert stat.S_IMODE(index.stat().st_mode) == 0o600
    listing = http.get("/v1/collections").json()
    assert listing["data"][0]["name"] == "home" and listing["index_bytes"] > 0


def test_search_finds_the_page_and_the_lines(served):
    http, *_ = served
    ready(http, "home")
    found = http.post("/v1/collections/home/search",
                      json={"query": "how tight are the wheel bolts", "top_k": 3}).json()["data"]
    assert found[0]["path"].endswith("manual.pdf") and found[0]["page"] == 2
    assert "120 Nm" in found[0]["text"] and found[0]["score"] > found[-1]["score"]
    notes = http.post("/v1/collections/home/search",
                      json={"query": "when should I water the tomatoes"}).json()["data"]
    assert notes[0]["path"].endswith("notes.md") and notes[0]["start_line"] == 1
    assert notes[0]["heading"] == "Garden"


def test_a_chat_with_the_collection_cites_its_source(served):
    _, address, *_ = served
    client = openai.OpenAI(base_url=address.url + "/v1", api_key=address.token)
    answer = client.chat.completions.create(
        model=STARTER, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "What torque do the wheel bolts need?"}],
        extra_body={"collections": ["home"]})
    citations = answer.model_extra["citations"]
    assert citations[0]["index"] == 1 and citations[0]["path"].endswith("manual.pdf")
    assert citations[0]["page"] == 2
    unrelated = client.chat.completions.create(
        model=STARTER, max_tokens=8,
        messages=[{"role": "user", "content": "Who painted the Mona Lisa?"}],
        extra_body={"collections": ["home"]})
    assert unrelated.model_extra["citations"] == []
    assert "nothing in home matched" in " ".join(unrelated.model_extra["homerack"]["notes"])


def test_a_long_message_is_searched_with_what_the_embedder_reads(served):
    """A 4,800-character paste with a question at its end (1,000 tokens, MiniLM reads
    512): answered with the documents, its note saying how the search read it (the
    whole reply failed, "input[0] has 1480 tokens")."""
    http, *_ = served
    paste = "The log of the week follows, line by line, as it was kept. " * 80
    reply = http.post("/v1/chat/completions", json={
        "model": STARTER, "max_tokens": 4, "collections": ["home"], "messages": [
            {"role": "user", "content": paste + "What torque do the wheel bolts need?"}]})
    assert reply.status_code == 200, reply.text
    notes = " ".join(reply.json()["homerack"]["notes"])
    assert "searched with its last 1,500" in notes, notes
    assert "citations" in reply.json()  # searched, found or not (the note says which)


def test_a_streamed_answer_carries_its_sources_first(served):
    http, *_ = served
    with http.stream("POST", "/v1/chat/completions", json={
            "model": STARTER, "stream": True, "max_tokens": 8, "collections": ["home"],
            "messages": [{"role": "user", "content": "What is the tyre pressure?"}]}) as got:
        first = next(sse_events(got))
    assert first["citations"][0]["page"] == 3


TORQUE = "What torque do the wheel bolts need?"


def _cites_the_manual(citations) -> None:
    assert citations[0]["index"] == 1 and citations[0]["path"].endswith("manual.pdf")
    assert citations[0]["page"] == 2


def test_anthropics_messages_are_grounded_too(served):
    _, address, *_ = served
    client = anthropic.Anthropic(base_url=address.url, api_key=address.token)
    answer = client.messages.create(model=STARTER, max_tokens=16,
                                    messages=[{"role": "user", "content": TORQUE}],
                                    extra_body={"collections": ["home"]})
    _cites_the_manual(answer.model_extra["citations"])
    with client.messages.stream(model=STARTER, max_tokens=8,
                                messages=[{"role": "user", "content": TORQUE}],
                                extra_body={"collections": ["home"]}) as stream:
        started = next(e for e in stream if e.type == "message_start")
    _cites_the_manual(started.message.model_extra["citations"])


def test_the_responses_api_is_grounded_too(served):
    _, address, *_ = served
    client = openai.OpenAI(base_url=address.url + "/v1", api_key=address.token)
    answer = client.responses.create(model=STARTER, input=TORQUE, max_output_tokens=16,
                                     extra_body={"collections": ["home"]})
    _cites_the_manual(answer.model_extra["citations"])
    with client.responses.stream(model=STARTER, input=TORQUE, max_output_tokens=8,
                                 extra_body={"collections": ["home"]}) as stream:
        created = next(e for e in stream if e.type == "response.created")
    _cites_the_manual(created.response.model_extra["citations"])


def test_ollamas_chat_and_generate_are_grounded_too(served):
    """Ollama's client sends no field of its own: `collections` is for a script's JSON."""
    http, *_ = served
    ask = {"model": STARTER, "options": {"num_predict": 16}, "collections": ["home"]}
    chat = http.post("/api/chat", json={**ask, "stream": False,
                                        "messages": [{"role": "user", "content": TORQUE}]})
    generate = http.post("/api/generate", json={**ask, "stream": False, "prompt": TORQUE})
    for answer in (chat, generate):
        assert answer.status_code == 200, answer.text
        _cites_the_manual(answer.json()["citations"])
    with http.stream("POST", "/api/chat", json={
            **ask, "messages": [{"role": "user", "content": TORQUE}]}) as streamed:
        last = [json.loads(line) for line in streamed.iter_lines() if line][-1]
    assert last["done"]
    _cites_the_manual(last["citations"])
    raw = http.post("/api/generate", json={**ask, "prompt": TORQUE, "raw": True,
                                           "stream": False})
    assert raw.status_code == 400 and "collections" in raw.json()["error"]


@pytest.mark.parametrize("body, field", [
    ({"name": "home", "paths": ["/"]}, "name"),                       # used already
    ({"name": "new", "paths": ["/does/not/exist"]}, "paths[0]"),
    ({"name": "new", "paths": ["relative/path"]}, "paths[0]"),
    ({"name": "../etc", "paths": ["/tmp"]}, "name"),
    ({"name": "new", "paths": []}, "paths"),
    ({"name": "new", "paths": ["/tmp"], "model": STARTER}, "model"),  # a chat model
])
def test_bad_collections_are_a_400_naming_the_field(served, body, field):
    http, *_ = served
    response = http.post("/v1/collections", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field


def test_bad_searches_are_a_400(served):
    http, *_ = served
    huge = http.post("/v1/collections/home/search", json={"query": "a" * (1 << 20)})
    assert huge.status_code == 400 and "query" in huge.text
    assert http.post("/v1/collections/none/search", json={"query": "x"}).status_code == 400
    chat = http.post("/v1/chat/completions", json={
        "model": STARTER, "messages": [{"role": "user", "content": "hi"}],
        "collections": ["none"]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "collections[0]"


def test_changes_are_seen_and_only_the_changed_file_is_read(served):
    http, _, folder, _ = served
    ready(http, "home")
    (folder / "notes.md").write_text("# Garage\nThe spare key hangs behind the garage door.\n")
    (folder / "router.html").unlink()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = ready(http, "home")
        if state["files_indexed"] == 3 and state.get("files_total") == 1:
            break
        time.sleep(0.3)
    assert state["files_indexed"] == 3 and state["files_total"] == 1  # one file read again
    found = http.post("/v1/collections/home/search",
                      json={"query": "where is the spare key"}).json()["data"]
    assert found[0]["path"].endswith("notes.md") and "garage door" in found[0]["text"]
    assert not any(f["path"].endswith("router.html") for f in found)


def test_a_reranker_scores_documents_and_orders_a_search(served):
    """A MiniLM cross-encoder with a random head (fixtures/documents.py): its scores mean
    nothing, so the test checks their shape and that they decide the order."""
    http, *_ = served
    ready(http, "home")
    documents = ["The wheel bolts take 120 Nm.", "Water the tomatoes.", "x " * 2000]
    ranked = http.post("/v1/rerank", json={"model": RERANKER, "query": "wheel bolts",
                                           "documents": documents, "top_n": 2}).json()
    results = ranked["results"]
    assert len(results) == 2 and {r["index"] for r in results} <= {0, 1, 2}
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    again = http.post("/rerank", json={"model": RERANKER, "query": "wheel bolts",
                                       "documents": documents}).json()["results"]
    assert [r["index"] for r in again][:2] == [r["index"] for r in results]  # deterministic
    found = http.post("/v1/collections/home/search", json={
        "query": "wheel bolts", "top_k": 3, "reranker": RERANKER}).json()["data"]
    assert len(found) == 3 and [f["score"] for f in found] == sorted(
        (f["score"] for f in found), reverse=True)
    chat_model = http.post("/v1/rerank", json={"model": STARTER, "query": "q",
                                               "documents": ["d"]})
    assert chat_model.status_code == 400 and chat_model.json()["error"]["param"] == "model"
    assert http.post("/v1/rerank", json={"model": RERANKER, "query": "q",
                                         "documents": []}).status_code == 400


def test_an_index_stopped_midway_goes_on_after_a_restart(tmp_path_factory, starters_dir):
    home, (process, address, _) = _engine(tmp_path_factory, starters_dir, "resume")
    folder = home / "many"
    folder.mkdir()
    for i in range(400):
        (folder / f"note-{i:03}.md").write_text(f"# Note {i}\nItem {i} is kept in box {i % 7}."
                                                + " More text." * 40)
    with api_client(address) as http:
        http.post("/v1/collections", json={"name": "many", "paths": [str(folder)]})
        while http.get("/v1/collections/many").json()["files_indexed"] < 20:
            time.sleep(0.1)
    process.process.kill()  # no goodbye: the index holds whole files only
    process.stop()
    process, address, _ = start_engine(home, "resume", ["--parallel", "1"])
    try:
        with api_client(address) as http:
            done = ready(http, "many", 300)  # the engine resumed it at its start
            assert done["files_indexed"] == 400 and done["files_failed"] == 0
            assert done["files_total"] < 400  # only what was left was read
    finally:
        process.stop()


def test_a_short_file_goes_in_whole_and_search_is_a_tool(served):
    http, _, folder, _ = served
    (folder / "kitchen.md").write_text(
        "# Oven\nThe oven needs twenty minutes to preheat before baking bread.\n"
        + "It is cleaned on Sundays with soap and warm water. " * 12
        + "\n\n# Fridge\nThe fridge is set to four degrees.\n"
        + "Its shelves hold vegetables, milk and cheese in that order. " * 12)
    deadline = time.monotonic() + 60
    while ready(http, "home")["files_indexed"] < 4 and time.monotonic() < deadline:
        time.sleep(0.3)  # the watcher adds it
    answer = http.post("/v1/chat/completions", json={
        "model": STARTER, "max_tokens": 4, "collections": ["home"],
        "messages": [{"role": "user", "content": "How long does the oven preheat?"}]}).json()
    first = answer["citations"][0]
    assert first["path"].endswith("kitchen.md") and first["whole"] is True
    assert "four degrees" in first["text"]  # the rest of the file came with it
    assert any("given whole" in note for note in answer["homerack"]["notes"])
    servers = {s["label"]: s for s in http.get("/v1/mcp/servers").json()["servers"]}
    assert servers["documents"]["kind"] == "built in"
    tools = http.get("/v1/mcp/servers/documents/tools").json()["tools"]
    assert tools[0]["name"] == "search_documents" and tools[0]["read_only"]
    assert tools[0]["parameters"]["properties"]["collection"]["enum"] == ["home"]
    result = http.post("/v1/mcp/servers/documents/tools/search_documents/call", json={
        "arguments": {"query": "wheel bolts torque", "top_k": 2}, "approved": "once"}).json()
    found = json.loads(result["text"])
    assert not result["is_error"] and found[0]["path"].endswith("manual.pdf")
    assert found[0]["page"] == 2
