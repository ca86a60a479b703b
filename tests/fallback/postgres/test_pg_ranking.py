"""The postgres store ranks keyword rows as the SQLite store's FTS5 bm25() does: same chunks,
same plans (fallback/search/fts.py via search_plan), same top-k order and ranks."""
# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.pg_fixtures import require_postgres, round_trips

require_postgres()
pytestmark = pytest.mark.postgres

import psycopg

from fallback.search.keyword import keyword_rows, rank_keyword_hits, search_plan
from fallback.store.db import Store
from fallback.store.fts_rows import insert_chunk_fts, note_title
from fallback.store.postgres import store as pg_store
from fallback.store.postgres.seam import PostgresSearchStore
from fallback.store.postgres.store import ChunkRow, FileRows, PostgresStore
from fallback.store.postgres.target import resolve_target
from fallback.text.chunking import chunk_markdown
from fallback.text.terms import derived_terms

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
LOCOMO = next((p / "shared" / "bench" / "locomo-dev" / "conv-26.json"
               for p in Path(__file__).resolve().parents
               if (p / "shared" / "bench" / "locomo-dev" / "conv-26.json").is_file()), None)
TURNS_PER_CHUNK = 4


def locomo_files() -> tuple[dict[str, list[tuple[int, int, str]]], list[str]]:
    """``{path: [(start_line, end_line, text)]}`` of conv-26's sessions, and its questions."""
    if LOCOMO is None:
        pytest.skip("shared/bench/locomo-dev not found")
    data = json.loads(LOCOMO.read_text())
    files: dict[str, list[tuple[int, int, str]]] = {}
    n = 1
    while f"session_{n}" in data:
        lines = [f"{t['speaker']}: {t['text']}" for t in data[f"session_{n}"]]
        header = f"# Session {n} ({data.get(f'session_{n}_date_time', '')})"
        body = [header, *lines]
        files[f"memory/session-{n:02d}.md"] = [
            (i + 1, min(i + TURNS_PER_CHUNK, len(body)), "\n".join(body[i:i + TURNS_PER_CHUNK]))
            for i in range(0, len(body), TURNS_PER_CHUNK)]
        n += 1
    return files, [q["question"] for q in data["qa"][:60]]


def chunk_id(path: str, start: int) -> str:
    return hashlib.sha256(f"{path}:{start}".encode()).hexdigest()[:16]


def build_sqlite(path: Path, files: dict[str, list[tuple[int, int, str]]]) -> Store:
    store = Store(path)
    with store.transaction() as conn:
        for rel, chunks in files.items():
            title = note_title(rel, "\n".join(c[2] for c in chunks))
            written = []
            for start, end, text in chunks:
                cur = conn.execute(
                    "INSERT INTO chunks (id, path, source, start_line, end_line, hash, model, text,"
                    " updated_at) VALUES (?, ?, 'memory', ?, ?, ?, '', ?, 0)",
                    (chunk_id(rel, start), rel, start, end, hashlib.sha256(text.encode()).hexdigest(), text))
                written.append((cur.lastrowid, text))
            insert_chunk_fts(conn, written, title=title, fill_trigram=True)
    return store


def build_postgres(dsn: str, files: dict[str, list[tuple[int, int, str]]]) -> PostgresStore:
    """The files written in one ``write_files`` (the postings of a term in several chunks of
    several files share a block)."""
    store = PostgresStore(resolve_target(dsn), agent_id="main", workspace="/ws")
    lease = store.sync_lease()
    assert lease is not None
    lease.write_files([FileRows(rel, "memory", "h", 0, 0, note_title(rel, "\n".join(c[2] for c in chunks)),
                                tuple(ChunkRow(chunk_id(rel, s), s, e, "h", "", t, derived_terms(t))
                                      for s, e, t in chunks)) for rel, chunks in files.items()])
    lease.publish()
    return store


def fts5_ranked(lite: Store, expr: str, limit: int) -> list[tuple[Any, ...]]:
    """FTS5's own ranking of the MATCH ``expr`` on ``lite``: ``limit`` rows of ``(chunk id,
    bm25)``, best first, ties by path."""
    return lite.query("SELECT c.id, bm25(chunks_fts, 1.0, 2.0, 1.0) FROM chunks_fts JOIN chunks c"
                      " ON c.rowid = chunks_fts.rowid WHERE chunks_fts MATCH ? ORDER BY 2, c.path"
                      " LIMIT ?", [expr, limit])


def assert_ranked_as_fts5(got: list[Any], want: list[tuple[Any, ...]]) -> None:
    """The postgres store's ``keyword_rows`` answer ``got`` holds FTS5's chunks in FTS5's order
    with its scores (relative 1e-9)."""
    assert [r[0] for r in got] == [r[0] for r in want]
    assert [r[6] for r in got] == pytest.approx([r[1] for r in want], rel=1e-9)


@pytest.mark.parametrize(("block_chunks", "candidates", "by_key", "probe"), [
    (64, 1, pg_store.BY_KEY_POSTINGS, pg_store.PROBE_POSTINGS), (3, 1, 0, 0), (3, 1, 10**9, 0),
    (64, pg_store.CANDIDATES_PER_ROW, pg_store.BY_KEY_POSTINGS, pg_store.PROBE_POSTINGS)])
def test_keyword_rows_match_sqlite_fts5_bm25_on_locomo(pg_dsn: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, block_chunks: int,
                                                        candidates: int, by_key: int, probe: int) -> None:
    """Same rows and ranks as FTS5, with a term's postings in blocks of up to 64 chunks and
    of 3 (a common word of the write then spans many blocks), a common word's postings of
    the window read by key (``BY_KEY_POSTINGS`` 0), from all its blocks (10**9) or as the
    store chooses, with the score to beat first taken from the rarest word's shares
    (``PROBE_POSTINGS`` 0) or not, and with as many candidates as asked for in the first
    round (so the rounds widen) or 8 times that."""
    files, questions = locomo_files()
    # First round of exact ranking: as many rows as asked for, so the widening is exercised.
    monkeypatch.setattr(pg_store, "CANDIDATES_PER_ROW", candidates)
    monkeypatch.setattr(pg_store, "BLOCK_CHUNKS", block_chunks)
    monkeypatch.setattr(pg_store, "BY_KEY_POSTINGS", by_key)
    monkeypatch.setattr(pg_store, "PROBE_POSTINGS", probe)
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    try:
        compared = 0
        for question in questions:
            plan = search_plan(lite, question)
            if plan is None or not plan.match:
                continue
            # The postgres store ranks exactly only the rows with the best score bounds and
            # must widen that set until no other row can enter the top.
            for limit in (1, 3, 10):
                want = keyword_rows(lite, plan, sources=["memory"], limit=limit)
                got = pg.keyword_rows(plan.match, sources=["memory"], limit=limit,
                                      trigram_match=plan.trigram_match,
                                      like_patterns=plan.like_patterns)
                assert [r[0] for r in got] == [r[0] for r in want], (question, limit)
                assert [r[6] for r in got] == pytest.approx([r[6] for r in want], rel=1e-9), question
            # The counts search_plan takes from the SQLite store to find a plan's common parts.
            exprs = [expr for _, expr in plan.parts]
            sql = "SELECT (SELECT COUNT(*) FROM chunks_fts_docsize), " + ", ".join(
                "(SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?)" for _ in exprs)
            counts = lite.query(sql, exprs)[0]
            assert pg.part_counts(exprs) == (counts[0], list(counts[1:])), question
            compared += 1
        assert compared == len(questions)
    finally:
        lite.close()
        pg.close()


def test_rows_holding_only_common_words_are_ranked_when_the_rare_ones_fall_short(
        pg_dsn: str, tmp_path: Path) -> None:
    """A common word's postings are not read at first (its bm25 share is too small to matter
    next to the rare word's); when the rare word's rows are fewer than asked for, the rows
    holding only the common word must still fill the answer, ranked as FTS5 ranks them."""
    files = {f"memory/n{i:02d}.md": [(1, 1, "zebra and apple" if i == 7 else f"apple pie number {i}"
                                      + " filler" * (i % 5))] for i in range(21)}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    try:
        plan = search_plan(lite, "zebra apple")
        assert plan is not None and plan.match
        want = keyword_rows(lite, plan, sources=["memory"], limit=10)
        got = pg.keyword_rows(plan.match, sources=["memory"], limit=10)
        assert len(want) == 10 and want[0][1] == "memory/n07.md"
        assert [r[0] for r in got] == [r[0] for r in want]
        assert [r[6] for r in got] == pytest.approx([r[6] for r in want], rel=1e-9)
    finally:
        lite.close()
        pg.close()


def test_a_common_word_beating_the_rare_words_later_rows_is_read_in_a_second_round(
        pg_dsn: str, tmp_path: Path) -> None:
    """The rare word's 200 notes score in three tiers by length; the common word is not read
    at first. The first round reads the rare word's 64 best candidates (the others' bounds are
    below its 40th lower bound) and ranks them, but short notes holding the common word alone
    can still beat its 40th: it ends there, and one round with both words read gives FTS5's
    rows and ranks: it takes every candidate whose bound reaches the 40th score the first
    round found (not 320 candidates, then 1,280, in two rounds; one statement a round, not
    one more per step past its window)."""
    def note(words: int) -> str:
        return " ".join(f"w{j}" for j in range(words))

    files = {**{f"memory/a{i:03d}.md": [(1, 1, f"zebra q{i}")] for i in range(10)},
             **{f"memory/b{i:03d}.md": [(1, 1, f"zebra {note(80)} x{i}")] for i in range(40)},
             **{f"memory/c{i:03d}.md": [(1, 1, f"zebra {note(200)} x{i}")] for i in range(150)},
             **{f"memory/d{i:03d}.md": [(1, 1, f"apple y{i}")] for i in range(500)},
             **{f"memory/e{i:03d}.md": [(1, 1, f"other words o{i}")] for i in range(800)}}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    build_postgres(pg_dsn, files).close()
    pg = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws", pool_size=1)
    try:
        expr = '"zebra" OR "apple"'
        want = fts5_ranked(lite, expr, 40)
        got: list[Any] = []
        # check; BEGIN + statistics; the rare word's round; one round of both; texts + ROLLBACK
        assert round_trips(pg, tmp_path / "libpq.trace",
                           lambda: got.extend(pg.keyword_rows(expr, sources=["memory"], limit=40))) == 5
        assert [r[5] for r in got[:12]] == [f"zebra q{i}" for i in range(10)] + ["apple y0", "apple y1"]
        assert_ranked_as_fts5(got, want)
    finally:
        lite.close()
        pg.close()


def test_copies_of_a_note_tied_past_the_first_candidates_are_ranked_in_one_more_round(
        pg_dsn: str, tmp_path: Path) -> None:
    """500 copies of one note tie at the best score, past the first round's 321 candidates:
    the second round takes every candidate whose bound reaches the 40th score found (all 500
    copies) at once, and the answer is FTS5's: the ties by path (not 1,281 candidates, then
    5,121, in two more rounds)."""
    files = {**{f"memory/a{i:03d}.md": [(1, 1, "zebra apple pie")] for i in range(500)},
             **{f"memory/b{i:03d}.md": [(1, 1, f"zebra crossing {' '.join(['w'] * (i % 7))}")]
                for i in range(300)},
             **{f"memory/e{i:03d}.md": [(1, 1, f"other words o{i}")] for i in range(800)}}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    build_postgres(pg_dsn, files).close()
    pg = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws", pool_size=1)
    try:
        expr = '"zebra" OR "apple" OR NEAR("zebra" "apple", 10)'
        want = fts5_ranked(lite, expr, 40)
        got: list[Any] = []
        # check; BEGIN + statistics; the first round; the round of every tie; texts + ROLLBACK
        assert round_trips(pg, tmp_path / "libpq.trace",
                           lambda: got.extend(pg.keyword_rows(expr, sources=["memory"], limit=40))) == 5
        assert [r[1] for r in got] == [f"memory/a{i:03d}.md" for i in range(40)]
        assert_ranked_as_fts5(got, want)
    finally:
        lite.close()
        pg.close()


def test_the_rare_words_best_shares_make_a_weightier_word_non_essential(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``apple`` (150 notes, up to 4 hits) has a bound above half of ``zebra``'s (50 notes of
    3 hits), so the first guess of the score to beat keeps it essential; the 40th best share
    of ``zebra`` alone is a lower bound of the answer's 40th score above ``apple``'s bound,
    so the first round scans ``zebra`` only, and the answer is FTS5's."""
    monkeypatch.setattr(pg_store, "PROBE_POSTINGS", 0)
    files = {**{f"memory/a{i:03d}.md": [(1, 1, "zebra zebra zebra")] for i in range(50)},
             **{f"memory/b{i:03d}.md": [(1, 1, " ".join(["apple"] * (1 + i % 4)) + f" b{i}")]
                for i in range(150)},
             **{f"memory/e{i:03d}.md": [(1, 1, f"other words o{i}")] for i in range(1350)}}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    scanned: list[list[str]] = []
    execute = psycopg.ClientCursor.execute

    def spy(cur: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(params, dict) and "ess" in params:
            scanned.append(sorted(params["ess"].strip("{}").replace('"', "").split(",")))
        return execute(cur, query, params, **kw)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", spy)
    try:
        expr = '"zebra" OR "apple"'
        want = fts5_ranked(lite, expr, 40)
        got = pg.keyword_rows(expr, sources=["memory"], limit=40)
        assert scanned == [["zebra"]]
        assert_ranked_as_fts5(got, want)
    finally:
        lite.close()
        pg.close()


def test_a_plan_with_a_phrase_of_two_words_ranks_its_best_candidates_only(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-word phrase takes the MaxScore route too: the chunks holding both its words are
    read to count the chunks holding the phrase (its IDF), and a chunk's bound counts the
    phrase with its first word's hits. FTS5's rows and ranks, with a few dozen chunks ranked
    exactly, not every one of the 470 holding a query word."""
    files = {**{f"memory/a{i:03d}.md": [(1, 1, f"melanie went out walking {i}")] for i in range(400)},
             **{f"memory/b{i:03d}.md": [(1, 1, f"self care matters to melanie {i}")] for i in range(20)},
             **{f"memory/c{i:03d}.md": [(1, 1, f"self help and care {i}")] for i in range(50)},
             **{f"memory/d{i:03d}.md": [(1, 1, f"other words {i}")] for i in range(500)}}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    ranked: list[int] = []
    rank_rows = pg_store.rank_rows

    def counted(query: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
        ranked.append(len(rows))
        return rank_rows(query, rows, *args, **kwargs)

    monkeypatch.setattr(pg_store, "rank_rows", counted)
    try:
        expr = '"melanie" OR ("self care" OR "selfcare") OR NEAR("melanie" "self care", 10)'
        want = fts5_ranked(lite, expr, 10)
        got = pg.keyword_rows(expr, sources=["memory"], limit=10)
        assert [r[5] for r in got[:3]] == [f"self care matters to melanie {i}" for i in range(3)]
        assert_ranked_as_fts5(got, want)
        assert 0 < sum(ranked) <= 100, ranked
    finally:
        lite.close()
        pg.close()


def test_a_pasted_question_keeps_its_rarest_words_on_both_stores(pg_dsn: str, tmp_path: Path) -> None:
    """A question of 60 content words, past the 32 a plan searches: its rarest words are kept,
    so the one word that finds the note, its last, is searched on both stores (it was cut as the
    61st part of the query in order)."""
    words = ("budget review meeting quarterly roadmap hiring vendor contract invoice deadline sprint "
             "backlog release staging deploy rollback incident alert dashboard metrics latency "
             "throughput database migration schema index replica failover backup restore snapshot "
             "cluster node pod container image registry pipeline runner artifact cache proxy gateway "
             "router firewall certificate token secret vault policy audit compliance ticket escalation "
             "oncall handover runbook postmortem retro").split()
    assert len(set(words)) == 59
    files = {**{f"memory/n{i}.md": [(1, 1, " ".join(words))] for i in range(4)},
             "memory/trip.md": [(1, 1, "The ferry to Zanzibar leaves at noon.")]}
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = PostgresSearchStore(build_postgres(pg_dsn, files))
    try:
        for store in (lite, pg):
            hits = rank_keyword_hits(store, " ".join([*words, "zanzibar?"]), ["memory"], 3)
            assert [h.path for h in hits][:1] == ["memory/trip.md"], store
    finally:
        lite.close()
        pg.close()


def corpus_files(root: Path) -> dict[str, list[tuple[int, int, str]]]:
    """The chunks of a ``scripts/corpus.py`` workspace (English with Japanese and Chinese
    lines), chunked as the engine chunks notes."""
    import sys

    sys.path.insert(0, str(SCRIPTS))
    from corpus import generate_workspace

    generate_workspace(root, files=40, file_bytes=3000, cjk_every=2)
    files = {}
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root).as_posix()
        files[rel] = [(c.start_line, c.end_line, c.text)
                      for c in chunk_markdown(path.read_text(), tokens=100, overlap=20, sections=True)]
    return files


CJK_QUESTIONS = ("東京チーム", "家計簿アプリ", "数据库迁移", "バックアップ", "数据", "家計簿アプリ backup job",
                 "会議", "迁移 webhook timeout")


def test_cjk_rows_match_sqlite_trigram_and_like(pg_dsn: str, tmp_path: Path) -> None:
    files = corpus_files(tmp_path / "ws")
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    try:
        for question in CJK_QUESTIONS:
            plan = search_plan(lite, question)
            assert plan is not None and (plan.trigram_match or plan.like_terms), question
            want = keyword_rows(lite, plan, sources=["memory"], limit=10)
            got = pg.keyword_rows(plan.match, sources=["memory"], limit=10,
                                  trigram_match=plan.trigram_match, like_patterns=plan.like_patterns)
            assert want, question
            assert [r[0] for r in got] == [r[0] for r in want], question
            assert [r[6] for r in got] == pytest.approx([r[6] for r in want], rel=1e-9), question
    finally:
        lite.close()
        pg.close()


def chunk_positions(post: Any) -> list[dict[str, list[int]]]:
    """Per chunk of ``post`` (``tokens.Postings``), ``{term: its positions}``."""
    out: list[dict[str, list[int]]] = [{} for _ in post.doc_len]
    positions, ends = post.positions.tolist(), post.ends.tolist()
    for t, c, a, b in zip(post.term.tolist(), post.chunk.tolist(), [0, *ends][:-1], ends, strict=True):
        out[c][post.terms[t]] = positions[a:b]
    return out


def fts5_postings(kind: tuple[tuple[str, ...], str], rows: list[tuple[str, ...]]) -> tuple[
        list[dict[str, list[int]]], list[int], list[list[int]]]:
    """FTS5's own tokens of whole ``rows`` for a tokenizer ``kind`` (``tokens.MAIN`` or
    ``TRIGRAM``), the reference of the postgres store's postings: per chunk ``{term: positions}``
    (``column << 20 | offset``), per chunk its token count, and per posting (by term, then
    chunk) its hits in each column."""
    import sqlite3

    from fallback.store.postgres.migrations import POSITION_COLUMN_SHIFT

    columns, tokenize = kind
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(columns)}, tokenize='{tokenize}')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
    conn.executemany(f"INSERT INTO t(rowid, {', '.join(columns)}) VALUES (?, {', '.join('?' * len(columns))})",
                     [(i + 1, *row) for i, row in enumerate(rows)])
    chunks: list[dict[str, list[int]]] = [{} for _ in rows]
    for doc, term, col, offset in conn.execute('SELECT doc, term, col, "offset" FROM v'):
        chunks[doc - 1].setdefault(term, []).append(columns.index(col) << POSITION_COLUMN_SHIFT | offset)
    conn.close()
    for chunk in chunks:
        for positions in chunk.values():
            positions.sort()
    hits = [[sum(p >> POSITION_COLUMN_SHIFT == i for p in chunk[term]) for i in range(len(columns))]
            for term in sorted({t for chunk in chunks for t in chunk}) for chunk in chunks if term in chunk]
    return chunks, [sum(map(len, chunk.values())) for chunk in chunks], hits


def test_trigram_postings_are_fts5s_on_a_cjk_corpus() -> None:
    """The trigrams cut from the folded text (each character folded by FTS5 once) are byte for
    byte the ones FTS5's trigram tokenizer gives for the whole row: CJK lines and runs, Latin
    letters FTS5 folds (``À``, ``Σ``, ``İ``) or not (``ß``), combining marks, emoji, NUL
    (the end of the text before SQLite 3.45), U+FFFE (read as U+FFFD), rows of fewer than three characters; with the folding
    cold, warm, and for a batch bringing new characters."""
    import random

    from fallback.store.postgres.tokens import TRIGRAM, Fts5Tokenizer

    pieces = ["渡辺さんと東京チームのデータ連携について打ち合わせ。", "今天和团队讨论了数据库迁移的计划",
              "한국어 텍스트", "Kenji's Parquet feed", "ÀÉÎ àéî", "ΣΑΣ σας", "İstanbul", "straße", "e\u0301",
              "😀👍🏽🇯🇵", "a\x00b\x00\x00c", "\ufffe\uffff", "\t\n\r\n", "  ", "ﬁ", "Ⅻ①", "東京2026年"]
    rng = random.Random(20261205)
    rows = [("".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12))),) for _ in range(200)]
    rows += [("",), ("ab",), ("abc",), ("\x00\x00\x00\x00",), ("A\x00BC",)]
    later = [("".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(rng.randrange(0, 80))) + "Ωmega",)
             for _ in range(50)]

    def flat(post: Any) -> tuple[list[dict[str, list[int]]], list[int], list[list[int]]]:
        return chunk_positions(post), post.doc_len.tolist(), post.hits.tolist()

    tokenizer = Fts5Tokenizer(TRIGRAM)
    try:
        want = fts5_postings(TRIGRAM, rows)
        assert flat(tokenizer.postings(rows)) == want  # every character folded now
        assert flat(tokenizer.postings(rows)) == want  # from the folding kept
        assert flat(tokenizer.postings(later)) == fts5_postings(TRIGRAM, later)
        assert sum(want[1]) > 5_000 and {"東京チ", "àéî", "σασ", "İst", "\ufffd\ufffd\t"} <= {t for c in want[0] for t in c}
    finally:
        tokenizer.close()


def test_the_tokenizer_keeps_no_terms_of_written_chunks() -> None:
    """A query phrase is tokenized by scanning the tokenizer's whole FTS5 index (fts5vocab), so
    the chunks tokenized for a write must leave nothing in it: only the structure record and
    the averages row remain in its data table."""
    from fallback.store.postgres.tokens import Fts5Tokenizer

    tokenizer = Fts5Tokenizer()
    try:
        post = tokenizer.postings([(f"alpha{i} beta{i} gamma walrus", "title", "") for i in range(2000)])
        chunks = chunk_positions(post)
        assert chunks[7]["alpha7"] == [0]
        assert chunks[7]["walru"] == [3]
        assert post.doc_len[7] == 5
        assert tokenizer._conn.execute("SELECT count(*) FROM t_data").fetchone() == (2,)
        assert tokenizer.phrase_tokens("Walrus Gamma") == ["walru", "gamma"]
    finally:
        tokenizer.close()


def test_a_terms_positions_are_ascending_over_every_column_in_a_large_batch() -> None:
    """The positions of a posting list its hits in the text, title and terms columns in
    ascending order (``column << 20 | offset``), with its hits per column, also when the batch
    is large enough for SQLite's sorter to spill (20,000 rows, ~240,000 instances)."""
    from fallback.store.postgres.tokens import Fts5Tokenizer

    tokenizer = Fts5Tokenizer()
    try:
        post = tokenizer.postings([(f"walrus alpha{i} walrus " + "beta " * 8, "walrus", "x walrus")
                                   for i in range(20_000)])
        chunks = chunk_positions(post)
        hits = {(post.terms[t], c): h for t, c, h in zip(post.term.tolist(), post.chunk.tolist(),
                                                         post.hits.tolist(), strict=True)}
        for i in (0, 7, 12_345, 19_999):
            assert chunks[i]["walru"] == [0, 2, 1048576, 2097153]
            assert hits[("walru", i)] == [2, 1, 1]
            assert hits[("beta", i)] == [8, 0, 0]
            assert chunks[i]["beta"] == [3, 4, 5, 6, 7, 8, 9, 10]
            assert chunks[i][f"alpha{i}"] == [1]
            assert post.doc_len[i] == 14
        assert post.chunk_terms()[7] == sorted(chunks[7])
    finally:
        tokenizer.close()


def test_column_filtered_counts_match_sqlite(pg_dsn: str, tmp_path: Path) -> None:
    """The contrast step's common-word counts (``text : "word"``, fallback/search/contrast.py)
    count the text column only, as FTS5 does: a word of the titles (``session``) counts the
    chunks whose text holds it, not every chunk of a titled note."""
    from fallback.search.contrast import content_words
    from fallback.search.fts import quote_term

    files, questions = locomo_files()
    lite = build_sqlite(tmp_path / "main.sqlite", files)
    pg = build_postgres(pg_dsn, files)
    try:
        words = list(dict.fromkeys(w for q in questions for w in content_words(q)))
        exprs = [f"text : {quote_term(w)}" for w in ["session", *words]]
        sql = "SELECT (SELECT COUNT(*) FROM chunks_fts_docsize), " + ", ".join(
            "(SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?)" for _ in exprs)
        counts = lite.query(sql, exprs)[0]
        assert pg.part_counts(exprs) == (counts[0], list(counts[1:]))
        assert counts[1] < counts[0] == pg.part_counts(['"session"'])[1][0]
    finally:
        lite.close()
        pg.close()


def test_word_by_word_tokens_are_fts5s_on_a_mixed_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's postings built from the cached tokens of its whitespace-separated words are
    byte for byte the ones FTS5 gives for the whole row: a seeded random corpus of English,
    diacritics, combining marks, CJK, emoji (modifiers, ZWJ sequences, flags), punctuation
    inside words, every separator ``str.split`` splits on (CRLF, NBSP, ideographic space, line
    separator, the ASCII control separators), over the text, title and terms columns; with
    the word cache cleared when full in between."""
    import random

    from fallback.store.postgres import tokens
    from fallback.store.postgres.tokens import Fts5Tokenizer, Postings

    pieces = ["walrus", "Walruses", "running", "café", "CAFÉ", "naïve", "Ångström", "straße", "ﬁsh",
              "e\u0301clair", "中文字符", "日本語のテキスト", "한국어", "東京2026", "😀", "👍🏽", "👩\u200d💻",
              "🇯🇵", "don't", "e-mail", "a.b.c", "$100", "#tag", "@user", "C++", "...", "—", "3.14",
              "1,000", "x\u200by", "ﬀ", "İstanbul", "ǅemal", "Ⅻ", "①", "٣٤", "ß", "_under_score_",
              "tab\x00nul", "o'clock", "«quoted»", "(paren)", "semi;colon", "URL:http://x.y/z?q=1"]
    seps = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\x1c", "\x1f", "\x85",
            "\v", "\f", "\u2009", "\u202f"]
    rng = random.Random(20261205)

    def text(words: int) -> str:
        out = [rng.choice(seps) if rng.random() < 0.2 else ""]
        for _ in range(words):
            out += [rng.choice(pieces) + (rng.choice(pieces) if rng.random() < 0.1 else ""),
                    rng.choice(seps)]
        return "".join(out)

    rows = [(text(rng.randrange(0, 120)), text(rng.randrange(0, 6)), text(rng.randrange(0, 10)))
            for _ in range(300)] + [("", "", ""), (" \r\n ", "—", "...")]
    def flat(post: Postings) -> tuple[list[dict[str, list[int]]], list[int], list[list[int]]]:
        return chunk_positions(post), post.doc_len.tolist(), post.hits.tolist()

    tokenizer = Fts5Tokenizer()
    try:
        want = fts5_postings(tokens.MAIN, rows)
        assert flat(tokenizer.postings(rows)) == want  # cold cache
        assert flat(tokenizer.postings(rows)) == want  # warm cache
        monkeypatch.setattr(tokens, "WORD_CACHE_MAX", 40)
        assert flat(tokenizer.postings(rows[:7]))[:2] == (want[0][:7], want[1][:7])  # the cache cleared, then filled
        assert len(tokenizer._words) <= len({w for row in rows[:7] for v in row for w in v.split()})
        assert sum(want[1]) > 10_000
        assert {"中文字符", "walru", "cafe", "😀"} - {t for c in want[0] for t in c} == {"😀"}
    finally:
        tokenizer.close()
