"""BuiltinEngine end to end over real files and SQLite (spec §12 cases 58, 62-65, 68); the
keyword searches that take a ``store`` run on the postgres store too (``pgserver``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fallback.contract import MemoryBackend
from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import (
    BackendUnavailableError,
    ManagerClosedError,
    SearchUnavailableError,
    UsageError,
)
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from tests.fallback.count_provider import CountProvider

pytestmark = pytest.mark.anyio


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("Beta knowledge base entry.")
    (tmp_path / "memory" / "2026-01-12.md").write_text(
        "# Log\nAlpha memory line.\nZebra memory line.\nAnother line.")
    return tmp_path


def _engine(ws: Path, provider: CountProvider | None = None, **search: object) -> BuiltinEngine:
    settings = EngineSettings.for_workspace(
        ws, search=MemorySearchSettings(provider="none" if provider is None else "openai", **search))
    sel = ProviderSelection(provider, "none" if provider is None else "test-count",
                            unavailable_reason=None if provider else "provider set to none")
    return BuiltinEngine(settings, provider_selection=sel, now_ms=lambda: 1_770_681_600_000)


async def test_fts_only_bootstrap_search_and_status(ws: Path) -> None:
    engine = _engine(ws)
    assert isinstance(engine, MemoryBackend)
    hits = (await engine.search(SearchRequest.of("Alpha"))).results  # no prior sync: bootstrap on first search (case 65)
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/2026-01-12.md", 1, 4)]
    assert "Alpha" in hits[0].snippet
    # keyword-only: the keyword side's score is there (as in a hybrid hit), no vector side
    assert hits[0].vector_score is None and hits[0].text_score is not None
    assert 0 < hits[0].score <= hits[0].text_score <= 1
    assert (await engine.search(SearchRequest.of("nonexistent_xyz_keyword"))).results == []
    status = await engine.status()
    assert (status.files, status.chunks, status.dirty, status.provider, status.search_mode) == (
        2, 2, False, "none", "fts-only")
    assert [c.to_json_dict() for c in status.source_counts] == [
        {"source": "memory", "files": 2, "chunks": 2}]
    assert status.fts == {"enabled": True, "available": True, "tokenizer": "unicode61",
                          "error": None, "cjk": "trigram+like", "keyword": "bm25"}
    assert status.vector["mode"] == "disabled" and status.vector["available"] is False
    assert status.cache == {"enabled": True, "entries": 0, "maxEntries": 50000}
    assert status.db_path == str(ws / ".openclaw-state" / "memory" / "main.sqlite")
    assert status.last_sync_at_ms == 1_770_681_600_000
    await engine.close()


async def test_blank_query_and_closed_engine(ws: Path) -> None:
    engine = _engine(ws)
    with pytest.raises(UsageError, match="^query must not be empty$"):
        await engine.search(SearchRequest.of("   \n"))
    await engine.close()
    await engine.close()
    with pytest.raises(ManagerClosedError, match="builtin engine is closed"):
        await engine.search(SearchRequest.of("alpha"))
    with pytest.raises(ManagerClosedError):
        await engine.sync(reason="cli")


@pytest.mark.parametrize(("query", "path"), [
    ("2026-03-31", "memory/dated.md"),
    ("pre-edit", "memory/dated.md"),
    ('"quoted"', "memory/syntax.md"),
    ("(paren", "memory/syntax.md"),
    ("a*", None),
    ("key:value", "memory/syntax.md"),
    ("^x", None),
    ("AND", "memory/ops.md"),
    ("OR", "memory/ops.md"),
    ("NOT", "memory/ops.md"),
    ("NEAR", "memory/ops.md"),
    ("🚀", None),
    ("launch 🚀", "memory/ops.md"),
    ("-leading", "memory/syntax.md"),
])
async def test_query_syntax_hazards(ws: Path, store: dict[str, object], query: str, path: str | None) -> None:
    (ws / "memory" / "dated.md").write_text("Deadline 2026-03-31 for the pre-edit review.")
    (ws / "memory" / "syntax.md").write_text('A "quoted" word, (paren text, key:value, -leading dash.')
    (ws / "memory" / "ops.md").write_text("Rust AND Go, OR tools, NOT this, NEAR that; launch 🚀 day")
    engine = _engine(ws, store=store)
    hits = (await engine.search(SearchRequest.of(query, min_score=0.0))).results
    if path is None:
        assert all(h.path for h in hits)  # ran without raising
    else:
        assert hits[0].path == path
    await engine.close()


@pytest.mark.parametrize(("query", "path"), [
    ("戦略", "memory/ja.md"), ("戦略会議", "memory/ja.md"), ("デプロイ計画", "memory/ja.md"),
    ("价格", "memory/zh.md"), ("金银价格", "memory/zh.md"),
    ("서버", "memory/ko.md"), ("발생한", "memory/ko.md"),
    ("ข้าวผัด", "memory/th.md"), ("ร้านใกล้บ้าน", "memory/th.md"),  # fried rice; the shop near home
    ("ເຂົ້າໜຽວ", "memory/lo.md"),  # sticky rice
    ("បាយឆា", "memory/km.md"),  # fried rice
    ("ထမင်းကြော်", "memory/my.md"),  # fried rice
])
async def test_words_of_scripts_without_spaces_are_found_inside_a_sentence(
        ws: Path, store: dict[str, object], query: str, path: str) -> None:
    """CJK, Thai, Lao, Khmer and Myanmar write no spaces between words: unicode61 makes a
    sentence one token, so a word inside it is found as a substring."""
    notes = {"ja": "昨日の戦略会議でデプロイ計画を決めた", "zh": "今天讨论了金银价格的走势",
             "ko": "어제 서버에서 발생한 에러를 확인했다", "th": "เมื่อวานเราไปกินข้าวผัดที่ร้านใกล้บ้าน\n",
             "lo": "ມື້ວານນີ້ພວກເຮົາໄປກິນເຂົ້າໜຽວຢູ່ຕະຫຼາດ\n", "km": "ម្សិលមិញយើងបានញ៉ាំបាយឆានៅផ្សារ\n",
             "my": "မနေ့ကကျွန်တော်တို့ထမင်းကြော်စားခဲ့တယ်\n", "en": "We had fried rice at the shop near home.\n"}
    for name, text in notes.items():
        (ws / "memory" / f"{name}.md").write_text(text)
    engine = _engine(ws, store=store)
    hits = (await engine.search(SearchRequest.of(query))).results
    assert [h.path for h in hits] == [path]
    await engine.close()


@pytest.mark.parametrize(("query", "path"), [
    # no note holds the question verbatim: its words are searched one by one, and the first
    # characters (我们什么时候: stop words) must not take the six keyword slots
    ("我们什么时候去了支持小组？", "memory/group.md"),
    ("我們什麼時候去了支持小組？", "memory/group-hant.md"),
    ("用户喜欢喝什么茶？", "memory/tea.md"),
    ("東京の会議はいつですか", "memory/tokyo.md"),
    ("부산에서 먹은 음식은 뭐였어?", "memory/busan.md"),
])
async def test_cjk_questions_find_notes_by_their_words(ws: Path, store: dict[str, object], query: str, path: str) -> None:
    (ws / "memory" / "group.md").write_text("Caroline went to 支持小组 on Tuesday.\n")
    (ws / "memory" / "group-hant.md").write_text("上週二去了支持小組。\n")
    (ws / "memory" / "tea.md").write_text("用户只喝乌龙茶。\n")
    (ws / "memory" / "tokyo.md").write_text("東京の会議は3月20日です。\n")
    (ws / "memory" / "busan.md").write_text("부산 출장에서 돼지국밥을 먹었다.\n")
    engine = _engine(ws, store=store)
    hits = (await engine.search(SearchRequest.of(query, min_score=0.0))).results
    assert hits and hits[0].path == path, [(h.path, h.score) for h in hits]
    await engine.close()


async def test_fullwidth_query_words_find_their_ascii_form(ws: Path, store: dict[str, object]) -> None:
    # an IME left in full-width mode types ｒｏｕｔｅｒ for router
    (ws / "memory" / "net.md").write_text("The router dropped the WAN link at noon.\n")
    (ws / "memory" / "wide.md").write_text("メモ: ｒｏｕｔｅｒ の設定を変えた。\n")
    engine = _engine(ws, store=store)
    hits = (await engine.search(SearchRequest.of("ｒｏｕｔｅｒ ＷＡＮ", min_score=0.0))).results
    assert [h.path for h in hits] == ["memory/net.md", "memory/wide.md"]
    assert "router" in hits[0].snippet
    # the words as typed still match a note that holds them full-width
    assert [h.path for h in (await engine.search(SearchRequest.of("ｒｏｕｔｅｒ の設定"))).results] == ["memory/wide.md"]
    # a full-width stop word is a stop word
    assert [h.path for h in (await engine.search(SearchRequest.of("ｔｈｅ router"))).results] == ["memory/net.md"]
    await engine.close()


async def test_edits_are_picked_up_before_search(ws: Path, store: dict[str, object]) -> None:
    engine = _engine(ws, store=store)
    assert [h.path for h in (await engine.search(SearchRequest.of("zebra"))).results] == ["memory/2026-01-12.md"]
    (ws / "memory" / "2026-01-12.md").write_text("# Log\nnothing here anymore")
    (ws / "memory" / "blob.md").write_bytes(b"\x00\x01zebra")
    engine.mark_dirty("watch")
    assert (await engine.status()).dirty is True
    assert (await engine.search(SearchRequest.of("zebra"))).results == []
    status = await engine.status()
    assert [(s.path, s.reason) for s in status.skipped] == [("memory/blob.md", "binary file (NUL bytes)")]
    await engine.close()


async def test_hybrid_keyword_hit_for_zero_query_vector(ws: Path) -> None:
    provider = CountProvider()
    engine = _engine(ws, provider, query={"hybrid": {"vectorWeight": 0, "textWeight": 1}})
    await engine.sync(reason="cli", force=True)
    hits = (await engine.search(SearchRequest.of("zebra"))).results  # case 62: query vector all zeros
    assert [h.path for h in hits] == ["memory/2026-01-12.md"]
    assert hits[0].vector_score == 0.0 and hits[0].text_score > 0
    await engine.close()
    engine = _engine(ws, CountProvider())
    hits = (await engine.search(SearchRequest.of("zebra", min_score=0.35))).results  # case 64: relaxed threshold
    assert [h.path for h in hits] == ["memory/2026-01-12.md"]
    await engine.close()


async def test_hybrid_alpha_ranks_file_first_and_reports_sources(ws: Path) -> None:
    engine = _engine(ws, CountProvider())
    await engine.sync(reason="cli", force=True)
    hits = (await engine.search(SearchRequest.of("alpha"))).results  # case 58
    assert "memory/2026-01-12.md" in hits[0].path
    assert hits[0].vector_score == pytest.approx(1.0)
    status = await engine.status()
    assert [c.to_json_dict() for c in status.source_counts] == [
        {"source": "memory", "files": status.files, "chunks": status.chunks}]
    assert (status.search_mode, status.model, status.cache["entries"]) == ("hybrid", "count-v1", 2)
    assert status.vector["available"] is True
    await engine.close()


@pytest.mark.parametrize(("weights", "first"), [((0.99, 0.01), "vector-only.md"),
                                                  ((0.01, 0.99), "keyword-only.md")])
async def test_hybrid_weights_decide_order(tmp_path: Path, weights: tuple[float, float],
                                           first: str) -> None:
    (tmp_path / "vector-only.md").write_text("Alpha beta. " * 4)
    (tmp_path / "keyword-only.md").write_text("Alpha " * 200 + " beta id123.")
    engine = _engine(tmp_path, CountProvider(), extra_paths=["vector-only.md", "keyword-only.md"],
                     query={"hybrid": {"vectorWeight": weights[0], "textWeight": weights[1],
                                       "candidateMultiplier": 10}})
    hits = (await engine.search(SearchRequest.of("alpha beta id123", max_results=200, min_score=0.0))).results  # case 63
    assert sorted(h.path for h in hits) == ["keyword-only.md", "vector-only.md"]
    assert hits[0].path == first
    await engine.close()


async def test_failed_query_embedding_answers_keyword_only_unless_strict(ws: Path) -> None:
    engine = _engine(ws, CountProvider(fail_query=True), query={"keywordFallback": False})
    with pytest.raises(BackendUnavailableError) as info:  # strict: no degraded answer
        await engine.search(SearchRequest.of("zebra"))
    assert str(info.value) == ("memory search unavailable: test-count: query embedding failed: "
                               "test-count embedding failed: fetch failed")
    await engine.close()
    engine = _engine(ws, CountProvider(fail_query=True))  # the default: keyword-only, warned
    outcome = await engine.search(SearchRequest.of("zebra"))
    assert [h.path for h in outcome.results] == ["memory/2026-01-12.md"]
    assert outcome.warnings == ["query embedding failed: test-count embedding failed: fetch failed;"
                                " results come from keyword search only"]
    status = await engine.status()  # told under the provider, not as an index failure
    assert (status.healthy, status.last_error, status.vector["providerError"]) == (
        False, None, "query embedding failed: test-count embedding failed: fetch failed")
    await engine.close()


async def test_explicit_unavailable_provider_fails_closed(ws: Path) -> None:
    settings = EngineSettings.for_workspace(ws, search=MemorySearchSettings(provider="openai"))
    sel = ProviderSelection(None, "openai", unavailable_reason="No API key found for provider openai",
                            failure=SearchUnavailableError("openai", "No API key found for provider openai"))
    engine = BuiltinEngine(settings, provider_selection=sel)
    with pytest.raises(BackendUnavailableError) as info:
        await engine.search(SearchRequest.of("alpha"))
    assert str(info.value) == "memory search unavailable: openai: No API key found for provider openai"
    assert info.value.backend == "builtin"
    await engine.close()


async def test_force_sync_leaves_no_temp_files_and_read_file(ws: Path) -> None:
    engine = _engine(ws)
    await engine.sync(reason="cli", force=True)
    await engine.sync(reason="cli", force=True)
    names = [p.name for p in (ws / ".openclaw-state" / "memory").iterdir()]
    assert not [n for n in names if re.search(r"\.(tmp|backup)-", n)]
    page = await engine.read_file("memory/2026-01-12.md", from_line=2, lines=1)
    assert (page.text, page.from_line, page.lines) == (
        "Alpha memory line.\n\n[More content available. Use from=3 to continue.]", 2, 1)
    await engine.close()


async def test_concurrent_syncs_share_one_run_and_issues_are_reported(tmp_path: Path) -> None:
    import anyio

    (tmp_path / "MEMORY.md").write_text("Only the root file.")
    engine = _engine(tmp_path)
    reports: list[object] = []

    async def run() -> None:
        reports.append(await engine.sync(reason="cli"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(run)
    assert len(reports) == 2 and reports[0] is reports[1]
    status = await engine.status()
    assert status.issues == [f"memory directory missing: {tmp_path / 'memory'}"]
    assert (status.files, status.chunks) == (1, 1)
    await engine.close()


async def test_explicit_provider_that_cannot_embed_fails_closed_when_strict(ws: Path) -> None:
    provider = CountProvider(fail_batch=True)
    settings = EngineSettings.for_workspace(ws, search=MemorySearchSettings(
        provider="ollama", query={"keywordFallback": False}))
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(provider, "ollama"))
    try:
        with pytest.raises(BackendUnavailableError) as info:
            await engine.search(SearchRequest.of("alpha"))
        assert str(info.value) == ("memory search unavailable: test-count: "
                                   "test-count embedding failed: connection refused")
    finally:
        await engine.close()


async def test_emoji_query_finds_the_note(ws: Path, store: dict[str, object]) -> None:
    (ws / "memory" / "2026-02-01.md").write_text("# Trip\n- saw a 🦘 near the road\n")
    engine = _engine(ws, None, store=store)
    try:
        hits = (await engine.search(SearchRequest.of("🦘"))).results
        assert [h.path for h in hits] == ["memory/2026-02-01.md"]
    finally:
        await engine.close()


async def test_an_index_of_another_workspace_is_reindexed_past_the_sync_budget(tmp_path: Path) -> None:
    """One agent's store, last synced for workspace A: a search for B re-indexes it in full
    before answering, even with no sync budget at all (else A's notes answer for B)."""
    state = tmp_path / "state"
    spaces = {}
    for name, text in (("a", "Alpha router is an ER605."), ("b", "Bravo router is a MikroTik.")):
        spaces[name] = tmp_path / name
        (spaces[name] / "memory").mkdir(parents=True)
        (spaces[name] / "MEMORY.md").write_text(f"# Notes\n{text}\n")
    engines = {name: BuiltinEngine(EngineSettings.for_workspace(
        path, state_dir=state, search=MemorySearchSettings(provider="none")),
        provider_selection=ProviderSelection(None, "none")) for name, path in spaces.items()}
    try:
        first = (await engines["a"].search(SearchRequest.of("router"), sync_budget_ms=0)).results  # an empty index: awaited
        assert [(h.path, h.snippet) for h in first] == [("MEMORY.md", "# Notes\nAlpha router is an ER605.")]
        outcome = await engines["b"].search(SearchRequest.of("router"), sync_budget_ms=0)
        assert [(h.path, h.snippet) for h in outcome.results] == [
            ("MEMORY.md", "# Notes\nBravo router is a MikroTik.")]
        assert outcome.warnings == [
            f"index store {state / 'memory' / 'main.sqlite'} held workspace {spaces['a']}; "
            f"re-indexing it for {spaces['b']} (one index per agent: every switch re-indexes it; to "
            "keep both indexed, give each workspace its own agent (--agent, agents.list) or state "
            "dir (OPENCLAW_STATE_DIR))"]
        status = await engines["a"].status()  # engine a synced once: the store is b's now
        assert (status.dirty, status.dirty_reason) == (True, f"index holds workspace {spaces['b']}")
    finally:
        for engine in engines.values():
            await engine.close()
