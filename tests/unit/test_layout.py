"""The tree stays easy to carry: no module over 400 lines, no function over 60, and no import
cycle among the project's modules (module-level imports; a function's own imports run late)."""
from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PACKAGES = ("conf", "state", "sinks", "streaming")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((PROJECT / package).rglob("*.py")):
            name = ".".join(path.relative_to(PROJECT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def test_no_module_over_400_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for name, path in modules().items():
        source = path.read_text()
        if source.count("\n") > 400:
            long_modules.append(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 60:
                    long_functions.append(f"{name}.{node.name}")
    assert long_modules == [] and long_functions == []


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports when it is loaded (not inside a function)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:   # relative: from the importing module's package
                parent = name.split(".")[: -node.level] if not path.name == "__init__.py" \
                    else name.split(".")[: len(name.split(".")) - node.level + 1]
                base = ".".join([*parent, node.module])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return {m for m in out if m in known and m != name}


def test_no_import_cycle():
    found = modules()
    graph = {name: _imported(name, path, set(found)) for name, path in found.items()}
    state: dict[str, int] = {}   # 1: on the path being walked, 2: done

    def walk(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                return [*path, name, nxt]
            if nxt not in state and (cycle := walk(nxt, [*path, name])):
                return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = walk(name, [])
            assert cycle is None, " -> ".join(cycle)
