"""Smoke run of ``scripts/bench_postgres.py --quick --json`` as a real process: it exits 0 and
its rows say both stores answered the same top 10, with no error and no lost row under load;
stopped by a signal, it stops the server it started. No timing is asserted (timing belongs to
the script)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.pg_fixtures import require_postgres

require_postgres()
pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[3]
DEFAULT_DATA = "/work/shared/bench/locomo-dev"  # the bench's --data default


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


def test_bench_postgres_stops_its_server_when_stopped() -> None:
    """A bench ended by a timeout's SIGTERM while its server runs stops that server and removes
    its data folder: the server's postmaster ends (within a generous bound) once the bench has
    exited. (SIGINT's KeyboardInterrupt leaves through the same ``finally`` as the SystemExit
    the bench's SIGTERM handler raises.)"""
    if not list(Path(DEFAULT_DATA).glob("conv-*.json")):
        pytest.skip(f"no LoCoMo conversations in {DEFAULT_DATA}")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "bench_postgres.py"), "--quick", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert proc.stderr is not None
        data = None
        for line in proc.stderr:  # the bench says where its server runs once it is up
            if line.startswith("postgres server running in "):
                data = Path(line.removeprefix("postgres server running in ").strip())
                break
        assert data is not None, "the bench exited before its server ran"
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        assert psutil.pid_exists(postmaster)
        server = psutil.Process(postmaster)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)  # its stderr read to the end: a full pipe would block it
        try:  # the server (not a child of this process) ends once the bench stopped it
            server.wait(timeout=60)
            left_running = False
        except psutil.TimeoutExpired:
            left_running = True
            server.terminate()  # a failure here must not leave the server behind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not left_running
    assert not data.exists()
