"""The window's pages get their collaborators, not the window: no module of ui/ but the
window's own reaches through it (`window.X.Y`), except the two drivers of the whole
window, which click through it as a user (and the GUI tests) do."""

import re

from support import ROOT

DRIVERS = {"self_test.py", "screenshots.py"}  # `homerack self-test --gui`, `make screenshots`
CHAIN = re.compile(r"\bwindow\.\w+\.\w+")


def test_no_page_reaches_through_the_window():
    reaches = {str(p.relative_to(ROOT)): CHAIN.findall(p.read_text())
               for p in (ROOT / "ui").rglob("*.py")
               if p.name not in DRIVERS | {"main_window.py"}}
    assert {path: found for path, found in reaches.items() if found} == {}


def test_the_chain_check_finds_a_reach():
    assert CHAIN.findall("client = self.window.engine.client") == ["window.engine.client"]
