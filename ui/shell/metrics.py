"""The status area's live figures. Each figure is a named field, so later features
(draft acceptance, cache hits, cluster stages) add theirs with `set`."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget
from ..safe_text import Label

FIELDS = (
    ("batch", "engine"),
    ("speed", "tokens/s"),
    ("ttft", "first token"),
    ("context", "context"),
    ("cache", "cached prompt"),
    ("speculation", "speculation"),
    ("device", "device"),
)


class MetricsBar(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        self._labels: dict[str, QLabel] = {}
        self._titles = dict(FIELDS)
        for key, _title in FIELDS:
            self._add(key)
        layout.addStretch()

    def _add(self, key: str) -> QLabel:
        label = Label(f"{self._titles.get(key, key)}: –")
        label.setObjectName(f"metric-{key}")
        label.hide()  # until it has a figure: no row of empty fields
        self.layout().insertWidget(len(self._labels), label)
        self._labels[key] = label
        return label

    def set(self, key: str, value: str, title: str | None = None) -> None:
        if title:
            self._titles[key] = title
        label = self._labels.get(key) or self._add(key)
        label.setText(f"{self._titles.get(key, key)}: {value}")
        label.setVisible(value not in ("", "–", "off"))
        label.setMinimumWidth(label.sizeHint().width())  # the status bar must not clip it
        self.updateGeometry()  # and must give the bar the room its longer text needs

    def text(self, key: str) -> str:
        return self._labels[key].text()

    def show_usage(self, usage: dict | None, n_ctx: int | None) -> None:
        if not usage:
            return
        timings = usage.get("timings", {})
        self.set("speed", f"{timings.get('decode_tokens_per_s', 0):.1f}")
        self.set("ttft", f"{timings.get('time_to_first_token_s', 0) * 1000:.0f} ms")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        self.set("cache", f"{cached} of {usage.get('prompt_tokens', 0)} tokens")
        used = usage.get("total_tokens", 0)
        self.set("context", f"{used} / {n_ctx}" if n_ctx else str(used))
        self.set("speculation", describe_speculation(usage.get("speculative")))


def describe_speculation(spec: dict | None) -> str:
    if not spec:
        return "off"
    if not spec.get("enabled"):
        return f"{spec['mode']}: paused (slower than plain)"
    acceptance = spec.get("acceptance")
    accepted = f"{spec['accepted']}/{spec['drafted']} accepted" if acceptance is not None else "no drafts"
    speedup = f", {spec['speedup']:.2f}x" if spec.get("speedup") else ""
    where = (f" ({spec['draft_device']}, {spec['draft_vocab']:,} tokens)"
             if spec.get("draft_vocab") else "")
    return f"{spec['mode']}: {accepted}{speedup}{where}"


def describe_batching(batching: dict) -> str:
    """What the engine does for all its clients: requests generating at once (those
    still reading their prompt) and the tokens per second of all of them together."""
    active = batching.get("active", 0)
    if not active:
        return f"idle · {batching.get('resident', 0)} resident"
    prefilling = batching.get("prefilling", 0)
    reading = f" ({prefilling} reading)" if prefilling else ""
    return f"{active} generating{reading} · {batching.get('generated_tokens_per_s', 0):.0f} tok/s"
