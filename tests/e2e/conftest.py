"""Fixtures of the end-to-end CLI tests: a copy of the example workspace and a clean environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    dst = tmp_path / "ws"
    shutil.copytree(EXAMPLE, dst)
    return dst


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("CI", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                      "MISTRAL_API_KEY")}
    e["OPENCLAW_STATE_DIR"] = str(tmp_path / "state")
    e["HOME"] = str(tmp_path / "home")
    return e
