"""The package's structure: no import cycles, no module reaching for another's private
names, every source file seen by the linter. Read from the source, nothing imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# the package and the built-in plugins, installed as qtrain.plugins
SOURCES = {"qtrain": ROOT / "qtrain", "qtrain.plugins": ROOT / "plugins"}
# single-file top-level modules installed beside the package (qtrain_dgl_hook)
TOP_LEVEL = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get(
    "py-modules", []
)


def _modules() -> dict[str, Path]:
    found = {name: ROOT / f"{name}.py" for name in TOP_LEVEL}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module imported, name taken from it or "", line) for every import of the package,
    at module level or inside a function, relative imports resolved."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("qtrain")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("qtrain"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append(
                    (sub, "", node.lineno) if sub in modules else (base, alias.name, node.lineno)
                )
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {m for m, _, _ in _imports(path, name, modules) if m in modules and m != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """Function-level imports count too: a lazy import is still an arrow back up."""
    graph = _graph()
    assert len(graph) > 50  # the whole package was read
    assert "qtrain_dgl_hook" in graph  # and the top-level modules beside it
    assert _cycles(graph) == []


def test_no_module_imports_another_modules_private_names() -> None:
    modules = _modules()
    wrong = [
        f"{path.relative_to(ROOT)}:{line} takes {taken} from {module}"
        for name, path in modules.items()
        for module, taken, line in _imports(path, name, modules)
        if taken.startswith("_") and not taken.endswith("__") and module != name
    ]
    assert wrong == []


def test_the_linter_sees_every_source_file() -> None:
    """ruff's default excludes once hid the package's `dist/` folder from `make lint`."""
    listed = subprocess.run(
        [
            sys.executable,
            *("-m", "ruff", "check", "--show-files", "qtrain", "plugins"),
            *(f"{name}.py" for name in TOP_LEVEL),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = {Path(line.strip()).resolve() for line in listed.splitlines() if line.strip()}
    missing = sorted(
        str(p.relative_to(ROOT)) for p in _modules().values() if p.resolve() not in seen
    )
    assert missing == []


def test_no_core_module_names_a_plugin() -> None:
    """Plugins reach the core through the registry and hooks, never the other way round
    (qtrain.plugin discovers them by name, outside any import statement)."""
    modules = _modules()
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for name, path in modules.items()
        if not name.startswith("qtrain.plugins")
        for module, _, line in _imports(path, name, modules)
        if module.startswith("qtrain.plugins")
    ]
    assert wrong == []
