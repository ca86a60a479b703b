"""The builtin engine on the postgres store (``memorySearch.store.driver: "postgres"``): a sync
writes through the store's lease, and searches rank, cut snippets and cite exactly as on the
SQLite store of the same workspace; ``index`` then ``search`` of the CLI give the same JSON."""
# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.pg_fixtures import password_role, require_postgres

require_postgres()
pytestmark = pytest.mark.postgres

from fallback.embeddings import select_provider
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.postgres.migrations import MIGRATIONS
from tests.e2e.cli_proc import run_cli_in_process

LOCOMO = next((p / "shared" / "bench" / "locomo-dev" / "conv-26.json"
               for p in Path(__file__).resolve().parents
               if (p / "shared" / "bench" / "locomo-dev" / "conv-26.json").is_file()), None)
QUESTIONS = 25


def locomo_workspace(ws: Path) -> list[str]:
    """conv-26 as daily notes (``scripts/bench_keyword.py``'s conversion) and its questions."""
    if LOCOMO is None:
        pytest.skip("shared/bench/locomo-dev not found")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    from bench_keyword import locomo_workspace as convert

    return convert(json.loads(LOCOMO.read_text(encoding="utf-8")), ws)[:QUESTIONS]


def engine(ws: Path, state: Path, store: dict[str, Any]) -> BuiltinEngine:
    search = MemorySearchSettings.model_validate(
        {"provider": "none", "store": store,
         "query": {"hybrid": {"temporalDecay": {"enabled": True, "halfLifeDays": 30}}}})
    return BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=state, search=search),
                         provider_selection=select_provider(search, env={}), now_ms=lambda: 1_700_000_000_000)


def rounded(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hits with their scores to 9 places: both stores compute the same BM25, summed in another
    order (the last bits of a float differ)."""
    return [{**h, **{k: round(h[k], 9) for k in ("score", "textScore") if h.get(k) is not None}}
            for h in hits]


async def answers(eng: BuiltinEngine, questions: list[str]) -> list[list[dict[str, Any]]]:
    out = []
    for q in questions:
        outcome = await eng.search(SearchRequest.of(q, max_results=5))
        out.append(rounded([r.model_dump(by_alias=True) for r in outcome.results]))
    return out


@pytest.mark.anyio
async def test_search_on_postgres_ranks_snippets_and_decays_as_on_sqlite(tmp_path: Path,
                                                                         pg_dsn: str) -> None:
    ws = tmp_path / "ws"
    questions = locomo_workspace(ws)
    lite = engine(ws, tmp_path / "lite", {})
    pg = engine(ws, tmp_path / "pg", {"driver": "postgres", "dsn": pg_dsn})
    try:
        report = await pg.sync(reason="test")
        assert (report.files_indexed, report.files_deleted) == (report.files_total, 0)
        want = await answers(lite, questions)
        got = await answers(pg, questions)
        assert sum(len(a) for a in want) > QUESTIONS  # the questions find hits
        assert got == want
        # a second sync writes nothing; a deleted note leaves both stores alike
        again = await pg.sync(reason="test")
        assert (again.files_indexed, again.files_deleted) == (0, 0)
        forced = await pg.sync(reason="test", force=True)
        assert (forced.full, forced.files_indexed) == (True, report.files_total)
        assert await answers(pg, questions[:5]) == want[:5]
        gone = sorted((ws / "memory").glob("*.md"))[0]
        gone.unlink()
        assert (await pg.sync(reason="test")).files_deleted == 1
        await lite.sync(reason="test")
        assert await answers(pg, questions[:5]) == await answers(lite, questions[:5])
        status, plain = await pg.status(), await lite.status()
        assert status.custom["store"]["driver"] == "postgres"
        assert (status.files, status.chunks) == (plain.files, plain.chunks)
        # no provider: the same reason and vector view as on SQLite (status's provider note)
        assert (status.provider_unavailable_reason, status.vector, status.cache) == (
            plain.provider_unavailable_reason, plain.vector, plain.cache)
    finally:
        await lite.close()
        await pg.close()


def cli_env(tmp_path: Path, name: str, store: dict[str, Any]) -> dict[str, str]:
    state = tmp_path / name
    state.mkdir()
    (state / "openclaw.json").write_text(json.dumps({"agents": {"defaults": {
        "memorySearch": {"provider": "none", "store": store}}}}))
    return {"OPENCLAW_STATE_DIR": str(state), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}


def test_cli_index_says_why_the_counts_after_its_sync_could_not_be_read(tmp_path: Path,
                                                                        pg_dsn: str) -> None:
    import psycopg

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    env = cli_env(tmp_path, "state", {"driver": "postgres", "dsn": pg_dsn, "statementTimeoutMs": 3000})
    assert run_cli_in_process(["index", "--workspace", str(ws)], env).returncode == 0
    (ws / "memory" / "2026-12-01.md").write_text("# Standup\n\n- the kettle is red now\n")
    with psycopg.connect(pg_dsn) as held:  # the status's read of the cache waits, then times out
        held.execute("LOCK TABLE qmdbridge.embedding_cache IN ACCESS EXCLUSIVE MODE")
        index = run_cli_in_process(["index", "--workspace", str(ws)], env)
    assert index.returncode == 0, index.stderr.decode()  # the sync itself published
    assert index.stdout.decode().startswith("Memory index updated (main): ")
    assert index.stderr.decode().startswith(
        "warning: postgres unavailable: read the store's counts on database ")
    assert "timed out after 3000ms (memorySearch.store.statementTimeoutMs)" in index.stderr.decode()
    status = run_cli_in_process(["status", "--workspace", str(ws), "--json"], env)
    assert (json.loads(status.stdout)["files"], json.loads(status.stdout)["chunks"]) == (2, 2)


def test_cli_index_then_search_on_postgres_answers_as_sqlite(tmp_path: Path, pg_dsn: str) -> None:
    ws = tmp_path / "ws"
    questions = locomo_workspace(ws)[:4]
    results = {}
    for name, store in (("sqlite", {}), ("postgres", {"driver": "postgres", "dsn": pg_dsn})):
        env = cli_env(tmp_path, name, store)
        index = run_cli_in_process(["index", "--workspace", str(ws), "--backend", "builtin"], env)
        assert index.returncode == 0, index.stderr.decode()
        docs = []
        for q in questions:
            p = run_cli_in_process(["search", "--json", "--workspace", str(ws), "--backend",
                                    "builtin", q], env)
            assert p.returncode == 0, p.stderr.decode()
            doc = json.loads(p.stdout)
            docs.append(rounded(doc["results"]))
        results[name] = docs
        status = run_cli_in_process(["status", "--json", "--workspace", str(ws), "--backend", "builtin"], env)
        doc = json.loads(status.stdout)
        if name == "postgres":
            assert doc["dbPath"] == (f'postgres database "{pg_dsn.split("dbname=")[1].split()[0]}" on host'
                                     f' {pg_dsn.split("host=")[1].split()[0]} port 5432 as user postgres,'
                                     f" schema qmdbridge version {len(MIGRATIONS)}")
        results[f"{name} counts"] = (doc["files"], doc["chunks"], doc["dirty"], doc["dirtyReason"])
    assert any(results["sqlite"])
    assert results["postgres"] == results["sqlite"]
    assert results["postgres counts"] == results["sqlite counts"]
    assert results["postgres counts"][2:] == (False, None)  # indexed by another process: not dirty
    # the postgres agent's rows are in the database, and it never made a SQLite store
    assert not (tmp_path / "postgres" / "memory" / "main.sqlite").exists()
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT agent_id, count(*) FROM qmdbridge.chunks GROUP BY agent_id").fetchall()
    assert [(agent, n > 0) for agent, n in rows] == [("main", True)]


@pytest.mark.anyio
async def test_doctor_checks_the_postgres_store(tmp_path: Path, pg_dsn: str, pg_server: Any) -> None:
    from qmdbridge.config import parse_config, resolve_agent
    from qmdbridge.doctor import run_doctor

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}

    async def index_check(dsn: str) -> tuple[str, str, str | None]:
        cfg = parse_config({"agents": {"defaults": {"memorySearch": {
            "provider": "none", "store": {"driver": "postgres", "dsn": dsn, "connectTimeoutMs": 2000}}}}})
        agent = resolve_agent(cfg, "main", workspace=ws, env=env)
        check = next(c for c in (await run_doctor(agent, env=env)).checks if c.name == "index")
        return check.level, check.detail, check.hint

    level, detail, hint = await index_check(pg_dsn)
    assert (level, hint) == ("warn", "run `qmdbridge index`")
    assert detail.endswith(f", schema qmdbridge version {len(MIGRATIONS)}: 0 files, 0 chunks (no index yet)")
    gone = pg_server.dsn("postgres").replace(str(pg_server.data_dir), str(tmp_path / "no-server"))
    level, detail, hint = await index_check(gone)
    assert level == "error" and "cannot reach PostgreSQL to connect" in detail
    assert hint is not None and hint.startswith("start the server")
    with password_role(pg_server, "doctor_user"):
        level, detail, hint = await index_check(
            pg_server.dsn("postgres", user="doctor_user", password="s3cret-pw"))
    assert level == "error" and "PostgreSQL refused the login" in detail
    assert 'password authentication failed for user "doctor_user"' in detail
    assert "s3cret-pw" not in detail
    assert hint is not None and hint.startswith("check the user and password")


@pytest.mark.anyio
async def test_a_dropped_table_is_told_with_what_to_do_and_status_still_answers(
        tmp_path: Path, pg_server: Any, pg_dsn: str) -> None:
    import psycopg

    from fallback.store.postgres.errors import PostgresUnavailableError

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    eng = engine(ws, tmp_path / "state", {"driver": "postgres", "dsn": pg_dsn})
    try:
        assert len((await eng.search(SearchRequest.of("kettle"))).results) == 1
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE qmdbridge.term_stats")
        with pytest.raises(PostgresUnavailableError) as caught:
            await eng.search(SearchRequest.of("kettle"))
        assert str(caught.value).startswith(
            "postgres unavailable: the store's schema qmdbridge lacks a table or is gone: "
            'relation "qmdbridge.term_stats" does not exist')
        assert caught.value.hint.startswith("restore schema qmdbridge from a backup (pg_dump -n qmdbridge)")
        status = await eng.status()  # told, not raised
        assert status.last_error is not None and status.last_error.startswith(
            "postgres unavailable: the store's schema qmdbridge lacks a table or is gone: ")
        assert status.db_path.endswith("schema qmdbridge (not reached)")
    finally:
        await eng.close()


def test_cli_doctor_prints_its_checks_when_the_server_is_down(tmp_path: Path, pg_server: Any) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n")
    gone = pg_server.dsn("postgres").replace(str(pg_server.data_dir), str(tmp_path / "no-server"))
    env = cli_env(tmp_path, "state", {"driver": "postgres", "dsn": gone, "connectTimeoutMs": 2000})
    p = run_cli_in_process(["doctor", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 1, p.stderr.decode()
    checks = {c["name"]: c for c in json.loads(p.stdout)["checks"]}  # the report, not one error
    assert checks["index"]["level"] == "error"
    assert "cannot reach PostgreSQL to connect" in checks["index"]["detail"]
    assert checks["index"]["hint"].startswith("start the server")
    assert checks["root memory file"]["level"] == "ok"


@pytest.mark.anyio
async def test_an_agent_connecting_with_its_own_role_syncs_and_searches_from_its_config(
        tmp_path: Path, pg_server: Any, pg_dsn: str) -> None:
    """docs/postgres.md "Row-level security": after the schema owner's setup, an agent whose
    ``store.dsn`` names its own role (not the owner, no right to create anything) syncs and
    searches through its config, ``shareWith`` included, and keeps the role the owner recorded."""
    import psycopg

    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target

    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        conn.execute("DROP ROLE IF EXISTS main_role")
        conn.execute("CREATE ROLE main_role LOGIN NOSUPERUSER")
    owner = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace=str(tmp_path / "ws"))
    try:
        owner.register_agent("main", role_name="main_role", share_with=["reviewer"])
        owner.grant_role("main_role")
    finally:
        owner.close()
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-12-01.md").write_text("# Trip\nThe heron nests by the north pier.\n")
    store = {"driver": "postgres", "dsn": pg_server.dsn(dbname, user="main_role"),
             "shareWith": ["reviewer"]}
    eng = engine(ws, tmp_path / "state", store)
    try:
        report = await eng.sync(reason="test")
        assert (report.files_indexed, report.files_total) == (1, 1)
        outcome = await eng.search(SearchRequest.of("where does the heron nest?"))
        assert [r.path for r in outcome.results] == ["memory/2026-12-01.md"]
    finally:
        await eng.close()
    with pg_server.admin(dbname) as conn:
        assert conn.execute("SELECT role_name FROM qmdbridge.agents WHERE agent_id = 'main'"
                            ).fetchall() == [("main_role",)]
        assert conn.execute("SELECT reader_agent FROM qmdbridge.shares WHERE owner_agent = 'main'"
                            ).fetchall() == [("reviewer",)]


def test_serve_tells_each_search_the_outage_failed_in_one_line(tmp_path: Path) -> None:
    """``serve`` while the database is down: each failed search is one stderr line with the
    store's message, not the connection pool's own records of every reconnect attempt (a dozen
    lines per search), and comes at once (the socket is gone: nothing to wait for), not after
    connectTimeoutMs; a status meanwhile is one (unhealthy, the error as lastError, nothing counted);
    the first search after the server is back answers."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.pg_fixtures import new_data_dir, start_pgserver

    server = start_pgserver(new_data_dir())
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-12-01.md").write_text("# Trip\nThe heron nests by the north pier.\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY")}
    env.update(cli_env(tmp_path, "state", {"driver": "postgres", "dsn": server.dsn(),
                                           "connectTimeoutMs": 30_000}), PATH=os.environ["PATH"])
    proc = subprocess.Popen([sys.executable, "-m", "qmdbridge", "serve", "--no-socket", "--workspace",
                             str(ws)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        def ask(rid: int) -> dict[str, Any]:
            proc.stdin.write(json.dumps({"id": rid, "tool": "memory_search", "params": {"query": "heron"}}) + "\n")
            proc.stdin.flush()
            reply: dict[str, Any] = json.loads(proc.stdout.readline())["result"]
            return reply

        assert [r["path"] for r in ask(1)["results"]] == ["memory/2026-12-01.md"]
        server.stop()
        failed = []
        for rid in (2, 3):
            failed.append(ask(rid))
        # the socket is gone (a refusal), not the 30 s connect deadline passed
        assert all(f["disabled"] and f["error"].startswith("postgres unavailable: ")
                   and "No such file or directory" in f["error"] for f in failed), failed
        proc.stdin.write(json.dumps({"id": 9, "tool": "status"}) + "\n")  # a status, not an error
        proc.stdin.flush()
        down = json.loads(proc.stdout.readline())["result"]
        assert (down["healthy"], down["files"], down["dbPath"].endswith(", schema qmdbridge (not reached)"),
                down["lastError"].startswith("postgres unavailable: ")) == (False, 0, True, True)
        server.start()
        assert [r["path"] for r in ask(4)["results"]] == ["memory/2026-12-01.md"]
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
        assert proc.stderr.read().splitlines() == [
            f"qmdbridge serve: agent main, backend builtin, workspace {ws}",
            *(f"memory_search failed: {f['error']}" for f in failed), "qmdbridge serve: stopped"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.mark.anyio
async def test_thai_chunks_indexed_without_trigram_postings_are_named_until_a_forced_sync(
        tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Thai note as the store wrote it before Thai took the substring path (no trigram
    postings, no trigram length): a word inside its sentence is not found, and status and
    doctor say so and what to run, whether status reads the Thai words' postings or the word
    lists of the chunks without trigrams; ``index --force`` writes its postings, and the word
    is found."""
    import psycopg

    from fallback.store.postgres import seam
    from qmdbridge.config import parse_config, resolve_agent
    from qmdbridge.doctor import run_doctor

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "th.md").write_text("เมื่อวานเราไปกินข้าวผัดที่ร้านใกล้บ้าน\n")  # fried rice
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    store = {"driver": "postgres", "dsn": pg_dsn}
    agent = resolve_agent(parse_config({"agents": {"defaults": {"memorySearch": {
        "provider": "none", "store": store}}}}), "main", workspace=ws, env=env)

    async def index_check() -> tuple[str, str, str | None]:
        check = next(c for c in (await run_doctor(agent, env=env)).checks if c.name == "index")
        return check.level, check.detail, check.hint

    eng = engine(ws, tmp_path / "state", store)
    try:
        await eng.sync(reason="test")
        assert [r.path for r in (await eng.search(SearchRequest.of("ข้าวผัด"))).results] == ["memory/th.md"]
        assert (await eng.status()).issues == []
        assert (await index_check())[0] == "ok"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM qmdbridge.trigram_postings")
            conn.execute("UPDATE qmdbridge.chunks SET trigram_len = NULL")
            conn.execute("UPDATE qmdbridge.workspaces SET trigram_chunk_count = 0, trigram_token_count = 0")
        assert (await eng.search(SearchRequest.of("ข้าวผัด"))).results == []
        issue = ("1 chunk of Thai, Lao, Khmer or Myanmar text indexed before those scripts were"
                 " searched as substrings: a word inside their sentences is not found until their"
                 " file changes or `qmdbridge index --force` runs")
        assert (await eng.status()).issues == [issue]
        monkeypatch.setattr(seam, "POSTINGS_PER_WORD_LIST", 0)  # the chunks' word lists
        assert (await eng.status()).issues == [issue]
        level, detail, hint = await index_check()
        assert (level, hint) == ("warn", "run `qmdbridge index --force`")
        assert detail.endswith(f": 2 files, 2 chunks; {issue}")
        await eng.sync(reason="test", force=True)
        assert [r.path for r in (await eng.search(SearchRequest.of("ข้าวผัด"))).results] == ["memory/th.md"]
        assert (await eng.status()).issues == []
        monkeypatch.undo()
        assert (await eng.status()).issues == []
        assert (await index_check())[0] == "ok"
    finally:
        await eng.close()


def test_status_lists_the_files_the_published_sync_skipped_as_on_sqlite(tmp_path: Path, pg_dsn: str) -> None:
    """``status`` run after the ``index`` that skipped them (its engine gone) lists the binary,
    too large and not UTF-8 files, and notes indexed with a caveat, as the SQLite store's does;
    a later sync that no longer skips a file drops it."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- the kettle is blue\n")
    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01binary")
    (ws / "memory" / "big.md").write_text("word " * 400)
    (ws / "memory" / "latin1.md").write_bytes("caf\xe9 on the corner\n".encode("latin-1"))
    listed = {}
    for name, store in (("sqlite", {}), ("postgres", {"driver": "postgres", "dsn": pg_dsn})):
        env = cli_env(tmp_path, name, store)
        cfg = json.loads((tmp_path / name / "openclaw.json").read_text())
        cfg["agents"]["defaults"]["memorySearch"]["maxFileBytes"] = 1000
        (tmp_path / name / "openclaw.json").write_text(json.dumps(cfg))
        args = ["--workspace", str(ws), "--backend", "builtin"]
        assert run_cli_in_process(["index", *args], env).returncode == 0
        listed[name] = json.loads(run_cli_in_process(["status", "--json", *args], env).stdout)["skipped"]
    assert listed["postgres"] == listed["sqlite"]
    assert [f["path"] for f in listed["postgres"]] == ["memory/big.md", "memory/blob.md", "memory/latin1.md"]
    (ws / "memory" / "big.md").write_text("word " * 10)
    assert run_cli_in_process(["index", *args], env).returncode == 0
    assert [f["path"] for f in json.loads(run_cli_in_process(["status", "--json", *args], env).stdout)[
        "skipped"]] == ["memory/blob.md", "memory/latin1.md"]


async def _status_on_both_stores(tmp_path: Path, pg_dsn: str, search: dict[str, Any],
                                 selection: Callable[[MemorySearchSettings], Any], *,
                                 query: str | None = None) -> list[Any]:
    """The engine status of one workspace on the SQLite store, then on postgres (``search``
    plus the store; ``query`` searched first when given)."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nalpha beta router firmware\n")
    statuses = []
    for name, store in (("lite", {}), ("pg", {"driver": "postgres", "dsn": pg_dsn})):
        settings = MemorySearchSettings.model_validate({**search, "store": store})
        eng = BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=tmp_path / name, search=settings),
                            provider_selection=selection(settings))
        try:
            if query is not None:
                await eng.search(SearchRequest.of(query, max_results=5))
            statuses.append(await eng.status())
        finally:
            await eng.close()
    return statuses


def _count_provider(**kwargs: Any) -> Callable[[MemorySearchSettings], Any]:
    from fallback.embeddings import ProviderSelection
    from tests.fallback.count_provider import CountProvider

    return lambda _settings: ProviderSelection(CountProvider(**kwargs), "test-count")


@pytest.mark.anyio
async def test_a_provider_that_fails_closed_makes_search_unavailable_as_on_sqlite(tmp_path: Path,
                                                                                   pg_dsn: str) -> None:
    statuses = await _status_on_both_stores(tmp_path, pg_dsn, {"provider": "openai"},
                                            lambda settings: select_provider(settings, env={}))  # no API key
    assert [(st.search_mode, st.provider_unavailable_reason) for st in statuses] == [
        ("unavailable", "memory search unavailable: openai: no API key found for openai")] * 2


@pytest.mark.anyio
async def test_a_vector_only_search_has_no_keyword_side_as_on_sqlite(tmp_path: Path, pg_dsn: str) -> None:
    statuses = await _status_on_both_stores(tmp_path, pg_dsn, {"query": {"hybrid": {"enabled": False}}},
                                            _count_provider())
    assert [(st.search_mode, st.fts["enabled"]) for st in statuses] == [("vector-only", False)] * 2


@pytest.mark.anyio
async def test_a_local_model_not_downloaded_is_the_same_status_on_both_stores(tmp_path: Path,
                                                                              pg_dsn: str) -> None:
    search = {"provider": "local",
              "local": {"modelPath": "hf:org/repo/model.gguf", "modelCacheDir": str(tmp_path / "models")}}
    statuses = await _status_on_both_stores(tmp_path, pg_dsn, search,
                                            lambda settings: select_provider(settings, env={}))
    missing = f"local model hf:org/repo/model.gguf is not downloaded yet ({tmp_path}/models/hf/org/repo/model.gguf)"
    assert [(st.search_mode, st.healthy, {k: st.vector.get(k) for k in ("providerError", "modelMissing")})
            for st in statuses] == [("fts-only", False, {"providerError": None, "modelMissing": missing})] * 2


@pytest.mark.anyio
async def test_a_query_the_provider_failed_to_embed_is_the_same_status_on_both_stores(tmp_path: Path,
                                                                                       pg_dsn: str) -> None:
    statuses = await _status_on_both_stores(tmp_path, pg_dsn, {}, _count_provider(fail_query=True), query="alpha")
    failed = "query embedding failed: test-count embedding failed: fetch failed"
    assert [(st.healthy, st.last_error, st.vector.get("providerError")) for st in statuses] == [
        (False, None, failed)] * 2
    # Another engine of the store (another process; on postgres another host, with a state
    # folder of its own) tells it too, until one of its queries embeds: status, search, status
    # of a third engine.
    told = []
    for state, store in (("lite", {}), ("pg-host-2", {"driver": "postgres", "dsn": pg_dsn})):
        settings = MemorySearchSettings.model_validate({"store": store})
        for query in (None, "alpha", None):
            eng = BuiltinEngine(EngineSettings.for_workspace(tmp_path / "ws", state_dir=tmp_path / state,
                                                             search=settings),
                                provider_selection=_count_provider()(settings))
            try:
                if query is not None:
                    await eng.search(SearchRequest.of(query, max_results=5))
                told.append((state, (await eng.status()).vector.get("providerError")))
            finally:
                await eng.close()
    assert told == [("lite", failed), ("lite", None), ("lite", None),
                    ("pg-host-2", failed), ("pg-host-2", None), ("pg-host-2", None)]


@pytest.mark.anyio
async def test_a_failed_sync_is_the_same_status_on_both_stores(tmp_path: Path, pg_dsn: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A sync the store fails (full, or a statement past its timeout) is told by the status of
    another engine (another process; on postgres another host, with a state folder of its own)
    on both stores, until a sync succeeds; on postgres the failure is kept in the store, not
    beside a SQLite file."""
    import psycopg

    from fallback.errors import BackendTimeoutError, IndexStoreError
    from qmdbridge.problems import status_problems

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router is an Omada ER605.\n")
    told: list[tuple[Any, ...]] = []

    def new_engine(state: str, store: dict[str, Any]) -> BuiltinEngine:
        search = MemorySearchSettings.model_validate({"provider": "none", "store": store})
        return BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=tmp_path / state, search=search),
                             provider_selection=select_provider(search, env={}))

    async def tell(state: str, store: dict[str, Any], *, sync: bool = False) -> None:
        eng = new_engine(state, store)
        try:
            if sync:
                await eng.sync(reason="test")
            st = await eng.status()
        finally:
            await eng.close()
        failed = st.custom.get("syncFailure")
        told.append((state, st.healthy, st.last_error, None if failed is None else (
            failed["reason"], failed["errorType"], failed["filesWaiting"]),
            [p["message"] for p in status_problems(st.to_json_dict()) if p["check"] == "index"]))

    pg = {"driver": "postgres", "dsn": pg_dsn}
    cases: list[tuple[str, dict[str, Any], tuple[str, str] | None]] = [
        ("lite", {}, None),  # PostgreSQL's full disk and a statement past statement_timeout, as
        # the server raises them for the next chunk row:
        ("pg", pg, ("disk_full", "could not extend file: No space left on device")),
        ("pg", pg, ("query_canceled", "canceling statement due to statement timeout"))]
    for name, store, failure in cases:
        eng = new_engine(name, store)
        try:
            await eng.sync(reason="test")
            if failure is not None:
                with psycopg.connect(pg_dsn, autocommit=True) as conn:
                    conn.execute("CREATE OR REPLACE FUNCTION fail_row() RETURNS trigger LANGUAGE plpgsql AS"
                                 f" $$ BEGIN RAISE EXCEPTION '{failure[1]}' USING ERRCODE = '{failure[0]}'; END $$")
                    conn.execute("CREATE TRIGGER fail_row BEFORE INSERT ON qmdbridge.chunks"
                                 " FOR EACH ROW EXECUTE FUNCTION fail_row()")
            else:  # the SQLite file may not grow by one page
                conn = eng._stores.store.conn
                conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
            for day in range(1, 4):
                (ws / "memory" / f"2026-01-0{day}.md").write_text(f"Heron count {day}.\n" * 200)
            with caplog.at_level("WARNING"), pytest.raises((IndexStoreError, BackendTimeoutError)) as info:
                await eng.sync(reason="cli")
        finally:
            await eng.close()
        assert type(info.value).__name__ == {None: "IndexStoreFullError", "disk_full": "PostgresStoreError",
                                             "query_canceled": "PostgresTimeoutError"}[failure and failure[0]]
        error = f"sync (cli) failed: {info.value}"
        other = name if not store else "pg-host-2"
        await tell(other, store)
        if store:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute("DROP TRIGGER fail_row ON qmdbridge.chunks")
        await tell(other, store, sync=True)
        await tell(other, store)
        for day in range(1, 4):
            (ws / "memory" / f"2026-01-0{day}.md").unlink()
        waiting = None if store else 3  # postgres does not count the files waiting
        problem = f"last sync (cli) failed: {info.value}" + (
            "" if waiting is None else f"; memory files waiting to be indexed: {waiting}")
        assert told[-3:] == [(other, False, error, ("cli", type(info.value).__name__, waiting), [problem]),
                             (other, True, None, None, []), (other, True, None, None, [])], name
    assert [m for m in caplog.messages if "record" in m or ".sqlite" in m] == []
