"""The builtin engine with the real local GGUF model (all-MiniLM-L6-v2) on the example
workspace: paraphrased queries find notes keyword search cannot, the vector modes agree, and a
model change rebuilds while the old index keeps answering until the swap."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from fallback.embeddings import create_provider, select_provider
from fallback.engine.builtin import BuiltinEngine
from fallback.index.embedding_step import BACKLOG_KEY
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings

pytestmark = [pytest.mark.anyio, pytest.mark.local_model]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workspace"


def _engine(tmp_path: Path, model: Path | None, *, state: str = "state", ws: Path | None = None,
            **extra: object) -> BuiltinEngine:
    """An engine over ``ws`` (default: a copy of the example workspace in ``tmp_path/ws``) with
    its state in ``tmp_path/<state>``, on the local model or keyword-only."""
    if ws is None:
        ws = tmp_path / "ws"
        if not ws.exists():
            shutil.copytree(EXAMPLE, ws)
    raw: dict[str, object] = {"provider": "local" if model else "none", **extra}
    if model:
        raw["local"] = {"modelPath": str(model)}
    s = MemorySearchSettings.model_validate(raw)
    es = EngineSettings.for_workspace(ws, state_dir=tmp_path / state, search=s)
    return BuiltinEngine(es, provider_selection=select_provider(s, env={}))


@pytest.fixture(scope="module")
def hybrid_index(local_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the example workspace (``ws``) and its hybrid index (``state``), every
    chunk embedded by the real model once for the module. A test that only searches uses that
    ``ws`` as it is (no test writes to it) and a copy of ``state`` (:func:`_hybrid`)."""
    root = tmp_path_factory.mktemp("hybrid")

    async def build() -> None:
        e = _engine(root, local_model_path)
        try:
            await e.sync(reason="test")
        finally:
            await e.close()

    anyio.run(build)
    return root


def _hybrid(tmp_path: Path, hybrid_index: Path, model: Path) -> BuiltinEngine:
    """An engine on the local model over the module's workspace and a copy of its index: the
    first search finds every note's chunks and vectors in place and embeds only the query."""
    shutil.copytree(hybrid_index / "state", tmp_path / "state")
    return _engine(tmp_path, model, ws=hybrid_index / "ws")


@pytest.mark.parametrize("query,expected", [
    ("medical appointment", "MEMORY.md"),            # "Health: ... Annual check-up is in March"
    # "Priya Raman owns the billing service" (keyword search stems "manages the payment system"
    # to "manager" and "payments" in MEMORY.md, so that paraphrase is no longer one it misses)
    ("who is in charge of invoices", "MEMORY.md"),
    ("fastest jog this month", "memory/2026-11-14.md"),
])
async def test_paraphrase_found_where_keyword_search_cannot(tmp_path: Path, local_model_path: Path,
                                                            hybrid_index: Path, query: str, expected: str) -> None:
    keyword = _engine(tmp_path, None, state="kw", ws=hybrid_index / "ws")
    try:
        assert expected not in [r.path for r in (await keyword.search(SearchRequest.of(query, min_score=0))).results][:2]
    finally:
        await keyword.close()
    hybrid = _hybrid(tmp_path, hybrid_index, local_model_path)
    try:
        # the default minScore (0.35): the calibrated score keeps a small model's true match,
        # whose cosine is only 0.2-0.5
        hits = (await hybrid.search(SearchRequest.of(query))).results
        assert expected in [h.path for h in hits[:2]]
        best = next(h for h in hits if h.path == expected)
        assert best.score >= 0.35 and best.vector_score is not None and best.vector_score < 0.7
        st = await hybrid.status()
        assert (st.provider, Path(st.model or "").name, st.search_mode) == ("local", "all-MiniLM-L6-v2.Q8_0.gguf", "hybrid")
        assert st.vector["dims"] == 384 and st.vector["available"] is True
    finally:
        await hybrid.close()


async def test_exact_keyword_hit_survives_min_score(tmp_path: Path, local_model_path: Path,
                                                    hybrid_index: Path) -> None:
    e = _hybrid(tmp_path, hybrid_index, local_model_path)
    try:
        hits = (await e.search(SearchRequest.of("ORBIT-10"))).results  # default minScore 0.35
        assert hits and hits[0].path in ("MEMORY.md", "memory/2026-11-09.md", "memory/projects/nebula.md")
        assert all("ORBIT" in h.snippet for h in hits)
        assert hits[0].text_score is not None and hits[0].vector_score is not None
    finally:
        await e.close()


async def test_model_change_rebuilds_and_old_index_answers_until_swap(tmp_path: Path,
                                                                      local_model_path: Path) -> None:
    ws = tmp_path / "ws"  # two of the example notes: the rebuild embeds each chunk with the model
    (ws / "memory").mkdir(parents=True)
    for note in ("MEMORY.md", "memory/2026-11-17.md"):
        shutil.copy(EXAMPLE / note, ws / note)
    fts = _engine(tmp_path, None)
    try:
        await fts.sync(reason="test")
        assert (await fts.status()).search_mode == "fts-only"
    finally:
        await fts.close()
    gate = anyio.Event()
    e = _engine(tmp_path, local_model_path)
    provider = e._provider_selection().provider
    real_embed = provider.embed_batch

    async def gated(texts: list[str]) -> list[list[float]]:
        await gate.wait()
        return await real_embed(texts)

    provider.embed_batch = gated  # the rebuild waits here, inside the temporary database
    db = e.settings.db_path
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: e.sync(reason="identity", force=False))
            with anyio.fail_after(30):
                while not list(db.parent.glob(f"{db.name}.tmp-*")):
                    await anyio.sleep(0.02)
            # mid-rebuild: the published (keyword-only) index still answers a real search
            assert list(db.parent.glob(f"{db.name}.tmp-*"))
            reader = _engine(tmp_path, None)
            try:
                hits = (await reader.search(SearchRequest.of("Parquet schema"), sync_budget_ms=0)).results
                assert hits and hits[0].path == "memory/2026-11-17.md"
            finally:
                await reader.close()
            gate.set()
        st = await e.status()
        assert st.search_mode == "hybrid" and st.vector["dims"] == 384
        assert not list(db.parent.glob(f"{db.name}.tmp-*"))
        hits = (await e.search(SearchRequest.of("medical appointment", min_score=0))).results
        assert hits[0].vector_score is not None and hits[0].vector_score > 0
    finally:
        await e.close()


async def test_searches_with_a_tight_sync_budget_work_off_the_embedding_backlog(
        tmp_path: Path, local_model_path: Path) -> None:
    """A one-shot search's sync (its budget shorter than one full embedding batch takes) sent
    32 texts, was cut off at the budget and embedded nothing, search after search; it now sends
    what fits the time left, so each search embeds some of the backlog and records what waits.
    The budget is what this model took just now for 16 of these chunks (half a batch)."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    for day in range(1, 5):
        (ws / "memory" / f"2026-03-0{day}.md").write_text("".join(
            f"## Item {day}-{i}\n\nThe router in rack {i} dropped the WAN link on day {day}; the "
            f"on-call engineer restarted it, filed ticket {day * 100 + i} and noted the firmware "
            "version, the uplink port and the time the link came back.\n\n" for i in range(16)))
    e = _engine(tmp_path, local_model_path, query={"timeoutMs": 600_000}, chunking={"tokens": 64})
    try:
        await e.sync(reason="test", embed_deadline=anyio.current_time())  # nothing embedded
    finally:
        await e.close()

    def backlog() -> tuple[int, int]:
        """Chunks without a vector, and the backlog the index meta records."""
        with closing(sqlite3.connect(tmp_path / "state" / "memory" / "main.sqlite")) as db:
            count = db.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NULL").fetchone()[0]
            (meta,) = db.execute("SELECT value FROM meta WHERE key = ?", [BACKLOG_KEY]).fetchone()
        return count, json.loads(meta)["pending"]

    total = backlog()
    assert total[0] == total[1] and total[0] >= 64, total
    with closing(sqlite3.connect(tmp_path / "state" / "memory" / "main.sqlite")) as db:
        texts = [r[0] for r in db.execute("SELECT text FROM chunks ORDER BY rowid LIMIT 16")]
    timer = create_provider("local", MemorySearchSettings.model_validate(
        {"provider": "local", "local": {"modelPath": str(local_model_path)}}), env={})
    try:
        await timer.embed_batch(texts[:1])  # loaded
        began = anyio.current_time()
        await timer.embed_batch(texts)
        budget_ms = int((anyio.current_time() - began) * 1000)
    finally:
        await timer.aclose()
    seen = [total]
    for _ in range(2):  # two one-shot searches, each in an engine of its own
        e = _engine(tmp_path, local_model_path, query={"timeoutMs": 600_000}, chunking={"tokens": 64})
        try:
            await e.search(SearchRequest.of("router firmware"), sync_budget_ms=budget_ms)
        finally:
            await e.close()
        seen.append(backlog())
    assert seen[1][0] == seen[1][1] and seen[2][0] == seen[2][1], seen  # recorded as it is
    assert seen[0][0] > seen[1][0] > seen[2][0], seen
