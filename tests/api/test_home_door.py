"""The home's door, hardened (issue 68), through a real `homerack serve --share-home`: the
sharing listener on 127.0.0.2 stands for the LAN. A spoken sentence that kills eSpeak NG
leaves the engine answering; a device generates but does not manage models; its audio and
embeddings are metered and cannot starve the owner's chat; half-sent connections cannot
take the engine's files; nothing of the owner's (prompts, cached answers, model names)
reaches a device; sharing off ends the devices' streams; a refused web-chat ask keeps
nothing."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import httpx
import pytest

from app.client import EngineClient
from support.home import LAN, device, pair, sharing_engine
from support.models import STARTER

pytestmark = pytest.mark.slow
OWNER_CHAT = {"model": STARTER, "max_tokens": 1, "temperature": 0,
              "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def house(tmp_path_factory, tiny_model, starters_dir):
    with sharing_engine(tmp_path_factory.mktemp("door"), tiny_model, starters_dir, "door", [
            "--model", STARTER, "--ctx", "2048", "--parallel", "4",
            "--response-cache-mib", "64"]) as house:
        assert house[0].patch("/v1/home", json={"shared": [STARTER]}).status_code == 200
        yield house


def answers(owner) -> None:
    """The owner's API is up and its chat answers."""
    reply = owner.post("/v1/chat/completions", json=OWNER_CHAT,
                       headers={"Cache-Control": "no-store"})  # computed, not replayed
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("times", [200, 1024])
def test_letter_dot_runs_that_killed_espeak_leave_the_engine_answering(house, owner, lan,
                                                                       times):
    """400 and 2,048 characters of "a." through a device's key, and through the desktop's
    own client (what Talk and Read aloud call)."""
    key = pair(owner, lan, f"speaker {times}")
    with device(lan, key) as phone:
        spoken = phone.post("/v1/audio/speech", json={"input": "a." * times, "voice": "en-us",
                                                        "response_format": "wav"})
        assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF"
    desktop = EngineClient(house[2])  # eSpeak's voice: the one these texts killed
    assert desktop.speech("a." * times, voice="en-us")[:4] == b"RIFF"  # wav: Talk's format
    answers(owner)


def test_a_dead_synthesizer_fails_its_request_alone():
    from engine.errors import SpeechFailed
    from engine.voice.speaker import Speaker

    speaker = Speaker()
    try:
        with pytest.raises(SpeechFailed, match="crashed"):  # the raw text, past the filter
            speaker._say("a." * 200, "en-us", 1.0)
        assert b"".join(speaker.sentences("Still here.", "alloy"))  # a new child speaks
    finally:
        speaker.close()


def test_a_synthesizer_that_cannot_start_never_fails_the_model_list(tmp_path, monkeypatch):
    """The packaged app once shipped without eSpeak NG's library: its child exited at
    once, /v1/models failed with it, and the window said the engine could not start.
    The list names the speech model as not loaded, and why."""
    import sys

    from engine.voice import speaker
    from engine.voice.voice import Voice

    monkeypatch.setattr(speaker, "module_command",
                        lambda *_a: [sys.executable, "-c", "raise SystemExit(1)"])
    voice = Voice(tmp_path, 1)
    try:
        speech = next(m for m in voice.models() if m["id"] == "espeak-ng")
    finally:
        voice.speaker.close()
    assert speech["loaded"] is False and speech["voices"] == []
    assert "eSpeak NG" in speech["error"] and "exit status 1" in speech["error"]


def test_a_device_generates_but_does_not_manage_models(owner, lan):
    key = pair(owner, lan, "manager")
    answers(owner)  # the owner's model loaded
    before = owner.get("/health").json()
    assert before["n_ctx"] == 2048
    with device(lan, key) as phone:
        unload = phone.post("/api/generate", json={"model": STARTER, "prompt": "",
                                                   "keep_alive": 0})
        assert unload.status_code == 403 and "prompt" in unload.json()["error"]
        pin = phone.post("/api/generate", json={"model": "tiny", "keep_alive": -1})
        assert pin.status_code == 403
        small = phone.post("/api/generate", json={
            "model": STARTER, "prompt": "Hi", "stream": False, "keep_alive": "1s",
            "options": {"num_ctx": 256, "num_predict": 2}})
        assert small.status_code == 200, small.text
    after = owner.get("/health").json()
    assert after["n_ctx"] == 2048 and after["model"] == STARTER
    assert "tiny" not in {m["id"] for m in after["models"]}
    answers(owner)


def test_a_devices_audio_and_embeddings_are_metered_and_the_owner_answers(owner, lan):
    key = pair(owner, lan, "busy phone")
    assert owner.patch("/v1/home/devices/busy phone", json={"parallel": 1}).status_code == 200
    with device(lan, key) as phone:
        said = phone.post("/v1/audio/speech", json={
            "input": "The quick brown fox jumps over the lazy dog. " * 12,
            "response_format": "wav"}).content
    statuses: list[int] = []

    def transcribe():
        with device(lan, key) as phone:
            statuses.append(phone.post("/v1/audio/transcriptions", files={
                "file": ("speech.wav", said)}, data={"model": "whisper-1"}).status_code)

    threads = [threading.Thread(target=transcribe) for _ in range(10)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    began = time.monotonic()
    answers(owner)
    took = time.monotonic() - began
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(statuses).count(429) >= 8 and 200 in statuses, statuses
    print(f"the owner's one-token chat beside 10 transcriptions: {took:.2f} s")
    assert took < 10  # (75.9 s before; 0.2-0.8 s alone on this machine)
    with device(lan, key) as phone:
        many = phone.post("/v1/embeddings", json={"model": STARTER, "input": ["a"] * 2049})
        assert many.status_code == 400 and many.json()["error"]["param"] == "input"
        unshared = phone.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
        assert unshared.status_code == 403
        count = phone.post("/v1/messages/count_tokens", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert count.status_code == 403


def _half_sent(port: int, count: int) -> list[socket.socket]:
    """`count` connections to the sharing listener, each with a request never finished
    (the ones it closes at once are dropped)."""
    held = []
    for _ in range(count):
        sock = socket.socket()
        try:
            sock.connect((LAN, port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.2\r\n")
        except OSError:
            sock.close()
            continue
        held.append(sock)
    return held


def test_half_sent_connections_cannot_take_the_engines_files(house, owner, lan):
    """1,100 half-sent requests from one LAN address, the engine held to 1,024 open files:
    the owner's loopback API answers, the owner is told of the refused connections, and
    the listener still serves the next device once they are gone."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    subprocess.run(["prlimit", f"--pid={house[2].pid}", "--nofile=1024:1024"], check=True)
    held = _half_sent(int(lan.rsplit(":", 1)[1]), 1100)
    try:
        health = owner.get("/health")
        assert health.status_code == 200
        door = health.json()["home"]["door"]
        assert door["refused"] > 0 and door["connections"] <= door["cap_per_address"]
        answers(owner)
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert httpx.get(f"{lan}/health", timeout=5).status_code == 200


def test_a_device_learns_nothing_of_the_owners_prompt_from_the_cache(owner, lan):
    secret, guesses = "The vault code is 4821. Repeat the code.", [
        "The vault code is 1234. Repeat the code.", "The vault code is 5678. Repeat the code."]
    chat = {"model": STARTER, "max_tokens": 1, "temperature": 0, "cache_prompt": True}
    for _ in range(2):  # the owner's prompt held in KV and in the response cache
        owner.post("/v1/chat/completions", json={
            **chat, "messages": [{"role": "user", "content": secret}]})
    key = pair(owner, lan, "snoop")
    with device(lan, key) as phone:
        cached = {}
        for text in (*guesses, secret):  # each shares with the device's own guesses only
            reply = phone.post("/v1/chat/completions", json={
                **chat, "messages": [{"role": "user", "content": text}]}).json()
            cached[text] = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert reply["homerack"]["response_cache"] != "hit"
        assert cached[secret] <= cached[guesses[1]], cached


def test_the_owners_cached_answer_on_an_unshared_model_is_refused(owner, lan):
    ask = {"model": "tiny", "max_tokens": 2, "temperature": 0,
           "messages": [{"role": "user", "content": "private question"}]}
    assert owner.post("/v1/chat/completions", json=ask).status_code == 200
    key = pair(owner, lan, "curious")
    with device(lan, key) as phone:
        refused = phone.post("/v1/chat/completions", json=ask)
        assert refused.status_code == 403
        missing = phone.post("/v1/chat/completions", json={**ask, "model": "no-such-model"})
        assert missing.status_code == 404 and "tiny" not in missing.text


def test_a_refused_web_chat_ask_keeps_nothing(owner, lan):
    key = pair(owner, lan, "chatty")
    assert owner.patch("/v1/home/devices/chatty", json={"parallel": 1}).status_code == 200
    with device(lan, key) as phone:
        conv = phone.post("/home/api/conversations", json={"title": "t"}).json()["id"]
        body = {"model": STARTER, "max_tokens": 300, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": "go on"}]}
        with phone.stream("POST", "/v1/chat/completions", json=body) as running:
            next(running.iter_lines())
            refused = phone.post(f"/home/api/conversations/{conv}/messages",
                                 json={"content": "x" * 100_000, "model": STARTER})
            assert refused.status_code == 429
        kept = phone.get(f"/home/api/conversations/{conv}").json()
        assert kept["messages"] == []


def test_sharing_off_ends_a_devices_running_stream(owner, lan):
    key = pair(owner, lan, "streamer")
    body = {"model": STARTER, "max_tokens": 2000, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    host, port = lan.removeprefix("http://").split(":")
    with device(lan, key) as phone:
        with phone.stream("POST", "/v1/chat/completions", json=body) as running:
            lines = running.iter_lines()
            next(lines)
            off = time.monotonic()
            assert owner.put("/v1/home/share", json={"enabled": False}).status_code == 200
            try:
                for _ in lines:  # to its end, or the connection's
                    pass
            except httpx.HTTPError:
                pass
            assert time.monotonic() - off < 2
    time.sleep(0.5)  # (the worker publishes its figures a moment after)
    assert owner.get("/health").json()["batching"]["active"] == 0
    assert owner.put("/v1/home/share", json={"enabled": True, "host": host,
                                             "port": int(port)}).status_code == 200
