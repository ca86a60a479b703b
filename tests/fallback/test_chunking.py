"""Tests for fallback.text.chunking (spec §3 and §12 cases 13-21)."""

from __future__ import annotations

import hashlib
import random
import re

import pytest

from fallback.errors import UsageError
from fallback.text.chunking import (
    Chunk,
    chunk_markdown,
    file_lines,
    remap_lines,
    split_by_utf8_bytes,
    split_lines,
    text_weight,
    truncate_chars,
    word_start,
)


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def test_text_weight_counts_cjk_as_four() -> None:
    assert text_weight("") == 0
    assert text_weight("abc") == 3
    assert text_weight("你好") == 8
    assert text_weight("한국") == 8
    assert text_weight("カナ") == 8
    assert text_weight("\U00020000") == 4  # Extension B: one code point, weight 4
    assert text_weight("😀") == 1
    assert text_weight("a你") == 5


def test_small_file_is_one_chunk_with_hash() -> None:
    chunks = chunk_markdown("# Title\nline two\nline three")
    assert chunks == [Chunk("# Title\nline two\nline three", 1, 3, _sha("# Title\nline two\nline three"))]


def test_case13_long_ascii_line_bounded() -> None:
    chunks = chunk_markdown("a" * (1600 * 3 + 25), tokens=400, overlap=0)
    assert [len(c.text) for c in chunks] == [1600, 1600, 1600, 25]
    assert all(c.start_line == c.end_line == 1 for c in chunks)


def test_case14_cjk_lines_make_more_chunks() -> None:
    cjk = chunk_markdown("\n".join(["你" * 20] * 20), tokens=50, overlap=0)
    ascii_ = chunk_markdown("\n".join(["a" * 20] * 20), tokens=50, overlap=0)
    assert len(cjk) == 10
    assert len(ascii_) == 3
    assert [(c.start_line, c.end_line) for c in cjk][:2] == [(1, 2), (3, 4)]


def test_case15_chinese_sentences_bounded() -> None:
    line = ("这是一个用于测试中文分块功能是否正常工作的句子内容" * 2)[:28]
    assert len(line) == 28
    chunks = chunk_markdown("\n".join([line] * 50), tokens=100)
    assert len(chunks) > 1
    assert all(sum(1 for ch in c.text if "\u4e00" <= ch <= "\u9fff") <= 200 for c in chunks)
    assert all(text_weight(c.text) <= 400 for c in chunks)


def test_case16_repeated_sentence_bounded() -> None:
    text = "hello world this is a test. " * 50
    chunks = chunk_markdown(text, tokens=100)
    # each cut falls after the last whole word that fits in 400 chars (the third lands on a
    # space), so together the chunks hold the line as it is (the last keeps its final space)
    assert [len(c.text) for c in chunks] == [398, 398, 400, 204]
    assert [c.text[-4:] for c in chunks] == ["llo ", "rld ", " is ", "st. "]
    assert "".join(c.text for c in chunks) == text


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def test_long_line_is_cut_between_words_so_every_word_is_found() -> None:
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 10)))
             for _ in range(6000)]
    line = " ".join(words)  # a pasted paragraph without line breaks, ~45,000 chars
    chunks = chunk_markdown(f"# Log\n{line}\n", tokens=400, overlap=80)
    found = set().union(*(_words(c.text) for c in chunks))
    assert set(words) - found == set()
    assert all(len(c.text) <= 1600 for c in chunks)


def test_long_line_without_spaces_is_cut_after_punctuation() -> None:
    line = "key=value;" * 10  # 100 chars, a chunk holds 32
    chunks = chunk_markdown(line, tokens=8, overlap=0)
    assert [c.text for c in chunks] == ["key=value;" * 3] * 3 + ["key=value;"]


def test_a_word_longer_than_a_chunk_is_still_cut() -> None:
    chunks = chunk_markdown("to " + "x" * 70 + " end", tokens=8, overlap=0)
    assert [c.text for c in chunks] == ["to ", "x" * 32, "x" * 32, "x" * 6 + " end"]


def test_case17_mixed_lines_keep_all_content() -> None:
    text = "\n".join(f"Line {i}: 这是中英文混合的测试内容 with some English text" for i in range(30))
    chunks = chunk_markdown(text, tokens=50)
    assert len(chunks) > 1
    joined = "".join(c.text for c in chunks)
    assert "Line 0" in joined and "Line 29" in joined
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 30


def test_case18_cjk_single_line() -> None:
    chunks = chunk_markdown("中" * 2000, tokens=200)
    assert len(chunks) == 10
    assert all(len(c.text) == 200 for c in chunks)


def test_case19_astral_ideographs_never_corrupted() -> None:
    chunks = chunk_markdown("\U00020000" * 120, tokens=31)
    assert [len(c.text) for c in chunks] == [31, 31, 31, 27]
    for c in chunks:
        assert "\ufffd" not in c.text
        assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in c.text)


def test_emoji_lines_never_split() -> None:
    chunks = chunk_markdown("😀" * 100, tokens=8, overlap=0)
    assert [len(c.text) for c in chunks] == [32, 32, 32, 4]
    assert "".join(c.text for c in chunks) == "😀" * 100


def test_case20_ascii_long_line_few_chunks() -> None:
    chunks = chunk_markdown("a" * 2000, tokens=200)
    assert len(chunks) == 3


def test_overlap_repeats_trailing_whole_lines() -> None:
    lines = [f"line {i:02d} " + "x" * 12 for i in range(1, 21)]  # 20 chars each -> weight 21
    chunks = chunk_markdown("\n".join(lines), tokens=20, overlap=10)  # 80 chars, overlap 40
    # Budget 80, line size 21: three lines per chunk; the overlap window (40) holds one line.
    assert [(c.start_line, c.end_line) for c in chunks] == [
        (1, 3), (3, 5), (5, 7), (7, 9), (9, 11), (11, 13), (13, 15), (15, 17), (17, 19), (19, 20)]
    assert chunks[1].text.split("\n")[0] == lines[2]
    assert all(len(c.text) <= 80 for c in chunks)


def test_no_overlap_disjoint_ranges() -> None:
    lines = [f"line {i:02d} " + "x" * 12 for i in range(1, 11)]
    chunks = chunk_markdown("\n".join(lines), tokens=20, overlap=0)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 3), (4, 6), (7, 9), (10, 10)]
    assert chunks[0].text == "\n".join(lines[:3])


def test_crlf_stripped_and_line_numbers_kept() -> None:
    chunks = chunk_markdown("one\r\ntwo\r\n\r\nfour\r\n")
    assert len(chunks) == 1
    assert chunks[0].text == "one\ntwo\n\nfour"
    assert (chunks[0].start_line, chunks[0].end_line) == (1, 4)


def test_lone_cr_line_endings() -> None:
    chunks = chunk_markdown("a" * 20 + "\r" + "b" * 20 + "\r" + "c" * 20, tokens=8, overlap=0)
    assert [(c.text, c.start_line, c.end_line) for c in chunks] == [
        ("a" * 20, 1, 1), ("b" * 20, 2, 2), ("c" * 20, 3, 3)]


def test_trailing_newline_adds_no_line() -> None:
    (chunk,) = chunk_markdown("one\ntwo\n")
    assert (chunk.text, chunk.start_line, chunk.end_line) == ("one\ntwo", 1, 2)
    (chunk,) = chunk_markdown("one\n\n")
    assert (chunk.text, chunk.start_line, chunk.end_line) == ("one\n", 1, 2)


def test_split_lines_all_styles() -> None:
    assert split_lines("a\r\nb\rc\nd") == ["a", "b", "c", "d"]
    assert split_lines("a\n") == ["a", ""]
    assert split_lines("a\r\nb\rc\nd", keep_ends=True) == ["a\r\n", "b\r", "c\n", "d"]
    assert split_lines("a\n", keep_ends=True) == ["a\n", ""]
    # max_lines: that many lines, then the rest of the text whole
    assert split_lines("a\nb\rc\r\nd", max_lines=2) == ["a", "b", "c\r\nd"]
    assert split_lines("a\nb\rc\r\nd", keep_ends=True, max_lines=2) == ["a\n", "b\r", "c\r\nd"]
    assert split_lines("a\nb\n", keep_ends=True, max_lines=9) == ["a\n", "b\n", ""]


def test_file_lines_start_no_line_after_the_final_break() -> None:
    assert file_lines("") == []
    assert file_lines("\n") == [""]
    assert file_lines("a\r\nb\r") == ["a", "b"]
    assert file_lines("a\nb\n\n", keep_ends=True) == ["a\n", "b\n", "\n"]
    assert file_lines("a\nb\n", keep_ends=True, max_lines=1) == ["a\n", "b\n"]
    assert file_lines("a\nb\n", keep_ends=True, max_lines=2) == ["a\n", "b\n"]


def test_empty_and_whitespace_files_have_no_chunks() -> None:
    assert chunk_markdown("") == []
    assert chunk_markdown("   \n\t\n\n  ") == []


def test_whitespace_only_chunk_dropped_between_content() -> None:
    text = "a" * 30 + "\n" + " " * 30 + "\n" + "b" * 30
    chunks = chunk_markdown(text, tokens=8, overlap=0)
    assert [(c.text, c.start_line) for c in chunks] == [("a" * 30, 1), ("b" * 30, 3)]


def test_case21_remap_five_lines() -> None:
    chunks = chunk_markdown("l1\nl2\nl3\nl4\nl5")
    mapped = remap_lines(chunks, [4, 6, 7, 10, 13])
    assert (mapped[0].start_line, mapped[-1].end_line) == (4, 13)
    assert mapped[0].text == chunks[0].text and mapped[0].content_hash == chunks[0].content_hash
    assert remap_lines(chunks, None) == chunks


def test_case21_remap_many_chunks() -> None:
    text = "\n".join(f"message number {i} with words" for i in range(10))
    line_map = [2 + 3 * i for i in range(10)]  # 2, 5, ..., 29
    chunks = remap_lines(chunk_markdown(text, tokens=10), line_map)
    assert len(chunks) > 1
    assert chunks[0].start_line == 2 and chunks[-1].end_line == 29
    assert all(c.start_line <= c.end_line for c in chunks)


def test_truncate_chars() -> None:
    assert truncate_chars("héllo😀x", 6) == "héllo😀"
    assert truncate_chars("abc", 10) == "abc"
    assert truncate_chars("abc", 0) == ""


def test_split_by_utf8_bytes_respects_code_points() -> None:
    text = "ab😀cd中文e"
    chunk = Chunk(text, 3, 7, _sha(text))
    pieces = split_by_utf8_bytes(chunk, 5)
    assert [p.text for p in pieces] == ["ab", "😀c", "d中", "文e"]
    assert all(len(p.text.encode("utf-8")) <= 5 for p in pieces)
    assert all((p.start_line, p.end_line) == (3, 7) for p in pieces)
    assert [p.content_hash for p in pieces] == [_sha(p.text) for p in pieces]
    assert "".join(p.text for p in pieces) == text


def test_split_by_utf8_bytes_fits_unchanged() -> None:
    chunk = Chunk("short", 1, 1, _sha("short"))
    assert split_by_utf8_bytes(chunk, 5) == [chunk]


def test_split_by_utf8_bytes_rejects_tiny_cap() -> None:
    with pytest.raises(UsageError, match="max_bytes must be >= 4, got 3"):
        split_by_utf8_bytes(Chunk("abcdef", 1, 1, _sha("abcdef")), 3)


def test_sections_start_a_chunk_at_each_heading() -> None:
    text = ("# MEMORY\n\nIntro line.\n\n## People\n- Dana is my manager.\n\n## Network\n"
            "- Router: ER605.\n   ### deep heading\nbody\n#hashtag is not a heading\n")
    chunks = chunk_markdown(text, tokens=400, overlap=80, sections=True)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4), (5, 7), (8, 9), (10, 12)]
    assert chunks[1].text == "## People\n- Dana is my manager.\n"
    assert chunks[3].text == "   ### deep heading\nbody\n#hashtag is not a heading"
    # without sections the whole small file is one chunk (reference E2 behaviour)
    assert len(chunk_markdown(text, tokens=400, overlap=80)) == 1


def test_sections_still_cut_long_sections_by_size() -> None:
    body = "\n".join(f"line {i} " + "x" * 60 for i in range(40))
    chunks = chunk_markdown(f"# A\n{body}\n# B\nshort\n", tokens=100, overlap=0, sections=True)
    assert chunks[-1].text == "# B\nshort" and chunks[-1].start_line == 42
    assert all(len(c.text) <= 400 for c in chunks) and len(chunks) > 3


FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # 👨‍👩‍👧‍👦: 7 code points
FLAG_JP = "\U0001F1EF\U0001F1F5"  # 🇯🇵: two regional indicators
FLAG_FR = "\U0001F1EB\U0001F1F7"  # 🇫🇷


def test_long_line_of_emoji_families_and_flags_is_cut_between_graphemes() -> None:
    line = (FAMILY + FLAG_JP) * 10  # 90 code points on one line, a chunk holds 32
    chunks = chunk_markdown(f"# Trip\n{line}\n", tokens=8, overlap=0, sections=False)
    # cuts at 27 code points (3 x family + flag), never at 32 (inside the 4th family)
    assert [(c.text, c.start_line, c.end_line) for c in chunks] == [
        ("# Trip", 1, 1), ((FAMILY + FLAG_JP) * 3, 2, 2), ((FAMILY + FLAG_JP) * 3, 2, 2),
        ((FAMILY + FLAG_JP) * 3, 2, 2), (FAMILY + FLAG_JP, 2, 2)]


def test_flag_pairs_are_never_split() -> None:
    line = "x" + (FLAG_JP + FLAG_FR) * 20  # an odd start: a code-point cut would pair RI halves
    chunks = chunk_markdown(line, tokens=8, overlap=0)
    assert [c.text for c in chunks] == [
        "x" + (FLAG_JP + FLAG_FR) * 7 + FLAG_JP,  # 31 code points: 32 would end in half a flag
        (FLAG_FR + FLAG_JP) * 8, (FLAG_FR + FLAG_JP) * 4 + FLAG_FR]


def test_cjk_recut_and_combining_marks_stay_whole() -> None:
    acute = "e\u0301"  # é as e + combining acute accent: one grapheme, two code points
    chunks = chunk_markdown("日本" + acute * 40, tokens=8, overlap=0)
    # the CJK-heavy first 32 code points are re-cut into 8-code-point pieces, the rest into 32
    assert [c.text for c in chunks] == [
        "日本" + acute * 3 + "\n" + acute * 4, acute * 4 + "\n" + acute * 4,
        acute * 16, acute * 9]


def test_truncate_and_byte_split_keep_grapheme_clusters() -> None:
    assert truncate_chars("ab" + FAMILY, 5) == "ab"       # not "ab" + half a family
    assert truncate_chars(FLAG_JP * 3, 5) == FLAG_JP * 2
    assert truncate_chars(FAMILY, 3) == FAMILY[:3]        # one cluster longer than the cap
    text = "ab" + FAMILY + "cd"  # the family is 25 UTF-8 bytes
    pieces = split_by_utf8_bytes(Chunk(text, 1, 1, _sha(text)), 26)
    assert [p.text for p in pieces] == ["ab", FAMILY + "c", "d"]
    tiny = split_by_utf8_bytes(Chunk(FAMILY, 1, 1, _sha(FAMILY)), 8)
    assert "".join(p.text for p in tiny) == FAMILY           # cut inside, between code points
    assert all(len(p.text.encode()) <= 8 for p in tiny)


@pytest.mark.parametrize(("text", "ranges"), [
    ("# A\n\none\n## B\ntwo\n\n### C\nthree", [(1, 3), (4, 6), (7, 8)]),
    # up to 3 spaces before the marks; 4 make code, and "#hashtag" is no heading
    ("intro\n# A\n# B\n\nbody\n   ## indented\n    # code, not a heading\n#hashtag\nend",
     [(1, 1), (2, 2), (3, 5), (6, 9)]),
    ("\n\n# first after blanks\ntext", [(1, 4)]),  # blank lines are no text to cut after
    ("no headings at all\njust lines", [(1, 2)]),
    ("", []),
])
def test_sections_start_a_chunk_at_each_heading_after_text(text: str, ranges: list) -> None:
    chunks = chunk_markdown(text, tokens=10_000, overlap=0, sections=True)
    assert [(c.start_line, c.end_line) for c in chunks] == ranges
    assert [(c.start_line, c.end_line) for c in chunk_markdown(text, tokens=10_000, overlap=0)] == (
        [(1, ranges[-1][1])] if ranges else [])


def test_truncate_at_words_and_word_start() -> None:
    """The word-aware cuts a snippet of a long line uses: after the last whole word that fits
    (a line break counts as whitespace, the whitespace before the cut is dropped), and the first
    word start in a span, after whitespace before punctuation; one long word is cut anyway."""
    assert truncate_chars("aaa bbb\nccc ddd", 10, at_words=True) == "aaa bbb"
    assert truncate_chars("alpha beta gamma", 12, at_words=True) == "alpha beta"
    assert truncate_chars("alpha beta gamma", 12) == "alpha beta g"
    assert truncate_chars("abcdefghij", 4, at_words=True) == "abcd"
    assert [word_start("hello world foo", s, 12) for s in (0, 2, 5, 6, 8)] == [0, 6, 5, 6, 12]
    assert (word_start("ab,cd ef", 1, 5), word_start("abcdef", 2, 5)) == (3, 2)
    assert word_start("xab \u0301cd", 2, 6) == 2  # after the space is inside a cluster: no cut there
