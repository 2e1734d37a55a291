"""The composer's Documents button: the collections (the Documents page) whose passages
ground the chat's replies, each on or off. The choice is the window's state
(`collections`)."""

from __future__ import annotations

from PySide6.QtWidgets import QMenu, QToolButton

from ..state import WindowState


class DocumentsButton(QToolButton):
    def __init__(self, state: WindowState, parent=None):
        super().__init__(parent)
        self.state = state
        self.names: list[str] = []
        self.setText("Documents")
        self.setAccessibleName("Documents")
        self.setToolTip("Answer from your document collections (Documents page), citing them")
        self.setPopupMode(QToolButton.InstantPopup)
        self.setMenu(QMenu(self))
        self.menu().aboutToShow.connect(self._fill)
        state.changed.connect(lambda names: self._show() if "collections" in names else None)

    def offer(self, names: list[str]) -> None:
        """The collections there are (the Documents page read them)."""
        self.names = names
        kept = tuple(n for n in self.state.now.collections if n in names)
        if kept != self.state.now.collections:
            self.state.update(collections=kept)

    def _fill(self) -> None:
        menu, chosen = self.menu(), set(self.state.now.collections)
        menu.clear()
        if not self.names:
            menu.addAction("No collections yet: add one on the Documents page").setEnabled(False)
        for name in self.names:
            action = menu.addAction(name)
            action.setCheckable(True)
            action.setChecked(name in chosen)
            action.toggled.connect(lambda on, n=name: self._toggle(n, on))

    def _toggle(self, name: str, on: bool) -> None:
        rest = [n for n in self.state.now.collections if n != name]
        self.state.update(collections=tuple(rest + ([name] if on else [])))

    def _show(self) -> None:
        chosen = self.state.now.collections
        self.setText(f"Documents: {', '.join(chosen)}" if chosen else "Documents")
