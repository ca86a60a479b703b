"""Tests for fallback.sources.memory_files: discovery (spec §2, §12 cases 1-9, 11-12) and reading."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fallback.models import SkippedFile
from fallback.settings import ExtraPath
from fallback.sources.file_text import read_memory_text
from fallback.sources.memory_files import (
    MemoryFile,
    MemoryRoot,
    RootFile,
    extra_roots,
    list_memory_files,
    locate_memory_path,
    memory_roots,
    root_memory_file,
    split_pattern,
)


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _rels(ws: Path, extra: list[str] | None = None) -> list[str]:
    return [f.rel_path for f in list_memory_files(ws, extra or []).files]


def test_case1_normalize_extra_paths(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    out = extra_roots(ws, [" notes ", "./notes", "/shared-notes", "/shared-notes", ""])
    assert [r.entry for r in out] == [ws / "notes", Path("/shared-notes")]


def test_normalize_expands_tilde(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    home = Path(os.path.expanduser("~"))
    assert [r.entry for r in extra_roots(ws, ["~/notes", "~", "a/../b"])] == [home / "notes", home, ws / "b"]


def test_case2_extra_dir_markdown_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    extra = tmp_path / "extra"
    for name in ("note1.md", "note2.md", "ignore.txt"):
        _write(extra / name)
    assert _rels(ws, [str(extra)]) == ["MEMORY.md", "../extra/note1.md", "../extra/note2.md"]


def test_case3_extra_single_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "standalone.md")
    assert _rels(ws, ["standalone.md"]) == ["MEMORY.md", "standalone.md"]


def test_case4_only_legacy_lowercase_is_indexed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "memory.md")
    disc = list_memory_files(ws, [])
    assert [f.rel_path for f in disc.files] == ["memory.md"]
    assert disc.issues == [f"memory directory missing: {ws / 'memory'}"]


def test_case5_both_roots_only_upper_and_issue(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md", "upper")
    _write(ws / "memory.md", "lower")
    if len(os.listdir(ws)) == 1:
        pytest.skip("case-insensitive file system")
    disc = list_memory_files(ws, [str(ws)])
    assert [f.rel_path for f in disc.files] == ["MEMORY.md"]
    assert ("both MEMORY.md and legacy memory.md exist; only MEMORY.md is indexed "
            "(merge memory.md into MEMORY.md)") in disc.issues


def test_case6_relative_extra_dir(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "subdir" / "nested.md")
    assert _rels(ws, ["subdir"]) == ["MEMORY.md", "subdir/nested.md"]


def test_case7_missing_extra_is_issue(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    (ws / "memory").mkdir()
    disc = list_memory_files(ws, ["/does/not/exist"])
    assert [f.rel_path for f in disc.files] == ["MEMORY.md"]
    assert disc.issues == ["extra path missing: /does/not/exist"]


def test_missing_memory_dir_is_issue(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    disc = list_memory_files(ws, [])
    assert disc.issues == [f"memory directory missing: {ws / 'memory'}"]


def test_case8_symlinks_not_followed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    extra = tmp_path / "extra"
    _write(extra / "note.md")
    outside = tmp_path / "outside"
    _write(outside / "secret.md")
    (extra / "linked.md").symlink_to(outside / "secret.md")
    (extra / "linkdir").symlink_to(outside)
    linked_extra = tmp_path / "linked-extra"
    linked_extra.symlink_to(outside)
    disc = list_memory_files(ws, [str(extra), str(linked_extra)])
    assert [f.rel_path for f in disc.files] == ["MEMORY.md", "../extra/note.md"]
    assert disc.skipped == [SkippedFile(path="../extra/linkdir", reason="symlink (not followed)"),
                            SkippedFile(path="../extra/linked.md", reason="symlink (not followed)")]
    assert f"extra path is a symlink (not followed): {linked_extra}" in disc.issues


def test_a_symlink_to_memory_another_root_holds_is_neither_skipped_nor_an_issue(tmp_path: Path) -> None:
    # the fix a symlink problem names (add the target's real path to extraPaths) clears it
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    synced = tmp_path / "Dropbox" / "memory"
    _write(synced / "2026-01-01.md")
    (ws / "memory").symlink_to(synced)
    notes = tmp_path / "notes"
    _write(notes / "a.md")
    _write(tmp_path / "other.md")
    (synced / "alias.md").symlink_to(notes / "a.md")
    (synced / "notes-link").symlink_to(notes)
    (synced / "elsewhere.md").symlink_to(tmp_path / "other.md")  # memory through no root
    alone = list_memory_files(ws, [])
    assert alone.issues == [f"memory directory is a symlink (not followed): {ws / 'memory'}"]
    disc = list_memory_files(ws, [str(synced), str(notes)])
    assert [f.rel_path for f in disc.files] == [
        "MEMORY.md", "../Dropbox/memory/2026-01-01.md", "../notes/a.md"]
    assert disc.issues == []
    assert disc.skipped == [SkippedFile(path="../Dropbox/memory/elsewhere.md", reason="symlink (not followed)")]


def test_case9_dedup_by_real_path(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "memory" / "2026-01-01.md")
    assert _rels(ws, [str(ws), ".", str(ws / "MEMORY.md")]) == ["MEMORY.md", "memory/2026-01-01.md"]


def test_memory_tree_walk_rules(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "memory" / "b.md")
    _write(ws / "memory" / "a.md")
    _write(ws / "memory" / "sub" / "deep" / "c.md")
    _write(ws / "memory" / "upper.MD")
    _write(ws / "memory" / "notes.txt")
    for junk in (".openclaw-repair", ".git", "node_modules", ".venv", "venv", "__pycache__",
                 ".tox", ".pnpm-store"):
        _write(ws / "memory" / junk / "hidden.md")
    (ws / "MEMORY-link.md").symlink_to(ws / "MEMORY.md")
    _write(ws / "memory" / ".draft.md")
    for skipped in ("vendor", "dist", "build", ".obsidian", ".cache"):
        _write(ws / "memory" / "sub" / skipped / "x.md")
    assert _rels(ws) == ["MEMORY.md", "memory/a.md", "memory/b.md", "memory/sub/deep/c.md"]
    assert list_memory_files(ws, []).skipped == [
        SkippedFile(path="memory/.draft.md", reason="hidden name (not memory)")]


def test_symlinked_root_file_skipped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(tmp_path / "real.md")
    ws.mkdir()
    (ws / "MEMORY.md").symlink_to(tmp_path / "real.md")
    disc = list_memory_files(ws, [])
    assert disc.files == []
    assert disc.skipped == [SkippedFile(path="MEMORY.md", reason="symlink (not followed)")]


def test_workspace_extra_skips_repair_backups(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "README.md")
    _write(ws / ".openclaw-repair" / "root-memory" / "2026" / "memory.md")
    assert _rels(ws, ["."]) == ["MEMORY.md", "README.md"]
    # an extra path that names the backups (or a folder in them) admits none of them either
    assert _rels(ws, [".openclaw-repair"]) == ["MEMORY.md"]
    assert _rels(ws, [".openclaw-repair/root-memory"]) == ["MEMORY.md"]


def test_too_large_file_skipped(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md", "small")
    _write(ws / "memory" / "big.md", "y" * 100)
    disc = list_memory_files(ws, [], max_file_bytes=50)
    assert [f.rel_path for f in disc.files] == ["MEMORY.md"]
    assert disc.skipped == [SkippedFile(path="memory/big.md", reason="too large (100 bytes > cap 50)")]


@contextlib.contextmanager
def _unprivileged() -> Iterator[None]:
    """Drop the effective uid to ``nobody`` while inside (tests run as root here and in CI;
    root reads any file, so permission errors need an unprivileged uid)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temp dir every uid can traverse (pytest's own tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="qmdbridge-perm-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_unreadable_file_skipped(open_tmp: Path) -> None:
    ws = open_tmp / "ws"
    locked = _write(ws / "memory" / "locked.md")
    for d in (ws, ws / "memory"):
        d.chmod(0o755)
    locked.chmod(0)
    try:
        with _unprivileged():
            disc = list_memory_files(ws, [])
    finally:
        locked.chmod(0o644)
    assert disc.files == []
    assert disc.skipped == [SkippedFile(path="memory/locked.md", reason="unreadable: Permission denied")]


def test_file_entry_fields(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    note = _write(ws / "memory" / "note.md", "hello")
    (f,) = list_memory_files(ws, []).files
    assert f == MemoryFile(abs_path=note, rel_path="memory/note.md", source="memory", size=5,
                           mtime_ms=note.stat().st_mtime_ns // 1_000_000,
                           ctime_ns=note.stat().st_ctime_ns)


def test_root_file_rule(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert root_memory_file(ws) == RootFile(None, False)
    _write(ws / "memory.md", "legacy")
    assert root_memory_file(ws) == RootFile("memory.md", False)
    assert _rels(ws) == ["memory.md"]
    _write(ws / "MEMORY.md", "canonical")
    assert root_memory_file(ws) == RootFile("MEMORY.md", True)
    disc = list_memory_files(ws, [])
    assert [f.rel_path for f in disc.files] == ["MEMORY.md"]
    assert disc.issues[0] == ("both MEMORY.md and legacy memory.md exist; only MEMORY.md is indexed "
                              "(merge memory.md into MEMORY.md)")
    _write(ws / "DREAMS.md", "diary")
    _write(ws / "dreams.md", "diary")
    assert _rels(ws) == ["MEMORY.md"]  # the dreaming diary is not memory


def test_memory_roots_and_patterns(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(ws / "notes" / "top.md")
    _write(ws / "notes" / "deep" / "inner.md")
    _write(tmp_path / "one[1].md")
    roots = memory_roots(ws, [ExtraPath(path="notes", pattern="*.md"), str(tmp_path / "one[1].md"), "notes"])
    assert [(r.kind, r.path, r.pattern) for r in roots] == [
        ("root", ws, "MEMORY.md"), ("memory", ws / "memory", "**/*.md"),
        ("extra", ws / "notes", "*.md"), ("extra", tmp_path, "one\\[1\\].md"),
        ("extra", ws / "notes", "**/*.md")]
    assert [r.recursive for r in roots[2:]] == [False, False, True]
    assert _rels(ws, [ExtraPath(path="notes", pattern="*.md")]) == ["MEMORY.md", "notes/top.md"]
    assert _rels(ws, [ExtraPath(path="notes", pattern="deep/*.md,top.md")]) == [
        "MEMORY.md", "notes/deep/inner.md", "notes/top.md"]
    assert _rels(ws, [str(tmp_path / "one[1].md")]) == ["MEMORY.md", "../one[1].md"]
    assert split_pattern("a.md, {b,c}/*.md,[x,y].md,") == ["a.md", "{b,c}/*.md", "[x,y].md"]


def test_rule_admits() -> None:
    folder = MemoryRoot(Path("/n"), "**/*.md", "extra", Path("/n"))
    assert [folder.admits(p) for p in ("a.md", "x/y/a.md", "a.MD", ".a.md", "x/.h/a.md",
                                       "node_modules/a.md", "dist/a.md", "x/../a.md", "")] == [
        True, True, False, False, False, False, False, False, False]
    root = MemoryRoot(Path("/w"), "memory.md", "root", Path("/w/memory.md"))
    assert (root.admits("memory.md"), root.admits("MEMORY.md")) == (True, False)
    assert locate_memory_path([folder], "/n/sub/a.md") == (folder, "sub/a.md")
    assert locate_memory_path([folder], "/other/a.md") is None


def _mf(path: Path, rel: str) -> MemoryFile:
    return MemoryFile(abs_path=path, rel_path=rel)


def test_case12_read_vanished_file(tmp_path: Path) -> None:
    got = read_memory_text(_mf(tmp_path / "gone.md", "gone.md"), max_file_bytes=100)
    assert got == SkippedFile(path="gone.md", reason="vanished before read")


def test_read_text_fields(tmp_path: Path) -> None:
    note = _write(tmp_path / "note.md", "hello")
    got = read_memory_text(_mf(note, "note.md"), max_file_bytes=100)
    assert got.text == "hello"
    assert got.content_hash == hashlib.sha256(b"hello").hexdigest()
    assert (got.invalid_utf8, got.size) == (False, 5)
    assert got.mtime_ms == note.stat().st_mtime_ns // 1_000_000


def test_read_strips_bom_hash_of_raw_bytes(tmp_path: Path) -> None:
    note = tmp_path / "bom.md"
    note.write_bytes(b"\xef\xbb\xbfhi\n")
    got = read_memory_text(_mf(note, "bom.md"), max_file_bytes=100)
    assert got.text == "hi\n"
    assert got.content_hash == hashlib.sha256(b"\xef\xbb\xbfhi\n").hexdigest()
    assert got.size == 6


def test_read_invalid_utf8_replaced(tmp_path: Path) -> None:
    note = tmp_path / "bad.md"
    note.write_bytes(b"ok \xff\xfe end")
    got = read_memory_text(_mf(note, "bad.md"), max_file_bytes=100)
    assert got.text == "ok \ufffd\ufffd end"
    assert got.invalid_utf8 is True


@pytest.mark.parametrize(("data", "text", "stripped"), [
    (b"# Log\nkept line\n" + b"\x00" * 4096, "# Log\nkept line\n", 4096),   # zero-filled tail
    (b"\x00\x00first\n\x00second\x00\n", "first\nsecond\n", 4),           # leading and inside
    (b"\xef\xbb\xbftab\tok\r\n\x00", "tab\tok\r\n", 1),                      # BOM, tab, CRLF kept
])
def test_read_note_padded_with_nul_bytes(tmp_path: Path, data: bytes, text: str,
                                         stripped: int) -> None:
    note = tmp_path / "padded.md"
    note.write_bytes(data)
    got = read_memory_text(_mf(note, "padded.md"), max_file_bytes=10_000)
    assert not isinstance(got, SkippedFile)
    assert (got.text, got.nul_bytes, got.invalid_utf8, got.size) == (text, stripped, False, len(data))
    assert got.content_hash == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("data", [
    b"PK\x03\x04\x14\x00\x00\x00",        # an archive: other control bytes
    b"h\x00\xe9\x00l\x00l\x00o\x00",          # UTF-16 text: invalid UTF-8 once NULs are gone
    b"text\x00\x1b[31mred",                  # ESC among NULs
])
def test_nul_bytes_with_other_binary_signs_are_skipped(tmp_path: Path, data: bytes) -> None:
    note = tmp_path / "bin.md"
    note.write_bytes(data)
    assert read_memory_text(_mf(note, "bin.md"), max_file_bytes=100) == SkippedFile(
        path="bin.md", reason="binary file (NUL bytes)")


def test_read_binary_and_too_large_and_symlink(tmp_path: Path) -> None:
    binary = tmp_path / "bin.md"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")  # NULs and other control bytes
    assert read_memory_text(_mf(binary, "bin.md"), max_file_bytes=100) == SkippedFile(
        path="bin.md", reason="binary file (NUL bytes)")
    big = _write(tmp_path / "big.md", "z" * 20)
    assert read_memory_text(_mf(big, "big.md"), max_file_bytes=10) == SkippedFile(
        path="big.md", reason="too large (20 bytes > cap 10)")
    link = tmp_path / "link.md"
    link.symlink_to(big)
    assert read_memory_text(_mf(link, "link.md"), max_file_bytes=100) == SkippedFile(
        path="link.md", reason="symlink (not followed)")


def test_read_permission_denied(open_tmp: Path) -> None:
    note = _write(open_tmp / "locked.md")
    note.chmod(0)
    try:
        with _unprivileged():
            got = read_memory_text(_mf(note, "locked.md"), max_file_bytes=100)
    finally:
        note.chmod(0o644)
    assert got == SkippedFile(path="locked.md", reason="unreadable: Permission denied")


def test_filesystem_root_as_extra_path_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md", "x")
    disc = list_memory_files(ws, ["/"])
    assert [f.rel_path for f in disc.files] == ["MEMORY.md"]
    assert "extra path is the filesystem root, ignored: /" in disc.issues


def test_walk_stops_after_the_entry_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fallback.sources.memory_files as files

    monkeypatch.setattr(files, "MAX_WALK_ENTRIES", 5)
    ws = tmp_path / "ws"
    for i in range(8):
        _write(ws / "memory" / f"{i}.md", "x")
    disc = list_memory_files(ws, [])
    assert disc.files == []
    assert any(i.startswith("stopped walking at ") for i in disc.issues)


def test_the_default_pattern_admits_what_its_glob_matches() -> None:
    # "**/*.md" is decided without the glob engine; every path the text checks let through must
    # be one the compiled glob matches, and the others are refused before either is asked.
    from fallback.sources.globs import glob_matcher
    from fallback.sources.memory_files import DEFAULT_PATTERN, MemoryRoot

    root = MemoryRoot(Path("/ws/memory"), DEFAULT_PATTERN, "memory", Path("/ws/memory"))
    glob = glob_matcher(DEFAULT_PATTERN)
    cases = ["a.md", "2026-01-12.md", "x/y/z.md", "deep/er/still/deeper/n.md", "[x].md", "{a,b}.md",
             "a*b?.md", "a\\b.md", "caf\udce9.md", "東京/メモ.md", "sp ace.md", "a.MD", "a.md.txt",
             ".hidden.md", "x/.hidden/y.md", "node_modules/a.md", "a/build/b.md", "build.md",
             "x//y.md", "./a.md", "x/../a.md", "", "md", ".md"]
    admitted = {rel: root.admits(rel) for rel in cases}
    assert all(glob.match(rel) for rel, ok in admitted.items() if ok)
    assert [rel for rel, ok in admitted.items() if ok] == [
        "a.md", "2026-01-12.md", "x/y/z.md", "deep/er/still/deeper/n.md", "[x].md", "{a,b}.md",
        "a*b?.md", "a\\b.md", "caf\udce9.md", "東京/メモ.md", "sp ace.md", "build.md"]
    other = MemoryRoot(Path("/ws/notes"), "team/*.md,{a,b}.md", "extra", Path("/ws/notes"))
    assert [rel for rel in ("team/x.md", "b.md", "c.md", "team/sub/x.md") if other.admits(rel)] == [
        "team/x.md", "b.md"]


@pytest.mark.parametrize(("pattern", "never"), [
    ("*.txt", True), ("notes/*.MD", True), ("a.txt,*.log", True), ("{a,b}.txt", True),
    ("[ab].txt", True), ("**/*.md", False), ("*md", False), ("*.m?", False), ("*.{md,txt}", False),
    ("*.{md,{x,y}}", False), ("a.txt,b.md", False), ("*.\\md", False), ("*.[m]d", False)])
def test_never_ends_with_is_sure_before_it_says_so(pattern: str, never: bool) -> None:
    from fallback.sources.globs import never_ends_with

    assert never_ends_with(pattern, ".md") is never


def test_extra_folder_whose_pattern_admits_no_markdown_is_an_issue(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md")
    _write(tmp_path / "notes" / "a.md")
    _write(tmp_path / "notes" / "b.txt")
    found = list_memory_files(ws, [ExtraPath(path=str(tmp_path / "notes"), pattern="*.txt"),
                                   ExtraPath(path=str(tmp_path / "notes"), pattern="*.{md,txt}")])
    assert [f.rel_path for f in found.files] == ["MEMORY.md", "../notes/a.md"]
    assert found.issues == [
        "memory directory missing: " + str(ws / "memory"),
        f"extra path pattern can never match a memory file: {tmp_path / 'notes'} (pattern *.txt; "
        "memory files end in .md)"]


def test_an_extra_path_of_the_workspace_admits_neither_the_diary_nor_the_legacy_file(tmp_path: Path) -> None:
    """``extraPaths: ["."]`` makes every note of the workspace memory, but the root-level
    names the rule decides stay decided: ``DREAMS.md`` is never memory and ``memory.md``
    beside ``MEMORY.md`` is not either (the root-file rule)."""
    ws = tmp_path / "ws"
    for name in ("MEMORY.md", "memory.md", "DREAMS.md", "notes.md", "sub/DREAMS.md"):
        _write(ws / name, "text")
    disc = list_memory_files(ws, ["."])
    assert sorted(f.rel_path for f in disc.files) == ["MEMORY.md", "notes.md", "sub/DREAMS.md"]
    assert [f.rel_path for f in list_memory_files(ws, [str(ws / "DREAMS.md")]).files] == ["MEMORY.md"]
