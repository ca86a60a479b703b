"""The passages of lexical qmd hits ranked across the notes qmd found
(``qmdbridge/qmd/passages.py``, ``parse.passage_hits``) and the line reads behind them
(``qmdbridge/qmd/reads.py``), numbered as ``memory_get`` numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fallback.models import MemorySearchResult, Source
from fallback.search.fts_only import Hit
from fallback.text.chunking import chunk_markdown, split_lines
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.parse import LocatedHit, passage_hits
from qmdbridge.qmd.passages import MAX_FOCUS_CHARS, MAX_POOL_CHARS, Note, rank_passages
from qmdbridge.qmd.reads import clamp_range, hit_lines, read_qmd_path, resolve_hit_file

# The builtin engine's default chunking, as an agent's config gives it.
CHUNKING = {"tokens": 400, "overlap": 80, "sections": True}
FILLER = "Melanie: That sounds lovely, tell me more about how the week went for you."


def _chat(n: int, answers: dict[int, str]) -> list[str]:
    """A chat log of ``n`` lines (1-based line numbers in ``answers`` replaced), each ~77 chars."""
    return [answers.get(i, f"{FILLER} ({i})") for i in range(1, n + 1)]


def _rank(question: str, *notes: list[str] | Note, limit: int = 6, snippet_chars: int = 700,
          **chunking: object) -> tuple[list[Hit], set[int]]:
    """``rank_passages`` over notes ``memory/n<i>.md`` (given as lines) with ``chunking``: the
    passages and the indexes of the notes matched."""
    given = [n if isinstance(n, Note) else Note(f"memory/n{i}.md", "memory", n)
             for i, n in enumerate(notes)]
    ranking = rank_passages(question, given, **{**CHUNKING, **chunking},  # type: ignore[arg-type]
                            snippet_chars=snippet_chars, limit=limit)
    return ranking.passages, ranking.matched


def _chunk_ranges(lines: list[str], **chunking: object) -> set[tuple[int, int]]:
    """The line ranges of the builtin index's chunks of ``lines``."""
    spec = {**CHUNKING, **chunking}
    return {(c.start_line, c.end_line) for c in chunk_markdown(
        "\n".join(lines), tokens=spec["tokens"], overlap=spec["overlap"],  # type: ignore[arg-type]
        sections=spec["sections"])}  # type: ignore[arg-type]


def _check_shape(p: Hit, lines: list[str], *, snippet_chars: int, **chunking: object) -> None:
    """The range is one of the builtin chunks of the note; the snippet is inside it, within its
    budget, and is its lines' text."""
    assert (p.start_line, p.end_line) in _chunk_ranges(lines, **chunking)
    assert p.start_line <= p.snippet_start_line <= p.snippet_end_line <= p.end_line
    assert len(p.snippet) <= snippet_chars
    assert p.snippet == "\n".join(lines[p.snippet_start_line - 1:p.snippet_end_line])


def test_the_passage_holds_the_line_with_the_question_words() -> None:
    lines = _chat(60, {7: "Caroline: I love the library downtown.",
                       41: "Caroline: I went to the LGBTQ support group yesterday, so powerful."})
    passages, ranked = _rank("When did Caroline go to the LGBTQ support group?", lines)
    assert ranked == {0}
    best = passages[0]
    _check_shape(best, lines, snippet_chars=700)
    assert best.path == "memory/n0.md" and best.score == 1.0
    assert best.start_line <= 41 <= best.end_line
    assert best.snippet_start_line <= 41 <= best.snippet_end_line
    assert "LGBTQ support group" in best.snippet
    # the chunk that holds line 7 only ("Caroline" is in no filler line) comes later, lower
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    assert all(p.score < 1.0 for p in passages[1:])


def test_a_note_qmd_ranked_low_gives_the_first_passage() -> None:
    """qmd's relaxed pass found the first note by one word; the third holds all of them."""
    found_by_one_word = _chat(20, {4: "Jon: my dog Bailey loves the beach"})
    unrelated = _chat(20, {9: "Jon: the car broke down again"})
    answer = _chat(20, {12: "Jon: we took Bailey to the agility contest in Denver, she won"})
    passages, ranked = _rank("Where did Jon take Bailey for the agility contest?",
                             found_by_one_word, unrelated, answer)
    assert [p.path for p in passages] == ["memory/n2.md", "memory/n0.md", "memory/n1.md"]  # the unrelated note: by the speaker's name
    assert ranked == {0, 1, 2}
    assert passages[0].start_line <= 12 <= passages[0].end_line
    assert passages[0].score == 1.0 > passages[1].score > passages[2].score


def test_one_note_gives_a_passage_per_region_that_answers() -> None:
    lines = _chat(80, {5: "Jon: the wombat burrow behind the shed", 70: "Jon: another wombat burrow"})
    passages, _ = _rank("wombat burrow", lines)
    cited = sorted(line for line in (5, 70)
                   for p in passages if p.start_line <= line <= p.end_line)
    assert cited == [5, 70] and len(passages) == 2
    assert len({p.path for p in passages}) == 1


def test_the_range_stays_inside_its_section() -> None:
    lines = ["# API", "", "Use nouns for resources.", "", "## Versioning", "",
             "Put the API version in the URL path.", "", "## Errors", "", "Return problem JSON."]
    passages, _ = _rank("API version", lines, limit=1)
    assert [(p.start_line, p.end_line) for p in passages] == [(5, 8)]
    assert passages[0].snippet == "## Versioning\n\nPut the API version in the URL path.\n"
    # with chunking.sections off, the whole note is one chunk
    whole, _ = _rank("API version", lines, limit=1, sections=False)
    assert [(p.start_line, p.end_line) for p in whole] == [(1, 11)]


def test_words_match_through_the_stemmer_hyphens_and_dates() -> None:
    lines = _chat(40, {30: "Melanie: we finished a sunset painting last weekend",
                       12: "Jon: the guest wifi password is on the fridge"})
    painted, _ = _rank("What has Melanie painted?", lines, tokens=100, overlap=0)
    assert painted[0].start_line <= 30 <= painted[0].end_line
    wifi, _ = _rank("guest Wi-Fi password", lines, tokens=100, overlap=0)
    assert wifi[0].start_line <= 12 <= wifi[0].end_line
    # a daily note is found by its date, as the builtin index finds it by its path
    dated = [Note("memory/2023-05-07.md", "memory", _chat(5, {})),
             Note("memory/2023-05-08.md", "memory", _chat(5, {}))]
    on_the_day = rank_passages("What happened on 8 May 2023?", dated, **CHUNKING,
                               snippet_chars=700, limit=6)
    assert [p.path for p in on_the_day.passages] == ["memory/2023-05-08.md"] and on_the_day.matched == {1}
    assert on_the_day.pooled == {0, 1}  # both were ranked; the other day holds none of its words


@pytest.mark.parametrize("question", ["zebra", "   ", "?!"])
def test_nothing_found_ranks_nothing(question: str) -> None:
    assert _rank(question, _chat(30, {}), []) == ([], set())


def test_fts5_operators_and_quotes_are_read_as_words() -> None:
    lines = _chat(30, {20: 'Nate: the NEAR "field" OR the AND gate'})
    passages, _ = _rank('"field" NEAR OR AND * NOT', lines, tokens=75, overlap=0,
                        snippet_chars=120)
    assert passages and passages[0].snippet_start_line <= 20 <= passages[0].snippet_end_line


def test_a_small_note_is_its_own_passage() -> None:
    lines = ["# Memory", "", "The wombat burrow is behind the shed."]
    passages, _ = _rank("wombat burrow", lines)
    assert passages == [Hit("memory/n0.md", 1, 3, 1.0, "\n".join(lines), 1, 3, "memory", 1.0)]


def test_a_line_longer_than_the_snippet_is_cut_around_the_word() -> None:
    long_line = "x " * 600 + "the wombat burrow " + "y " * 600
    passages, _ = _rank("wombat", ["# Notes", long_line, "end"], snippet_chars=100)
    assert passages and all(p.start_line <= 2 <= p.end_line for p in passages)
    assert (passages[0].snippet_start_line, passages[0].snippet_end_line) == (2, 2)
    assert "wombat" in passages[0].snippet and len(passages[0].snippet) <= 100


def test_marker_characters_in_a_note_are_not_read_as_matches() -> None:
    lines = _chat(40, {3: "\x01weird\x02 control characters", 33: "Jon: the wombat burrow"})
    passages, _ = _rank("wombat", lines, tokens=75, overlap=0, snippet_chars=100)
    assert passages[0].snippet_start_line <= 33 <= passages[0].snippet_end_line
    assert "\x01" not in passages[0].snippet and "\x02" not in passages[0].snippet


def test_nul_bytes_in_a_note_neither_move_nor_hide_its_lines() -> None:
    """FTS5 reads a NUL byte as the end of a text: the lines after it would vanish. They are
    left out of the ranked text (as the builtin index leaves them out of a note), so the line
    numbers stay those of the file."""
    lines = _chat(40, {3: "Jon: padded\x00\x00 line", 33: "Jon: the wombat\x00 burrow"})
    passages, _ = _rank("wombat burrow", lines, tokens=75, overlap=0, snippet_chars=100)
    assert passages[0].start_line <= 33 <= passages[0].end_line <= 40
    assert passages[0].snippet_start_line == passages[0].snippet_end_line == 33
    assert passages[0].snippet == "Jon: the wombat burrow"


def test_notes_over_the_caps_are_not_ranked() -> None:
    big = ["wombat " * 1000] * (MAX_FOCUS_CHARS // 7000 + 2)
    assert _rank("wombat", big) == ([], set())
    # notes are pooled in qmd's order until MAX_POOL_CHARS: the later ones are not ranked
    per_note = ["wombat " * 1000] * (MAX_FOCUS_CHARS // 7000 - 1)
    fit = MAX_POOL_CHARS // len("\n".join(per_note))
    notes = [Note(f"memory/n{i}.md", "memory", per_note) for i in range(fit + 2)]
    ranking = rank_passages("wombat", notes, **CHUNKING, snippet_chars=700, limit=1)  # type: ignore[arg-type]
    assert ranking.pooled == set(range(fit))
    assert ranking.matched <= ranking.pooled and ranking.matched


def test_session_transcripts_take_at_most_half_of_the_slots() -> None:
    notes = [Note(f"qmd/sessions-main/s{i}.md", "sessions", _chat(3, {2: "wombat burrow wombat"}))
             for i in range(4)]
    notes += [Note(f"memory/m{i}.md", "memory", _chat(3, {2: "a wombat"})) for i in range(3)]
    passages = rank_passages("wombat burrow", notes, **CHUNKING, snippet_chars=700, limit=4).passages
    assert [p.source for p in passages] == ["sessions", "sessions", "memory", "memory"]
    # with too few other hits, transcripts fill the slots (nothing else matches)
    passages = rank_passages("wombat burrow", notes[:5], **CHUNKING, snippet_chars=700, limit=4).passages
    assert [p.source for p in passages] == ["sessions", "sessions", "sessions", "memory"]


def _located(path: str, text: list[str] | None, *, score: float = 0.5,
             lines: tuple[int, int] | None = (1, 2), source: Source = "memory") -> LocatedHit:
    return LocatedHit(path=path, source=source, score=score, lines=lines, snippet="qmd's lines",
                      text=text)


def _shape(hits: list[MemorySearchResult]) -> list[tuple[str, int, int, float]]:
    return [(h.path, h.start_line, h.end_line, round(h.score, 3)) for h in hits]


def test_passage_hits_rank_then_keep_what_they_cannot_place_in_qmds_order() -> None:
    answer = ["Jon: the wombat burrow behind the shed", "Jon: bye"]
    located = [
        _located("memory/big.md", None, score=0.9, lines=(3, 6)),  # too big to read: qmd's lines
        _located("memory/a.md", ["Jon: hello", "Jon: a wombat"], score=0.8),
        _located("memory/prefix.md", ["Jon: wombatish"], score=0.7),  # qmd's prefix match
        _located("memory/a.md", ["Jon: hello", "Jon: a wombat"], score=0.6),  # the same file again
        _located("memory/b.md", answer, score=0.2),
        _located("memory/gone.md", ["Jon: nothing"], score=0.9, lines=None),  # past its end
    ]
    hits = passage_hits("wombat burrow", located, **CHUNKING, snippet_chars=700, limit=6,
                        min_score=0.0)
    [b, a, big, prefix] = hits
    assert (b.path, b.score, b.snippet_start_line, b.snippet_end_line) == ("memory/b.md", 1.0, 1, 2)
    assert a.path == "memory/a.md" and 0 < a.score < 1
    # the notes left unranked keep qmd's lines, in qmd's order: one too big to read keeps qmd's
    # score, at most the last passage's; one that was ranked and holds none of the question's
    # words (qmd's prefix match) scores 0
    assert _shape([big, prefix]) == [("memory/big.md", 3, 6, round(a.score, 3)),
                                     ("memory/prefix.md", 1, 2, 0.0)]
    assert (big.snippet, big.snippet_start_line, big.snippet_end_line) == ("qmd's lines", 3, 6)
    # min_score applies to the scores shown
    assert [h.path for h in passage_hits("wombat burrow", located, **CHUNKING, snippet_chars=700,
                                         limit=6, min_score=0.0001)] == [
        "memory/b.md", "memory/a.md", "memory/big.md"]
    floor = a.score + 0.01
    assert _shape(passage_hits("wombat burrow", located, **CHUNKING, snippet_chars=700, limit=6,
                               min_score=floor)) == [("memory/b.md", 1, 2, 1.0)]


def test_passage_hits_without_any_match_keep_qmds_order_and_scores_that_never_rise() -> None:
    """qmd's order puts the AND call's notes first; a later note's higher qmd score (the relaxed
    pass) is shown no higher than the hit before it, so hits stay best first. A note that was
    ranked and holds none of the question's words scores 0, whatever qmd said: qmd's scores
    differ between the warm child (1/rank) and a spawned search (BM25)."""
    located = [_located("memory/y.md", None, score=0.4, lines=(2, 2)),
               _located("memory/z.md", None, score=0.7, lines=(5, 6)),
               _located("memory/x.md", ["nothing here"], score=0.9)]
    hits = passage_hits("wombat", located, **CHUNKING, snippet_chars=700, limit=6, min_score=0.0)
    assert _shape(hits) == [("memory/y.md", 2, 2, 0.4), ("memory/z.md", 5, 6, 0.4),
                            ("memory/x.md", 1, 2, 0.0)]


@pytest.mark.parametrize("body", [
    b"", b"one", b"one\n", b"one\ntwo", b"one\r\ntwo\r\n", b"one\rtwo\rthree", b"a\r\r\nb\n\n",
    b"x\n\n\n", b"\xff\xfe bad \x80 bytes\nnext", "caf\u00e9\u2028still one line\n".encode(),
    b"\xef\xbb\xbf# Title\r\nnext\n", b"\xef\xbb\xbf", b"nul\x00 byte\nnext",
])
def test_lines_are_numbered_as_memory_get_numbers_them(tmp_path: Path, body: bytes) -> None:
    coll = ManagedCollection("notes-main", tmp_path, "**/*.md", "custom")
    (tmp_path / "n.md").write_bytes(body)
    page = read_qmd_path({coll.name: coll}, "qmd/notes-main/n.md", 1, 1000, workspace=tmp_path / "ws")
    assert not page.truncated
    read_by_memory_get = split_lines(page.text)[:page.lines]  # the page is the file's text
    lines = read_by_memory_get
    assert hit_lines(coll, "n.md", workspace=tmp_path / "ws", max_bytes=sys.maxsize) == (len(lines), lines)
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
    assert hit_lines(coll, "My Trip.md", workspace=tmp_path / "ws", max_bytes=sys.maxsize) == (
        3, ["# Trip", "", "ferry booked"])
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
