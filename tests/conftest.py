"""Shared pytest fixtures for the whole test tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TEST_MODEL_NAME = "all-MiniLM-L6-v2.Q8_0.gguf"


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only."""
    return "asyncio"


def find_test_model() -> Path | None:
    """``$QMDBRIDGE_TEST_MODEL``, else ``shared/models/<name>`` beside any parent of the repo."""
    env = os.environ.get("QMDBRIDGE_TEST_MODEL")
    if env:
        p = Path(env).expanduser()
        return p if p.is_file() else None
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "models" / TEST_MODEL_NAME
        if candidate.is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def local_model_path() -> Path:
    """The real GGUF embedding model; skips without it (or llama-cpp-python), fails in CI."""
    from fallback.embeddings.local_gguf import is_llama_cpp_installed

    path = find_test_model()
    problem = None
    if path is None:
        problem = f"test model {TEST_MODEL_NAME} not found (set QMDBRIDGE_TEST_MODEL)"
    elif not is_llama_cpp_installed():
        problem = "llama-cpp-python is not installed (pip install 'qmdbridge[local]')"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    assert path is not None
    return path


@pytest.fixture(scope="session")
def qmd_bin() -> Path:
    """Absolute path of the real qmd 2.8.3 launcher installed by ``scripts/install-qmd.sh``
    (skip without it, fail under CI)."""
    from qmdbridge.qmd.locate import repo_tools_qmd

    launcher = repo_tools_qmd()
    if launcher.is_file() and os.access(launcher, os.X_OK):
        return launcher
    message = f"real qmd not installed at {launcher}; run: bash scripts/install-qmd.sh"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
