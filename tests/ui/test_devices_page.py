"""The Devices page against a real `homerack serve`: the switch opens the sharing listener
(127.0.0.2 stands for the LAN) and shows its address with a QR code; Add a device shows a
code a phone pairs with; the device appears with what it used; Remove revokes its key;
the switch off closes the listener and is kept for the app's next start."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
import pytest

from ui.home.devices_page import SHARE_FLAG, DevicesPage, qr_pixmap
from fixtures.network import free_port

pytestmark = pytest.mark.slow
LAN = "127.0.0.2"


@pytest.fixture(scope="module")
def engine(tiny_client):
    return tiny_client


def test_share_add_pair_remove_and_unshare(qtbot, engine, tmp_path):
    port = free_port(LAN)
    supervisor = SimpleNamespace(serve_args=["--model", "tiny"])
    page = DevicesPage(tmp_path, lambda: engine, supervisor)
    page.share_where = {"host": LAN, "port": port}
    qtbot.addWidget(page)
    page.show()
    page.share.setChecked(True)
    url = f"http://{LAN}:{port}"
    qtbot.waitUntil(lambda: url in page.address.text(), timeout=15000)
    assert not page.qr.pixmap().isNull() and (tmp_path / "home" / SHARE_FLAG).exists()
    assert "--share-home" in supervisor.serve_args
    assert httpx.get(f"{url}/").status_code == 200

    page.name.setText("Ana's phone")
    page.add.click()
    qtbot.waitUntil(lambda: "Code for Ana's phone" in page.code.text(), timeout=15000)
    code = page.code.text().split(": ", 1)[1][:6]
    assert code.isdigit()
    key = httpx.post(f"{url}/pair", json={"code": code}).json()["key"]
    said = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tiny", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]})
    assert said.status_code == 200
    page.refresh()
    qtbot.waitUntil(lambda: page.table.rowCount() == 1, timeout=15000)
    qtbot.waitUntil(lambda: "1 requests" in page.table.item(0, 2).text(), timeout=15000)
    assert page.table.item(0, 0).text() == "Ana's phone"

    with qtbot.waitSignal(page.notice, timeout=15000):
        page.table.cellWidget(0, 4).click()
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}
                     ).status_code == 401
    qtbot.waitUntil(lambda: page.table.rowCount() == 0, timeout=15000)

    page.share.setChecked(False)
    qtbot.waitUntil(lambda: "Not shared" in page.address.text(), timeout=15000)
    assert not (tmp_path / "home" / SHARE_FLAG).exists()
    assert "--share-home" not in supervisor.serve_args
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/", timeout=1)
        except httpx.ConnectError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the sharing listener is still open")


def test_the_qr_code_is_a_picture_of_the_address():
    assert qr_pixmap("http://192.168.1.20:8580").width() > 100


def test_the_owner_is_told_when_codes_were_withdrawn_or_the_door_refused_connections(qtbot):
    page = DevicesPage(None, lambda: None, None)
    qtbot.addWidget(page)
    home = {"enabled": True, "owner_first": True, "url": "http://127.0.0.2:8580",
            "limits": {"parallel": 8, "tokens_per_minute": 0}, "devices": [],
            "codes_withdrawn": {"why": "20 wrong pairing codes were tried: the codes "
                                       "waiting were withdrawn; make a new one"},
            "door": {"connections": 32, "cap": 256, "cap_per_address": 32, "refused": 1068,
                     "cut_off": 3}}
    page.show_home(home)
    assert "withdrawn" in page.alerts.text() and "1,068 connections" in page.alerts.text()
    page.show_home({**home, "codes_withdrawn": None, "door": {**home["door"], "refused": 0,
                                                              "cut_off": 0}})
    assert page.alerts.text() == ""
