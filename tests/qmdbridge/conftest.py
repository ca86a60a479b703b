"""Fixtures for tests that drive the real qmd CLI or its small stand-ins.

``qmd_bin`` is the launcher written by ``scripts/install-qmd.sh`` (``<repo>/.tools/bin/qmd``).
When it is missing the test is skipped with the install command as the reason, except when
``CI`` is set: then the test fails, so CI can never pass without exercising the real qmd.

Note that qmd itself refuses ``query``, ``vsearch`` and ``embed`` when ``CI`` is set in its
environment; ``qmd_env`` removes ``CI`` unless a test puts it back on purpose.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from qmdbridge.paths import QmdHome, child_env, ensure_home, qmd_home

STANDINS_DIR = Path(__file__).resolve().parent / "standins"


@pytest.fixture
def standins_dir() -> Path:
    """Folder of the executable qmd stand-ins (hang, noisy JSON, garbage, crash ...)."""
    return STANDINS_DIR


@pytest.fixture
def base_path_env() -> str:
    """A PATH with this Python's folder and the system folders (stand-ins need python3, sh)."""
    dirs = [os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]
    seen: list[str] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return os.pathsep.join(seen)


@pytest.fixture
def agent_home(tmp_path: Path) -> QmdHome:
    """A created qmd home for agent ``main`` under ``tmp_path/state`` (no model link)."""
    home = qmd_home(tmp_path / "state", "main")
    warnings = ensure_home(home, parent_env={"HOME": str(tmp_path / "user-home")})
    assert warnings == []
    return home


@pytest.fixture
def qmd_env(agent_home: QmdHome, tmp_path: Path, base_path_env: str) -> dict[str, str]:
    """Child environment for the real qmd in ``agent_home`` (``HOME`` in ``tmp_path``, no CI)."""
    parent = {k: v for k, v in os.environ.items() if k != "CI"}
    parent["HOME"] = str(tmp_path / "user-home")
    return child_env(agent_home, parent_env=parent, path_env=base_path_env)
