"""ARCHITECTURE.md's map is each room's docstring: every package's docstring names every
module and every room (as "name/") in it (engine/speculation/__init__.py's table is the model), so a module added
without a word in its room's map fails here."""

import ast

import pytest

from support import ROOT

ROOMS = sorted(p.parent for top in ("engine", "app", "ui", "bench", "fixtures")
               for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("room", ROOMS, ids=[str(r.relative_to(ROOT)) for r in ROOMS])
def test_each_rooms_docstring_names_every_module_in_it(room):
    docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
    if room.name == "bench":  # the benches are its table's; the helpers its docstring's
        from bench import BENCHES

        docstring += " ".join(f"{b.name}.py" for b in BENCHES)
    modules = {p.name for p in room.glob("*.py")} - {"__init__.py"}
    assert {m for m in modules if m not in docstring} == set()
    rooms = {f"{p.parent.name}/" for p in room.glob("*/__init__.py")}
    assert {r for r in rooms if r not in docstring} == set()  # its rooms too, as "name/"
