"""Smoke run of ``scripts/bench_postgres.py --quick --json`` as a real process: it exits 0 and
its rows say both stores answered the same top 10, with no error and no lost row under load.
No timing is asserted (timing belongs to the script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg_fixtures import require_postgres

require_postgres()
pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[3]


def test_bench_postgres_quick() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_postgres.py"), "--quick", "--json"],
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)},
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    rows = {(r["section"], r["name"]): r for r in doc["rows"]}
    if ("setup", "LoCoMo") in rows:
        pytest.skip(rows[("setup", "LoCoMo")]["note"])
    same = rows[("keyword search", "same top 10 as SQLite")]
    assert same["value"] == int(same["note"].removeprefix("of "))
    load = "under load (4 writers + 8 searchers)"
    for store in ("SQLite store", "postgres store"):
        assert rows[(load, f"{store} errors")]["value"] == 0
        assert rows[(load, f"{store} lost rows")]["value"] == 0
    assert rows[("index", "postgres store, one agent")]["value"] > 0
    assert rows[("index", "postgres store, 3 more agents (4 syncing at once)")]["value"] > 0
