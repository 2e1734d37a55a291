"""The Devices page: this engine shared with the home's phones and laptops. *Share with
this home* opens the sharing listener at once (and the app starts the engine with it
from then on); the address shows with a QR code a phone's camera opens; *Add a device*
shows a one-use code; each paired device shows when it was last seen, what it used
today and what it is waiting for, with *Remove*, which revokes its key at once. The
limits every device gets, and whether the owner's own requests go first, are set here.

All the engine's work runs off the UI thread (ui.tasks); the page polls while shown."""

from __future__ import annotations

import io
import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QHBoxLayout, QLineEdit, QPushButton,
                               QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..safe_text import Label
from ..tasks import start_task

COLUMNS = ("Device", "Last seen", "Today", "Now", "")
SHARE_FLAG = "share-home"  # under data/home: the switch, kept for the app's next start


def qr_pixmap(url: str) -> QPixmap:
    import segno

    out = io.BytesIO()
    segno.make(url, error="m").save(out, kind="png", scale=5, border=2)
    pixmap = QPixmap()
    pixmap.loadFromData(out.getvalue(), "PNG")
    return pixmap


def seen_text(when: float) -> str:
    if not when:
        return "never"
    ago = time.time() - when
    return "just now" if ago < 90 else f"{ago / 60:.0f} min ago" if ago < 3600 else \
        time.strftime("%d %b %H:%M", time.localtime(when))


def waiting_text(waiting: list[dict]) -> str:
    return "; ".join(f"{w['client']}: {w['requests']} waiting {w['waited_s']:.1f} s "
                     f"({w['why']})" for w in waiting) or "Nobody is waiting."


def alert_text(home: dict) -> str:
    """What the owner should know of the door: codes withdrawn after wrong guesses, and
    connections the LAN was refused or cut off (its caps bit)."""
    said = []
    withdrawn = home.get("codes_withdrawn")
    if withdrawn:
        said.append(withdrawn["why"] + ".")
    door = home.get("door") or {}
    if door.get("refused") or door.get("cut_off"):
        said.append(f"The network was refused {door['refused']:,} connections past the "
                    f"door's limits ({door['cap']} at once, {door['cap_per_address']} from "
                    f"one address) and {door['cut_off']:,} too slow to send a request.")
    return " ".join(said)


class DevicesPage(QWidget):
    notice = Signal(str)
    error = Signal(str)

    def __init__(self, data: Path, client, supervisor, parent=None):
        super().__init__(parent)
        self.data, self.client, self.supervisor = data, client, supervisor  # client(): now
        self._polling = False
        self.share_where: dict = {}  # the listener's host and port (default: the LAN's, 8580)
        self.share = QCheckBox("Share with this home")
        self.share.setToolTip("Phones and laptops on this network use this computer's "
                              "models after pairing; off closes the door at once")
        self.address = Label("Not shared.", wordWrap=True)
        self.qr = Label("")
        self.name = QLineEdit(placeholderText="Ana's phone", maxLength=40,
                              accessibleName="The new device's name")
        self.add = QPushButton("Add a device")
        self.code = Label("", wordWrap=True)
        self.code.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS), accessibleName="Paired devices")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.waiting = Label("Nobody is waiting.", wordWrap=True)
        self.alerts = Label("", wordWrap=True)
        self.parallel = QSpinBox(minimum=1, maximum=256,
                                 accessibleName="Requests at once, per device")
        self.tokens = QSpinBox(minimum=0, maximum=10_000_000, singleStep=10_000,
                               specialValueText="no limit",
                               accessibleName="Tokens a minute, per device")
        self.owner_first = QCheckBox("My own requests go first")
        self._lay_out()
        self.share.toggled.connect(self._share)
        self.add.clicked.connect(self._add)
        self.name.returnPressed.connect(self._add)
        for box in (self.parallel, self.tokens):
            box.editingFinished.connect(self._choose)
        self.owner_first.toggled.connect(self._choose)
        self.timer = QTimer(self, interval=2000)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()

    def _lay_out(self) -> None:
        column = QVBoxLayout(self)
        column.addWidget(self.share)
        column.addWidget(self.address)
        column.addWidget(self.qr)
        adding = QHBoxLayout()
        adding.addWidget(self.name, 1)
        adding.addWidget(self.add)
        column.addLayout(adding)
        column.addWidget(self.code)
        column.addWidget(self.table, 1)
        column.addWidget(self.waiting)
        column.addWidget(self.alerts)
        limits = QFormLayout()
        limits.addRow(Label("Requests at once, per device"), self.parallel)
        limits.addRow(Label("Tokens a minute, per device"), self.tokens)
        limits.addRow(self.owner_first)
        column.addLayout(limits)

    # -- the engine's answers ----------------------------------------------------------

    def refresh(self) -> None:
        client = self.client()
        if self._polling or not client or not self.isVisible():
            return
        self._polling = True

        def done(home) -> None:
            self._polling = False
            self.show_home(home)

        start_task(lambda _t: client.home(), on_done=done,
                   on_error=lambda _e: setattr(self, "_polling", False), owner=self)

    def show_home(self, home: dict) -> None:
        for box, value in ((self.share, home["enabled"]),
                           (self.owner_first, home["owner_first"])):
            box.blockSignals(True)
            box.setChecked(value)
            box.blockSignals(False)
        if not self.parallel.hasFocus():
            self.parallel.setValue(home["limits"]["parallel"])
        if not self.tokens.hasFocus():
            self.tokens.setValue(home["limits"]["tokens_per_minute"])
        url = home["url"] if home["enabled"] else None
        self.address.setText(f"Open {url} on a phone or laptop of this home (or scan the "
                             "code), then enter the code a new device gets here."
                             if url else "Not shared: nothing on the network can reach "
                             "this computer's models.")
        self.qr.setPixmap(qr_pixmap(url) if url else QPixmap())
        self._fill(home["devices"])
        self.waiting.setText(waiting_text(home.get("waiting", [])))
        self.alerts.setText(alert_text(home))

    def _fill(self, devices: list[dict]) -> None:
        self.table.setRowCount(len(devices))
        for row, d in enumerate(devices):
            cells = (d["name"], seen_text(d["last_seen"]),
                     f"{d['requests_today']} requests, {d['tokens_today']:,} tokens",
                     f"{d['in_flight']} in flight")
            for col, text in enumerate(cells):
                self.table.setItem(row, col, QTableWidgetItem(text))
            remove = QPushButton("Remove")
            remove.clicked.connect(lambda _=False, name=d["name"]: self._remove(name))
            self.table.setCellWidget(row, len(cells), remove)
        self.table.resizeColumnsToContents()

    # -- the owner's actions ----------------------------------------------------------

    def _share(self, on: bool) -> None:
        flag = self.data / "home" / SHARE_FLAG
        flag.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flag.touch() if on else flag.unlink(missing_ok=True)
        args = [a for a in self.supervisor.serve_args if a != "--share-home"]
        self.supervisor.serve_args = args + (["--share-home"] if on else [])
        self._ask(lambda client: client.share(on, **self.share_where), self.show_home,
                  "Sharing could not be " + ("turned on" if on else "turned off"))

    def _add(self) -> None:
        name = self.name.text().strip()
        if not name:
            self.error.emit("Name the device first (say, “Ana's phone”).")
            return

        def shown(made: dict) -> None:
            self.name.clear()
            self.code.setText(f"Code for {made['name']}: {made['code']}\nEnter it on the "
                              f"device within {made['expires_s'] // 60} minutes; it works once.")
            self.refresh()

        self._ask(lambda client: client.add_device(name), shown, "The device was not added")

    def _remove(self, name: str) -> None:
        self._ask(lambda client: client.remove_device(name),
                  lambda _r: (self.notice.emit(f"{name} was removed: its key no longer "
                                               "works."), self.refresh()),
                  f"{name} was not removed")

    def _choose(self) -> None:
        choices = {"parallel": self.parallel.value(), "tokens_per_minute": self.tokens.value(),
                   "owner_first": self.owner_first.isChecked()}
        self._ask(lambda client: client.choose_for_home(**choices), self.show_home,
                  "The limits were not changed")

    def _ask(self, work, on_done, failed: str) -> None:
        client = self.client()
        if client is None:
            self.error.emit(f"{failed}: the engine is not running.")
            return
        start_task(lambda _t: work(client), on_done=on_done,
                   on_error=lambda e: self.error.emit(f"{failed}: {e}"), owner=self)
