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


def import_graph() -> dict[str, set[str]]:
    """module -> the rlhfkit modules it imports anywhere in its source (top level or inside functions)."""
    mods = _modules()
    graph = {}
    for mod, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(mod, is_pkg, node, mods))
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


def _room(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None


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


def test_no_source_file_over_700_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
