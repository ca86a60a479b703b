"""The ``qmdbridge`` process on a degraded builtin engine: a SQLite without FTS5 (keyword search
by substring, said in the answer and in status)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "workspace"


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


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("qmdbridge")
    argv = [exe, *args] if exe else [
        sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())", *args]
    return subprocess.run(argv, env=env, capture_output=True, timeout=120)


def test_search_without_fts5_answers_by_substring_and_warns(ws: Path, env: dict[str, str]) -> None:
    (ws / "memory" / "tickets.md").write_text("# Tickets\nThe outage ticket is ABC-1234.\n")
    assert run(["index", "--workspace", str(ws), "--json"], env).returncode == 0
    db = Path(env["OPENCLAW_STATE_DIR"]) / "memory" / "main.sqlite"
    with sqlite3.connect(db) as conn:  # what a SQLite without FTS5 leaves (migration m002)
        conn.execute("DROP TABLE chunks_fts")
        conn.execute("DROP TABLE chunks_trigram")
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_error', 'no such module: fts5')")
    p = run(["search", "ABC-1234", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert [(r["path"], r["startLine"], r["endLine"]) for r in doc["results"]] == [
        ("memory/tickets.md", 1, 2)]
    assert doc["warnings"] == ["FTS5 is unavailable in this SQLite (no such module: fts5): keyword "
                               "search is a substring scan of the chunks, without BM25 ranking"]
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert status["fts"]["keyword"] == "substring" and status["fts"]["available"] is False
    human = run(["status", "--workspace", str(ws)], env).stdout.decode()
    assert "FTS: unavailable unicode61 (keyword search: substring scan)" in human
