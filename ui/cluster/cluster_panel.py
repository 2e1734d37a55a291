"""The cluster dashboard: this machine shared as a worker (its address and pairing code;
as a pipeline stage, and serving whole models when asked), pairing with another
machine's worker, using the paired workers as pipeline stages or as replicas, and
the machines at work — their layer ranges, memory, link round trip, bytes per token on
each link, the models this machine holds with their requests, and the tokens/s while
generating.

The panel only shows and asks (signals); the main window runs the work off the UI
thread and hands the answers back (`show_cluster`, `show_sharing`)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLineEdit, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)
from ..safe_text import Label

MiB = 1 << 20
COLUMNS = ("Machine", "Models", "Layers", "Memory", "Round trip", "Bytes / token", "State")


def _layers(stages: list[dict]) -> str:
    return ", ".join(f"{s['first_layer']}–{s['last_layer']}" for s in stages) or "–"


def models_text(models: list[dict]) -> str:
    """The models a machine holds, each with what it is doing."""
    def one(m: dict) -> str:
        doing = f"{m['running']} running" + (f", {m['queued']} queued" if m["queued"] else "") \
            if m["running"] or m["queued"] else "loading" if m["state"] == "loading" else "idle"
        speed = f", {m['generated_tokens_per_s']:.1f} tok/s" \
            if m.get("generated_tokens_per_s") else ""
        return f"{m['id']} ({doing}{speed})"
    return "; ".join(one(m) for m in models) or "–"


def machine_rows(view: dict) -> list[tuple[str, ...]]:
    """One row per machine: this one first, then each paired worker."""
    local = view.get("local_stages", [])
    host = view.get("host")
    rows = [(f"{host} (this machine)" if host else "This machine",
             models_text(view.get("models", [])), _layers(local),
             f"{sum(s['bytes'] for s in local) / MiB:,.0f} MiB" if local else "–", "–", "–",
             "output layer here")]
    for w in view.get("workers", []):
        stages = w.get("stages", [])
        per_token = f"{w['bytes_per_token']:,.0f} B" if w.get("bytes_per_token") else "–"
        rows.append((f"{w['name']} ({w['address']})", "–", _layers(stages),
                     f"{sum(s['bytes'] for s in stages) / MiB:,.0f} MiB" if stages else "–",
                     f"{w['rtt_ms']:.2f} ms" if w.get("rtt_ms") else "–", per_token,
                     w["state"] + (f": {w['why']}" if w.get("why") else "")))
    for r in view.get("replicas", []):
        loaded = ", ".join(r.get("loaded", [])) or "no model loaded"
        state = f"replica, {r['requests_sent']} requests sent" if r["state"] == "serving" \
            else f"replica left out: {r.get('why', '')}"
        rows.append((f"{r['name']} (replica)", loaded if r["state"] == "serving" else "–",
                     "whole models", "–", "–", "–", state))
    return rows


class ClusterPanel(QWidget):
    share_toggled = Signal(bool)
    pair_again_requested = Signal()
    use_toggled = Signal(bool)
    replicas_toggled = Signal(bool)
    pair_requested = Signal(str, str)  # address, code

    def __init__(self, parent=None):
        super().__init__(parent)
        self.share = QCheckBox("Share this machine")
        self.share.setToolTip("Other Homerack hosts on this network can use this machine as a "
                              "pipeline stage once paired with the code shown here")
        self.share.toggled.connect(self.share_toggled)
        self.serve_models = QCheckBox("Also serve whole models")
        self.serve_models.setToolTip("Hosts that use replicas send some of their requests "
                                     "here; this machine answers with an engine of its own "
                                     "(applies the next time it is shared)")
        self.pair_again = QPushButton("Pair another host")
        self.pair_again.setToolTip("A new code for one more host, for 5 minutes")
        self.pair_again.setEnabled(False)  # while shared
        self.pair_again.clicked.connect(self.pair_again_requested)
        self.sharing = Label("Not shared.")
        self.sharing.setObjectName("cluster-sharing")
        self.sharing.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.sharing.setWordWrap(True)  # the pairing code and the trust note: never wider than the window
        self.address = QLineEdit(placeholderText="worker address, e.g. 192.168.1.20:50151")
        self.code = QLineEdit(placeholderText="pairing code", maxLength=12)
        pair = QPushButton("Pair")
        pair.clicked.connect(lambda: self.pair_requested.emit(self.address.text().strip(),
                                                              self.code.text().strip()))
        self.use = QCheckBox("Use paired workers (restarts the engine)")
        self.use.setToolTip("The paired workers run some of the model's layers as pipeline "
                            "stages")
        self.use.toggled.connect(self.use_toggled)
        self.replicas = QCheckBox("Use paired replicas (restarts the engine)")
        self.replicas.setToolTip("Paired workers that serve whole models answer some requests: "
                                 "the least busy machine, or the one that holds the "
                                 "conversation")
        self.replicas.toggled.connect(self.replicas_toggled)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.speed = Label("")
        self.speed.setObjectName("cluster-speed")

        for widget, name in ((self.share, "Share this machine"), (self.address, "Worker address"),
                             (self.code, "Pairing code"), (pair, "Pair"),
                             (self.pair_again, "Pair another host"),
                             (self.use, "Use paired workers"), (self.table, "Machines"),
                             (self.serve_models, "Also serve whole models"),
                             (self.replicas, "Use paired replicas")):
            widget.setAccessibleName(name)
        layout = QVBoxLayout(self)  # one column: it lives in the drawer beside the chat
        layout.addWidget(self.share)
        layout.addWidget(self.serve_models)
        layout.addWidget(self.sharing)
        layout.addWidget(self.pair_again, 0, Qt.AlignLeft)
        layout.addWidget(Label("Pair with another machine's worker:"))
        layout.addWidget(self.address)
        row = QHBoxLayout()
        row.addWidget(self.code, 1)
        row.addWidget(pair)
        layout.addLayout(row)
        layout.addWidget(self.use)
        layout.addWidget(self.replicas)
        layout.addWidget(self.table)
        layout.addWidget(self.speed)
        layout.addStretch(1)

    def show_sharing(self, text: str) -> None:
        self.sharing.setText(text)

    def show_cluster(self, view: dict) -> None:
        rows = machine_rows(view)
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(value))
        self.table.resizeColumnsToContents()
        expected, now = view.get("expected_tokens_per_s"), view.get("tokens_per_s")
        parts = [f"{now:.1f} tokens/s now" if now else None,
                 f"{expected:.1f} tokens/s expected by the plan" if expected else None]
        left_out = [f"{name} left out: {why}" for name, why in (view.get("left_out") or {}).items()]
        self.speed.setText(" · ".join(p for p in parts + left_out if p))
