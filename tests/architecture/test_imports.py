"""The shape of the package: no import cycles (imports inside functions and under
``TYPE_CHECKING`` counted), every path name of the layout spelled once, and a light
``import memstore``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import memstore
import memstore.layout

PACKAGE = Path(memstore.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module) if node.level else (node.module or "")
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                # Importing a.b.c imports a and a.b too; a package's own __init__ is not a cycle.
                while target:
                    if target in modules and target != name and not name.startswith(target + "."):
                        graph[name].add(target)
                    target = target.rpartition(".")[0]
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    """No module reaches itself through imports, counting those inside functions and under
    TYPE_CHECKING (the package __init__'s lazy names are not imports)."""
    graph = _import_graph()
    # The package root re-exports from everything; what matters is that no module below it
    # imports back into a module that imports it.
    for deps in graph.values():
        deps.discard("memstore")
    assert _cycles(graph) == []


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_layout_names_are_spelled_once():
    """Every file name of a store, and every directory name used as a path component, is written
    only in memstore/layout.py (docstrings may mention them)."""
    names = {
        value
        for key, value in vars(memstore.layout).items()
        if key.isupper() and isinstance(value, str) and key.endswith(("_DIR", "_FILE", "_LOG", "_PREFIX"))
    }
    files = [n for n in names if "." in n.lstrip(".") or n.endswith("-")]
    dirs = [n for n in names if n not in files]
    file_pattern = re.compile("|".join(rf"(?:^|/){re.escape(n)}(?:$|/)" for n in files))
    dir_pattern = re.compile("|".join(rf"^{re.escape(n)}/" for n in dirs))  # a relative store path
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == Path(memstore.layout.__file__):
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            hit = False
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                hit = bool(file_pattern.search(node.value) or dir_pattern.search(node.value))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
                hit = node.right.value in names
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "joinpath"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                hit = node.args[0].value in names
            if hit:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_import_memstore_loads_no_numpy_and_no_store_wide_module():
    """``import memstore`` loads the write path only (PEP 562 lazy attributes for the rest)."""
    code = (
        "import sys, memstore\n"
        "print(','.join(sorted(m for m in sys.modules if m in ('numpy', 'datasette', 'sqlite_utils', 'click')\n"
        "    or m in ('memstore.search', 'memstore.catalog', 'memstore.importers', 'memstore.demo',\n"
        "             'memstore.retention', 'memstore.migration', 'memstore.maintenance', 'memstore.explorer'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout.strip() == ""


def test_every_lazy_name_resolves():
    """Each public name the package lists loads from the module it names."""
    for name in memstore.__all__:
        assert getattr(memstore, name) is not None, name


def test_opening_a_new_session_and_appending_loads_no_numpy_and_no_sqlite_utils(tmp_path):
    """What an agent hook does in a fresh process: open a session that does not exist yet, append
    one event, close. Its index is a copy of the empty index (made once per schema and cached),
    so the hook loads neither sqlite-utils nor numpy (nor what they import)."""
    code = (
        "import sys, memstore\n"
        "log = memstore.open_session(sys.argv[1], sys.argv[2])\n"
        "log.append({'type': 'item.completed', 'item': {'type': 'agent_message', 'text': 'ran the tests'}})\n"
        "log.close()\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "    ('numpy', 'sqlite_utils', 'dateutil', 'pluggy', 'click', 'datasette'))))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MEMSTORE_CACHE_DIR": str(tmp_path / "cache")}
    root = tmp_path / "store"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(root), f"hook-{n}"], capture_output=True, text=True, check=True, env=env
        )
        for n in range(3)
    ]
    # The first process of a schema may build the cached empty index; every later one copies it.
    assert [run.stdout.strip() for run in runs[1:]] == ["", ""]
    for n in range(3):
        with memstore.open_session(root, f"hook-{n}") as log:
            assert [e["type"] for e in log.iter_events()] == ["item.completed"]
