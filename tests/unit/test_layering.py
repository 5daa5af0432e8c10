"""The rooms' layering, read from the source (imports inside functions included): no import circle between modules,
no import from a lower room to a higher one except the documented lazy registry reads, no source file over 700
lines. See docs/architecture.md ("Rooms")."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
#: rooms from the ground up: a room imports only rooms before it in this list (docs/architecture.md)
ROOMS = ["errors", "files", "config", "algos", "data", "models", "rollout", "rewards", "envs", "track", "report",
         "train", "tasks", "pipeline", "evaluate", "plan", "cli", "api", "__main__"]
#: the documented exception: config reads the registries it validates against, lazily, inside its checks
LAZY_REGISTRY_READS = {("config", "algos"), ("config", "rollout"), ("config", "envs")}
#: the rooms inside train/, from the ground up: the run's lifecycle, what both loops share (records, batches, the
#: model's forward passes), the online step, the supervised loop
TRAIN_ROOMS = ["lifecycle", "shared", "online", "supervised"]
MAX_LINES = 700


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _targets(mod: str, is_pkg: bool, node, mods) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
    out = []
    for name in names:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in mods and name != mod:
            out.append(name)
    return out


def _imported_by_name(node) -> str | None:
    """The module of ``importlib.import_module("rlhfkit....")`` (a literal name): an import all the same."""
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("rlhfkit.")):
        return node.args[0].value
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the rlhfkit modules it imports anywhere in its source (top level or inside functions)."""
    mods = _modules()
    graph = {}
    for mod, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(mod, is_pkg, node, mods))
            elif (name := _imported_by_name(node)) is not None:
                deps.update(_targets(mod, is_pkg, ast.Import(names=[ast.alias(name)]), mods))
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


# modules of the api room beside api.py (docs/architecture.md's `api.py` row)
ROOM_OF = {"api_inputs": "api", "callbacks": "api"}


def _room(mod: str) -> str | None:
    parts = mod.split(".")
    return ROOM_OF.get(parts[1], parts[1]) if len(parts) > 1 else None


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_rooms_import_only_rooms_below_them():
    upward = []
    for mod, deps in import_graph().items():
        for dep in deps:
            a, b = _room(mod), _room(dep)
            if a is None or b is None or a == b or (a, b) in LAZY_REGISTRY_READS:
                continue
            assert a in ROOMS and b in ROOMS, f"room of {mod} or {dep} missing from ROOMS (docs/architecture.md)"
            if ROOMS.index(b) > ROOMS.index(a):
                upward.append(f"{mod} -> {dep}")
    assert upward == []


def test_train_rooms_import_only_rooms_below_them():
    """Inside train/: the lifecycle imports no loop, the shared room no loop, the online step and the supervised
    loop not each other (docs/architecture.md, "train/")."""
    upward = []
    for mod, deps in import_graph().items():
        parts = mod.split(".")
        if parts[:2] != ["rlhfkit", "train"] or len(parts) == 2:
            continue
        assert len(parts) in (3, 4) and parts[2] in TRAIN_ROOMS, f"{mod}: train's modules live in {TRAIN_ROOMS}"
        for dep in deps:
            dp = dep.split(".")
            if dp[:2] == ["rlhfkit", "train"] and len(dp) > 2 and dp[2] != parts[2]:
                if TRAIN_ROOMS.index(dp[2]) > TRAIN_ROOMS.index(parts[2]) or {dp[2], parts[2]} == {"online",
                                                                                                   "supervised"}:
                    upward.append(f"{mod} -> {dep}")
    assert upward == []


def test_an_import_by_name_is_an_import():
    tree = ast.parse('import importlib\nimportlib.import_module("rlhfkit.envs.openenv")')
    assert [_imported_by_name(n) for n in ast.walk(tree) if _imported_by_name(n)] == ["rlhfkit.envs.openenv"]


def test_no_source_file_over_700_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_test_files_have_unique_basenames():
    """pytest imports test modules by basename (rootdir-relative, no packages): two `test_x.py` in different folders
    break collection of the whole suite on a clean clone ("import file mismatch"), so they are refused here."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("*.py")):
        if path.name in seen and path.name != "__init__.py":
            clashes.append(f"{seen[path.name].relative_to(tests)} and {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, "same basename in two test folders: " + "; ".join(clashes)
