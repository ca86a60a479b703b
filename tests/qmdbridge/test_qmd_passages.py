"""The passage of a lexical qmd hit chosen with the question's words (``qmdbridge/qmd/passages.py``)
and the line reads behind it (``qmdbridge/qmd/reads.py``), numbered as ``memory_get`` numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.passages import MAX_FOCUS_CHARS, Passage, PassageFinder
from qmdbridge.qmd.reads import clamp_range, file_lines, hit_lines, read_in_root, resolve_hit_file

# The builtin engine's default chunking, as an agent's config gives it.
CHUNKING = {"chunk_tokens": 400, "sections": True}


def _small(chars: int) -> dict[str, object]:
    """A chunk budget of ``chars`` characters (tokens of 4 chars), sections on."""
    return {"chunk_tokens": chars // 4, "sections": True}


def _chat(n: int, answers: dict[int, str]) -> list[str]:
    """A chat log of ``n`` lines (1-based line numbers in ``answers`` replaced), each ~77 chars."""
    filler = "Melanie: That sounds lovely, tell me more about how the week went for you."
    return [answers.get(i, f"{filler} ({i})") for i in range(1, n + 1)]


def _check_shape(p: Passage, lines: list[str], *, range_chars: int, snippet_chars: int) -> None:
    """Both windows fit their budgets, nest, and the snippet is its lines' text."""
    assert 1 <= p.start_line <= p.snippet_start_line <= p.snippet_end_line <= p.end_line <= len(lines)
    assert len("\n".join(lines[p.start_line - 1:p.end_line])) <= range_chars
    assert len(p.snippet) <= snippet_chars
    assert p.snippet == "\n".join(lines[p.snippet_start_line - 1:p.snippet_end_line])


def _filled(lines: list[str], first: int, last: int, budget: int) -> bool:
    """One more line on either side of ``first..last`` (1-based) would not fit ``budget``."""
    size = len("\n".join(lines[first - 1:last]))
    return all(not 1 <= i <= len(lines) or size + 1 + len(lines[i - 1]) > budget
               for i in (first - 1, last + 1))


def test_the_passage_holds_the_line_with_the_question_words() -> None:
    lines = _chat(60, {7: "Caroline: I love the library downtown.",
                       41: "Caroline: I went to the LGBTQ support group yesterday, so powerful."})
    with PassageFinder(("Caroline", "LGBTQ", "support", "group"), **CHUNKING,
                       snippet_chars=700) as finder:
        p = finder.find(lines)
    assert p is not None
    _check_shape(p, lines, range_chars=1600, snippet_chars=700)
    assert p.start_line <= 41 <= p.end_line and p.snippet_start_line <= 41 <= p.snippet_end_line
    # each budget is filled: 20 lines of ~77 chars in 1,600, 8 in 700
    assert (p.end_line - p.start_line + 1, p.snippet_end_line - p.snippet_start_line + 1) == (20, 8)
    assert _filled(lines, p.start_line, p.end_line, 1600)
    assert _filled(lines, p.snippet_start_line, p.snippet_end_line, 700)
    assert "LGBTQ support group" in p.snippet


def test_the_section_with_more_of_the_words_wins_over_the_denser_one() -> None:
    lines = ["# Log", "", "## Monday", *_chat(20, {5: "Jon: wombat wombat wombat", 6: "Jon: wombat"}),
             "## Friday", *_chat(20, {15: "Jon: the wombat burrow behind the shed"})]
    with PassageFinder(("wombat", "burrow", "shed"), **CHUNKING, snippet_chars=300) as finder:
        p = finder.find(lines)
    assert p is not None and p.start_line >= 24 and p.snippet_start_line <= 39 <= p.snippet_end_line


def test_the_range_stays_inside_its_section() -> None:
    lines = ["# API", "", "Use nouns for resources.", "", "## Versioning", "",
             "Put the API version in the URL path.", "", "## Errors", "", "Return problem JSON."]
    with PassageFinder(("API", "version"), **CHUNKING, snippet_chars=700) as finder:
        p = finder.find(lines)
    assert p is not None and (p.start_line, p.end_line) == (5, 8)
    assert p.snippet == "## Versioning\n\nPut the API version in the URL path.\n"
    # with chunking.sections off, the whole note fits the budget and is the range
    with PassageFinder(("API", "version"), chunk_tokens=400, sections=False,
                       snippet_chars=700) as finder:
        whole = finder.find(lines)
    assert whole is not None and (whole.start_line, whole.end_line) == (1, 11)


def test_words_match_through_the_stemmer_and_hyphens() -> None:
    lines = _chat(40, {30: "Melanie: we finished a sunset painting last weekend",
                       12: "Jon: the guest wi fi password is on the fridge"})
    with PassageFinder(("paints",), **_small(400), snippet_chars=200) as finder:
        painted = finder.find(lines)
        assert painted is not None and painted.snippet_start_line <= 30 <= painted.snippet_end_line
    with PassageFinder(("Wi-Fi", "password"), **_small(400), snippet_chars=200) as finder:
        wifi = finder.find(lines)
        assert wifi is not None and wifi.snippet_start_line <= 12 <= wifi.snippet_end_line


@pytest.mark.parametrize("terms", [(), ("zebra",), ("   ",)])
def test_nothing_found_keeps_qmds_lines(terms: tuple[str, ...]) -> None:
    with PassageFinder(terms, **CHUNKING, snippet_chars=700) as finder:
        assert finder.find(_chat(30, {})) is None
        assert finder.find([]) is None


def test_fts5_operators_and_quotes_are_read_as_words() -> None:
    lines = _chat(30, {20: 'Nate: the NEAR "field" OR the AND gate'})
    with PassageFinder(('"field"', "NEAR", "OR", "AND", "*", "NOT"), **_small(300),
                       snippet_chars=120) as finder:
        p = finder.find(lines)
    assert p is not None and p.snippet_start_line <= 20 <= p.snippet_end_line


def test_a_small_file_is_its_own_passage() -> None:
    lines = ["# Memory", "", "The wombat burrow is behind the shed."]
    with PassageFinder(("wombat", "burrow"), **CHUNKING, snippet_chars=700) as finder:
        p = finder.find(lines)
    assert p == Passage(1, 3, "\n".join(lines), 1, 3)


def test_a_line_longer_than_the_snippet_is_cut_around_the_word() -> None:
    long_line = "x " * 600 + "the wombat burrow " + "y " * 600
    lines = ["# Notes", long_line, "end"]
    with PassageFinder(("wombat",), **CHUNKING, snippet_chars=100) as finder:
        p = finder.find(lines)
    assert p is not None and (p.start_line, p.end_line) == (2, 2)
    assert (p.snippet_start_line, p.snippet_end_line) == (2, 2)
    assert "wombat" in p.snippet and len(p.snippet) <= 100


def test_marker_characters_in_a_note_are_not_read_as_matches() -> None:
    lines = _chat(40, {3: "\x01weird\x02 control characters", 33: "Jon: the wombat burrow"})
    with PassageFinder(("wombat",), **_small(300), snippet_chars=100) as finder:
        p = finder.find(lines)
    assert p is not None and p.snippet_start_line <= 33 <= p.snippet_end_line
    assert "\x01" not in p.snippet and "\x02" not in p.snippet


def test_nul_bytes_in_a_note_neither_move_nor_hide_its_lines() -> None:
    """FTS5 reads a NUL byte as the end of the text it highlights: the lines after it would
    shift or vanish. They are left out of the marked text (as the builtin index leaves them
    out of a note), so the line numbers stay those of the file."""
    lines = _chat(40, {3: "Jon: padded\x00\x00 line", 33: "Jon: the wombat\x00 burrow"})
    with PassageFinder(("wombat", "burrow"), **_small(300), snippet_chars=100) as finder:
        p = finder.find(lines)
    assert p is not None
    # 22 chars; a ~79-char neighbour would not fit the 100-char snippet
    assert (p.snippet_start_line, p.snippet_end_line, p.snippet) == (33, 33, "Jon: the wombat burrow")
    assert p.start_line <= 33 <= p.end_line <= 40


def test_a_file_over_the_cap_keeps_qmds_lines() -> None:
    lines = ["wombat " * 1000] * (MAX_FOCUS_CHARS // 7000 + 2)
    with PassageFinder(("wombat",), **CHUNKING, snippet_chars=700) as finder:
        assert finder.find(lines) is None


def test_one_finder_serves_many_files() -> None:
    with PassageFinder(("wombat",), **_small(200), snippet_chars=100) as finder:
        first = finder.find(_chat(20, {5: "the wombat"}))
        second = finder.find(_chat(20, {15: "a wombat"}))
        assert finder.find(_chat(20, {})) is None
    assert first is not None and first.snippet_start_line <= 5 <= first.snippet_end_line
    assert second is not None and second.snippet_start_line <= 15 <= second.snippet_end_line


@pytest.mark.parametrize("body", [
    b"", b"one", b"one\n", b"one\ntwo", b"one\r\ntwo\r\n", b"one\rtwo\rthree", b"a\r\r\nb\n\n",
    b"x\n\n\n", b"\xff\xfe bad \x80 bytes\nnext", "caf\u00e9\u2028still one line\n".encode(),
    b"\xef\xbb\xbf# Title\r\nnext\n", b"\xef\xbb\xbf", b"nul\x00 byte\nnext",
])
def test_lines_are_numbered_as_memory_get_numbers_them(tmp_path: Path, body: bytes) -> None:
    coll = ManagedCollection("notes-main", tmp_path, "**/*.md", "custom")
    (tmp_path / "n.md").write_bytes(body)
    page = read_in_root(coll, "n.md", "qmd/notes-main/n.md", 1, 1000, workspace=tmp_path / "ws")
    assert not page.truncated
    read_by_memory_get = [line.removesuffix("\r") for line in page.text.split("\n")][:page.lines]
    lines = file_lines(coll, "n.md", workspace=tmp_path / "ws")
    assert lines == read_by_memory_get
    # read whole or counted as a stream, the count is the same
    assert hit_lines(coll, "n.md", workspace=tmp_path / "ws", max_bytes=1 << 20) == (len(lines), lines)
    assert hit_lines(coll, "n.md", workspace=tmp_path / "ws", max_bytes=0) == (
        len(lines), None if body else [])


def test_a_normalised_path_still_finds_a_note_that_starts_with_a_bom(tmp_path: Path) -> None:
    """qmd keeps a note's BOM in its snippet; the note's lines are read without it (as
    ``memory_get`` reads them), and the snippet's first line still names the note behind a
    path an old qmd stored normalised."""
    coll = ManagedCollection("notes-main", tmp_path, "**/*.md", "custom")
    (tmp_path / "My Trip.md").write_bytes("\ufeff# Trip\n\nferry booked\n".encode())
    assert file_lines(coll, "My Trip.md", workspace=tmp_path / "ws") == ["# Trip", "", "ferry booked"]
    assert resolve_hit_file(coll, "my-trip.md", "\ufeff# Trip\n\nferry booked", 1, 3,
                            workspace=tmp_path / "ws") == ("My Trip.md", None)


def test_a_stream_count_handles_a_crlf_split_between_blocks(tmp_path: Path) -> None:
    coll = ManagedCollection("notes-main", tmp_path, "**/*.md", "custom")
    body = b"a" * ((1 << 20) - 1) + b"\r\n" + b"b\rc\n" + b"tail"
    (tmp_path / "big.md").write_bytes(body)
    assert hit_lines(coll, "big.md", workspace=tmp_path / "ws", max_bytes=0) == (4, None)
    whole = hit_lines(coll, "big.md", workspace=tmp_path / "ws", max_bytes=len(body))
    assert whole is not None and whole[0] == 4


@pytest.mark.parametrize(("start", "end", "total", "want"), [
    (2, 9, 3, (2, 3)), (3, 3, 3, (3, 3)), (4, 5, 3, None), (1, 4, 0, (1, 1)), (5, 2, 9, (5, 5)),
])
def test_clamp_range(start: int, end: int, total: int, want: tuple[int, int] | None) -> None:
    assert clamp_range(start, end, total) == want
