"""What of the engine runs in the window's process: every engine module the modules of ui/
reach (through app/, lazy imports counted) is in one of the groups ARCHITECTURE.md names,
and each of those groups is named there. A new reach fails here until the map says it."""

from test_import_cycles import ROOT, import_graph

# the groups ARCHITECTURE.md's "Rooms" lists as running in the UI's process
IN_THE_WINDOW = {"engine/catalog/", "engine/cluster/", "engine/conversation/images.py",
                 "engine/outbound.py", "engine/documents/reading.py",
                 "engine/documents/pdf_pages.py", "engine/tools/approvals.py",
                 "engine/tools/config.py", "engine/errors.py", "engine/files.py",
                 "engine/spawn.py"}
WHOLE_ROOMS = ("engine.catalog", "engine.cluster")


def reached_from_ui() -> set[str]:
    graph = import_graph(ROOT, ("engine", "app", "ui"))
    seen: set[str] = set()
    stack = [module for module in graph if module.split(".")[0] == "ui"]
    while stack:
        for target in graph[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return {m for m in seen if m.startswith("engine.")}


def group(module: str) -> str:
    room = next((r for r in WHOLE_ROOMS if module == r or module.startswith(r + ".")), None)
    if room:
        return room.replace(".", "/") + "/"
    path = module.replace(".", "/")
    return path + "/" if (ROOT / path / "__init__.py").exists() else path + ".py"


def test_the_engine_code_in_the_windows_process_is_what_the_map_says():
    reached = {group(m) for m in reached_from_ui()}
    # a package reached for its __init__ on the way to a listed module below it
    packages = {g for g in reached if g.endswith("/") and g not in IN_THE_WINDOW
                and any(listed.startswith(g) for listed in IN_THE_WINDOW)}
    assert reached - packages == IN_THE_WINDOW
    architecture = (ROOT / "ARCHITECTURE.md").read_text()
    assert {g for g in IN_THE_WINDOW if f"`{g}`" not in architecture} == set()
