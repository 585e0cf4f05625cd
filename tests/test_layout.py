"""The package's layout stays acyclic: no module imports, even late inside a function, a module that
imports it back (directly or through others)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "transformer"


def imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports anywhere in its code."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("transformer.")}
        graph[path.stem] = (found & modules) - {path.stem}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other, path + [other])):
                return found
        state[module] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_the_package_has_no_import_cycle():
    graph = imports()
    assert {"train", "model", "data", "tokenizer"} <= graph.keys() and graph["train"]  # it read the package
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_a_cycle_is_found_when_there_is_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
