"""Tests for fallback.sources.read_page: memory_get path rules, the openat-style safe open (a
folder swapped for a symlink never leaks), paging (§12 cases 46-57)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fallback.errors import MemoryFileNotFoundError, PathRefusedError
from fallback.models import MemoryReadResult
from fallback.settings import ExtraPath
from fallback.sources.memory_files import MemoryRoot
from fallback.sources.read_page import (
    ResolvedMemoryPath,
    open_memory_file,
    page_text,
    read_memory_page,
    read_page_in_root,
    resolve_memory_path,
)


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    _write(root / "MEMORY.md", "root")
    _write(root / "memory" / "2026-01-01.md", "day")
    return root


def _refused(ws: Path, rel: str, reason: str, extra: list[str] | None = None) -> None:
    with pytest.raises(PathRefusedError) as info:
        resolve_memory_path(ws, extra or [], rel)
    assert info.value.reason == reason
    assert info.value.path == rel
    assert str(info.value) == f"path refused: {rel!r}: {reason}"


def _page(text: str, **kw: int | None) -> tuple[str, int, int, bool, int | None]:
    kw.setdefault("from_line", None)
    kw.setdefault("lines", None)
    return page_text(text, **kw)  # type: ignore[arg-type]


def test_case46_empty_file() -> None:
    assert _page("", from_line=1, lines=2) == ("", 1, 0, False, None)


def test_case47_trailing_newline_no_extra_line() -> None:
    assert _page("one\ntwo\n", from_line=1, lines=2) == ("one\ntwo", 1, 2, False, None)


def test_case48_crlf_kept() -> None:
    assert _page("one\r\ntwo\r\n", from_line=1, lines=2) == ("one\r\ntwo\r", 1, 2, False, None)


def test_case49_blank_lines() -> None:
    assert _page("one\n\n", lines=2) == ("one\n", 1, 2, False, None)
    assert _page("one\n\n\n", lines=3) == ("one\n\n", 1, 3, False, None)


def test_case50_inner_blank_line() -> None:
    assert _page("one\n\ntwo\n", lines=3) == ("one\n\ntwo", 1, 3, False, None)


def test_case51_from_offsets() -> None:
    assert _page("one\ntwo\n", from_line=2, lines=1) == ("two", 2, 1, False, None)
    assert _page("one\ntwo\n", from_line=3, lines=1) == ("", 3, 0, False, None)


def test_case52_continuation_notice() -> None:
    assert _page("one\ntwo\n", from_line=1, lines=1) == (
        "one\n\n[More content available. Use from=2 to continue.]", 1, 1, True, 2)


def test_case53_no_trailing_newline() -> None:
    assert _page("one\ntwo", lines=2) == ("one\ntwo", 1, 2, False, None)


def test_default_lines_and_clamping() -> None:
    text = "\n".join(str(i) for i in range(1, 201))
    page, start, count, truncated, next_from = _page(text)
    assert (start, count, truncated, next_from) == (1, 120, True, 121)
    assert page.startswith("1\n2\n") and page.endswith("120\n\n[More content available. Use from=121 to continue.]")
    assert _page("a\nb", from_line=-5, lines=-2) == ("a\n\n[More content available. Use from=2 to continue.]", 1, 1, True, 2)


def test_char_budget_drops_lines() -> None:
    assert page_text("aaaa\nbbbb\ncccc", from_line=1, lines=3, max_chars=9) == (
        "aaaa\nbbbb\n\n[More content available. Use from=3 to continue.]", 1, 2, True, 3)


def test_hard_truncation_single_line_code_points() -> None:
    assert page_text("abc😀tail", from_line=1, lines=1, max_chars=4) == (
        "abc😀\n\n[More content available. Line 1 is cut at the maxChars budget. Use from=1 "
        "fromChar=5 to continue.]", 1, 1, True, None)
    # a cut never splits a grapheme cluster: the flag waits for the next page
    assert page_text("ab\U0001F1FA\U0001F1F8cd", from_line=1, lines=1, max_chars=3)[0].startswith(
        "ab\n\n[More content available. Line 1 is cut at the maxChars budget. Use from=1 fromChar=3 ")


def test_a_line_longer_than_the_budget_is_read_on_by_from_char() -> None:
    """A 60,000-char line (a pasted log): each page names the fromChar it goes on at, and the
    pages joined are the line; the last one goes on with the next lines as usual."""
    line = "".join(f"{{\"id\": {i}, \"level\": \"info\"}}, " for i in range(2_400))[:60_000]
    text = f"# Log\n{line}\nafter\n"
    pages, from_char = [], None
    while True:
        page, start, count, truncated, next_from = page_text(text, from_line=2, lines=1,
                                                             max_chars=12_000, from_char=from_char)
        body, _, notice = page.partition("\n\n[More content available. ")
        pages.append(body)
        if not notice.startswith("Line 2 is cut"):
            break
        assert (start, count, truncated, next_from) == (2, 1, True, None)
        from_char = int(notice.split("fromChar=")[1].split(" ")[0])
        assert from_char == 1 + len("".join(pages))
    assert "".join(pages) == line and len(pages) == 5
    assert page_text(text, from_line=2, lines=None, from_char=48_011, max_chars=12_000) == (
        line[48_010:] + "\nafter", 2, 2, False, None)
    assert page_text("ab\r\ncd", from_line=1, lines=None, from_char=9) == ("\r\ncd", 1, 2, False, None)


def test_lone_cr_page_is_the_files_text_as_it_is() -> None:
    assert _page("one\rtwo\rthree\rfour\r", from_line=2, lines=2) == (
        "two\rthree\r\n\n[More content available. Use from=4 to continue.]", 2, 2, True, 4)
    assert _page("one\rtwo\r\nthree\nfour\r") == ("one\rtwo\r\nthree\nfour\r", 1, 4, False, None)


def test_a_large_lines_value_pages_up_to_the_char_budget() -> None:
    text = "".join(f"line {i:05d} of the note\n" for i in range(1, 60_001))  # 23 chars a line
    page, start, count, truncated, next_from = _page(text, from_line=100, lines=60_000)
    # 12,000 chars hold 521 lines of 22 chars and their 520 line breaks
    assert (start, count, truncated, next_from) == (100, 521, True, 621)
    assert page.split("\n\n[More")[0] == "\n".join(f"line {i:05d} of the note" for i in range(100, 621))
    assert _page("\n" * 50, lines=1_000, max_chars=10)[1:] == (1, 11, True, 12)


def test_lone_cr_counts_as_line_break() -> None:
    assert _page("one\rtwo\rthree", from_line=2, lines=1) == (
        "two\r\n\n[More content available. Use from=3 to continue.]", 2, 1, True, 3)


def test_resolve_memory_paths(ws: Path) -> None:
    assert resolve_memory_path(ws, [], "MEMORY.md") == ResolvedMemoryPath(ws, ("MEMORY.md",), "MEMORY.md", True)
    assert resolve_memory_path(ws, [], " ./memory/2026-01-01.md ") == ResolvedMemoryPath(
        ws, ("memory", "2026-01-01.md"), "memory/2026-01-01.md", True)


@pytest.mark.parametrize(("rel", "reason"), [
    ("", "empty path"),
    ("   ", "empty path"),
    ("/etc/passwd.md", "absolute path"),
    ("C:/x/memory.md", "absolute path"),
    ("memory/../MEMORY.md", "parent segment"),
    ("../outside.md", "parent segment"),
    ("memory%2fx.md", "encoded characters"),
    ("memory/x\x00.md", "invalid characters"),
    ("NOTES.md", "not a memory path"),
    ("DREAMS.md", "not a memory path"),
    ("dreams.md", "not a memory path"),
    ("Memory.md", "not a memory path"),
    ("memory-evil/x.md", "not a memory path"),
    ("memory/notes.txt", "not markdown"),
    ("memory/upper.MD", "not markdown"),
    ("memory/.draft.md", "hidden or skipped segment"),
    ("memory/.obsidian/x.md", "hidden or skipped segment"),
    ("memory/node_modules/x.md", "hidden or skipped segment"),
    ("memory/build/x.md", "hidden or skipped segment"),
])
def test_refusals(ws: Path, rel: str, reason: str) -> None:
    _refused(ws, rel, reason)


def _read_refused(ws: Path, rel: str, reason: str, extra: list[str] | None = None) -> None:
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, extra or [], rel)
    assert (info.value.path, info.value.reason) == (rel, reason)


@pytest.mark.parametrize("rel", ["memory/%2e%2e/MEMORY.md", "memory/x%00.md", "memory%2fx.md"])
def test_a_percent_escape_naming_no_file_is_refused_never_decoded(ws: Path, rel: str) -> None:
    _read_refused(ws, rel, "encoded characters")


def test_a_percent_escape_in_a_real_name_is_read_literally(ws: Path) -> None:
    (ws / "memory" / "20%Deal.md").write_text("deal\n")
    assert read_memory_page(ws, [], "memory/20%Deal.md").text == "deal"


def test_refuses_symlinks(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside / "secret.md", "secret")
    (ws / "memory" / "link.md").symlink_to(outside / "secret.md")
    (ws / "memory" / "linkdir").symlink_to(outside)
    _read_refused(ws, "memory/link.md", "symlink")
    _read_refused(ws, "memory/linkdir/secret.md", "symlinked directory")
    _read_refused(ws, "memory/linkdir/missing.md", "symlinked directory")
    for rel, reason in (("memory/link.md", "symlink"), ("memory/linkdir/secret.md", "symlinked directory")):
        with pytest.raises(PathRefusedError) as info:
            read_memory_page(ws, [], rel)
        assert str(info.value) == (f"path refused: {rel!r}: {reason} (links are not followed; add the "
                                   "target's real path to memorySearch.extraPaths to allow it)")
    (ws / "memory" / "folder.md").mkdir()
    _read_refused(ws, "memory/folder.md", "not a regular file")
    os.mkfifo(ws / "memory" / "pipe.md")
    _read_refused(ws, "memory/pipe.md", "not a regular file")  # O_NONBLOCK: never hangs


def test_refuses_symlinked_memory_dir(tmp_path: Path) -> None:
    ws = tmp_path / "ws2"
    ws.mkdir()
    real = tmp_path / "real-memory"
    _write(real / "a.md")
    (ws / "memory").symlink_to(real)
    _read_refused(ws, "memory/a.md", "symlinked directory")


def test_root_file_rule_for_reads(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write(ws / "memory.md", "legacy root")
    assert read_memory_page(ws, [], "memory.md").text == "legacy root"  # the root file
    assert read_memory_page(ws, [], "MEMORY.md").missing is True
    _write(ws / "MEMORY.md", "canonical root")
    _read_refused(ws, "memory.md", "shadowed legacy root file")
    assert read_memory_page(ws, [], "MEMORY.md").text == "canonical root"
    (ws / "memory.md").unlink()  # only MEMORY.md: nothing is shadowed, memory.md is not there
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], "memory.md")
    assert str(info.value) == "path refused: 'memory.md': the root file is MEMORY.md (names are case-sensitive)"


def test_read_page_and_missing(ws: Path) -> None:
    _write(ws / "memory" / "pagination.md", "one\ntwo\n")
    assert read_memory_page(ws, [], "memory/pagination.md", from_line=1, lines=1) == MemoryReadResult(
        path="memory/pagination.md", text="one\n\n[More content available. Use from=2 to continue.]",
        from_line=1, lines=1, truncated=True, next_from=2)
    assert read_memory_page(ws, [], "memory/nope.md") == MemoryReadResult(
        path="memory/nope.md", text="", from_line=1, lines=0, missing=True)
    assert read_memory_page(ws, [], "memory/2026-01-01.md/child.md").missing is True
    assert read_memory_page(ws, [], "memory/no/such/dir.md").missing is True


def test_open_raises_typed_not_found(ws: Path) -> None:
    with pytest.raises(MemoryFileNotFoundError) as info:
        os.close(open_memory_file(ws, ("memory", "vanished.md"), shown="memory/vanished.md"))
    assert (info.value.path, info.value.reason) == ("memory/vanished.md", "no such file")
    assert not isinstance(info.value, FileNotFoundError)
    with pytest.raises(MemoryFileNotFoundError) as info:
        os.close(open_memory_file(ws, ("memory", "2026-01-01.md", "x.md"), shown="p"))
    assert str(info.value) == "no such memory file: 'p': a parent is not a folder"


def test_read_invalid_utf8_and_bom(ws: Path) -> None:
    (ws / "memory" / "bad.md").write_bytes(b"\xef\xbb\xbfok \xff end\n")
    result = read_memory_page(ws, [], "memory/bad.md")
    assert (result.text, result.lines, result.truncated) == ("ok \ufffd end", 1, False)


def test_case54_55_57_extra_paths(ws: Path, tmp_path: Path) -> None:
    extra_in = ws / "extra"
    _write(extra_in / "extra.md", "Extra content.")
    extra_out = tmp_path / "notes"
    _write(extra_out / "x.md", "outside note")
    _write(tmp_path / "single.md", "single file")
    _write(tmp_path / "other" / "y.md", "not configured")
    extras = ["extra", str(extra_out), str(tmp_path / "single.md")]

    got = read_memory_page(ws, extras, "extra/extra.md")
    assert (got.path, got.text, got.missing) == ("extra/extra.md", "Extra content.", False)
    got = read_memory_page(ws, extras, "../notes/x.md")
    assert (got.path, got.text) == ("../notes/x.md", "outside note")
    got = read_memory_page(ws, extras, "../single.md")
    assert (got.path, got.text) == ("../single.md", "single file")
    _refused(ws, "../other/y.md", "parent segment", extras)
    _refused(ws, "../notes/../other/y.md", "parent segment", extras)
    _refused(ws, "../single.txt", "parent segment", extras)

    # case 54: missing file inside an extra dir, or under a parent that is a file
    assert read_memory_page(ws, extras, "extra/missing.md") == MemoryReadResult(
        path="extra/missing.md", text="", from_line=1, lines=0, missing=True)
    assert read_memory_page(ws, extras, "extra/extra.md/below.md").missing is True

    # cases 55 and 57: symlinks inside an extra dir
    (extra_in / "linked.md").symlink_to(extra_in / "extra.md")
    (extra_in / "inside-link").symlink_to(extra_in)
    (extra_in / "outside-link").symlink_to(tmp_path / "other")
    _read_refused(ws, "extra/linked.md", "symlink", extras)
    _read_refused(ws, "extra/inside-link/extra.md", "symlinked directory", extras)
    _read_refused(ws, "extra/outside-link/y.md", "symlinked directory", extras)
    _read_refused(ws, "extra/outside-link/missing.md", "symlinked directory", extras)


def test_extra_path_patterns(ws: Path) -> None:
    _write(ws / "notes" / "top.md", "top")
    _write(ws / "notes" / "deep" / "inner.md", "inner")
    extras: list[str | ExtraPath] = [ExtraPath(path="notes", pattern="*.md")]
    assert read_memory_page(ws, extras, "notes/top.md").text == "top"
    _refused(ws, "notes/deep/inner.md", "outside the pattern *.md", extras)


def test_symlinked_extra_path_admits_nothing(ws: Path, tmp_path: Path) -> None:
    _write(tmp_path / "real" / "z.md")
    (ws / "linked-extra").symlink_to(tmp_path / "real")
    _refused(ws, "linked-extra/z.md", "not a memory path", ["linked-extra"])


def test_case56_transient_error_retried(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(ws / "memory" / "flaky.md", "full text\nsecond line")
    real_open = os.open
    calls: list[str] = []

    def flaky_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        calls.append(str(path))
        if str(path) == "flaky.md" and calls.count("flaky.md") == 1:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", flaky_open)
    result = read_memory_page(ws, [], "memory/flaky.md")
    assert result.text == "full text\nsecond line"
    assert calls == [str(ws), "memory", "flaky.md"] * 2


def test_folder_swapped_for_symlink_never_leaks(tmp_path: Path) -> None:
    """A thread swaps memory/sub between a real folder and a symlink to an outside folder
    while reads run: every read sees the inside note, a missing file or a refusal."""
    ws = tmp_path / "ws"
    _write(ws / "memory" / "sub" / "note.md", "inside note")
    _write(tmp_path / "outside" / "note.md", "OUTSIDE SECRET")
    sub, parked_dir, parked_link = ws / "memory" / "sub", ws / "memory" / "sub-real", ws / "memory" / "sub-link"
    parked_link.symlink_to(tmp_path / "outside")
    done = threading.Event()

    def swap() -> None:
        try:
            for _ in range(3000):
                os.rename(sub, parked_dir)
                os.rename(parked_link, sub)
                os.rename(sub, parked_link)
                os.rename(parked_dir, sub)
        finally:
            done.set()

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes: dict[str, int] = {}
    try:
        while not done.is_set():
            try:
                text = read_memory_page(ws, [], "memory/sub/note.md").text or "<missing>"
            except PathRefusedError as exc:
                text = f"<refused: {exc.reason}>"
            outcomes[text] = outcomes.get(text, 0) + 1
    finally:
        swapper.join()
    assert set(outcomes) <= {"inside note", "<missing>", "<refused: symlinked directory>"}, outcomes
    assert sum(outcomes.values()) > 0


def test_read_page_in_root_applies_the_collection_pattern(tmp_path: Path) -> None:
    root = tmp_path / "coll"
    _write(root / "a.md", "alpha")
    _write(root / "private" / "diary.md", "diary")
    _write(root / "b.txt", "text")
    coll = MemoryRoot(root, "*.md", "extra", root)
    got = read_page_in_root(coll, "a.md", shown="qmd/c/a.md", follow_base=False)
    assert (got.path, got.text) == ("qmd/c/a.md", "alpha")
    for inner, reason in (("private/diary.md", "outside the pattern *.md"), ("b.txt", "not markdown"),
                          ("../coll/a.md", "parent segment"), ("/etc/x.md", "absolute path"),
                          (".hidden.md", "hidden or skipped segment"), ("A.MD", "not markdown")):
        with pytest.raises(PathRefusedError) as info:
            read_page_in_root(coll, inner, shown=f"qmd/c/{inner}", follow_base=False)
        assert (info.value.path, info.value.reason) == (f"qmd/c/{inner}", reason)
    assert read_page_in_root(coll, "gone.md", shown="qmd/c/gone.md", follow_base=False).missing is True


@pytest.mark.parametrize("body", [
    "one\ntwo\nthree\n", "one\r\ntwo\r\nthree\r\n", "one\rtwo\rthree", "\ufeffone\ntwo\n\nfour",
    "x\n" * 300, "caf\u00e9\n\ud83d\ude00 emoji\n" * 50 + "tail",
])
@pytest.mark.parametrize("window", [(None, None), (1, 1), (2, 2), (3, 5), (200, 10), (1000, 3),
                                    (2, 1_000_000)])
@pytest.mark.parametrize("max_chars", [12_000, 9])
@pytest.mark.parametrize("from_char", [None, 7])
def test_streamed_paging_matches_whole_file_paging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   body: str, window: tuple[int | None, int | None],
                                                   max_chars: int, from_char: int | None) -> None:
    import fallback.sources.read_page as rf

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    note = ws / "memory" / "big.md"
    note.write_bytes(body.encode("utf-8", errors="surrogatepass"))
    whole = read_memory_page(ws, [], "memory/big.md", from_line=window[0], lines=window[1],
                             max_chars=max_chars, from_char=from_char)
    monkeypatch.setattr(rf, "STREAM_ABOVE_BYTES", 0)
    streamed = read_memory_page(ws, [], "memory/big.md", from_line=window[0], lines=window[1],
                                max_chars=max_chars, from_char=from_char)
    assert streamed == whole


@pytest.mark.parametrize("block", [1, 2, 3, 5])
@pytest.mark.parametrize("body", ["one\r\ntwo\r\nthree\r\n", "a\rb\r\rc\r", "\ufeffx\r\ny\nz\r\r\n",
                                  "caf\u00e9\r\n\ud83d\ude00\r" * 5])
def test_streamed_paging_skips_lines_across_block_edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        body: str, block: int) -> None:
    import fallback.sources.read_page as rf

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "big.md").write_bytes(body.encode("utf-8", errors="surrogatepass"))
    whole = [read_memory_page(ws, [], "memory/big.md", from_line=n, lines=2) for n in range(1, 20)]
    monkeypatch.setattr(rf, "STREAM_ABOVE_BYTES", 0)
    monkeypatch.setattr(rf, "SKIP_BLOCK_BYTES", block)  # a "\r\n" and a character cut by a block
    assert [read_memory_page(ws, [], "memory/big.md", from_line=n, lines=2)
            for n in range(1, 20)] == whole


@pytest.mark.parametrize("streamed", [False, True])
def test_binary_file_is_refused_as_indexing_skips_it(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                     streamed: bool) -> None:
    import fallback.sources.read_page as rf
    from fallback.sources.file_text import read_memory_text
    from fallback.sources.memory_files import list_memory_files

    if streamed:
        monkeypatch.setattr(rf, "STREAM_ABOVE_BYTES", 0)
    (ws / "memory" / "blob.md").write_bytes(b"PNG\x00\x01\x02 header\n" + b"text\n" * 10)
    (ws / "memory" / "padded.md").write_bytes(b"padded note\n" + b"\x00" * 64)  # text once NULs go
    (ws / "memory" / "mixed.md").write_bytes(b"note\n\x00\xff\xfe\n")  # NULs and invalid UTF-8
    found = {f.rel_path: f for f in list_memory_files(ws, []).files}
    skipped = {p: read_memory_text(found[p], max_file_bytes=1 << 20) for p in
               ("memory/blob.md", "memory/padded.md", "memory/mixed.md")}
    assert [getattr(v, "reason", None) for v in skipped.values()] == [
        "binary file (NUL bytes)", None, "binary file (NUL bytes)"]
    _read_refused(ws, "memory/blob.md", "binary file (NUL bytes)")
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], "memory/blob.md", from_line=5, lines=1)  # also a page past the bytes
    assert str(info.value) == "path refused: 'memory/blob.md': binary file (NUL bytes)"
    assert read_memory_page(ws, [], "memory/padded.md").text.startswith("padded note")
    _read_refused(ws, "memory/mixed.md", "binary file (NUL bytes)")


def _bytes_read() -> int:
    """Bytes this process has read through read system calls so far (Linux ``rchar``)."""
    counters = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(counters["rchar"])


LINE = b"plain note line\n"
TEXT = LINE * ((3 << 20) // len(LINE))  # 3 MiB of text: above STREAM_ABOVE_BYTES, read as a stream
TAIL = b"\x00\x01 binary tail\n"  # a NUL byte with another control byte: binary by indexing's rule


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="needs Linux /proc/self/io (rchar)")
def test_get_judges_binary_as_the_index_does_reading_at_most_its_size_cap(ws: Path) -> None:
    """A file up to the index's size cap (``maxFileBytes``) is judged whole, as the indexer
    judges it; a larger one, which the index skips as too large, by its first cap bytes only,
    so a NUL byte after the cap is never read and a huge file costs one bounded read."""
    from fallback.sources.file_text import BINARY_FILE, read_memory_text
    from fallback.sources.memory_files import list_memory_files

    cap = 4 << 20
    (ws / "memory" / "inside.md").write_bytes(TEXT + TAIL)  # under the cap, NUL at 3 MiB
    (ws / "memory" / "beyond.md").write_bytes(TEXT * 8 + TAIL)  # 24 MiB, NUL after the cap only
    (ws / "memory" / "early.md").write_bytes(TAIL + TEXT * 8)  # 24 MiB, NUL in the first bytes
    cut = b"\x00" + b"a" * (cap - 2) + "\u00e9 and more\n".encode()  # NUL padding; é split at the cap
    (ws / "memory" / "cut.md").write_bytes(cut)
    found = list_memory_files(ws, [], max_file_bytes=cap)
    inside = next(f for f in found.files if f.rel_path == "memory/inside.md")
    assert getattr(read_memory_text(inside, max_file_bytes=cap), "reason", None) == BINARY_FILE
    assert sorted((s.path, s.reason.split(" (")[0]) for s in found.skipped) == [
        ("memory/beyond.md", "too large"), ("memory/cut.md", "too large"), ("memory/early.md", "too large")]
    with pytest.raises(PathRefusedError) as refused:
        read_memory_page(ws, [], "memory/inside.md", max_file_bytes=cap)
    assert refused.value.reason == BINARY_FILE
    before = _bytes_read()
    page = read_memory_page(ws, [], "memory/beyond.md", lines=2, max_file_bytes=cap)
    read = _bytes_read() - before
    assert (page.text.split("\n\n")[0], page.lines, page.next_from) == ("plain note line\nplain note line", 2, 3)
    assert cap <= read < cap + (1 << 20)  # the prefix once (no NUL in it), then the page
    before = _bytes_read()
    with pytest.raises(PathRefusedError) as early:
        read_memory_page(ws, [], "memory/early.md", max_file_bytes=cap)
    assert early.value.reason == BINARY_FILE and _bytes_read() - before <= 2 * cap
    # the split é is not invalid UTF-8: the prefix ends inside it
    assert read_memory_page(ws, [], "memory/cut.md", lines=1, max_file_bytes=cap).lines == 1


@pytest.mark.anyio
async def test_the_engine_judges_binary_by_its_own_size_cap(ws: Path, tmp_path: Path) -> None:
    from fallback.engine.builtin import BuiltinEngine
    from fallback.settings import EngineSettings, MemorySearchSettings

    (ws / "memory" / "big.md").write_bytes(TEXT + TAIL)  # NUL at 3 MiB, past a 2 MiB cap
    settings = EngineSettings.for_workspace(ws, state_dir=tmp_path / "state", search=MemorySearchSettings(
        provider="none", maxFileBytes=2 << 20))
    engine = BuiltinEngine(settings)
    try:
        page = await engine.read_file("memory/big.md", lines=1)
    finally:
        await engine.close()
    assert (page.text.split("\n\n")[0], page.lines) == ("plain note line", 1)


def test_the_dreaming_diary_is_refused_even_under_an_extra_path_of_the_workspace(ws: Path) -> None:
    """With ``extraPaths: ["."]`` the workspace's other notes are readable, ``DREAMS.md`` is not
    (search never cites it), and the refusal says why; without the extra path it is no memory
    path at all."""
    (ws / "DREAMS.md").write_text("dream\n")
    (ws / "notes.md").write_text("note\n")
    assert read_memory_page(ws, ["."], "notes.md").text == "note"
    _read_refused(ws, "DREAMS.md", "the dreaming diary (DREAMS.md) is not memory", ["."])
    _refused(ws, "DREAMS.md", "not a memory path")
    (ws / "memory.md").write_text("legacy\n")  # beside MEMORY.md: refused as qmd's read refuses it
    _read_refused(ws, "notes/../memory.md", "shadowed legacy root file", ["."])


def test_an_unreadable_note_or_transcript_is_a_backend_failure_naming_it() -> None:
    """A file the reader may not open is no missing page and no refusal: memory_get fails
    with the OS reason, for a memory file and for a transcript alike."""
    import shutil
    import tempfile

    from fallback.errors import BackendUnavailableError

    # Root reads any file, and the tests run as root here and in CI: read as uid nobody in a
    # folder every uid may use.
    top = Path(tempfile.mkdtemp(prefix="qmdbridge-perm-"))
    try:
        ws, sessions = top / "ws", top / "sessions"
        note = _write(ws / "memory" / "locked.md", "secret\n")
        transcript = _write(sessions / "locked.jsonl", '{"type": "message"}\n')
        for d in (top, ws, ws / "memory", sessions):
            d.chmod(0o777)
        note.chmod(0)
        transcript.chmod(0)
        dropped = os.geteuid() == 0
        errors: list[str] = []
        if dropped:
            os.seteuid(65534)
        try:
            for rel in ("memory/locked.md", "sessions/locked.jsonl"):
                with pytest.raises(BackendUnavailableError) as info:
                    read_memory_page(ws, [], rel, sessions_dir=sessions)
                errors.append(str(info.value))
        finally:
            if dropped:
                os.seteuid(0)
        assert errors == ["builtin unavailable: cannot read memory/locked.md: Permission denied",
                          "builtin unavailable: cannot read sessions/locked.jsonl: Permission denied"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_shared_path_is_answered_and_refused_as_the_owners_local_path(tmp_path: Path) -> None:
    """``shared/<owner>/<path>`` read from the texts of the owner's indexed files: each
    request gives the owner's own ``memory_get`` answer of ``<path>``, or its refusal reason."""
    from fallback.sources.memory_files import list_memory_files
    from fallback.sources.read_page import read_shared_page

    ws = tmp_path / "ws"
    _write(ws / "MEMORY.md", "root\n")
    _write(ws / "memory" / "2026-01-01.md", "day\n")
    _write(ws / "notes" / "in.md", "inside\n")
    _write(tmp_path / "outside" / "out.md", "outside\n")
    extras: list[str | ExtraPath] = ["notes", str(tmp_path / "outside")]
    texts = {f.rel_path: f.abs_path.read_text() for f in list_memory_files(ws, extras).files}
    assert sorted(texts) == ["../outside/out.md", "MEMORY.md", "memory/2026-01-01.md", "notes/in.md"]

    def answer(read: Callable[[], MemoryReadResult]) -> tuple[str, ...]:
        try:
            page = read()
        except PathRefusedError as exc:
            return ("refused", exc.reason)
        return (page.text, page.path.removeprefix("shared/owner/"))

    for path in ("memory/../MEMORY.md", "memory/../memory/2026-01-01.md", "memory/../nothing.md",
                 "memory/../notes/in.md", "../outside/out.md", "memory/../../outside/./out.md",
                 "./memory//2026-01-01.md", "memory/2030-01-01.md", "/etc/passwd.md", "memory/\x01.md"):
        local = answer(lambda p=path: read_memory_page(ws, extras, p))  # type: ignore[misc]
        shared = answer(lambda p=path: read_shared_page(texts.get, f"shared/owner/{p}"))  # type: ignore[misc]
        assert shared == local, path
    assert answer(lambda: read_shared_page(texts.get, "shared/owner/memory/../MEMORY.md")) == (
        "refused", "parent segment")
