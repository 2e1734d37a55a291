"""The card that asks before a tool runs: the server (its name and the program or address
behind it), the tool and what it says it does, whether it only reads or may destroy, and
the full arguments, editable, as JSON. Run once, allow in this chat, always allow, or
deny; closing the card denies. Everything on it that came from a server or the model is
plain text (inert)."""

from __future__ import annotations

import json

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout)

from app.tool_rounds import Approval

from ..safe_text import Label

CHOICES = (("once", "Run once"), ("chat", "Allow in this chat"), ("always", "Always allow"))


class ApprovalCard(QFrame):
    decided = Signal(object, str, object)  # the Approval, its choice, the arguments (dict)

    def __init__(self, approval: Approval, parent=None):
        super().__init__(parent)
        self.approval = approval
        tool = approval.tool
        self.setObjectName("approval")
        self.setFrameShape(QFrame.StyledPanel)
        self.setAccessibleName(f"Approve {tool.name} of {tool.server}")
        title = Label(f"Run {tool.name} from {tool.server}?", objectName="title")
        close = QToolButton(text="×", accessibleName="Deny and close")
        close.setToolTip("Deny this call")
        close.clicked.connect(lambda: self._decide("deny"))
        head = QHBoxLayout()
        head.addWidget(title, 1)
        head.addWidget(close)
        kind = "reads only" if tool.read_only else \
            "may change or delete things" if tool.destructive else "may change things"
        facts = Label(f"{tool.server}: {tool.describe or 'an MCP server'} — this tool {kind}",
                      objectName="muted", wordWrap=True)
        about = Label(tool.description[:600] or "(the server says nothing of this tool)",
                      wordWrap=True)
        self.arguments = QPlainTextEdit(accessibleName="The call's arguments (JSON)")
        self.arguments.setPlainText(json.dumps(approval.arguments, indent=2, ensure_ascii=False))
        self.arguments.setMaximumHeight(140)
        self.arguments.textChanged.connect(self._check)
        self.problem = Label(objectName="muted", wordWrap=True)
        self.buttons = {}
        row = QHBoxLayout()
        for choice, text in CHOICES:
            button = self.buttons[choice] = QPushButton(text, accessibleName=text)
            button.clicked.connect(lambda _=False, c=choice: self._decide(c))
            row.addWidget(button)
        row.addStretch(1)
        self.deny = QPushButton("Deny", accessibleName="Deny")
        self.deny.clicked.connect(lambda: self._decide("deny"))
        row.addWidget(self.deny)
        self.buttons["once"].setObjectName("primary")
        layout = QVBoxLayout(self)
        layout.addLayout(head)
        layout.addWidget(facts)
        layout.addWidget(about)
        layout.addWidget(Label("Arguments (you may edit them before it runs):",
                               objectName="muted"))
        layout.addWidget(self.arguments)
        layout.addWidget(self.problem)
        layout.addLayout(row)
        self.problem.hide()

    def edited(self) -> dict | None:
        try:
            value = json.loads(self.arguments.toPlainText() or "{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def _check(self) -> None:
        ok = self.edited() is not None
        self.problem.setText("" if ok else "The arguments must be a JSON object.")
        self.problem.setVisible(not ok)
        for button in self.buttons.values():
            button.setEnabled(ok)

    def _decide(self, choice: str) -> None:
        arguments = self.edited() if choice != "deny" else None
        if choice != "deny" and arguments is None:
            return
        self.decided.emit(self.approval, choice, arguments)
