"""One theme, light and dark, following the system's setting: Qt's Fusion style with a
palette and a small style sheet for spacing and type. The chat view's HTML takes its
colours from `colors()`, so a rendered message matches the widgets around it."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Colors:
    window: str
    base: str
    text: str
    muted: str
    accent: str
    user_bubble: str
    code_bg: str
    border: str
    error_bg: str
    notice_bg: str
    code_style: str  # a pygments style


LIGHT = Colors("#f6f7f9", "#ffffff", "#1d2430", "#6b7380", "#2f6fed", "#eef3fd",
               "#f3f4f6", "#dfe3ea", "#fbe1e3", "#e5eefc", "friendly")
DARK = Colors("#1c1f24", "#23272e", "#e6e9ef", "#98a1ae", "#6ea1ff", "#2b3444",
              "#1a1d22", "#373d47", "#5a2a2f", "#273650", "monokai")

STYLE = """
QWidget {{ font-size: 10.5pt; }}
QMainWindow, #sidebar {{ background: {window}; }}
#sidebar QListWidget {{ border: none; background: {window}; }}
#sidebar QListWidget::item {{ padding: 6px 8px; border-radius: 6px; }}
#sidebar QListWidget::item:selected {{ background: {user_bubble}; color: {text}; }}
QLineEdit, QPlainTextEdit {{
    border: 1px solid {border}; border-radius: 6px; padding: 4px 6px; background: {base}; }}
QPlainTextEdit#composer {{ padding: 8px; }}
QPushButton {{ border: 1px solid {border}; border-radius: 6px; padding: 5px 12px;
    background: {base}; }}
QPushButton:checked {{ background: {user_bubble}; border-color: {accent}; }}
QPushButton#primary {{ background: {accent}; color: white; border-color: {accent}; }}
QPushButton#primary:disabled {{ background: {border}; border-color: {border}; }}
QPushButton#chip {{ border-radius: 14px; padding: 6px 14px; }}
QLabel#muted {{ color: {muted}; }}
QLabel#heading {{ font-size: 18pt; font-weight: 600; }}
#drawer {{ background: {base}; border-left: 1px solid {border}; }}
#drawer QLabel#drawerTitle {{ font-size: 12pt; font-weight: 600; }}
QTextBrowser#chat {{ border: none; background: {base}; }}
"""


_chosen = {"scheme": "system"}  # or "light", "dark": View ▸ Appearance


def is_dark() -> bool:
    if _chosen["scheme"] != "system":
        return _chosen["scheme"] == "dark"
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def choose_scheme(scheme: str) -> None:
    """Light, dark, or as the system says; applied at once, to the widgets and the chat."""
    _chosen["scheme"] = scheme if scheme in ("light", "dark") else "system"
    app = QApplication.instance()
    _paint(app)
    scheme_changed.changed.emit()


def colors() -> Colors:
    return DARK if is_dark() else LIGHT


class _Notifier(QObject):
    changed = Signal()


scheme_changed = _Notifier()  # after the palette changed: views that paint colours redo it


def apply_theme(app: QApplication) -> None:
    """Fusion, this scheme's palette and style sheet; again when the system switches."""
    app.setStyle("Fusion")
    _paint(app)
    if not getattr(app, "_homerack_themed", False):
        QGuiApplication.styleHints().colorSchemeChanged.connect(
            lambda _scheme: (_paint(app), scheme_changed.changed.emit()))
        app._homerack_themed = True


def _paint(app: QApplication) -> None:
    chosen = colors()
    palette = QPalette()
    for role, value in ((QPalette.Window, chosen.window), (QPalette.Base, chosen.base),
                        (QPalette.AlternateBase, chosen.window), (QPalette.Text, chosen.text),
                        (QPalette.WindowText, chosen.text), (QPalette.ButtonText, chosen.text),
                        (QPalette.Button, chosen.base), (QPalette.Highlight, chosen.accent),
                        (QPalette.HighlightedText, "#ffffff"), (QPalette.Link, chosen.accent),
                        (QPalette.PlaceholderText, chosen.muted), (QPalette.ToolTipBase, chosen.base),
                        (QPalette.ToolTipText, chosen.text)):
        palette.setColor(role, QColor(value))
    app.setPalette(palette)
    app.setStyleSheet(STYLE.format(**chosen.__dict__))
