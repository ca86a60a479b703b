"""Snippet windows: whole lines around the best-matching line (fallback/search/snippets.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fallback.search.snippets import MARK_CLOSE, MARK_OPEN, SnippetWindow, best_window, mark_substrings


def m(word: str) -> str:
    return f"{MARK_OPEN}{word}{MARK_CLOSE}"


def test_short_chunk_is_its_own_snippet() -> None:
    assert best_window(f"# Log\nthe {m('router')} died\n", max_chars=700) == SnippetWindow(
        "# Log\nthe router died\n", 0, 2)


def test_window_is_centred_on_the_line_with_the_rarest_marks() -> None:
    # "Ann" is marked on every line (a speaker's name), "support group" only on line 5.
    lines = [f"{m('Ann')}: line {i} " + "x" * 40 for i in range(10)]
    lines[5] = f"{m('Ann')}: I went to a {m('support')} {m('group')} yesterday"
    window = best_window("\n".join(lines), max_chars=160)
    assert (window.first_line, window.last_line) == (4, 6)
    assert window.text.split("\n")[1] == "Ann: I went to a support group yesterday"
    assert MARK_OPEN not in window.text and len(window.text) <= 160


def test_growth_prefers_lines_adding_new_query_words() -> None:
    lines = ["filler " * 6] * 3 + [f"the {m('router')} rebooted", "filler " * 6,
                                   f"{m('wan')} link down"] + ["filler " * 6] * 3
    window = best_window("\n".join(lines), max_chars=90)
    assert (window.first_line, window.last_line) == (3, 5)


def test_no_marks_gives_the_first_lines() -> None:
    text = "\n".join(f"line {i} " + "y" * 30 for i in range(20))
    window = best_window(text, max_chars=100)
    assert (window.first_line, window.last_line) == (0, 1)
    assert window.text == "\n".join(text.split("\n")[:2])


def test_one_long_line_is_cut_around_its_first_mark() -> None:
    line = "a" * 500 + m("needle") + "b" * 500
    window = best_window("head\n" + line + "\ntail", max_chars=90)
    assert (window.first_line, window.last_line) == (1, 1)
    assert window.text == "a" * 30 + "needle" + "b" * 54


def test_mark_substrings_for_cjk_tokens() -> None:
    assert mark_substrings("今天讨论了金银价格的走势", ["价格", "金银价格"]) == (
        f"今天讨论了{m('金银价格')}的走势")
    assert mark_substrings("no needles", []) == "no needles"


def test_a_name_on_every_line_weighs_little() -> None:
    # "Ann" is on 9 of 10 lines: it weighs 0.1, so the one line with the rarest word wins over
    # lines holding the name and a word found twice.
    lines = [f"{m('Ann')}: chatting about the weekend plans, {i}" for i in range(10)]
    lines[2] = f"{m('Ann')}: the {m('wan')} port blinked twice today"
    lines[3] = f"{m('Ann')}: the {m('wan')} port went dark again"
    lines[7] = f"Bob: the {m('router')} died this morning for good"
    window = best_window("\n".join(lines), max_chars=50)
    assert (window.first_line, window.last_line, window.text) == (
        7, 7, "Bob: the router died this morning for good")


def test_forms_of_one_word_count_once() -> None:
    # "love", "loving", "loves" and "loved" are one form: line 1 covers two forms, line 4 one
    # form three times (counted as three forms, line 4 would win).
    lines = ["x" * 40] * 6
    lines[1] = f"I {m('love')} the {m('turtles')} here"
    lines[4] = f"{m('loving')}, {m('loves')}, {m('loved')}"
    window = best_window("\n".join(lines), max_chars=30)
    assert (window.first_line, window.last_line) == (1, 1)


def test_a_cut_line_starts_and_ends_on_whole_words() -> None:
    """A long line of prose (a pasted paragraph): the window starts at the first word after a
    third of the budget before the mark (offset 869, inside word096x) and ends after the last
    word that fits 95 chars; it was "96x word097x ... word106x wor" before."""
    words = [f"word{i:03d}x" for i in range(200)]  # 9 chars a word with its space
    words[100] = m("needle")
    window = best_window(" ".join(words), max_chars=95)
    assert window.text == " ".join([*(f"word{i:03d}x" for i in range(97, 100)), "needle",
                                    *(f"word{i:03d}x" for i in range(101, 107))])


def test_a_cut_line_never_splits_a_grapheme_cluster() -> None:
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # 7 code points
    line = family * 40 + m("needle") + family * 40
    window = best_window(line, max_chars=50)
    text = window.text
    assert len(text) <= 50 and "needle" in text
    assert text.replace("needle", "").replace(family, "") == ""


def _tie_text() -> tuple[str, int]:
    """14 lines: line 7 holds three rare words (the seed); line 6 holds a, b, c and line 8 d, e, f,
    found on 2, 3 and 4 lines each, so both neighbours add the same weight in exact arithmetic,
    while a plain float sum of three such weights differs in its last bit with their order.
    Returns the text and a budget that fits the seed and one neighbour, not both."""
    lines = [f"filler line number {i:02d} here" for i in range(14)]
    lines[0] = f"{m('a')} {m('b')} {m('c')} far"
    lines[1] = f"{m('b')} {m('c')} far away"
    lines[2] = f"{m('c')} far far away"
    lines[6] = f"{m('a')} {m('b')} {m('c')} near"
    lines[7] = f"{m('s1')} {m('s2')} {m('s3')} seed"
    lines[8] = f"{m('d')} {m('e')} {m('f')} near"
    lines[11] = f"{m('f')} far far away"
    lines[12] = f"{m('e')} {m('f')} far away"
    lines[13] = f"{m('d')} {m('e')} {m('f')} far"
    plain = [line.replace(MARK_OPEN, "").replace(MARK_CLOSE, "") for line in lines]
    return "\n".join(lines), len(plain[7]) + 1 + len(plain[8])


def test_a_tie_is_broken_the_same_way_whatever_the_hash_seed() -> None:
    """Sets of marked forms iterate in an order that string hashing randomises per process; the
    window must not depend on it (the right neighbour wins an exact tie, in every process)."""
    code = ("from tests.fallback.test_snippets import _tie_text; "
            "from fallback.search.snippets import best_window; "
            "text, budget = _tie_text(); w = best_window(text, max_chars=budget); "
            "print(w.first_line, w.last_line)")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[2],
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
            for seed in range(12)}
    assert seen == {"7 8"}
