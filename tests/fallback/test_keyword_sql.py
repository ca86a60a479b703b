"""keyword_rows: FTS5 ranks a capped set of rows before the join; when filters drop the capped
rows the query runs again uncapped, so filtered searches still find every match."""

from __future__ import annotations

from pathlib import Path

from fallback.search.fts import build_fts_query
from fallback.search.keyword import MIN_INNER_ROWS, keyword_rows
from fallback.store.db import Store
from fallback.store.fts_rows import insert_chunk_fts, note_title


def _fill(store: Store, rows: list[tuple[str, str, str]]) -> None:
    with store.transaction() as conn:
        for i, (path, source, text) in enumerate(rows, start=1):
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
        plan = build_fts_query("alpha")
        assert plan is not None
        rows = keyword_rows(store, plan, sources=["memory"], limit=6)
        assert [r[1] for r in rows] == ["memory/a.md"]
        both = keyword_rows(store, plan, sources=["memory", "sessions"], limit=6)
        assert len(both) == 6 and all(r[2] == "sessions" for r in both)
    finally:
        store.close()
