"""Hybrid search on the postgres store: a sync writes each chunk's window vectors (the SQLite
sync's embedding step and cache), the store answers the vector side of the seam (best-window
cosine and its calibration statistics), so hybrid search, decay and MMR give the hits the
SQLite store gives; the embedding cache is shared by agents and, on an agent's first sync,
filled from its SQLite cache."""
# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.pg_fixtures import PgServer, require_postgres

require_postgres()
pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.postgres.store import PostgresStore
from fallback.store.postgres.target import resolve_target
from tests.fallback.count_provider import CountProvider
from tests.fallback.postgres.test_pg_engine import QUESTIONS, locomo_workspace

NOW_MS = 1_700_000_000_000


class WordProvider(CountProvider):
    """:class:`CountProvider` over a dozen everyday words, so the chunks of a conversation
    spread in the vector space (counts of ``alpha`` and ``beta`` are zero there)."""

    WORDS = ("i", "you", "the", "and", "to", "my", "it", "that", "with", "for", "was", "love")
    dims = len(WORDS)

    @staticmethod
    def vector(text: str) -> list[float]:
        words = text.lower().split()
        return [float(words.count(w)) for w in WordProvider.WORDS]


def engine(ws: Path, state: Path, provider: CountProvider, store: dict[str, Any], *,
           agent_id: str = "main") -> BuiltinEngine:
    search = MemorySearchSettings.model_validate(
        {"provider": "openai", "store": store,
         "query": {"hybrid": {"temporalDecay": {"enabled": True, "halfLifeDays": 30},
                              "mmr": {"enabled": True}}}})
    settings = EngineSettings.for_workspace(ws, agent_id=agent_id, state_dir=state, search=search)
    return BuiltinEngine(settings, provider_selection=ProviderSelection(provider, "test-count"),
                         now_ms=lambda: NOW_MS)


async def answers(eng: BuiltinEngine, questions: list[str]) -> list[list[dict[str, Any]]]:
    out = []
    for q in questions:
        outcome = await eng.search(SearchRequest.of(q, max_results=5))
        out.append([r.model_dump(by_alias=True) for r in outcome.results])
    return out


def assert_same_hits(got: list[list[dict[str, Any]]], want: list[list[dict[str, Any]]]) -> None:
    """The same hits in the same order; scores within 1e-6 (float32 vectors: numpy sums a
    cosine in another order than pgvector)."""
    scores = ("score", "vectorScore", "textScore")
    assert [[{k: v for k, v in h.items() if k not in scores} for h in a] for a in got] == \
        [[{k: v for k, v in h.items() if k not in scores} for h in a] for a in want]
    for a, b in zip(got, want, strict=True):
        for h, w in zip(a, b, strict=True):
            for k in scores:
                assert (h[k] is None) == (w[k] is None)
                if w[k] is not None:
                    assert abs(h[k] - w[k]) <= 1e-6, (k, h[k], w[k])


async def test_hybrid_search_on_postgres_gives_the_sqlite_hits(tmp_path: Path, pg_dsn: str) -> None:
    ws = tmp_path / "ws"
    questions = locomo_workspace(ws)
    lite = engine(ws, tmp_path / "lite", WordProvider(), {})
    pg_provider = WordProvider()
    pg = engine(ws, tmp_path / "pg", pg_provider, {"driver": "postgres", "dsn": pg_dsn})
    try:
        report = await pg.sync(reason="test")
        assert report.chunks_pending == 0 and report.chunks_embedded == report.chunks_written > 0
        want = await answers(lite, questions)
        got = await answers(pg, questions)
        assert sum(1 for a in want for h in a if h["vectorScore"]) > QUESTIONS  # vectors rank
        assert_same_hits(got, want)
        status = await pg.status()
        assert (status.provider, status.model, status.search_mode) == ("test-count", "count-v1",
                                                                       "hybrid")
        # the shared cache holds what the SQLite cache holds: one vector per window embedded
        assert status.cache == (await lite.status()).cache and status.cache["entries"] > 0
        # a second sync embeds nothing and writes nothing; an edit is embedded and found alike
        calls = pg_provider.texts_embedded
        again = await pg.sync(reason="test")
        assert (again.files_indexed, pg_provider.texts_embedded) == (0, calls)
        note = sorted((ws / "memory").glob("*.md"))[0]
        note.write_text(note.read_text() + "\nI love the new pottery class with you and my kids.\n")
        assert (await pg.sync(reason="test")).files_indexed == 1
        await lite.sync(reason="test")
        assert_same_hits(await answers(pg, questions[:5]), await answers(lite, questions[:5]))
    finally:
        await lite.close()
        await pg.close()


def notes(ws: Path) -> None:
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Facts\nAlpha team owns the beta rollout.\n")
    (ws / "memory" / "2023-11-10.md").write_text("# Standup\nAlpha alpha review went well.\n")
    (ws / "memory" / "2023-11-12.md").write_text("# Retro\nBeta testers asked for dark mode.\n")


async def test_the_shared_embedding_cache_is_pruned_to_its_cap_oldest_first(tmp_path: Path,
                                                                          pg_dsn: str) -> None:
    """``cache.maxEntries`` bounds the shared cache as it bounds a SQLite one, for each agent
    that holds an index (one agent's sync does not evict the fleet's entries): after each sync
    the oldest entries beyond it go; and status gives the vectors' length, as on SQLite."""
    store = {"driver": "postgres", "dsn": pg_dsn}
    notes(tmp_path / "ws-a")
    (tmp_path / "ws-b" / "memory").mkdir(parents=True)
    (tmp_path / "ws-b" / "MEMORY.md").write_text("# Facts\nGamma owns the delta plan.\n")
    for day, line in (("10", "Gamma gamma sync."), ("12", "Delta slipped a week.")):
        (tmp_path / "ws-b" / "memory" / f"2023-11-{day}.md").write_text(f"# Day\n{line}\n")

    def capped(ws: str, agent_id: str, provider: CountProvider) -> BuiltinEngine:
        search = MemorySearchSettings.model_validate(
            {"provider": "openai", "store": store, "cache": {"maxEntries": 2}})
        settings = EngineSettings.for_workspace(tmp_path / ws, agent_id=agent_id,
                                                state_dir=tmp_path / f"state-{agent_id}", search=search)
        return BuiltinEngine(settings, provider_selection=ProviderSelection(provider, "test-count"))

    a, b, c = CountProvider(), CountProvider(), CountProvider()
    engines = [capped("ws-a", "a", a), capped("ws-b", "b", b), capped("ws-b", "c", c)]
    try:
        assert (await engines[0].sync(reason="test")).chunks_embedded == 3
        status = await engines[0].status()
        assert status.cache == {"enabled": True, "entries": 2, "maxEntries": 2}
        assert status.vector["dims"] == CountProvider.dims == 2
        # two agents hold an index: a cap of 4, so the oldest of a's two entries goes
        assert (await engines[1].sync(reason="test")).chunks_embedded == 3
        assert (await engines[1].status()).cache["entries"] == 4
        # b's three entries stayed: the same notes as b embed nothing
        assert (await engines[2].sync(reason="test")).chunks_embedded == 3
        assert (a.texts_embedded, b.texts_embedded, c.texts_embedded) == (3, 3, 0)
        assert (await engines[2].status()).cache["entries"] == 4
    finally:
        for e in engines:
            await e.close()


async def test_a_sync_marks_the_shared_cache_entries_it_used(tmp_path: Path, pg_dsn: str) -> None:
    """A vector taken from the shared cache marks its entry used (``updated_at``), as on
    SQLite, so the cache is pruned by last use: after agent ``b`` reuses the three entries
    ``a`` wrote, the entries a third agent wrote later, and never reused, are the oldest."""
    store = {"driver": "postgres", "dsn": pg_dsn}
    for name in ("ws-a", "ws-b"):
        notes(tmp_path / name)
    (tmp_path / "ws-c" / "memory").mkdir(parents=True)
    (tmp_path / "ws-c" / "MEMORY.md").write_text("# Facts\nGamma owns the delta plan.\n")
    a = engine(tmp_path / "ws-a", tmp_path / "state-a", CountProvider(), store, agent_id="a")
    b = engine(tmp_path / "ws-b", tmp_path / "state-b", CountProvider(), store, agent_id="b")
    c = engine(tmp_path / "ws-c", tmp_path / "state-c", CountProvider(), store, agent_id="c")
    cache = "qmdbridge.embedding_cache"
    try:
        assert (await a.sync(reason="test")).windows_embedded == 3
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {cache} SET updated_at = '2001-01-01'")  # a's, written long ago
        assert (await c.sync(reason="test")).windows_embedded == 1
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            (c_hash,), = conn.execute(f"SELECT content_hash FROM {cache} WHERE updated_at > '2001-01-01'")
        report = await b.sync(reason="test")
        assert (report.chunks_embedded, report.windows_embedded) == (3, 0)  # three cache hits
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            by_use = [h for (h,) in conn.execute(f"SELECT content_hash FROM {cache} ORDER BY updated_at")]
        assert len(by_use) == 4 and by_use[0] == c_hash
    finally:
        for e in (a, b, c):
            await e.close()


async def test_the_embedding_cache_is_shared_by_agents(tmp_path: Path, pg_dsn: str) -> None:
    store = {"driver": "postgres", "dsn": pg_dsn}
    first, second = CountProvider(), CountProvider()
    for name in ("ws-a", "ws-b"):
        notes(tmp_path / name)
    a = engine(tmp_path / "ws-a", tmp_path / "state-a", first, store, agent_id="a")
    b = engine(tmp_path / "ws-b", tmp_path / "state-b", second, store, agent_id="b")
    try:
        assert (await a.sync(reason="test")).chunks_embedded == 3
        assert first.texts_embedded == 3
        report = await b.sync(reason="test")
        # the same notes on another agent: every window found in the shared cache
        assert (report.chunks_embedded, report.windows_embedded, second.batch_calls) == (3, 0, 0)
        hits = (await b.search(SearchRequest.of("alpha"))).results
        assert [h.path for h in hits][:2] == ["memory/2023-11-10.md", "MEMORY.md"]
        assert hits[0].vector_score == pytest.approx(1.0)
    finally:
        await a.close()
        await b.close()


async def test_the_first_postgres_sync_reuses_the_sqlite_embedding_cache(tmp_path: Path,
                                                                          pg_dsn: str) -> None:
    ws, state = tmp_path / "ws", tmp_path / "state"
    notes(ws)
    lite_provider, pg_provider = CountProvider(), CountProvider()
    lite = engine(ws, state, lite_provider, {})
    pg = engine(ws, state, pg_provider, {"driver": "postgres", "dsn": pg_dsn})
    try:
        await lite.sync(reason="test")
        assert lite_provider.texts_embedded == 3
        report = await pg.sync(reason="test")
        assert (report.chunks_embedded, pg_provider.batch_calls) == (3, 0)
        questions = ["alpha review", "beta testers", "dark mode", "who owns the rollout"]
        assert_same_hits(await answers(pg, questions), await answers(lite, questions))
    finally:
        await lite.close()
        await pg.close()


async def test_chunks_the_provider_could_not_embed_are_written_again_by_the_next_sync(
        tmp_path: Path, pg_dsn: str) -> None:
    ws = tmp_path / "ws"
    notes(ws)
    provider = CountProvider(fail_batch=True)
    pg = engine(ws, tmp_path / "state", provider, {"driver": "postgres", "dsn": pg_dsn})
    try:
        report = await pg.sync(reason="test")
        assert (report.files_indexed, report.chunks_pending) == (3, 3)
        # the chunks are published at once (keyword search finds them); the index is dirty
        status = await pg.status()
        assert (report.embedding_error, status.chunks, status.dirty) == (
            "test-count embedding failed: connection refused", 3, True)
        provider.fail_batch = False
        again = await pg.sync(reason="test")
        assert (again.files_indexed, again.chunks_pending, again.chunks_embedded) == (3, 0, 3)
        assert not (await pg.status()).dirty
        hits = (await pg.search(SearchRequest.of("alpha"))).results
        assert hits[0].path == "memory/2023-11-10.md" and hits[0].vector_score == pytest.approx(1.0)
    finally:
        await pg.close()


def test_m006_keeps_a_chunk_vector_as_its_window_0(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from fallback.store.postgres import migrations

    every = migrations.MIGRATIONS
    assert every[5] is migrations.m006_vector_windows
    monkeypatch.setattr(migrations, "MIGRATIONS", every[:5])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrations.migrate(conn, "qmdbridge")
        conn.execute("INSERT INTO qmdbridge.chunk_vectors (chunk_rowid, agent_id, workspace, dims,"
                     " embedding) VALUES (7, 'main', '/ws', 2, '[0.6,0.8]')")
        monkeypatch.setattr(migrations, "MIGRATIONS", every[:6])
        assert migrations.migrate(conn, "qmdbridge") == ["m006_vector_windows"]
        assert conn.execute("SELECT chunk_rowid, window_no, embedding::text FROM"
                            " qmdbridge.chunk_vectors").fetchall() == [(7, 0, "[0.6,0.8]")]
        # a second window of the chunk is a row of its own; the same window twice is refused
        conn.execute("INSERT INTO qmdbridge.chunk_vectors (chunk_rowid, window_no, agent_id,"
                     " workspace, dims, embedding) VALUES (7, 1, 'main', '/ws', 2, '[1,0]')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO qmdbridge.chunk_vectors (chunk_rowid, window_no, agent_id,"
                         " workspace, dims, embedding) VALUES (7, 1, 'main', '/ws', 2, '[0,1]')")


@pytest.mark.parametrize("in_memory", [True, False])
def test_window_search_follows_each_published_generation(pg_dsn: str, in_memory: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The windows held in memory follow the published index (a deleted file's chunks go, a
    new file's come, an unpublished sync is not seen); above the memory budget the exact SQL
    statement answers the same."""
    from fallback.store.postgres import store as pg_store
    from fallback.store.postgres.store import ChunkRow, PostgresStore
    from fallback.store.postgres.target import resolve_target

    if not in_memory:
        monkeypatch.setattr(pg_store, "MATRIX_MAX_BYTES", 0)
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")

    def sync(files: dict[str, tuple[list[float], ...]], *, publish: bool = True) -> None:
        lease = store.sync_lease(wait_ms=5000)
        assert lease is not None
        for path, windows in files.items():
            lease.write_file(path, "memory", content_hash=path, mtime_ms=1, size=1, title=path,
                             chunks=[ChunkRow(f"{path}#1", 1, 1, path, "m", path, "", windows=windows)]
                             if windows else [])
        if publish:
            lease.publish()
        else:
            lease.close()

    def search() -> tuple[list[tuple[str, float]], float, float, int]:
        hits, mean, std, count = store.window_search([2.0, 0.0], model="m", sources=["memory"], limit=5)
        return [(h, round(s, 6)) for h, s in hits], round(mean, 6), round(std, 6), count

    try:
        sync({"a.md": ([1.0, 0.0],), "b.md": ([0.0, 1.0], [0.8, 0.6])})
        assert search() == ([("a.md#1", 1.0), ("b.md#1", 0.8)], 0.9, 0.1, 2)
        sync({"a.md": (), "c.md": ([0.6, 0.8],)})
        assert search() == ([("b.md#1", 0.8), ("c.md#1", 0.6)], 0.7, 0.1, 2)
        sync({"d.md": ([1.0, 0.0],)}, publish=False)
        assert search() == ([("b.md#1", 0.8), ("c.md#1", 0.6)], 0.7, 0.1, 2)
    finally:
        store.close()


async def test_a_role_that_may_not_prune_the_shared_cache_keeps_its_sync(
        tmp_path: Path, pg_server: PgServer, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A role granted before pruning needed ``DELETE`` on the cache: its sync is published and
    answers; the cache waits over its cap, with one warning naming why."""
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    role = f"cache_{dbname}"
    with pg_server.admin(dbname) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
    owner = PostgresStore(resolve_target(pg_dsn), agent_id="r", workspace=str(tmp_path / "ws"))
    try:
        owner.register_agent("r", role_name=role)
        owner.grant_role(role)
    finally:
        owner.close()
    with pg_server.admin(dbname) as conn:
        conn.execute(f"REVOKE DELETE ON qmdbridge.embedding_cache FROM {role}")
    notes(tmp_path / "ws")
    first = engine(tmp_path / "ws", tmp_path / "state-o", CountProvider(), {"driver": "postgres", "dsn": pg_dsn},
                   agent_id="o")  # the schema owner's sync creates the vector index
    try:
        assert (await first.sync(reason="test")).chunks_embedded == 3
    finally:
        await first.close()
    search = MemorySearchSettings.model_validate(
        {"provider": "openai", "cache": {"maxEntries": 1},
         "store": {"driver": "postgres", "dsn": pg_server.dsn(dbname, user=role)}})
    settings = EngineSettings.for_workspace(tmp_path / "ws", agent_id="r", state_dir=tmp_path / "state",
                                            search=search)
    eng = BuiltinEngine(settings, provider_selection=ProviderSelection(CountProvider(), "test-count"))
    try:
        with caplog.at_level("WARNING", logger="fallback.index.lease_sync"):
            assert (await eng.sync(reason="test")).chunks_embedded == 3
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [
            "the shared embedding cache was not pruned"]
        assert "permission denied" in caplog.records[0].getMessage()
        assert (await eng.status()).cache["entries"] == 3
        hits = (await eng.search(SearchRequest.of("alpha review", max_results=5))).results
        assert [h.path for h in hits][:1] == ["memory/2023-11-10.md"]
    finally:
        await eng.close()
