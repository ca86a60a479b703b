"""qmd JSON parsing and hit mapping (spec 2.8.4-5, section 4 cases 26-41), pure and on SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fallback.errors import BackendUnavailableError
from fallback.models import MemorySearchResult
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.errors import QmdOutputError
from qmdbridge.qmd.parse import (
    DocLookup,
    clamp_injected,
    display_path,
    line_range,
    locate_entries,
    parse_qmd_uri,
    qmd_lines_hit,
)
from qmdbridge.qmd.query_text import encode_query
from qmdbridge.qmd.reads import slugify_path
from qmdbridge.qmd.results_json import QmdEntry, parse_qmd_json

HIT = '{"docid": "#abc123", "score": 0.8, "file": "qmd://memory-root-main/MEMORY.md", "snippet": "@@ -3,2 @@ (2 before, 0 after)\\nalpha\\nbeta\\n"}'


def test_strict_array() -> None:
    entries = parse_qmd_json(f"[{HIT}]", command="query")
    assert entries == [QmdEntry(docid="#abc123", file="qmd://memory-root-main/MEMORY.md",
                                snippet="@@ -3,2 @@ (2 before, 0 after)\nalpha\nbeta\n", score=0.8)]


def test_noise_banner_and_ansi_around_json() -> None:
    out = ("\x1b[1mqmd\x1b[0m ready\ninitializing qmd reranker [ok]\n"
           f"[\n  {HIT}\n]\n\x1b[33mWarning:\x1b[0m 1 documents need embeddings\n")
    assert [e.docid for e in parse_qmd_json(out, command="query")] == ["#abc123"]


@pytest.mark.parametrize("stdout,stderr", [
    ("No results found.\n", ""), ("[qmd] warn: No results found\n", ""), ("", "No results found."),
    ("[]", ""), ("  \n[]\n", "")])
def test_no_results_forms(stdout: str, stderr: str) -> None:
    assert parse_qmd_json(stdout, stderr, command="query") == []


def test_whitespace_stdout_with_other_stderr_is_invalid() -> None:
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json("  \n", "boom happened", command="query")
    assert str(ei.value) == ("qmd unavailable: qmd query returned invalid JSON: stdout empty "
                             "(stderr: boom happened)")


@pytest.mark.parametrize("garbage", ["not json", "[1, 2, 3]", '{"a": 1}', "[oops"])
def test_garbage_raises(garbage: str) -> None:
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json(garbage, command="query")
    assert str(ei.value) == ("qmd unavailable: qmd query returned invalid JSON: qmd query JSON"
                             f" response was not an array (stdout: {garbage})")


@pytest.mark.parametrize("command", ["search", "vsearch", "query"])
def test_the_message_names_the_subcommand_that_printed_it(command: str) -> None:
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json("not json", command=command)
    assert str(ei.value) == (f"qmd unavailable: qmd {command} returned invalid JSON: qmd {command}"
                             " JSON response was not an array (stdout: not json)")
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json("", "boom", command=command)
    assert str(ei.value) == (f"qmd unavailable: qmd {command} returned invalid JSON: stdout empty"
                             " (stderr: boom)")


OTHER = '{"docid": "#def456", "score": 0.5, "file": "qmd://memory-dir-main/2026-01-02.md"}'


@pytest.mark.parametrize("stdout", [
    f"[]\n[{HIT}]\n",                                   # a stray empty array before the hits
    f"[\n  {HIT}\n]\n[]\n",                            # ... or after them
    f"[{OTHER}]\nreranking...\n[{HIT}]\n",             # two result arrays: the last one wins
    f"[{{broken\n[ {HIT} ] trailing text\n",            # a broken value, then one with a tail
    f"[node-llama-cpp] load [1/3]\n[2, 3]\n[{HIT}]",    # log lines and a non-result array
])
def test_last_result_array_wins(stdout: str) -> None:
    assert [(e.docid, e.file) for e in parse_qmd_json(stdout, command="query")] == [
        ("#abc123", "qmd://memory-root-main/MEMORY.md")]


def test_result_schema_needs_file_or_path_on_every_object() -> None:
    [e] = parse_qmd_json('[{"docid": "#a1", "path": "notes/x.md", "score": 1}]', command="query")
    assert (e.docid, e.file, e.score) == ("#a1", "notes/x.md", 1.0)
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json('[{"docid": "#a1", "score": 1}]', command="query")
    assert str(ei.value).endswith('(stdout: [{"docid": "#a1", "score": 1}])')
    assert parse_qmd_json(f'[{{"docid": "#zz"}}]\n[{OTHER}]', command="query")[0].docid == "#def456"


@pytest.mark.parametrize("stdout,stderr", [
    ("No results found.\n\nNo results found above minimum score threshold.\n", ""),
    ("\x1b[33mwarning:\x1b[0m  No   results found\n", ""),
    ('No results found for "alpha".\n', ""),
    ("\n", "[qmd] info: No results found.\n")])
def test_output_of_only_markers_means_no_hits(stdout: str, stderr: str) -> None:
    assert parse_qmd_json(stdout, stderr, command="query") == []


@pytest.mark.parametrize("stdout,stderr,detail", [
    ("No results found.\nError: SQLITE_BUSY: database is locked\n", "",
     "qmd query JSON response was not an array (stdout: No results found. Error: SQLITE_BUSY:"
     " database is locked)"),
    ("qmd 2.8.3 ready\nNo results found.\n", "",
     "qmd query JSON response was not an array (stdout: qmd 2.8.3 ready No results found.)"),
    ("", "No results found.\nError: boom\n", "stdout empty (stderr: No results found. Error: boom)"),
])
def test_a_marker_beside_other_lines_is_an_output_error(stdout: str, stderr: str, detail: str) -> None:
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json(stdout, stderr, command="query")
    assert str(ei.value) == f"qmd unavailable: qmd query returned invalid JSON: {detail}"


def test_long_garbage_is_quoted_short_and_logged_whole(caplog: pytest.LogCaptureFixture) -> None:
    stdout = "\x1b[31mfatal:\x1b[0m " + "x" * 300 + "\nthe end"
    with caplog.at_level("DEBUG", logger="qmdbridge.qmd.backend"), pytest.raises(QmdOutputError) as ei:
        parse_qmd_json(stdout, command="query")
    excerpt = "fatal: " + "x" * 110 + "..."
    assert str(ei.value).endswith(f"(stdout: {excerpt})") and len(excerpt) == 120
    [record] = [r for r in caplog.records if r.levelname == "DEBUG"]
    assert record.getMessage() == (f"qmd stdout is not a result array (315 chars):"
                                   f" {'fatal: ' + 'x' * 300 + chr(10) + 'the end'!r}")


@pytest.mark.parametrize("stdout", ['[{"file": 42}]', '[{"path": null}]', '[{"file": ""}]',
                                    '[{"file": {"uri": "qmd://c/x.md"}}]', '[{"file": ["qmd://c/x.md"]}]',
                                    f'[{HIT}, {{"file": 7, "score": 0.2}}]'])
def test_entries_without_a_file_name_are_not_results(stdout: str) -> None:
    """An entry must name its file with a non-empty string (``file``, or ``path``): one that does
    not is no result of qmd's, and the array is unreadable output, not "no matches"."""
    with pytest.raises(QmdOutputError) as ei:
        parse_qmd_json(stdout, command="search")
    assert str(ei.value).startswith("qmd unavailable: qmd search returned invalid JSON: qmd search"
                                    " JSON response was not an array (stdout: [{")
    [e] = parse_qmd_json('[{"file": 42, "path": "notes/x.md"}]', command="search")
    assert e.file == "notes/x.md"


def test_field_types_are_strict() -> None:
    [e] = parse_qmd_json('[{"docid": 5, "score": "high", "start_line": 0, "end_line": 4.0,'
                         ' "file": "qmd://c/x.md"}]', command="query")
    assert (e.docid, e.score, e.start_line, e.end_line, e.file) == (None, None, None, 4, "qmd://c/x.md")


def test_qmd_uri_manual_parse() -> None:
    assert parse_qmd_uri("qmd://workspace-main/notes/welcome.md") == ("workspace-main", "notes/welcome.md")
    assert parse_qmd_uri("QMD://c/a%20b/#1?.md") == ("c", "a b/#1?.md")
    assert parse_qmd_uri("qmd://c/x.md?index=other") == ("c", "x.md")
    assert parse_qmd_uri("notes/x.md") is None


@pytest.mark.parametrize("entry,snippet,expected", [
    (QmdEntry(), "@@ -5,2 @@\na\nb", (5, 6)),
    (QmdEntry(), "@@ -7,1 @@\na", (7, 7)),
    (QmdEntry(start_line=8, end_line=10), "@@ -5,2 @@\na\nb", (8, 10)),
    (QmdEntry(start_line=10, end_line=8), "", (8, 10)),
    (QmdEntry(start_line=8), "@@ -1,3 @@\na\nb\nc", (8, 10)),
    (QmdEntry(end_line=2), "@@ -1,3 @@\na\nb\nc", (1, 2)),
    (QmdEntry(), "one\ntwo\nthree", (1, 3)),
    (QmdEntry(), "@@ -4,4 @@ (3 before, 0 after)\nsecond\nbravo\nthird\n", (4, 6)),
])
def test_line_range(entry: QmdEntry, snippet: str, expected: tuple[int, int]) -> None:
    assert line_range(entry, snippet) == expected


def test_slugify() -> None:
    assert slugify_path("Notes/My File_1.MD") == "notes/my-file-1.md"


def test_encode_query_keeps_text_literal() -> None:
    assert encode_query("-dash topic", "search") == "- dash topic"
    assert encode_query("lex: literal", "query") == "lex : literal"
    assert encode_query("lex: literal", "search") == "lex: literal"
    assert encode_query("one\ntwo", "query") == "one two"
    assert encode_query("記憶系統升級 QMD", "search") == "記憶系統升級 QMD"
    assert encode_query("a -b", "search") == "a -b"


def _index(path: Path, rows: list[tuple[str, str, str, int]]) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE documents (id INTEGER PRIMARY KEY, collection TEXT, path TEXT, "
                 "title TEXT, hash TEXT, active INTEGER DEFAULT 1)")
    conn.executemany("INSERT INTO documents (collection, path, hash, active) VALUES (?,?,?,?)", rows)
    conn.commit()
    conn.close()


def _roots(ws: Path, export: Path) -> dict[str, ManagedCollection]:
    return {c.name: c for c in [
        ManagedCollection("memory-root-main", ws, "MEMORY.md", "memory"),
        ManagedCollection("workspace-main", ws, "**/*.md", "custom"),
        ManagedCollection("notes-main", ws.parent / "notes", "**/*.md", "custom"),
        ManagedCollection("sessions-main", export, "**/*.md", "sessions")]}


def _map(tmp_path: Path, entries: list[QmdEntry], *, hint: str | None = None,
         rows: list[tuple[str, str, str, int]] | None = None, export: Path | None = None,
         min_score: float = 0.0, max_snippet: int = 700) -> list[MemorySearchResult]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    db = tmp_path / "index.sqlite"
    if not db.exists():
        _index(db, rows or [])
    lookup = DocLookup(db)
    try:
        located = locate_entries([(e, hint) for e in entries], roots=_roots(ws, export or tmp_path / "exp"),
                                 workspace=ws, lookup=lookup, max_snippet_chars=max_snippet,
                                 min_score=min_score, cache={})
        return [hit for found in located if (hit := qmd_lines_hit(found)) is not None]
    finally:
        lookup.close()


def _files(tmp_path: Path, **texts: str) -> None:
    """Write workspace files (``a__b_md="..."`` is ``ws/a/b.md``): a hit is kept only while its
    file exists."""
    for name, text in texts.items():
        path = tmp_path / "ws" / name.replace("__", "/").replace("_md", ".md")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_file_hint_without_docid_maps_to_workspace_path(tmp_path: Path) -> None:
    _files(tmp_path, notes__welcome_md="1\n2\n3\n4\nx\ny\n")
    [hit] = _map(tmp_path, [QmdEntry(file="qmd://workspace-main/notes/welcome.md", score=0.5,
                                     snippet="@@ -5,2 @@\nx\ny")])
    assert (hit.path, hit.start_line, hit.end_line, hit.snippet, hit.source) == (
        "notes/welcome.md", 5, 6, "x\ny", "memory")


def test_docid_hinted_collection_wins_and_exact_hash_first(tmp_path: Path) -> None:
    _files(tmp_path, MEMORY_md="s\n")
    rows = [("stale-coll", "MEMORY.md", "abc123ff", 1), ("workspace-main", "MEMORY.md", "abc123ff", 1),
            ("memory-root-main", "MEMORY.md", "abc123ff", 1)]
    [hit] = _map(tmp_path, [QmdEntry(docid="#abc123", score=0.9, snippet="s")],
                 hint="memory-root-main", rows=rows)
    assert hit.path == "MEMORY.md"


def test_outside_workspace_and_sessions_paths(tmp_path: Path) -> None:
    export = tmp_path / "ws" / "qmd" / "sessions-main"
    export.mkdir(parents=True)
    (export / "session-1.md").write_text("s\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "guide.md").write_text("g\n")
    rows = [("notes-main", "guide.md", "aaaaaa11", 1), ("sessions-main", "session-1.md", "bbbbbb22", 1)]
    hits = _map(tmp_path, [QmdEntry(docid="#aaaaaa", score=0.6, snippet="g"),
                           QmdEntry(docid="#bbbbbb", score=0.7, snippet="s")], rows=rows, export=export)
    assert [(h.path, h.source) for h in hits] == [("qmd/notes-main/guide.md", "memory"),
                                                  ("qmd/sessions-main/session-1.md", "sessions")]


def test_unknown_collection_and_low_scores_dropped(tmp_path: Path) -> None:
    rows = [("elsewhere", "x.md", "cccccc33", 1)]
    hits = _map(tmp_path, [QmdEntry(docid="#cccccc", score=0.9, snippet="x"),
                           QmdEntry(file="qmd://memory-root-main/MEMORY.md", score=0.1, snippet="y")],
                rows=rows, min_score=0.2)
    assert hits == []


def test_slugged_db_path_maps_back_to_real_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "Notes").mkdir(parents=True)
    (ws / "Notes" / "My File.md").write_text("hi\n")
    rows = [("workspace-main", "notes/my-file.md", "dddddd44", 1)]
    [hit] = _map(tmp_path, [QmdEntry(docid="#dddddd", score=0.5, snippet="hi")], rows=rows)
    assert hit.path == "Notes/My File.md"


def test_snippet_cut_to_max_chars(tmp_path: Path) -> None:
    _files(tmp_path, MEMORY_md="é" * 50 + "\n")
    [hit] = _map(tmp_path, [QmdEntry(file="qmd://memory-root-main/MEMORY.md", score=0.5,
                                     snippet="@@ -1,1 @@\n" + "é" * 50)], max_snippet=10)
    assert hit.snippet == "é" * 10
    # lines of words end after the last word that fits (it was "first line\nsecond li")
    _files(tmp_path, MEMORY_md="first line\nsecond line\n")
    [hit] = _map(tmp_path, [QmdEntry(file="qmd://memory-root-main/MEMORY.md", score=0.5,
                                     snippet="@@ -1,2 @@\nfirst line\nsecond line")], max_snippet=20)
    assert hit.snippet == "first line\nsecond"


def test_busy_index_fails_the_search(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    _index(db, [("memory-root-main", "MEMORY.md", "eeeeee55", 1)])
    locker = sqlite3.connect(db)
    locker.execute("PRAGMA locking_mode = EXCLUSIVE")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        lookup = DocLookup(db)
        with pytest.raises(BackendUnavailableError, match="qmd index busy while reading results"):
            lookup.by_docid("#eeeeee")
        lookup.close()
    finally:
        locker.rollback()
        locker.close()


def _r(path: str, score: float, source: str, snippet: str = "x") -> MemorySearchResult:
    return MemorySearchResult(path=path, start_line=1, end_line=1, score=score, snippet=snippet,
                              source=source)  # type: ignore[arg-type]


def test_clamp_injected_chars() -> None:
    rs = [_r("a", 0.9, "memory", "x" * 6), _r("b", 0.8, "memory", "y" * 6), _r("c", 0.7, "memory", "z")]
    out = clamp_injected(rs, max_chars=10)
    assert [(r.path, r.snippet) for r in out] == [("a", "xxxxxx"), ("b", "yyyy")]
    # a budget used up exactly keeps no later hit, not even one with an empty snippet
    spent = [_r("a", 0.9, "memory", "x" * 10), _r("b", 0.8, "memory", ""), _r("c", 0.7, "memory", "z")]
    assert [(r.path, r.snippet) for r in clamp_injected(spent, max_chars=10)] == [("a", "x" * 10)]


def test_display_path_under_qmd_folder(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    coll = ManagedCollection("workspace-main", ws, "**/*.md", "custom")
    assert display_path(coll, "qmd/x.md", ws) == "qmd/workspace-main/qmd/x.md"
    assert display_path(coll, "MEMORY.md", ws) == "MEMORY.md"


def test_line_ranges_are_kept_inside_the_file(tmp_path: Path) -> None:
    from qmdbridge.qmd.reads import clamp_range, hit_lines

    def clamp_lines(coll: ManagedCollection, rel: str, start: int, end: int, *,
                    workspace: Path) -> tuple[int, int] | None:
        """A hit's lines kept inside its file as ``locate_entries`` keeps them."""
        read = hit_lines(coll, rel, workspace=workspace, max_bytes=0)
        return None if read is None else clamp_range(start, end, read[0])

    coll = ManagedCollection("notes-main", tmp_path, "**/*.md", "custom")
    (tmp_path / "MEMORY.md").write_text("one\ntwo\nthree\n")
    assert clamp_lines(coll, "MEMORY.md", 2, 9, workspace=tmp_path / "ws") == (2, 3)
    assert clamp_lines(coll, "MEMORY.md", 999_999_999, 1_000_000_000, workspace=tmp_path / "ws") is None
    # a file that no longer exists is not cited (qmd's index is stale)
    assert clamp_lines(coll, "missing.md", 5, 6, workspace=tmp_path / "ws") is None
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "n.md").write_text("n\n")
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    assert clamp_lines(coll, "linked/n.md", 1, 1, workspace=tmp_path / "ws") is None


def test_hits_outside_the_rule_are_dropped_whatever_qmd_returns(tmp_path: Path) -> None:
    """A qmd build that ignored the pattern flag returned private/diary.md from the root-file
    collection; hidden, skipped, non-Markdown and shadowed-root hits go too."""
    ws = tmp_path / "ws"
    for rel in ("MEMORY.md", "memory.md", "private/diary.md", "notes/.draft.md",
                "notes/node_modules/x.md", "notes/ok.md", "notes/a.txt"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("x\n")
    entries = [QmdEntry(file=f"qmd://{c}/{r}", score=0.5, snippet="x")
               for c, r in (("memory-root-main", "private/diary.md"), ("memory-root-main", "memory.md"),
                            ("workspace-main", "notes/.draft.md"), ("workspace-main", "notes/node_modules/x.md"),
                            ("workspace-main", "notes/a.txt"), ("workspace-main", "notes/ok.md"),
                            ("memory-root-main", "MEMORY.md"))]
    assert [h.path for h in _map(tmp_path, entries)] == ["notes/ok.md", "MEMORY.md"]


def test_hit_checks_reuse_a_folder_listing_until_the_folder_changes(tmp_path: Path) -> None:
    """A listing is kept only for a folder that changed more than ``RACY_NS`` ago, and used
    while the folder is unchanged; adding a look-alike file changes the folder, so the next
    check lists it again and finds the hit ambiguous."""
    import os
    import time

    from qmdbridge.qmd.reads import RACY_NS, Listings, resolve_hit_file

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "2020-01-02.md").write_text("# Day\n\nferry booked\n")
    coll = ManagedCollection(name="notes", path=notes, pattern="**/*.md", kind="custom")
    listings: Listings = {}
    assert resolve_hit_file(coll, "2020-01-02.md", "ferry booked", 3, 3, workspace=tmp_path,
                            listings=listings) == ("2020-01-02.md", None)
    assert listings == {}  # just written: not kept
    settled = time.time_ns() - 2 * RACY_NS
    os.utime(notes, ns=(settled, settled))
    assert resolve_hit_file(coll, "2020-01-02.md", "ferry booked", 3, 3, workspace=tmp_path,
                            listings=listings) == ("2020-01-02.md", None)
    assert listings[str(notes)][1] == {"2020-01-02.md": ["2020-01-02.md"]}
    (notes / "2020_01_02.md").write_text("# Day\n\nferry booked\n")
    rel, note = resolve_hit_file(coll, "2020-01-02.md", "ferry booked", 3, 3, workspace=tmp_path,
                                 listings=listings)
    assert rel is None and note is not None and "matches 2 files (2020-01-02.md, 2020_01_02.md)" in note


@pytest.mark.anyio
async def test_index_counts_are_read_again_only_when_the_index_files_change(tmp_path: Path) -> None:
    """The index (last written ``2 x RACY_NS`` ago) is rewritten in place to bytes SQLite cannot
    open, with its size and mtime put back: the counts still come from the last read (the
    database is not opened); a real write (new stamp) makes the next read open it again."""
    import os
    import time

    from qmdbridge.qmd.parse import IndexCounts
    from qmdbridge.qmd.reads import RACY_NS

    db = tmp_path / "index.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE documents (collection TEXT, path TEXT, active INTEGER)")
    conn.execute("INSERT INTO documents VALUES ('memory-dir-main', 'a.md', 1), ('memory-dir-main', 'b.md', 0)")
    conn.commit()
    conn.close()
    settled = time.time_ns() - 2 * RACY_NS
    os.utime(db, ns=(settled, settled))
    counts = IndexCounts(db)
    assert await counts.read() == ({"memory-dir-main": 1}, None)
    st = db.stat()
    good = db.read_bytes()
    db.write_bytes(b"x" * len(good))
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert await counts.read() == ({"memory-dir-main": 1}, None)
    db.write_bytes(good)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO documents VALUES ('memory-root-main', 'MEMORY.md', 1)")
    conn.commit()
    conn.close()
    assert await counts.read() == ({"memory-dir-main": 1, "memory-root-main": 1}, None)
