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


def test_mypy_passes() -> None:
    out = subprocess.run([*_tool("mypy"), "qmdbridge", "fallback"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_passes() -> None:
    out = subprocess.run([*_tool("ruff"), "check", "qmdbridge", "fallback", "tests", "scripts"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


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
