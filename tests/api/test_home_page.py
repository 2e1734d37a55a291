"""The web chat in a real browser: Debian's headless Chromium at a phone's size (390x844),
driven by Selenium, against a real `homerack serve --share-home` on 127.0.0.2 with a
model that sees. Pair with the code, ask and watch the answer stream, stop one, reload
and find the conversation, attach a picture; a model's answer carrying HTML, a script
and javascript: links renders inert; a second device sees none of it; a removed device
is sent back to pairing. Screenshots go to $HOMERACK_PAGE_SHOTS (docs/images/ was made
so) or the test's own folder."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from support.engines import api_client, models_once_read, start_engine
from support.models import STARTER
from fixtures.network import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="Debian's chromium and chromium-driver are not installed (make test installs "
           "them where it can)")]
LAN = "127.0.0.2"
MODEL = "smolvlm-256m"
HOSTILE = ('Here: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>\n\n'
           '[click me](javascript:window.__pwned=3) and ![pic](http://example.com/x.png)\n\n'
           '```html\n<b onmouseover="window.__pwned=4">code</b>\n```')


@pytest.fixture(scope="module")
def house(tmp_path_factory, vision_dir, starters_dir):

    home = tmp_path_factory.mktemp("page-house")
    models = home / "data" / "models"
    models.mkdir(parents=True)
    for path in vision_dir.iterdir():
        (models / path.name).symlink_to(path)
    (models / f"{STARTER}.gguf").symlink_to(starters_dir / f"{STARTER}.gguf")
    port = free_port(LAN)
    process, address, _ = start_engine(home, "page", [
        "--model", MODEL, "--ctx", "2048", "--parallel", "2", "--share-home",
        "--share-host", LAN, "--share-port", str(port)])
    with api_client(address) as owner:
        while not owner.get("/v1/home").json()["enabled"]:
            time.sleep(0.05)
        models_once_read(owner)
        yield owner, f"http://{LAN}:{port}", home / "page" / "data" / "home"
    process.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("HOMERACK_PAGE_SHOTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("page-shots")


def browser(tmp_path: Path, dark: bool = False):
    """Chromium at a phone's size."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path}"):
        options.add_argument(flag)
    options.add_experimental_option("mobileEmulation", {
        "deviceMetrics": {"width": 390, "height": 844, "pixelRatio": 2},
        "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 "
                     "(KHTML, like Gecko) Chrome/130.0 Mobile Safari/537.36"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_script_timeout(30)
    if dark:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    return driver


def wait(condition, seconds: float = 60, step: float = 0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (got := condition()):
            return got
        time.sleep(step)
    raise AssertionError(f"not within {seconds} s: {condition}")


def by_id(driver, name):
    return driver.find_element("id", name)


def answers(driver) -> list[str]:
    """The answers' text as shown, read in one step (the page redraws them as they grow),
    without their Read aloud button."""
    return driver.execute_script(
        "return [...document.querySelectorAll('article.msg.assistant')].map((a) => "
        "[...a.children].filter((c) => !c.matches('button.read'))"
        ".map((c) => c.innerText).join('\\n').trim())")


def pair_page(driver, owner, lan: str, name: str) -> None:
    code = owner.post("/v1/home/devices", json={"name": name}).json()["code"]
    driver.get(lan)
    wait(lambda: by_id(driver, "pair").is_displayed())
    by_id(driver, "code").send_keys(code)
    by_id(driver, "pair-form").submit()
    wait(lambda: by_id(driver, "chat").is_displayed())


def ask(driver, text: str) -> None:
    by_id(driver, "input").send_keys(text)
    by_id(driver, "send").click()


def test_pair_ask_stream_stop_reload_and_a_picture(house, shots, tmp_path):
    owner, lan, _ = house
    driver = browser(tmp_path / "phone")
    try:
        driver.get(lan)
        wait(lambda: by_id(driver, "pair").is_displayed())
        driver.save_screenshot(str(shots / "home-pairing.png"))
        pair_page(driver, owner, lan, "Ana's phone")
        models = [o.get_attribute("value") for o in driver.find_elements("css selector",
                                                                          "#model option")]
        assert MODEL in models and STARTER in models
        # an answer streams in: the Stop button shows while its text grows
        ask(driver, "Write a long story about a dragon who learns to bake bread.")
        first = wait(lambda: by_id(driver, "stop").is_displayed() and answers(driver)
                     and len(answers(driver)[-1]) > 10 and answers(driver)[-1])
        wait(lambda: len(answers(driver)[-1]) > len(first))
        by_id(driver, "stop").click()
        wait(lambda: answers(driver)[-1].endswith("Stopped."))
        assert by_id(driver, "send").is_displayed()
        ask(driver, "Name three colors.")
        wait(lambda: len(answers(driver)) == 2 and by_id(driver, "send").is_displayed())
        driver.save_screenshot(str(shots / "home-chat.png"))
        # reload: the conversation is there, its title the first question
        driver.refresh()
        wait(lambda: len(answers(driver)) == 2)
        assert by_id(driver, "title").text.startswith("Write a long story")
        # a picture from the gallery, for a model that sees
        picture = tmp_path / "red.png"
        Image.new("RGB", (320, 240), (220, 30, 30)).save(picture)
        by_id(driver, "new").click()
        wait(lambda: not answers(driver))
        by_id(driver, "picture").send_keys(str(picture))
        wait(lambda: by_id(driver, "attached").is_displayed())
        ask(driver, "What color is this?")
        sent = wait(lambda: driver.find_elements("css selector", "article.msg.user img.picture"))
        assert sent[0].get_attribute("src").startswith("data:image/png;base64,")
        wait(lambda: len(answers(driver)) == 1 and by_id(driver, "send").is_displayed())
        assert by_id(driver, "chat-error").text == ""
        # reload: the picture is the conversation's attachment, served by its hash, and
        # the conversation goes on with it (read back from the attachment, not the page)
        driver.refresh()
        shown = wait(lambda: driver.find_elements("css selector", "article.msg.user img.picture"))
        assert "/pictures/" in shown[0].get_attribute("src")
        wait(lambda: driver.execute_script("return arguments[0].naturalWidth", shown[0]) == 320)
        ask(driver, "And the corners?")
        wait(lambda: len(answers(driver)) == 2 and by_id(driver, "send").is_displayed())
        assert by_id(driver, "chat-error").text == ""
        by_id(driver, "menu").click()
        titles = [e.text for e in driver.find_elements("css selector", "#conversations .open")]
        assert titles[0] == "What color is this?" and len(titles) == 2
    finally:
        driver.quit()


def test_a_hostile_answer_renders_inert(house, shots, tmp_path):
    owner, lan, folder = house
    driver = browser(tmp_path / "phone", dark=True)
    try:
        pair_page(driver, owner, lan, "ben")
        key_cookie = driver.get_cookie("homerack_key")
        assert key_cookie["httpOnly"] and key_cookie["sameSite"] == "Strict"
        http = httpx.Client(base_url=lan, cookies={"homerack_key": key_cookie["value"]})
        conv = http.post("/home/api/conversations", json={"title": "Hostile"}).json()
        with sqlite3.connect(folder / "conversations.sqlite") as db:  # as if the model said it
            db.execute("INSERT INTO messages (conversation, role, content, finish, created) "
                       "VALUES (?, 'assistant', ?, 'stop', 0)", (conv["id"], HOSTILE))
        driver.refresh()
        wait(lambda: answers(driver))
        log = by_id(driver, "log")
        assert "onerror" in log.text and "<script>" in log.text  # shown as text
        assert not log.find_elements("css selector", "script, img:not(.picture), iframe")
        assert not [a for a in log.find_elements("tag name", "a")
                    if not (a.get_attribute("href") or "").startswith("http")]
        assert log.find_elements("css selector", "pre code")[0].text.startswith("<b onmouse")
        time.sleep(0.3)
        assert driver.execute_script("return window.__pwned") is None
        driver.save_screenshot(str(shots / "home-dark.png"))
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": 360, "height": 740, "deviceScaleFactor": 2, "mobile": True})
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 360
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        # a second device sees none of the first one's conversations
        assert http.get("/home/api/conversations").json()["data"][0]["title"] == "Hostile"
        assert all(c["title"] != "Write a long story about a dragon who learns to bake bread."
                   for c in http.get("/home/api/conversations").json()["data"])
        by_id(driver, "menu").click()
        titles = [e.text for e in driver.find_elements("css selector", "#conversations .open")]
        assert titles == ["Hostile"]
        # removed: the next request finds the page back at pairing
        owner.delete("/v1/home/devices/ben")
        by_id(driver, "new").click()
        wait(lambda: by_id(driver, "pair").is_displayed())
        assert http.get("/home/api/conversations").status_code == 401
    finally:
        driver.quit()


def test_speech_in_and_out_from_a_phone(house, shots, tmp_path):
    """A phone on the LAN has no microphone for a plain-HTTP page: Speak opens its own
    recorder (a file input with `capture`), and the recording's words come into the box,
    to edit before sending; an answer's Read aloud plays the engine's speech. (The page's
    own recording, where it may record, was tried with Chromium's fake microphone: what
    that device captures under load is too uneven to assert words on.)"""
    owner, lan, _ = house
    question = owner.post("/v1/audio/speech", json={
        "input": "Good morning. What is the weather like in Paris today?", "voice": "en-us",
        "speed": 0.9,
        "response_format": "wav"}).content
    (tmp_path / "question.wav").write_bytes(question)
    driver = browser(tmp_path / "phone")
    try:
        pair_page(driver, owner, lan, "Cleo's phone")
        by_id(driver, "input").send_keys("Please:")
        by_id(driver, "recording").send_keys(str(tmp_path / "question.wav"))  # the recorder's file
        said = wait(lambda: len(by_id(driver, "input").get_attribute("value")) > 10
                    and by_id(driver, "input").get_attribute("value"))
        assert by_id(driver, "chat-error").text == ""
        assert said.startswith("Please: ") and "paris" in said.lower(), said
        by_id(driver, "send").click()
        wait(lambda: by_id(driver, "stop").is_displayed() and answers(driver)
             and len(answers(driver)[-1]) > 40)
        by_id(driver, "stop").click()  # a long answer need not finish to be read aloud
        wait(lambda: answers(driver)[-1].endswith("Stopped."))
        read = wait(lambda: driver.find_elements("css selector", "article.msg.assistant .read"))
        read[0].click()
        wait(lambda: driver.execute_script(
            "const v = document.getElementById('voice'); "
            "return v.src.startsWith('blob:') && v.duration > 0.5"))
        assert by_id(driver, "chat-error").text == ""
        driver.save_screenshot(str(shots / "home-voice.png"))
    finally:
        driver.quit()


def test_twenty_pictures_in_a_web_chat_and_the_page_says_which_were_left_out(house, shots,
                                                                            tmp_path):
    """A phone's conversation of twenty pictures goes on, none of them encoded by this
    engine yet (kept from before a restart): its oldest are left out for the cap on new
    pictures (16) and for the 2,048-token context, the latest kept, and the page says so
    under the answer. (The API's test has pictures encoded before: no cap on them.)"""
    import hashlib
    import io

    from support.home import pair

    owner, lan, folder = house
    key = pair(owner, lan, "Photo phone")
    conv = httpx.post(f"{lan}/home/api/conversations", json={"title": "Holiday"},
                      headers={"Authorization": f"Bearer {key}"}).json()["id"]
    with sqlite3.connect(folder / "conversations.sqlite") as db:  # as kept before a restart
        for n in range(19):
            out = io.BytesIO()
            Image.new("RGB", (40, 40), (n * 13, 200 - n * 9, 40)).save(out, "PNG")
            asked = db.execute("INSERT INTO messages (conversation, role, content, created) "
                               "VALUES (?, 'user', ?, 0)", (conv, f"Photo {n}")).lastrowid
            db.execute("INSERT INTO attachments (message, kind, name, sha256, bytes) VALUES "
                       "(?, 'picture', 'picture.png', ?, ?)",
                       (asked, hashlib.sha256(out.getvalue()).hexdigest(), out.getvalue()))
            db.execute("INSERT INTO messages (conversation, role, content, finish, created) "
                       "VALUES (?, 'assistant', 'Seen.', 'stop', 0)", (conv,))
    last = tmp_path / "p19.png"
    Image.new("RGB", (40, 40), (250, 250, 0)).save(last)
    driver = browser(tmp_path / "phone")
    try:  # the page with this phone's key: its conversation, and a twentieth picture
        driver.get(lan)
        driver.add_cookie({"name": "homerack_key", "value": key, "path": "/"})
        driver.get(lan)
        wait(lambda: len(driver.find_elements("css selector", "article.msg.user img.picture"))
             == 19)
        by_id(driver, "model").send_keys(MODEL)
        by_id(driver, "picture").send_keys(str(last))
        wait(lambda: by_id(driver, "attached").is_displayed())
        ask(driver, "Which one was yellow?")
        note = wait(lambda: driver.execute_script(  # read at once: the answer redraws
            "const notes = document.querySelectorAll('article.msg.assistant p.note');"
            "return notes.length ? notes[notes.length - 1].textContent : null"))
        assert note.startswith("left out:") and "earlier pictures" in note, note
        assert "pictures new to the engine" in note and "-token context" in note
        driver.execute_script("const stop = document.getElementById('stop');"
                              "if (stop.offsetParent) stop.click()")  # unless it has ended
        wait(lambda: by_id(driver, "send").is_displayed())
        assert by_id(driver, "chat-error").text == ""
        driver.save_screenshot(str(shots / "home-pictures-left-out.png"))
    finally:
        driver.quit()
