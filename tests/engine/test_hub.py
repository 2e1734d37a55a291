"""Hub downloads through the real huggingface_hub client against a local Hub-compatible
server (tests/support/hub_server.py): search, quant listing, verdicts, download, resume after a
dropped connection, checksum failure, missing and gated repos, a full disk."""

import os
from dataclasses import replace
import resource
import signal
import subprocess
import sys

import pytest

from support import ROOT
from support.models import GEMMA_REPO, SMOL, STARTER
from engine.errors import HomerackError
from engine.machine.hardware import simulated
from engine.hub.repos import download, header_shape, judge, quant_of, repo_quants, search
from support.hub_server import Repo


def test_quant_names_are_read_from_file_names():
    assert quant_of("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("model.IQ3_XXS.gguf") == "IQ3_XXS"
    assert quant_of("gemma-3-270m-it-UD-Q8_K_XL.gguf") == "UD-Q8_K_XL"
    assert quant_of("qwen2-7b-f16.gguf") == "F16"


def test_search_lists_and_judges_quants(hub):
    found = search("gguf")
    assert [r.id for r in found] == [GEMMA_REPO, SMOL, "meta-llama/Gated-GGUF"]  # by downloads
    assert found[1].license == "apache-2.0" and found[2].gated
    quants = repo_quants(SMOL)
    assert [(q.quant, len(q.files)) for q in quants] == [("Q8_0", 2), ("Q4_1", 1)]
    shape = header_shape(SMOL, quants[1])  # from the first megabytes only
    assert shape.n_layers == 30 and hub.sent < 10 << 20
    verdicts = judge(simulated((), 8), shape, quants)
    assert [v.fit for v in verdicts] == ["cpu", "cpu"]
    assert "CPU only" in verdicts[0].words and sum(v.recommended for v in verdicts) == 1
    on_gpu = judge(simulated((8,), 16), shape, quants)
    assert on_gpu[0].fit == "gpu" and on_gpu[0].words.startswith("fully on GPU")
    assert [v.fit for v in judge(simulated((), 0.08), shape, quants)] == ["cpu", "no"]


def test_download_resumes_after_a_dropped_connection_and_verifies(hub, tmp_path, home):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    models = tmp_path / "models"
    models.mkdir()
    quant = repo_quants(SMOL)[1]
    hub.drop_after, hub.break_after_drop = 40 << 20, True
    with pytest.raises(HomerackError, match="resumes where it stopped"):
        download(SMOL, quant, models)
    store = ModelStore(models, GGUFInspector())
    assert store.list() == []  # nothing half-written is a model
    hub.broken, before = False, hub.sent
    files = download(SMOL, quant, models)
    resumed = hub.sent - before
    assert resumed < quant.size * 0.7, f"sent {resumed} of {quant.size} again"
    assert [m.path.name for m in store.list()] == ["SmolLM2-135M-Instruct-Q4_1.gguf"]
    assert files[0].read_bytes() == (home / "data" / "models" / f"{STARTER}.gguf").read_bytes()
    assert not (models / ".downloads" / SMOL.replace("/", "--")).exists()


def test_corrupted_bytes_fail_the_checksum_and_nothing_is_listed(hub, tmp_path):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    hub.corrupt = True
    models = tmp_path / "models"
    models.mkdir()
    with pytest.raises(HomerackError, match="checksum"):
        download(SMOL, repo_quants(SMOL)[1], models)
    assert ModelStore(models, GGUFInspector()).list() == []
    assert not list(models.rglob("*.gguf"))


def test_the_token_stays_with_the_hub_when_a_download_is_redirected_to_its_cdn(hub, tmp_path):
    from support.hub_server import HubServer

    quant = repo_quants(SMOL)[1]
    download(SMOL, quant, tmp_path / "direct", token="hf_secret")
    assert hub.authorizations == ["Bearer hf_secret"]  # the Hub itself gets the token
    cdn = HubServer(hub.repos)
    try:
        hub.redirect_to = cdn.url
        files = download(SMOL, quant, tmp_path / "redirected", token="hf_secret")
        assert cdn.authorizations == [None]
        assert files[0].stat().st_size == quant.size
    finally:
        cdn.close()


def test_a_file_outside_lfs_is_checked_by_its_size_and_etag(hub, tmp_path, tiny_model):
    hub.repos["someone/Tiny-GGUF"] = Repo({"Tiny-Q8_0.gguf": tiny_model}, lfs=False)
    quant = repo_quants("someone/Tiny-GGUF")[0]
    assert quant.sha256 == ("",)  # no LFS checksum to check against
    files = download("someone/Tiny-GGUF", quant, tmp_path / "good")
    assert files[0].read_bytes() == tiny_model.read_bytes()
    hub.corrupt = True
    with pytest.raises(HomerackError, match="checksum"):
        download("someone/Tiny-GGUF", quant, tmp_path / "bad")
    assert not list((tmp_path / "bad").rglob("*.gguf"))


def test_missing_and_gated_repos_say_so(hub, tmp_path):
    with pytest.raises(HomerackError, match="not found on the Hub"):
        repo_quants("nobody/nothing-GGUF")
    quant = repo_quants("meta-llama/Gated-GGUF")[0]
    with pytest.raises(HomerackError, match="gated.*HF_TOKEN"):
        download("meta-llama/Gated-GGUF", quant, tmp_path)


def test_no_network_says_so(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(HomerackError, match="cannot reach the Hub"):
        repo_quants(SMOL)


def test_a_full_disk_is_a_plain_error(hub, tmp_path):
    """A file-size quota (RLIMIT_FSIZE) in a child process: writes past 10 MiB fail."""
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}]\n"
            "from pathlib import Path\n"
            "from engine.hub.repos import download, repo_quants\n"
            "from engine.errors import HomerackError\n"
            "try:\n"
            f"    download({SMOL!r}, repo_quants({SMOL!r})[1], Path({str(tmp_path)!r}))\n"
            "except HomerackError as exc:\n"
            "    print(exc.message)\n")

    def quota():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (10 << 20, 10 << 20))

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, preexec_fn=quota, env=dict(os.environ))
    assert "the disk is full" in done.stdout, done.stdout + done.stderr[-2000:]
    assert not list(tmp_path.glob("*.gguf"))


def test_pull_cli_shows_verdicts_and_adds_the_model(hub, tmp_path):
    env = dict(os.environ, HOMERACK_HOME=str(tmp_path / "home"))
    (tmp_path / "home" / "data" / "models").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "app", "pull", GEMMA_REPO], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "* Q4_K_M" in done.stdout and "ready: " in done.stdout
    listed = subprocess.run([sys.executable, "-m", "app", "models"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "gemma-3-270m-it-q4_k_m" in listed.stdout.lower()


# -- the engine's Hub routes and background downloads, over a real engine process ----

SMOL_360 = "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF"


@pytest.fixture(scope="module")
def smol_f16(starters_dir, tmp_path_factory):
    """A bigger model of the SmolLM2 vocabulary (the starter requantized to F16)."""
    from engine.llama.quantize import requantize

    return requantize(starters_dir / f"{STARTER}.gguf",
                      tmp_path_factory.mktemp("f16") / "smol-f16.gguf", 1)


@pytest.fixture
def engine_hub(hub, smol_f16, tmp_path, starters_dir):
    import httpx

    from app.engine_proc import EngineProcess

    hub.repos[SMOL_360] = Repo({"SmolLM2-360M-Instruct-F16.gguf": smol_f16}, downloads=50)
    hub.repos["someone/SmolLM2-tiny-GGUF"] = Repo(  # same family name, other vocabulary
        {"tiny-Q4_K_M.gguf": hub.repos[GEMMA_REPO].files["gemma-3-270m-it-Q4_K_M.gguf"]})
    root = tmp_path / "engine-home"
    (root / "data" / "models").mkdir(parents=True)
    for starter in starters_dir.glob("*.gguf"):  # linked, not copied
        (root / "data" / "models" / starter.name).symlink_to(starter)
    env = dict(os.environ, HOMERACK_HOME=str(root))

    def start():
        process = EngineProcess(["--no-prompt-cache"], env=env)
        address = process.wait_ready()
        http = httpx.Client(base_url=address.url, timeout=120,
                            headers={"Authorization": f"Bearer {address.token}"})
        return process, http

    started = []

    def make():
        started.append(start())
        return started[-1]

    yield make, root
    for process, http in started:
        http.close()
        process.stop()


def wait_for(http, download_id, statuses, timeout=120, at_least=0):
    """The download once its status is one of `statuses` with `at_least` bytes done."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = next(d for d in http.get("/v1/downloads").json()["data"] if d["id"] == download_id)
        if state["status"] in statuses and state["done_bytes"] >= at_least:
            return state
        time.sleep(0.1)
    raise AssertionError(f"download {download_id} stayed {state['status']}")


def start_slow_download(http, hub, at_least: int) -> dict:
    """A download over a slow link, once `at_least` bytes of it are on disk."""
    hub.chunk_delay = 0.003  # about 5 s for the file
    started = http.post("/v1/downloads", json={"repo": SMOL, "quant": "Q4_1"}).json()
    assert started["status"] in ("queued", "downloading")
    wait_for(http, started["id"], ("downloading",), at_least=at_least)
    return started


def test_engine_hub_routes_search_verdicts_card_and_drafts(engine_hub):
    make, _root = engine_hub
    _process, http = make()
    found = http.get("/v1/hub/search", params={"q": "smollm2"}).json()["data"]
    assert [r["id"] for r in found][:2] == [SMOL, SMOL_360]
    assert found[0]["size_min"] == 2 << 20 and found[0]["size_max"] > 90 << 20
    quants = http.get(f"/v1/hub/repos/{SMOL}/quants").json()
    assert [q["quant"] for q in quants["quants"]] == ["Q8_0", "Q4_1"]
    assert sum(q["recommended"] for q in quants["quants"]) == 1
    assert all(q["fit"] == "cpu" and "CPU only" in q["verdict"] for q in quants["quants"])
    assert "# A model" in http.get(f"/v1/hub/repos/{SMOL}/card").json()["text"]
    drafts = http.get(f"/v1/hub/repos/{SMOL_360}/drafts").json()["data"]
    assert drafts == [{"repo": SMOL, "quant": "Q4_1", "size_bytes": repo_quants(SMOL)[1].size}]
    missing = http.get("/v1/hub/repos/nobody/nothing/quants")
    assert missing.status_code == 404 and "not found" in missing.json()["error"]["message"]
    wrong = http.post("/v1/downloads", json={"repo": SMOL, "quant": "Q2_K"})
    assert wrong.status_code == 400 and "Q4_1" in wrong.json()["error"]["message"]


def test_background_download_pauses_resumes_and_becomes_a_model(engine_hub, hub):
    make, _root = engine_hub
    _process, http = make()
    started = start_slow_download(http, hub, 4 << 20)
    paused = http.post(f"/v1/downloads/{started['id']}/pause").json()
    assert paused["status"] == "paused" and 0 < paused["done_bytes"] < paused["size_bytes"]
    assert "SmolLM2-135M-Instruct-Q4_1" not in [m["id"] for m in
                                                http.get("/v1/models").json()["data"]]
    hub.chunk_delay, before = 0.0, hub.sent
    http.post(f"/v1/downloads/{started['id']}/resume")
    done = wait_for(http, started["id"], ("done", "failed"))
    assert done["status"] == "done", done
    assert hub.sent - before < paused["size_bytes"] - paused["done_bytes"] + (1 << 20)
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    defaults = models["SmolLM2-135M-Instruct-Q4_1"]["sampling_defaults"]
    assert (defaults["temperature"], defaults["top_p"]) == (0.25, 0.85)  # the repo's own
    assert defaults["source"] == "the model's generation_config.json"


def test_cancel_removes_the_partial_file(engine_hub, hub):
    make, root = engine_hub
    _process, http = make()
    started = start_slow_download(http, hub, 4 << 20)
    cancelled = http.post(f"/v1/downloads/{started['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert not list((root / "data" / "models").rglob("SmolLM2-135M-Instruct-Q4_1*"))


def test_a_download_survives_an_engine_crash(engine_hub, hub):
    make, root = engine_hub
    process, http = make()
    started = start_slow_download(http, hub, 8 << 20)
    process.process.kill()  # as the out-of-memory killer would
    process.process.wait()
    partial = sum(p.stat().st_size for p in (root / "data" / "models").rglob("*.part"))
    assert partial > 0
    hub.chunk_delay, before = 0.0, hub.sent
    _process, http = make()  # a new engine carries on from the journal and the partial file
    done = wait_for(http, started["id"], ("done", "failed"))
    assert done["status"] == "done", done
    assert hub.sent - before <= done["size_bytes"] - partial + (1 << 20)


def test_a_split_quant_downloads_every_part_keeping_a_part_done_before(hub, tmp_path):
    from engine.hub.downloads import Downloads

    models = tmp_path / "models"
    quant = repo_quants(SMOL)[0]  # Q8_0 in two parts
    first = download(SMOL, replace(quant, files=quant.files[:1], sha256=quant.sha256[:1],
                                   size=1 << 20), models)
    staging = models / ".downloads" / SMOL.replace("/", "--")
    staging.mkdir(parents=True)
    os.replace(first[0], staging / (first[0].name + ".part"))  # as an earlier attempt left it
    downloads, before = Downloads(models, tmp_path / "downloads.json"), hub.sent
    state = downloads.wait(downloads.start(SMOL, quant).id, timeout=60)
    assert state.status == "done" and state.done_bytes == quant.size == 2 << 20
    config = len(hub.repos[SMOL].files["generation_config.json"].read_bytes())
    assert hub.sent - before == (1 << 20) + config  # only the second part travelled
    assert sorted(p.name for p in models.glob("*.gguf")) == list(quant.files)


def test_search_marks_embedding_models(starters_dir, tmp_path, monkeypatch):
    from support.hub_server import HubServer, Repo

    embedder = "sentence-transformers/all-MiniLM-L6-v2-GGUF"
    server = HubServer({
        embedder: Repo({"all-MiniLM-L6-v2-F16.gguf": starters_dir / "all-minilm-l6-v2-f16.gguf"},
                       pipeline_tag="sentence-similarity", downloads=5),
        SMOL: Repo({"SmolLM2-135M-Instruct-Q4_1.gguf":
                    starters_dir / "smollm2-135m-instruct-q4_1.gguf"}, downloads=9)})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    try:
        found = search("", sizes=False)
    finally:
        server.close()
    assert [(r.id, r.embedding) for r in found] == [(SMOL, False), (embedder, True)]


def test_adapter_repositories_are_found_judged_against_local_models_and_downloaded(
        hub, tmp_path, starters_dir):
    from fixtures.adapter_files import LoraSpec, write_lora
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore
    from engine.hub.repos import repo_verdicts

    repo = "someone/SmolLM2-Persona-LoRA-GGUF"
    adapter = write_lora(starters_dir / f"{STARTER}.gguf", tmp_path / "persona.gguf",
                         LoraSpec(layers=(0, 1)), base_name="SmolLM2 135M Instruct")
    hub.repos[repo] = Repo({"SmolLM2-persona-F32.gguf": adapter},
                           tags=("lora", f"base_model:adapter:{SMOL}"))
    found = {r.id: r for r in search("")}
    assert found[repo].adapter and not found[SMOL].adapter
    models = tmp_path / "models"
    models.mkdir()
    (models / f"{STARTER}.gguf").symlink_to(starters_dir / f"{STARTER}.gguf")
    store = ModelStore(models, GGUFInspector())
    store.kind_of(store.resolve(STARTER))  # read, as the engine does at start
    shape, verdicts, _ = repo_verdicts(repo, simulated((), 8), None, fitting=store.fitting)
    assert shape is None and [v.fit for v in verdicts] == ["adapter"]
    assert verdicts[0].words == f"LoRA adapter (rank 4) for {STARTER}" and verdicts[0].recommended
    other = ModelStore(tmp_path / "empty", GGUFInspector())
    _, lonely, _ = repo_verdicts(repo, simulated((), 8), None, fitting=other.fitting)
    assert "for SmolLM2 135M Instruct: none of your models fits it yet" in lonely[0].words
    files = download(repo, verdicts[0].quant, models)
    downloaded = store.resolve(files[0].stem)
    assert store.kind_of(downloaded) == "adapter"
    assert [m.id for m in store.bases_for(downloaded)] == [STARTER]


def test_a_probe_reads_no_further_than_a_header_can_be(hub, tmp_path, monkeypatch):
    """A file that is no GGUF costs one read of 8 MiB; a GGUF whose header never parses
    stops at MAX_HEADER, not at the end of the file; an oversized generation_config.json
    is not fetched at all; a card is read up to MAX_CARD."""
    import engine.hub.repos as repos
    from engine.hub.generation_config import keep_generation_config
    from engine.hub.repos import HubError, model_card

    monkeypatch.setattr(repos, "MAX_HEADER", 16 << 20)
    junk, broken = tmp_path / "junk-Q4_0.gguf", tmp_path / "broken-Q8_0.gguf"
    junk.write_bytes(os.urandom(40 << 20))
    with broken.open("wb") as handle:  # a header that claims more keys than it holds
        handle.write(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little")
                     + (10**7).to_bytes(8, "little"))  # 130 MB of keys at the least
        handle.truncate(60 << 20)
    config = tmp_path / "generation_config.json"
    config.write_text('{"temperature": 0.5, "pad": "' + "x" * (1 << 20) + '"}')
    hub.repos["someone/Odd-GGUF"] = Repo({junk.name: junk, broken.name: broken,
                                          "generation_config.json": config},
                                         card="# Odd\n" + "word " * (1 << 20))
    quants = {q.quant: q for q in repo_quants("someone/Odd-GGUF")}
    before = hub.sent
    with pytest.raises(HubError, match="not a GGUF"):
        header_shape("someone/Odd-GGUF", quants["Q4_0"])
    assert hub.sent - before <= 8 << 20
    before = hub.sent
    with pytest.raises(HubError, match="cannot read the GGUF header"):
        header_shape("someone/Odd-GGUF", quants["Q8_0"])
    assert hub.sent - before <= (8 + 16) << 20
    before = hub.sent
    assert keep_generation_config("someone/Odd-GGUF", tmp_path / "odd.gguf") is None
    assert hub.sent - before < 64 << 10 and not (tmp_path / "odd.generation_config.json").exists()
    card = model_card("someone/Odd-GGUF")
    assert card.startswith("# Odd") and len(card) < repos.MAX_CARD + 100
    assert card.endswith("(the rest of the card is not shown)")


def test_a_vision_repository_downloads_its_projector_which_pairs_with_the_model(
        hub, tmp_path, vision_dir):
    """unsloth names its projector mmproj-F16.gguf, which names no model: it is kept as
    mmproj-MODEL.gguf beside the model so that the flat folder pairs them; the BF16 one
    is passed over for F16, as llama-server's -hf does."""
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    projector = vision_dir / "mmproj-smolvlm-256m-f16.gguf"
    hub.repos["unsloth/SmolVLM-GGUF"] = Repo({
        "SmolVLM-256M-Instruct-Q8_0.gguf": vision_dir / "smolvlm-256m.gguf",
        "mmproj-BF16.gguf": projector, "mmproj-F16.gguf": projector})
    quants = repo_quants("unsloth/SmolVLM-GGUF")
    assert [q.projector for q in quants] == ["mmproj-F16.gguf"]  # never a quant itself
    models = tmp_path / "models"
    files = download("unsloth/SmolVLM-GGUF", quants[0], models)
    assert [f.name for f in files] == ["SmolVLM-256M-Instruct-Q8_0.gguf",
                                       "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf"]
    listed = ModelStore(models, GGUFInspector()).list()
    assert [(m.id, m.projector.name) for m in listed] == [
        ("SmolVLM-256M-Instruct-Q8_0", "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf")]


def test_a_crafted_header_on_the_hub_is_refused_before_any_reader_sees_it(hub, tmp_path):
    """A public repository's file whose header claims 2^62 items (the wizard probes up to
    20 searched repositories): refused in words after one read, never parsed."""
    import time

    from engine.hub.repos import HubError
    from support.crafted import crafted_gguf

    crafted = tmp_path / "crafted-Q4_0.gguf"
    with crafted.open("wb") as handle:
        handle.write(crafted_gguf())
        handle.truncate(1 << 30)  # sparse: a model's size, nothing stored
    hub.repos["someone/Crafted-GGUF"] = Repo({crafted.name: crafted})
    quant, = repo_quants("someone/Crafted-GGUF")
    before, started = hub.sent, time.monotonic()
    with pytest.raises(HubError, match="4,611,686,018,427,387,904 array elements"):
        header_shape("someone/Crafted-GGUF", quant)
    assert time.monotonic() - started < 10 and hub.sent - before <= 8 << 20
