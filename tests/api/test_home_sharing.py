"""Sharing with the home through a real `homerack serve --share-home`: the sharing
listener on 127.0.0.2 stands for the LAN, the owner's on 127.0.0.1. Pairing by code, a
device's key with the official clients, what a key cannot reach, the owner's token kept
to loopback, rebound hosts and cross-site posts refused, revoking, limits, a reply that
outlives its page, each device's own conversations, fair turns between devices, and
20 wrong codes withdrawing the code waiting."""

from __future__ import annotations

import threading
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from support.home import LAN, device, pair, sharing_engine
from support.models import STARTER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def house(tmp_path_factory, tiny_model, starters_dir):
    with sharing_engine(tmp_path_factory.mktemp("house"), tiny_model, starters_dir, "house",
                        ["--model", "tiny", "--ctx", "8192", "--parallel", "4"]) as house:
        yield house


def test_an_unpaired_client_gets_the_pairing_page_and_nothing_else(owner, lan, house):
    page = httpx.get(f"{lan}/")
    assert page.status_code == 200 and "Pairing code" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    for path in ("/home/api/me", "/home/api/conversations", "/v1/models", "/v1/sources"):
        refused = httpx.get(f"{lan}{path}")
        assert refused.status_code == 401, path
        assert "content-security-policy" in refused.headers
    assert httpx.post(f"{lan}/v1/chat/completions", json={}).status_code == 401
    # the owner's token is no key here
    token = {"Authorization": f"Bearer {house[2].token}"}
    assert httpx.get(f"{lan}/v1/models", headers=token).status_code == 401
    assert httpx.get(f"{lan}/health").json() == {"status": "ok"}


def test_a_devices_key_works_with_the_official_clients(owner, lan):
    key = pair(owner, lan, "laptop")
    chat = openai.OpenAI(base_url=f"{lan}/v1", api_key=key, max_retries=0)
    assert {m.id for m in chat.models.list()} >= {"tiny", STARTER}
    stream = chat.chat.completions.create(model="tiny", max_tokens=8, stream=True,
                                          messages=[{"role": "user", "content": "hi"}])
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "length"
    claude = anthropic.Anthropic(base_url=lan, api_key=key, max_retries=0)
    answer = claude.messages.create(model="tiny", max_tokens=8,
                                    messages=[{"role": "user", "content": "hi"}])
    assert answer.usage.output_tokens == 8
    llama = ollama.Client(host=lan, headers={"Authorization": f"Bearer {key}"})
    said = llama.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                      options={"num_predict": 8})
    assert said.eval_count == 8
    today = {d["name"]: d for d in owner.get("/v1/home").json()["devices"]}["laptop"]
    assert today["requests_today"] == 3 and today["tokens_today"] > 24


def test_a_key_reaches_generation_only(owner, lan, house):
    key = pair(owner, lan, "tablet")
    with device(lan, key) as http:
        for method, path in (("GET", "/v1/sources"), ("POST", "/v1/models/load"),
                             ("POST", "/v1/models/unload"), ("GET", "/v1/models/preset"),
                             ("PUT", "/v1/models/preset"), ("GET", "/v1/mcp/servers"),
                             ("GET", "/v1/collections"), ("POST", "/v1/collections"),
                             ("GET", "/v1/home"), ("GET", "/metrics"), ("POST", "/v1/plan"),
                             ("POST", "/api/pull"), ("DELETE", "/api/delete")):
            refused = http.request(method, path, json={})
            assert refused.status_code == 403, (method, path, refused.text)
        grounded = http.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 2, "collections": ["notes"],
            "messages": [{"role": "user", "content": "hi"}]})
        assert grounded.status_code == 403 and grounded.json()["error"]["param"] == "collections"
    # the device's key is nothing on the owner's listener
    assert httpx.get(f"{house[2].url}/v1/models",
                     headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_a_rebound_host_and_a_cross_site_post_are_refused(owner, lan):
    key = pair(owner, lan, "phone")
    assert httpx.get(f"{lan}/", headers={"Host": "attacker.example"}).status_code == 421
    with httpx.Client(base_url=lan) as page:
        # as the page's own cookie is kept: its host's, renewed by each visit (a second
        # one of another domain would be refused: two key cookies are none)
        page.cookies.set("homerack_key", key, domain=lan.split("//")[1].split(":")[0])
        assert page.get("/home/api/me").json()["device"] == "phone"
        form = page.post("/home/api/conversations", content=b"title=x",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 403
        upload = page.post("/v1/audio/transcriptions", files={"file": ("x.wav", b"RIFF")})
        assert upload.status_code == 403  # a form's multipart, without the page's mark
        elsewhere = page.post("/home/api/conversations", json={"title": "x"},
                              headers={"Origin": "http://attacker.example"})
        assert elsewhere.status_code == 403
        same = page.post("/home/api/conversations", json={"title": "x"},
                         headers={"Origin": lan})
        assert same.status_code == 200


def test_each_device_sees_only_its_own_conversations(owner, lan):
    ana, ben = pair(owner, lan, "ana"), pair(owner, lan, "ben")
    with device(lan, ana) as a, device(lan, ben) as b:
        made = a.post("/home/api/conversations", json={"title": "Secret plans"}).json()
        assert [c["title"] for c in a.get("/home/api/conversations").json()["data"]] == \
            ["Secret plans"]
        assert b.get("/home/api/conversations").json()["data"] == []
        assert b.get(f"/home/api/conversations/{made['id']}").status_code == 404
        assert b.delete(f"/home/api/conversations/{made['id']}").status_code == 404
        assert a.get(f"/home/api/conversations/{made['id']}").status_code == 200


def test_an_answer_outlives_the_page_that_asked(owner, lan):
    key = pair(owner, lan, "sleepy phone")
    with device(lan, key) as http:
        conv = http.post("/home/api/conversations", json={}).json()
        with http.stream("POST", f"/home/api/conversations/{conv['id']}/messages",
                         json={"content": "tell me a story", "model": "tiny"}) as stream:
            next(stream.iter_lines())  # the first event, then the phone sleeps
        deadline = time.monotonic() + 60
        while (got := http.get(f"/home/api/conversations/{conv['id']}").json())["replying"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        user, answer = got["messages"]
        assert user["content"] == "tell me a story" and got["title"] == "tell me a story"
        assert answer["role"] == "assistant" and answer["content"]
        assert answer["finish"] in ("stop", "length")


def test_a_bad_picture_is_a_400_and_keeps_nothing(owner, lan):
    key = pair(owner, lan, "camera")
    with device(lan, key) as http:
        conv = http.post("/home/api/conversations", json={}).json()
        bad = http.post(f"/home/api/conversations/{conv['id']}/messages", json={
            "content": "what is this?", "model": "tiny",
            "picture": "data:image/png;base64,bm90IGEgcGljdHVyZQ=="})
        assert bad.status_code == 400, bad.text
        assert http.get(f"/home/api/conversations/{conv['id']}").json()["messages"] == []


def test_a_removed_device_is_refused_and_its_stream_ends(owner, lan):
    key = pair(owner, lan, "old phone")
    chat = openai.OpenAI(base_url=f"{lan}/v1", api_key=key, max_retries=0)
    stream = chat.chat.completions.create(model=STARTER, max_tokens=2000, stream=True,
                                          extra_body={"ignore_eos": True},
                                          messages=[{"role": "user", "content": "count"}])
    chunks = iter(stream)
    next(chunks)
    assert owner.delete("/v1/home/devices/old phone").json()["removed"]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "cancelled" and len(reasons) < 2000
    with pytest.raises(openai.AuthenticationError):
        chat.models.list()


def test_a_device_past_its_limit_gets_429_with_retry_after(owner, lan):
    key = pair(owner, lan, "agent box")
    assert owner.patch("/v1/home/devices/agent box", json={"parallel": 1}).status_code == 200
    with device(lan, key) as http:
        body = {"model": STARTER, "max_tokens": 200, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": "go"}]}
        with http.stream("POST", "/v1/chat/completions", json=body) as first:
            next(first.iter_lines())
            second = http.post("/v1/chat/completions", json={**body, "stream": False})
            assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
            assert second.json()["error"]["type"] == "rate_limit_exceeded"
            claude = http.post("/v1/messages", json={
                "model": STARTER, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]})
            assert claude.status_code == 429 and claude.json()["type"] == "error"


def test_fair_turns_a_short_request_starts_before_a_busy_devices_second_ends(owner, lan):
    a, b = pair(owner, lan, "busy agent"), pair(owner, lan, "kid's tablet")
    finished: list[float] = []
    b_first: list[float] = []
    waiting_seen: list[dict] = []

    def long_request():
        with device(lan, a) as http:
            answer = http.post("/v1/chat/completions", json={
                "model": STARTER, "max_tokens": 100, "ignore_eos": True,
                "messages": [{"role": "user", "content": "write"}]})
        assert answer.status_code == 200, answer.text
        finished.append(time.monotonic())

    threads = [threading.Thread(target=long_request) for _ in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60  # until A holds its share (its model may be loading)
    while time.monotonic() < deadline and len(finished) < 2 and not any(
            w["holds"] == 3 for w in waiting_seen):
        waiting_seen = owner.get("/health").json()["home"]["waiting"]
    with device(lan, b) as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": STARTER, "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}) as stream:
            for line in stream.iter_lines():
                if '"content"' in line and not b_first:
                    b_first.append(time.monotonic())
    for thread in threads:
        thread.join()
    assert b_first and len(finished) == 8
    assert b_first[0] < sorted(finished)[1]
    assert [w["client"] for w in waiting_seen] == ["busy agent"]
    assert waiting_seen[0]["holds"] == 3 and "one stays free" in waiting_seen[0]["why"]
    reported = {d["name"]: d for d in owner.get("/health").json()["home"]["devices"]}
    assert isinstance(reported["kid's tablet"]["last_wait_s"], float)
    assert reported["kid's tablet"]["last_wait_s"] < 5


def test_the_engine_is_announced_as_homerack_local(lan):
    from zeroconf import IPVersion, ServiceBrowser, Zeroconf

    port = int(lan.rsplit(":", 1)[1])
    zc = Zeroconf(ip_version=IPVersion.V4Only)
    names: list[str] = []
    try:
        browser = ServiceBrowser(zc, "_http._tcp.local.",
                                 handlers=[lambda name, **_: names.append(name)])
        deadline, found = time.monotonic() + 10, None
        while found is None and time.monotonic() < deadline:
            for name in [n for n in names if n.startswith("Homerack")]:
                info = zc.get_service_info("_http._tcp.local.", name, timeout=1000)
                if info and info.port == port:
                    found = info
            time.sleep(0.1)
        browser.cancel()
    finally:
        zc.close()
    assert found is not None and found.server == "homerack.local."
    assert found.parsed_addresses() == [LAN]


def test_turning_sharing_off_closes_the_listener_at_once(owner, lan):
    host, port = lan.removeprefix("http://").split(":")
    off = owner.put("/v1/home/share", json={"enabled": False}).json()
    assert off["enabled"] is False
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{lan}/", timeout=5)
    on = owner.put("/v1/home/share", json={"enabled": True, "host": host, "port": int(port)})
    assert on.json()["url"] == lan and httpx.get(f"{lan}/").status_code == 200


def test_twenty_wrong_codes_withdraw_the_code_and_tell_the_owner(owner, lan):
    code = owner.post("/v1/home/devices", json={"name": "guessed"}).json()["code"]
    wrong = f"{(int(code) + 1) % 10**6:06d}"
    for _ in range(20):
        assert httpx.post(f"{lan}/pair", json={"code": wrong}).status_code == 403
    assert httpx.post(f"{lan}/pair", json={"code": code}).status_code == 403
    told = owner.get("/v1/home").json()["codes_withdrawn"]
    assert told["codes"] == ["guessed"] and "20 wrong pairing codes" in told["why"]
    # nothing is locked: a new code pairs at once
    again = owner.post("/v1/home/devices", json={"name": "guessed"}).json()["code"]
    assert httpx.post(f"{lan}/pair", json={"code": again}).status_code == 200
