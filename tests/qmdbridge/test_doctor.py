"""doctor: legacy root file split detection and repair (archive + merge), across a device
boundary where the machine allows a tmpfs mount, and the other checks' shapes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from qmdbridge.config import OpenClawConfig, parse_config, resolve_agent
from qmdbridge.doctor import LEGACY_HEADING, LEGACY_MARKER, repair_root_memory, root_memory_state, run_doctor

pytestmark = pytest.mark.anyio


def _split_ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n- canonical fact\n")
    (ws / "memory.md").write_text("- legacy fact about the router\n")
    return ws


def test_states(tmp_path: Path) -> None:
    ws = tmp_path / "w"
    ws.mkdir()
    assert root_memory_state(ws) == "none"
    (ws / "memory.md").write_text("x")
    assert root_memory_state(ws) == "legacy-only"
    (ws / "MEMORY.md").write_text("y")
    assert root_memory_state(ws) == "split"
    (ws / "memory.md").unlink()
    assert root_memory_state(ws) == "canonical"


async def test_symlinked_root_file_is_not_memory(tmp_path: Path) -> None:
    """doctor decides the root file by the same rule as indexing: a symlinked MEMORY.md is not
    memory, so the legacy memory.md is the root file, and --fix leaves the symlink alone."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "elsewhere.md").write_text("linked\n")
    (ws / "MEMORY.md").symlink_to(tmp_path / "elsewhere.md")
    assert root_memory_state(ws) == "none"
    agent = resolve_agent(OpenClawConfig(), "main", workspace=ws,
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    report = await run_doctor(agent, env={"PATH": os.environ.get("PATH", "")})
    check = next(c for c in report.checks if c.name == "root memory file")
    assert (check.level, check.detail) == ("error", "MEMORY.md is not indexed: symlink (not followed)")
    (ws / "memory.md").write_text("legacy\n")
    assert root_memory_state(ws) == "legacy-only"
    assert repair_root_memory(ws) == "MEMORY.md is a symlink (never followed): replace it with a regular file first"
    assert (ws / "MEMORY.md").is_symlink() and (ws / "memory.md").read_text() == "legacy\n"


def test_repair_split_archives_and_merges(tmp_path: Path) -> None:
    ws = _split_ws(tmp_path)
    done = repair_root_memory(ws, now=1_700_000_000.5)
    assert done.startswith("merged memory.md into MEMORY.md (archived at .openclaw-repair/root-memory/")
    assert not (ws / "memory.md").exists()
    text = (ws / "MEMORY.md").read_text()
    assert text == ("# Memory\n- canonical fact\n\n" + LEGACY_HEADING + "\n\n" + LEGACY_MARKER
                    + "\n\n- legacy fact about the router\n")
    archives = list((ws / ".openclaw-repair" / "root-memory").iterdir())
    assert len(archives) == 1
    assert (archives[0] / "memory.md").read_text() == "- legacy fact about the router\n"
    assert root_memory_state(ws) == "canonical"


def test_repair_never_overwrites_an_earlier_archive(tmp_path: Path) -> None:
    ws = _split_ws(tmp_path)
    repair_root_memory(ws, now=1_700_000_000.0)
    (ws / "memory.md").write_text("second legacy\n")
    repair_root_memory(ws, now=1_700_000_000.0)  # same timestamp on purpose
    archives = sorted((ws / ".openclaw-repair" / "root-memory").iterdir())
    assert [a.name for a in archives] == ["2023-11-14T22-13-20-000Z", "2023-11-14T22-13-20-000Z-2"]
    assert (archives[0] / "memory.md").read_text() == "- legacy fact about the router\n"
    assert (archives[1] / "memory.md").read_text() == "second legacy\n"
    assert (ws / "MEMORY.md").read_text().count(LEGACY_MARKER) == 2


def test_repair_legacy_only_renames(tmp_path: Path) -> None:
    ws = tmp_path / "w"
    ws.mkdir()
    (ws / "memory.md").write_text("only legacy\n")
    done = repair_root_memory(ws, now=1_700_000_000.0)
    assert done.startswith("renamed memory.md to MEMORY.md")
    assert sorted(os.listdir(ws)) == [".openclaw-repair", "MEMORY.md"]
    assert (ws / "MEMORY.md").read_text() == "only legacy\n"


def test_repair_across_a_device_boundary(tmp_path: Path) -> None:
    ws = _split_ws(tmp_path)
    repair = ws / ".openclaw-repair"
    repair.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(repair)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here to create a device boundary")
    try:
        assert os.stat(repair).st_dev != os.stat(ws).st_dev
        repair_root_memory(ws, now=1_700_000_000.0)
        archived = repair / "root-memory" / "2023-11-14T22-13-20-000Z" / "memory.md"
        assert archived.read_text() == "- legacy fact about the router\n"
        assert not (ws / "memory.md").exists()
        assert LEGACY_MARKER in (ws / "MEMORY.md").read_text()
    finally:
        subprocess.run(["umount", str(repair)], check=True)


async def test_run_doctor_reports_split_then_fixes(tmp_path: Path) -> None:
    ws = _split_ws(tmp_path)
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    agent = resolve_agent(OpenClawConfig(), "main", workspace=ws, env=env)
    report = await run_doctor(agent, env=env)
    by_name = {c.name: c for c in report.checks}
    assert by_name["root memory file"].level == "error"
    assert "doctor --fix" in (by_name["root memory file"].hint or "")
    assert by_name["FTS5"].level == "ok"
    assert by_name["index"].level == "warn"  # no index yet
    assert by_name["embedding provider"].level == "warn"  # keyword-only, no keys in env
    assert report.ok is False
    fixed = await run_doctor(agent, fix=True, env=env)
    root = {c.name: c for c in fixed.checks}["root memory file"]
    assert root.level == "ok" and root.fixed is True
    again = await run_doctor(agent, env=env)
    assert {c.name: c for c in again.checks}["root memory file"].detail == "MEMORY.md"


async def test_config_warnings_are_warn_checks(tmp_path: Path) -> None:
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {
        "chunking": {"tokens": -5}}}}})
    report = await run_doctor(resolve_agent(cfg, "main", workspace=tmp_path, env=env), env=env)
    assert [(c.level, c.detail) for c in report.checks if c.name == "config"] == [
        ("warn", "agents.defaults.memorySearch.chunking.tokens: -5 is out of range; using 1")]


async def test_doctor_fix_rebuilds_a_corrupt_index(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    agent = resolve_agent(OpenClawConfig(), "main", workspace=ws, env=env)
    agent.engine.db_path.parent.mkdir(parents=True)
    agent.engine.db_path.write_bytes(b"garbage, not SQLite" * 500)
    before = {c.name: c for c in (await run_doctor(agent, env=env)).checks}["index"]
    assert before.level == "error" and "doctor --fix" in (before.hint or "")
    fixed = {c.name: c for c in (await run_doctor(agent, fix=True, env=env)).checks}["index"]
    assert fixed.level == "ok" and fixed.fixed is True and fixed.detail.startswith("rebuilt (")
    assert list(agent.engine.db_path.parent.glob("main.sqlite.corrupt-*"))


def test_cli_doctor_prints_its_checks_when_the_index_cannot_be_read(tmp_path: Path) -> None:
    """A store whose pages are damaged (its header intact) fails the status the CLI doctor
    reads after its checks; the report is printed all the same, the index check saying why."""
    import sqlite3

    from tests.e2e.cli_proc import run_cli_in_process

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    for i in range(40):
        (ws / "memory" / f"2026-01-{i % 28 + 1:02d}-{i}.md").write_text(f"note {i} " * 300)
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert run_cli_in_process(["index", "--workspace", str(ws)], env).returncode == 0
    db = tmp_path / "state" / "memory" / "main.sqlite"
    sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").connection.close()
    with db.open("r+b") as f:
        f.seek(8192)
        f.write(b"\x00garbage" * 2000)
    p = run_cli_in_process(["doctor", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 1, p.stderr.decode()
    index = {c["name"]: c for c in orjson.loads(p.stdout)["checks"]}["index"]
    assert (index["level"], index["detail"]) == ("error", f"{db}: database disk image is malformed")


def _indexed_store(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A one-note workspace indexed by ``qmdbridge index``: ``(workspace, env, store file)``."""
    from tests.e2e.cli_proc import run_cli_in_process

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert run_cli_in_process(["index", "--workspace", str(ws)], env).returncode == 0
    return ws, env, tmp_path / "state" / "memory" / "main.sqlite"


def test_cli_doctor_reports_a_corrupt_store_and_only_fix_moves_it_aside(tmp_path: Path) -> None:
    from tests.e2e.cli_proc import run_cli_in_process

    ws, env, db = _indexed_store(tmp_path)
    with db.open("r+b") as f:
        f.write(b"garbage, not a SQLite header")
    damaged = db.read_bytes()
    p = run_cli_in_process(["doctor", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 1, p.stderr.decode()
    assert [(c["name"], c["detail"], c["hint"]) for c in orjson.loads(p.stdout)["checks"]
            if c["level"] == "error"] == [
        ("index", f"{db}: file is not a database",
         "run `qmdbridge doctor --fix` or `qmdbridge index --force` to rebuild it")]
    assert db.read_bytes() == damaged and not list(db.parent.glob("main.sqlite.corrupt-*"))
    fixed = run_cli_in_process(["doctor", "--fix", "--workspace", str(ws), "--json"], env)
    assert fixed.returncode == 0, fixed.stdout.decode()
    index = {c["name"]: c for c in orjson.loads(fixed.stdout)["checks"]}["index"]
    assert (index["level"], index["detail"], index["fixed"]) == (
        "ok", f"rebuilt ({db}: file is not a database)", True)
    assert len(list(db.parent.glob("main.sqlite.corrupt-*"))) == 1


def test_every_note_of_a_file_indexed_anyway_is_a_caveat_not_a_problem() -> None:
    from fallback.index.indexer import CONTROL_NAME_NOTE, ESCAPED_NAME_NOTE, INVALID_UTF8_NOTE, NUL_BYTES_NOTE
    from qmdbridge.problems import is_indexed_caveat, status_problems

    notes = [INVALID_UTF8_NOTE, NUL_BYTES_NOTE.format(count=3), ESCAPED_NAME_NOTE, CONTROL_NAME_NOTE]
    assert [is_indexed_caveat(n) for n in notes] == [True, True, True, True]
    assert is_indexed_caveat("binary file (NUL bytes)") is False
    doc = {"backend": "builtin", "skipped": [{"path": f"memory/{i}.md", "reason": n} for i, n in enumerate(notes)]}
    assert status_problems(doc) == []


def test_the_never_matching_pattern_issue_has_its_own_hint() -> None:
    from fallback.sources.memory_files import NEVER_MATCHES
    from qmdbridge.problems import NEVER_MATCHES as PROBLEM_PREFIX

    assert PROBLEM_PREFIX == NEVER_MATCHES


@pytest.mark.parametrize("status", [200, 401])
async def test_embedding_provider_probe_against_a_server(tmp_path: Path, status: int) -> None:
    """The provider check embeds one text through the configured provider (an OpenAI-shaped
    server on 127.0.0.1): ok names the provider and model; a refusal names the error."""
    from tests.fallback.embeddings_fake_server import Reply, serve

    def reply(req: object) -> Reply:
        if status != 200:
            return Reply(status, {"error": {"message": "bad key"}})
        return Reply(200, {"data": [{"index": 0, "embedding": [0.6, 0.8]}], "model": "m"})

    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "sk-t"}
    with serve(reply) as srv:
        cfg = parse_config({"agents": {"defaults": {"memorySearch": {
            "provider": "openai", "model": "text-embedding-3-small", "remote": {"baseUrl": srv.url}}}}})
        agent = resolve_agent(cfg, "main", workspace=tmp_path, env=env)
        check = {c.name: c for c in (await run_doctor(agent, env=env)).checks}["embedding provider"]
    if status == 200:
        assert (check.level, check.detail, check.hint) == ("ok", "openai text-embedding-3-small", None)
    else:
        assert (check.level, check.hint) == ("error", "check the key, the endpoint and the network")
        assert check.detail == "openai embedding failed (HTTP 401): bad key"  # named once


def test_cli_doctor_reports_a_store_that_fails_quick_check(tmp_path: Path) -> None:
    """A store SQLite opens and reads whose ``quick_check`` finds a fault (a NULL in a NOT NULL
    column): the index check is an error quoting ``quick_check``'s finding."""
    import sqlite3

    from tests.e2e.cli_proc import run_cli_in_process

    ws, env, db = _indexed_store(tmp_path)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE damaged(x)")
    conn.execute("INSERT INTO damaged VALUES (NULL)")
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE damaged(x NOT NULL)' WHERE name = 'damaged'")
    conn.execute("PRAGMA writable_schema=OFF")
    conn.close()
    p = run_cli_in_process(["doctor", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 1, p.stderr.decode()
    index = {c["name"]: c for c in orjson.loads(p.stdout)["checks"]}["index"]
    assert (index["level"], index["detail"], index["hint"]) == (
        "error", f"{db}: quick_check: NULL value in damaged.x",
        "run `qmdbridge doctor --fix` or `qmdbridge index --force` to rebuild it")
