"""The household's pure parts: pairing codes and keys, the lock against guessing, the
meter's limits, each device's conversations, and fair turns in a lane's queue."""

from __future__ import annotations

import json
import stat
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from engine.batching.fairness import FairQueue
from engine.errors import Forbidden, InvalidRequest, NotFound, RateLimited
from engine.events import Finished, Usage
from engine.home import devices as devices_module
from engine.home.conversations import Conversations
from engine.home.devices import Devices
from engine.home.household import Household
from engine.home.meter import Limits, Meter, Metered


def test_a_code_pairs_once_and_the_file_keeps_only_the_keys_hash(tmp_path):
    path = tmp_path / "devices.json"
    devices = Devices(path)
    code = devices.add("Ana's phone")
    assert len(code.code) == 6 and code.code.isdigit() and code.public()["expires_s"] == 300
    device, key = devices.pair(code.code)
    assert device.name == "Ana's phone" and len(key) >= 40
    assert key not in path.read_text() and device.key_hash in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(Forbidden):
        devices.pair(code.code)  # one use
    assert Devices(path).device_for(key).name == "Ana's phone"  # kept across restarts
    assert Devices(path).device_for(key[:-1] + "x") is None
    assert Devices(path).device_for("") is None


def test_an_expired_code_pairs_nothing(tmp_path, monkeypatch):
    devices = Devices(None)
    code = devices.add("tablet")
    monkeypatch.setattr(devices_module.time, "time", lambda: code.expires + 1)
    with pytest.raises(Forbidden):
        devices.pair(code.code)


def test_twenty_wrong_codes_withdraw_the_codes_waiting_and_lock_nothing():
    devices = Devices(None)
    code = devices.add("laptop")
    wrong = f"{(int(code.code) + 1) % 10**6:06d}"
    for _ in range(devices_module.WRONG_CODES_LOCK):
        with pytest.raises(Forbidden):
            devices.pair(wrong)
    with pytest.raises(Forbidden):  # withdrawn: the right one pairs nothing now
        devices.pair(code.code)
    assert devices.withdrawn["codes"] == ["laptop"] and "withdrawn" in devices.withdrawn["why"]
    assert devices.codes() == []
    # the owner makes a new code: it pairs at once (nothing locks the engine)
    device, _ = devices.pair(devices.add("laptop").code)
    assert device.name == "laptop" and devices.withdrawn is None


def test_wrong_codes_with_none_waiting_withdraw_nothing_later():
    devices = Devices(None)
    for _ in range(devices_module.WRONG_CODES_LOCK * 2):
        with pytest.raises(Forbidden):
            devices.pair("123456")
    device, _ = devices.pair(devices.add("phone").code)
    assert device.name == "phone"


@pytest.mark.parametrize("name", ["", " ", "x" * 41, "<script>", "a/b", 7])
def test_device_names_are_plain_words(name):
    with pytest.raises(InvalidRequest):
        Devices(None).add(name)


def test_a_name_in_use_is_refused_and_removing_forgets_the_key():
    devices = Devices(None)
    _, key = devices.pair(devices.add("phone").code)
    with pytest.raises(InvalidRequest):
        devices.add("phone")
    devices.remove("phone")
    assert devices.device_for(key) is None
    with pytest.raises(NotFound):
        devices.remove("phone")


def _job(job_id: int, client=None, precedence=False, submitted=None):
    request = SimpleNamespace(client=client, precedence=precedence)
    return SimpleNamespace(id=job_id, request=request, cancelled=False,
                           submitted=submitted or time.perf_counter(),
                           cancel=lambda: None)


def test_the_meter_refuses_past_the_parallel_limit_and_counts_tokens_per_minute():
    meter = Meter()
    limits = Limits(parallel=2, tokens_per_minute=100)
    meter.take("a", _job(1), limits)
    meter.take("a", _job(2), limits)
    with pytest.raises(RateLimited) as over:
        meter.take("a", _job(3), limits)
    assert over.value.retry_after_s >= 1
    meter.take("b", _job(4), limits)  # another device is not held back
    meter.ended("a", 1, 120, 0.5)
    with pytest.raises(RateLimited) as tokens:
        meter.take("a", _job(5), limits)
    assert "120 tokens" in tokens.value.message and 1 <= tokens.value.retry_after_s <= 60
    status = meter.status("a")
    assert status["in_flight"] == 1 and status["tokens_today"] == 120
    assert status["requests_today"] == 2 and status["last_wait_s"] == 0.5


def test_metered_emit_counts_the_end_and_passes_every_event_on():
    meter, seen = Meter(), []
    job = _job(9)
    meter.take("a", job, Limits())
    emit = Metered(seen.append, meter, "a", job.id)
    done = Finished("stop", Usage(10, 5, 0, 0.25, 0, 0, 0))
    emit(done)
    assert seen == [done] and meter.status("a")["in_flight"] == 0
    assert meter.status("a")["tokens_today"] == 15


def test_each_device_sees_only_its_own_conversations(tmp_path):
    conversations = Conversations(tmp_path / "home" / "c.sqlite")
    mine = conversations.create("ana", "Soup")
    conversations.add("ana", mine["id"], "user", "how long to boil an egg?")
    assert [c["title"] for c in conversations.listed("ana")] == ["Soup"]
    assert conversations.listed("ben") == []
    for act in (lambda: conversations.get("ben", mine["id"]),
                lambda: conversations.rename("ben", mine["id"], "mine now"),
                lambda: conversations.delete("ben", mine["id"]),
                lambda: conversations.add("ben", mine["id"], "user", "hi")):
        with pytest.raises(NotFound):
            act()
    assert conversations.get("ana", mine["id"])["messages"][0]["content"].startswith("how")
    assert stat.S_IMODE((tmp_path / "home" / "c.sqlite").stat().st_mode) == 0o600


def test_pictures_are_attachments_by_hash_and_version_0s_data_urls_migrate(tmp_path):
    """Pictures are kept as the files sent (kind, name, sha256, bytes), read back by
    their hash from the device's own conversation only; a version-0 file's data URLs
    move into attachments once, in place, the text column dropped."""
    import base64
    import hashlib
    import sqlite3

    from engine.home.conversations import Attachment

    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    digest = hashlib.sha256(png).hexdigest()
    path = tmp_path / "c.sqlite"
    with sqlite3.connect(path) as db:  # version 0, as the last release wrote it
        db.executescript("""
            CREATE TABLE conversations (id TEXT PRIMARY KEY, device TEXT NOT NULL,
                title TEXT NOT NULL, model TEXT, created REAL NOT NULL, updated REAL NOT NULL);
            CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
                conversation TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
                role TEXT NOT NULL, content TEXT NOT NULL, reasoning TEXT NOT NULL DEFAULT '',
                picture TEXT, finish TEXT, created REAL NOT NULL);""")
        db.execute("INSERT INTO conversations VALUES ('c1', 'ana', 'Cat', NULL, 0, 0)")
        db.execute("INSERT INTO messages (conversation, role, content, picture, created) "
                   "VALUES ('c1', 'user', 'what is it?', ?, 0)",
                   ("data:image/png;base64," + base64.b64encode(png).decode(),))
        db.execute("INSERT INTO messages (conversation, role, content, created) "
                   "VALUES ('c1', 'assistant', 'a cat', 0)")
    kept = Conversations(path)
    assert [m["picture"] for m in kept.get("ana", "c1")["messages"]] == [digest, None]
    assert kept.attachment("ana", "c1", digest) == Attachment("picture", "picture.png",
                                                              digest, png)
    with pytest.raises(NotFound):
        kept.attachment("ben", "c1", digest)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (1,)
        assert "picture" not in {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    again = Conversations(path)  # opened again: nothing to migrate, nothing lost
    second = Attachment("picture", "picture.png", "ab" * 32, b"\x89PNG second")
    again.add("ana", "c1", "user", "and this?", second)
    assert [m["picture"] for m in again.get("ana", "c1")["messages"]] == [digest, None,
                                                                         "ab" * 32]
    again.delete("ana", "c1")
    with sqlite3.connect(path) as db:  # its pictures went with it
        assert db.execute("SELECT COUNT(*) FROM attachments").fetchone() == (0,)


def test_fair_turns_owner_first_then_fewest_slots_then_longest_unserved():
    queue = FairQueue()
    for n in range(1, 5):
        queue.add(_job(n, client="a"))
    queue.add(_job(10, client="b"))
    queue.add(_job(20, client=None, precedence=True))
    running = Counter()
    order = []
    while (job := queue.next(running, slots=8)) is not None:
        order.append(job.id)
        running[job.request.client] += 1
    assert order[:3] == [20, 1, 10]  # the owner, then a and b in turn
    assert sorted(order[3:]) == [2, 3, 4]


def test_a_device_never_holds_every_slot_so_another_starts_at_once():
    queue = FairQueue()
    for n in range(8):
        queue.add(_job(n, client="a"))
    running = Counter()
    while (job := queue.next(running, slots=4)) is not None:
        running[job.request.client] += 1
    assert running["a"] == 3  # the fourth slot stays free
    waiting = queue.waiting(running, slots=4)
    assert waiting[0]["client"] == "a" and waiting[0]["requests"] == 5
    assert "one stays free" in waiting[0]["why"]
    queue.add(_job(99, client="b"))
    assert queue.next(running, slots=4).id == 99
    one_slot = FairQueue()
    one_slot.add(_job(1, client="a"))
    assert one_slot.next(Counter(), slots=1).id == 1  # one slot: nobody is held back


def test_the_household_keeps_the_owners_choices_privately(tmp_path):
    home = Household(tmp_path / "home")
    home.choose(parallel=3, tokens_per_minute=0, owner_first=False, shared=["tiny"])
    again = Household(tmp_path / "home")
    assert again.choices.limits == Limits(3, 0) and not again.choices.owner_first
    assert again.choices.shared == ("tiny",)
    with pytest.raises(Forbidden):
        again.check_shared("other")
    with pytest.raises(InvalidRequest):
        again.choose(parallel=0)
    assert json.loads((tmp_path / "home" / "home.json").read_text())["limits"]["parallel"] == 3
    assert stat.S_IMODE((tmp_path / "home" / "home.json").stat().st_mode) == 0o600


def test_a_devices_stored_messages_are_capped_and_others_unaffected(monkeypatch):
    from engine.home import conversations as module

    monkeypatch.setattr(module, "MAX_DEVICE_BYTES", 1000)
    kept = Conversations(None)
    phone = kept.create("phone")["id"]
    kept.add("phone", phone, "user", "x" * 900)
    with pytest.raises(InvalidRequest) as full:
        kept.add("phone", phone, "user", "y" * 200)
    assert full.value.param == "content" and "delete some conversations" in full.value.message
    laptop = kept.create("laptop")["id"]
    kept.add("laptop", laptop, "user", "z" * 900)  # another device's room is its own
    assert [m["content"][0] for m in kept.get("phone", phone)["messages"]] == ["x"]
    from engine.home.conversations import Attachment

    with pytest.raises(InvalidRequest):  # a picture's bytes count as its text's
        kept.add("laptop", laptop, "user", "", Attachment("picture", "p.png", "0" * 64,
                                                          b"p" * 200))


def test_the_doors_key_cookie_and_origin_rules():
    from engine.api.server.home_door import _authority, _cross_site, _key

    assert _key({"cookie": "homerack_key=k; theme=dark"}) == ("k", True)
    # a second key cookie, planted by another port's page: none is taken
    assert _key({"cookie": "homerack_key=mine; homerack_key=planted"}) == ("", True)
    assert _key({"authorization": "Bearer b", "cookie": "homerack_key=k"}) == ("b", False)
    assert _authority("127.0.0.2:8580") != _authority("127.0.0.2:9000")
    assert _authority("127.0.0.2") == _authority("127.0.0.2:80")
    json_post = {"content-type": "application/json", "host": "127.0.0.2:8580"}
    assert _cross_site("POST", {**json_post, "origin": "http://127.0.0.2:8580"}) is None
    assert _cross_site("POST", {**json_post, "origin": "http://127.0.0.2:9000"}) is not None


def test_a_devices_draft_model_is_checked_against_the_shared_models():
    from engine.home.household import Household

    home = Household(None)
    home.choose(shared=["big"])
    request = SimpleNamespace(client="phone", model=SimpleNamespace(id="big"),
                              draft_model=SimpleNamespace(id="secret-draft"))
    with pytest.raises(Forbidden) as refused:
        home.take(SimpleNamespace(request=request, id=1, emit=lambda e: None))
    assert refused.value.param == "draft_model"
    with pytest.raises(Forbidden):  # token counting, embeddings: the same rule
        with home.working("phone", "secret-draft"):
            pass
    with home.working(None, "secret-draft") as charge:  # the owner's: anything
        charge.tokens = 5
