"""The type checker and the linter pass on the whole code base (as the style guide asks)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None and subprocess.run([sys.executable, "-m", name, "--version"],
                                                     capture_output=True).returncode != 0:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return [sys.executable, "-m", name]


@pytest.mark.slow  # a checker over the whole tree, as a process
def test_mypy_passes() -> None:
    out = subprocess.run([*_tool("mypy"), "qmdbridge", "fallback"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


@pytest.mark.slow  # a checker over the whole tree, as a process
def test_ruff_passes() -> None:
    out = subprocess.run([*_tool("ruff"), "check", "qmdbridge", "fallback", "tests", "scripts"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


@pytest.mark.slow  # a checker over the whole tree, as a process
def test_import_layers_and_no_cycles() -> None:
    """The layering contracts in pyproject.toml ([tool.importlinter]) hold: fallback never imports
    qmdbridge, each package's layers point one way, and no sibling modules import each other in a
    cycle."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "broken" not in out.stdout.lower().split("contracts:")[-1].split("\n")[0] or \
        ", 0 broken" in out.stdout, out.stdout[-2000:]


def _module_imports() -> dict[str, set[str]]:
    """Every module of ``qmdbridge`` and ``fallback`` and the project modules it imports at
    module level, ``if TYPE_CHECKING:`` blocks included (imports inside functions are left out:
    they run at call time and form no import cycle)."""
    import ast

    modules: dict[str, Path] = {}
    for pkg in ("qmdbridge", "fallback"):
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        stack: list[ast.stmt] = list(ast.parse(path.read_text(encoding="utf-8")).body)
        targets: set[str] = set()
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                               for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                stack.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
                stack.extend(s for h in getattr(node, "handlers", []) for s in h.body)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_no_import_cycles_counting_type_checking_imports() -> None:
    """No module of the tree imports itself back through other modules, counting the imports of
    ``if TYPE_CHECKING:`` blocks (a cycle there still ties the modules' designs together)."""
    graph = _module_imports()
    assert "qmdbridge.qmd.search_calls" in graph["qmdbridge.qmd.backend"]  # the graph is read
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)
