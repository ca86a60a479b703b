"""keyword_rows: FTS5 ranks a capped set of rows before the join; when filters drop the capped
rows the query runs again uncapped, so filtered searches still find every match."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.search.fts import COVERAGE_MAX_CHUNKS, analyze_fts_query
from fallback.search.fts_only import keyword_search
from fallback.search.keyword import keyword_rows, rank_keyword_hits, search_plan
from fallback.store.db import Store
from fallback.store.fts_rows import insert_chunk_fts, note_title
from fallback.store.readonly import MIN_INNER_ROWS


def _fill(store: Store, rows: list[tuple[str, str, str]], *, first: int = 1) -> None:
    with store.transaction() as conn:
        for i, (path, source, text) in enumerate(rows, start=first):
            conn.execute("INSERT INTO chunks(rowid, id, path, source, start_line, end_line, hash, model,"
                         " text, embedding, updated_at) VALUES (?, ?, ?, ?, 1, 1, 'h', 'fts-only', ?, '[]', 0)",
                         (i, f"c{i}", path, source, text))
            insert_chunk_fts(conn, [(i, text)], title=note_title(path, text), fill_trigram=False)


def test_filtered_rows_beyond_the_cut_are_still_found(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        # many short session chunks rank better than the one long memory chunk
        sessions = [(f"sessions/s{i}.jsonl", "sessions", "alpha") for i in range(MIN_INNER_ROWS + 50)]
        memory = [("memory/a.md", "memory", "alpha " + "filler " * 200)]
        _fill(store, sessions + memory)
        plan = analyze_fts_query("alpha").plan()
        assert plan is not None
        rows = keyword_rows(store, plan, sources=["memory"], limit=6)
        assert [r[1] for r in rows] == ["memory/a.md"]
        both = keyword_rows(store, plan, sources=["memory", "sessions"], limit=6)
        assert len(both) == 6 and all(r[2] == "sessions" for r in both)
    finally:
        store.close()


def _chat(n: int) -> list[tuple[str, str, str]]:
    """``n`` chunks that all name Melanie; one of them is about pottery, one about turtles."""
    rows = [("memory/chat.md", "memory", f"Melanie: line {i} about nothing much"
             + (" with the kids" if i % 3 == 0 else "")) for i in range(n)]
    rows[3] = ("memory/chat.md", "memory", "Melanie: I signed up for a pottery class")
    rows[7] = ("memory/chat.md", "memory", "Caroline: my turtles love the new tank")
    return rows


def test_common_words_join_no_pair_and_a_small_store_still_searches_them(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(40))
        plan = search_plan(store, "Melanie pottery class?")
        assert plan is not None
        # "melanie" is in 39 of 40 chunks: no NEAR pair, no snippet mark, still an OR term; the
        # joined forms ("melaniepottery", "potteryclass") are in no chunk: left out
        assert plan.match == '"melanie" OR "pottery" OR "class" OR NEAR("pottery" "class", 10)'
        assert plan.mark_match == '"pottery" OR "class"'
        rows = keyword_rows(store, plan, sources=["memory"], limit=50)
        assert len(rows) == 39 and rows[0][0] == "c4"  # every Melanie line, the pottery one first
        # every part common: all of them are searched, with coverage pairs in a small store
        every = search_plan(store, "Melanie line")
        assert every is not None
        assert every.match == ('"melanie" OR "line" OR NEAR("melanie" "line", 10)'
                               ' OR ("melanie" AND "line")')
        kids = search_plan(store, "kids pottery class")  # "kids": a third of the chunks
        assert kids is not None
        assert kids.match == ('"kids" OR "pottery" OR "class" OR NEAR("kids" "pottery", 10)'
                              ' OR NEAR("pottery" "class", 10)')
    finally:
        store.close()


def test_a_large_store_leaves_common_words_out_of_the_match_without_changing_ranks(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(COVERAGE_MAX_CHUNKS + 10))
        plan = search_plan(store, "Melanie pottery class?")
        assert plan is not None
        assert plan.match == '"pottery" OR "class" OR NEAR("pottery" "class", 10)'
        assert plan.terms == ("melanie", "pottery", "class")
        hits = rank_keyword_hits(store, "Melanie pottery class?", ["memory"], 10, plan=plan)
        assert [h.chunk_id for h in hits] == ["c4"]
        # the same plan with the common word searched too: the same best row and BM25
        walked = plan._replace(match=f'{plan.match} OR "melanie"')
        with_common = keyword_rows(store, walked, sources=["memory"], limit=5)
        assert len(with_common) == 5 and with_common[0][0] == "c4"
        assert with_common[0][6] == pytest.approx(hits[0].bm25, rel=1e-4)
        # every part common: the plain OR, no coverage pairs (they would double the cost) and
        # no NEAR pair of words found in a quarter of the chunks or more ("kids": a third)
        every = search_plan(store, "Melanie line")
        assert every is not None
        assert every.match == '"melanie" OR "line"'
        kids = search_plan(store, "kids pottery class")
        assert kids is not None
        assert kids.match == '"kids" OR "pottery" OR "class" OR NEAR("pottery" "class", 10)'
    finally:
        store.close()


def test_only_hits_longer_than_the_snippet_budget_are_highlighted(tmp_path: Path) -> None:
    # A chunk that fits in the snippet budget is its own snippet: no highlight() statement runs
    # for it, and none at all when every hit is that short.
    store = Store(tmp_path / "s.sqlite")
    try:
        long = "gamma line\n" * 60 + "alpha here\n" + "gamma line\n" * 60
        _fill(store, [("memory/a.md", "memory", "alpha beta"), ("memory/b.md", "memory", long)])
        statements: list[str] = []
        store._reader.set_trace_callback(statements.append)  # type: ignore[union-attr]

        def search(limit: int) -> list[str]:
            statements.clear()
            found = keyword_search(store, "alpha", sources=["memory"], limit=limit, candidates=8,
                                   floor=0.0, half_life_days=None, now_ms=0)
            return [h.snippet for h in found.hits]

        assert search(1) == ["alpha beta"]
        assert not any("highlight(" in sql for sql in statements)
        short, window = search(2)
        assert short == "alpha beta" and len(window) <= 700
        assert window.split("\n")[31] == "alpha here"  # the window centred on the match
        assert sum("highlight(" in sql for sql in statements) == 1
    finally:
        store.close()


def test_parts_and_joined_forms_in_no_chunk_leave_the_match_and_every_rank_unchanged(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(40))
        question = "kids zebra pottery class"  # "zebra" and every joined form: in no chunk
        plan = search_plan(store, question)
        assert plan is not None
        # the NEAR pairs with "zebra" go with it; no new pair of its neighbours is made
        assert plan.match == '"kids" OR "pottery" OR "class" OR NEAR("pottery" "class", 10)'
        assert plan.mark_match == '"kids" OR "zebra" OR "pottery" OR "class"'
        query = analyze_fts_query(question)
        assert query is not None
        whole = query.plan(coverage_pairs=False)
        assert whole.match == ('"kids" OR "zebra" OR "pottery" OR "class" OR "kidszebra"'
                               ' OR "zebrapottery" OR "potteryclass" OR NEAR("kids" "zebra", 10)'
                               ' OR NEAR("zebra" "pottery", 10) OR NEAR("pottery" "class", 10)')
        rows = keyword_rows(store, plan, sources=["memory"], limit=50)
        assert len(rows) == 14 and rows[0][0] == "c4"
        assert rows == keyword_rows(store, whole, sources=["memory"], limit=50)  # same floats
        # nothing of the query in any chunk: the plan stays whole (never an empty MATCH)
        nothing = search_plan(store, "zebra giraffe")
        assert nothing is not None
        assert nothing.match == '"zebra" OR "giraffe" OR "zebragiraffe" OR NEAR("zebra" "giraffe", 10)'
        assert keyword_rows(store, nothing, sources=["memory"], limit=5) == []
    finally:
        store.close()


def test_part_counts_are_kept_until_another_connection_commits(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, _chat(40))
        statements: list[str] = []
        store._reader.set_trace_callback(statements.append)  # type: ignore[union-attr]

        def matches() -> list[int]:  # MATCH expressions of each count statement run
            ran = [sql.count("MATCH") for sql in statements if sql.startswith("SELECT data_version")]
            statements.clear()
            return ran

        assert store.part_counts(['"pottery"', '"kids"']) == (40, [1, 13])
        assert matches() == [2]
        # counted already: the statement reads only the store's data_version
        assert store.part_counts(['"kids"', '"pottery"', '"kids"']) == (40, [13, 1, 13])
        assert matches() == [0]
        assert store.part_counts(['"turtles"', '"kids"']) == (40, [1, 13])
        assert matches() == [1]
        # the writer's commit changes the reader's data_version: everything is counted again
        _fill(store, [("memory/b.md", "memory", "pottery with the kids")], first=41)
        matches()
        assert store.part_counts(['"kids"', '"pottery"']) == (41, [14, 2])
        assert matches() == [0, 2]
    finally:
        store.close()


def test_a_counted_store_of_few_chunks_ranks_in_one_statement_without_the_cut(
        tmp_path: Path) -> None:
    # Once part_counts() has counted no more chunks than FTS5 would rank before the join, the
    # ranked rows come from one statement with nothing cut and nothing counted apart; the rows
    # are those of the statement with the cut, in (rank, path, start line) order.
    store = Store(tmp_path / "s.sqlite")
    try:
        _fill(store, [*_chat(40), ("memory/a.md", "memory", "Melanie: pottery class"),
                      ("memory/0.md", "memory", "Melanie: pottery class")], first=1)
        statements: list[str] = []
        store._reader.set_trace_callback(statements.append)  # type: ignore[union-attr]
        plan = analyze_fts_query("pottery class").plan()
        assert plan is not None and plan.match is not None
        cut = keyword_rows(store, plan, sources=["memory"], limit=5)  # nothing counted yet
        assert sum("COUNT(*) FROM m" in sql for sql in statements) == 1
        assert store.part_counts(['"pottery"']) == (42, [3])
        statements.clear()
        whole = keyword_rows(store, plan, sources=["memory"], limit=5)
        ranked = [sql for sql in statements if "chunks_fts MATCH" in sql]
        assert len(ranked) == 1 and "COUNT(*) FROM m" not in ranked[0]
        assert whole == cut
        assert [r[1] for r in whole] == ["memory/0.md", "memory/a.md", "memory/chat.md"]
        assert whole[0][6] == whole[1][6] < whole[2][6]  # a tie goes by path
    finally:
        store.close()
