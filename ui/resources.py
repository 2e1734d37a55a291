"""Paths of the files in assets/."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def icon_path() -> Path:
    return ASSETS / "homerack.svg"
