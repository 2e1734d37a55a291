"""A model that sees, through a real `homerack serve` and the official clients: an image
reaches it through OpenAI's chat, Anthropic's Messages, the Responses API and Ollama's
API; a repeated image is not encoded again; bad images get a 400 and the engine lives;
a model without a projector, or with vision turned off, says why.

The model is SmolVLM-256M's shape with random projector weights (fixtures/projectors.py):
its answers mean nothing, so the tests read what the engine reports (image chunks,
prompt tokens, encode time), never the text."""

from __future__ import annotations

import base64
import io

import anthropic
import httpx
import ollama
import openai
import pytest
from PIL import Image

from support.engines import api_client, models_once_read, start_engine
from support.models import STARTER

pytestmark = pytest.mark.slow

MODEL = "smolvlm-256m"


def png(width: int = 640, height: int = 480, color=(200, 40, 40)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory, vision_dir, starters_dir):
    home = tmp_path_factory.mktemp("vision-home")
    (home / "seer" / "data").mkdir(parents=True)
    models = home / "seer" / "data" / "models"
    models.mkdir()
    for path in vision_dir.iterdir():
        (models / path.name).symlink_to(path)
    (models / f"{STARTER}.gguf").symlink_to(starters_dir / f"{STARTER}.gguf")
    process, address, _ = start_engine(home, "seer", ["--model", MODEL, "--parallel", "2"])
    yield address
    process.stop()


@pytest.fixture(scope="module")
def http(engine):
    with api_client(engine) as client:
        yield client


def chat(http, content, model=MODEL, **extra) -> httpx.Response:
    return http.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": content}], **extra})


def test_the_model_is_listed_as_seeing_and_its_projector_is_no_model(http):
    models = models_once_read(http)
    assert not any("mmproj" in name for name in models)
    seer = models[MODEL]
    assert "vision" in seer["capabilities"]
    assert seer["vision"]["type"] == "idefics3"
    assert seer["projector"].endswith("mmproj-smolvlm-256m-f16.gguf")
    assert "vision" not in (models[STARTER]["capabilities"] or [])


def test_an_image_reaches_the_model_through_openai_and_is_encoded_once(engine):
    client = openai.OpenAI(base_url=f"{engine.url}/v1", api_key=engine.token)
    image = {"type": "image_url", "image_url": {"url": data_url(png(color=(1, 2, 3)))}}

    def ask(question):
        return client.chat.completions.create(model=MODEL, max_tokens=3, temperature=0,
                                              messages=[{"role": "user", "content": [
                                                  image, {"type": "text", "text": question}]}])
    first = ask("What is in this picture?")
    images = first.usage.model_extra["images"]
    assert images["chunks"] == 2  # idefics3 at this size: one tile and the overview
    assert images["encode_s"] > 0
    assert first.usage.prompt_tokens > 2 * 64  # each chunk is 64 image tokens
    again = ask("And what colour is it?")  # the same picture, another question
    assert again.usage.model_extra["images"]["encode_s"] == 0  # kept: no second encode
    assert again.usage.prompt_tokens_details.cached_tokens > 2 * 64  # the prompt cache too


def test_several_images_in_one_message_each_count(http):
    reply = chat(http, [{"type": "text", "text": "Compare"},
                        {"type": "image_url", "image_url": {"url": data_url(png(color=(9, 9, 9)))}},
                        {"type": "text", "text": "with"},
                        {"type": "image_url", "image_url": data_url(png(320, 200))}])
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["images"]["chunks"] == 4


def test_anthropic_image_blocks(engine):
    client = anthropic.Anthropic(base_url=engine.url, api_key=engine.token)
    out = io.BytesIO()
    Image.new("RGB", (300, 500), (0, 120, 0)).save(out, "JPEG")
    reply = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                     "data": base64.b64encode(out.getvalue()).decode()}},
        {"type": "text", "text": "Describe it."}]}])
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 2 * 64


def test_anthropic_counts_a_pictures_tokens(engine):
    client = anthropic.Anthropic(base_url=engine.url, api_key=engine.token)
    picture = base64.b64encode(png(300, 200)).decode()
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": picture}},
        {"type": "text", "text": "Describe it."}]}])
    usage = client.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": picture}},
        {"type": "text", "text": "Describe it."}]}]).usage
    used = usage.input_tokens + usage.cache_read_input_tokens  # the whole prompt
    assert 2 * 64 <= counted.input_tokens <= used  # the tiles' markers aside


def test_ollama_shows_vision(engine, http):
    models_once_read(http)
    client = ollama.Client(host=engine.url, headers={"Authorization": f"Bearer {engine.token}"})
    assert "vision" in client.show(MODEL).capabilities


def test_responses_input_image(http):
    reply = http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 3, "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": data_url(png(200, 200, (5, 5, 250)))}]}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["input_tokens"] > 2 * 64


def test_ollama_images(engine):
    client = ollama.Client(host=engine.url, headers={"Authorization": f"Bearer {engine.token}"})
    reply = client.chat(model=MODEL, options={"num_predict": 3, "temperature": 0}, messages=[
        {"role": "user", "content": "What is this?", "images": [png(100, 80)]}])
    assert reply.prompt_eval_count > 2 * 64
    generated = client.generate(model=MODEL, prompt="Describe", images=[png(90, 90)],
                                options={"num_predict": 2})
    assert generated.prompt_eval_count > 2 * 64


BAD = [
    ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB", "cannot be decoded"),
    (data_url(b"plain text, not a picture"), "not an image"),
    ("data:image/png;base64,%%%", "base64"),
    ("https://example.com/cat.png", "--allow-image-urls"),  # off by default: never fetched
    (data_url(png()[:100]), "cannot be decoded"),
]


@pytest.mark.parametrize("url, says", BAD)
def test_bad_images_get_a_400_naming_the_part_and_the_engine_lives(http, url, says):
    reply = chat(http, [{"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": url}}])
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert says in error["message"]
    assert error["param"] == "messages[0].content[1].image_url"
    assert chat(http, "Still there?").status_code == 200


def test_a_model_without_a_projector_says_so(http):
    reply = chat(http, [{"type": "image_url", "image_url": {"url": data_url(png(20, 20))}},
                        {"type": "text", "text": "?"}], model=STARTER)
    assert reply.status_code == 400
    assert "has no vision projector" in reply.json()["error"]["message"]


def test_vision_turned_off_gives_its_memory_back(http):
    planned = http.post("/v1/plan", json={"model": MODEL}).json()
    assert sum(d["projector"] for d in planned["devices"]) > 40 << 20
    assert planned["forecast"]["image_encode_s"] > 0  # the picture's time, forecast
    off = http.post("/v1/plan", json={"model": MODEL, "vision": False}).json()
    assert sum(d["projector"] for d in off["devices"]) == 0
    assert http.put("/v1/models/preset", json={"model": MODEL, "vision": False}).status_code == 200
    try:
        reply = chat(http, [{"type": "image_url", "image_url": {"url": data_url(png(20, 20))}},
                            {"type": "text", "text": "?"}])
        assert reply.status_code == 400
        assert "vision is turned off" in reply.json()["error"]["message"]
    finally:
        http.put("/v1/models/preset", json={"model": MODEL, "vision": None})


def test_pictures_and_text_batch_together(http):
    """One request with a picture and three without, at once: each answered, each with
    its own usage (the picture goes in a step of its own; the others keep decoding)."""
    from concurrent.futures import ThreadPoolExecutor

    image = [{"type": "image_url", "image_url": {"url": data_url(png(400, 300, (0, 0, 0)))}},
             {"type": "text", "text": "Describe it."}]
    asks = [image] + [f"Count to {n}." for n in (3, 4, 5)]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda content: chat(http, content, max_tokens=12), asks))
    assert [r.status_code for r in replies] == [200] * 4
    usages = [r.json()["usage"] for r in replies]
    assert usages[0]["images"]["chunks"] == 2
    assert all("images" not in u for u in usages[1:])


def test_text_that_looks_like_an_image_marker_is_text(http):
    reply = chat(http, [{"type": "text", "text": "<__media__> <image> <__image__>"},
                        {"type": "image_url", "image_url": {"url": data_url(png(50, 50))}}])
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["images"]["chunks"] == 2


def test_a_conversation_of_twenty_pictures_goes_on_and_a_chat_is_fitted_to_its_context(http):
    """A conversation resends all its pictures every turn: a turn whose history holds
    twenty is answered (the engine encoded them before; the caps bound new ones only). A
    chat that asks to be fitted (`fit_pictures`: the desktop's and the web chat's) leaves
    its oldest pictures out when the answer would have no room, and says so."""
    # four pictures, encoded in a first turn; then a history of twenty (each of them five
    # times, over the cap of 16 if the pictures encoded before were counted again)
    pictures = [{"type": "image_url", "image_url": {"url": data_url(png(40, 40, (n * 60, 9, 9)))}}
                for n in range(4)]
    first = chat(http, [{"type": "text", "text": "Four photos:"}, *pictures], max_tokens=1)
    assert first.status_code == 200, first.text
    messages = []
    for n in range(20):
        messages += [{"role": "user", "content": [{"type": "text", "text": f"Picture {n}:"},
                                                  pictures[n % 4]]},
                     {"role": "assistant", "content": "Seen."}]
    messages[-1] = {"role": "user", "content": "Which was the reddest?"}
    reply = chat(http, None, max_tokens=1, messages=messages)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["images"]["chunks"] == 40  # two a picture, all of them
    assert reply.json()["usage"]["images"]["encode_s"] == 0  # every one kept
    n_ctx = reply.json()["homerack"]["n_ctx"]
    room = n_ctx - 1200  # the answer's room leaves the conversation ~1,200 tokens
    fitted = chat(http, None, max_tokens=room, fit_pictures=True, messages=messages,
                  grammar='root ::= "ok"')
    assert fitted.status_code == 200, fitted.text
    body = fitted.json()
    left_out = [note for note in body["homerack"]["notes"] if note.startswith("left out:")]
    assert left_out and "earlier pictures" in left_out[0], body["homerack"]["notes"]
    assert body["choices"][0]["message"]["content"] == "ok"
    assert 0 < body["usage"]["images"]["chunks"] < 40  # the latest pictures kept
    assert body["usage"]["prompt_tokens"] + room <= n_ctx
