"""Snippets centred on the evidence: the window of a chunk's whole lines that best matches the query.

In a hit's text marked by FTS5 ``highlight()`` (CJK substrings by :func:`mark_substrings`),
:func:`best_window` weighs every marked form (lower-cased, one plural/verb ending stripped)
``ln(1 + L / n)`` (``L`` lines, ``n`` holding it; 0.1 on more than half of the lines), seeds
the window at the line with the largest sum of its distinct forms' weights (the first on a
tie), then grows it a whole line at a time towards the neighbour adding the most uncovered
weight plus a tenth of its own line score (on a tie the shorter side) while it fits in
``max_chars`` code points. A chunk that fits is its own snippet; without marks the window is
the chunk's first lines. After Luhn's significant-sentence extraction (1958) and FTS5's
``snippet()``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from fallback.text.chunking import grapheme_ends, truncate_chars, word_start

__all__ = [
    "MARK_CLOSE",
    "MARK_OPEN",
    "SnippetWindow",
    "best_window",
    "mark_substrings",
]

# Markers FTS5 highlight() wraps matches in: control characters that Markdown text never holds
# (any already there are removed before the window is returned).
MARK_OPEN = "\x01"
MARK_CLOSE = "\x02"
_MARK_RE = re.compile(MARK_OPEN + "(.*?)" + MARK_CLOSE, re.DOTALL)
# Weight of a marked form found on more than half of a chunk's lines.
UBIQUITOUS_WEIGHT = 0.1
# Share of a neighbour line's own score added to what it newly covers when the window grows.
DENSITY_SHARE = 0.1
# A marked word's stem and the one plural/verb ending stripped from it: the lazy stem takes the
# longest ending that leaves it 3 or more characters.
_ENDING_RE = re.compile(r"(.{3,}?)(?:ings|ing|ies|ied|es|ed|s|e|y)", re.DOTALL)


@functools.lru_cache(maxsize=4096)  # a pure function of the word: the same words recur
def _form(surface: str) -> str:
    """A marked word's group key: lower-cased, one plural/verb ending stripped when 3+ letters
    remain (FTS5 matched it through Porter stemming; this only groups what it marked)."""
    low = surface.lower()
    stem = _ENDING_RE.fullmatch(low)
    return low if stem is None else stem.group(1)


class SnippetWindow(NamedTuple):
    """The lines of a chunk chosen as its snippet: ``text`` (whole lines, markers removed, at
    most the budget) and the 0-based ``first_line`` / ``last_line`` of the chunk text."""

    text: str
    first_line: int
    last_line: int


def mark_substrings(text: str, needles: Sequence[str]) -> str:
    """``text`` (markers it holds kept) with every case-insensitive occurrence of each non-empty
    needle wrapped in the highlight markers, overlaps merged: CJK tokens, which FTS5 matched as
    substrings and ``highlight()`` cannot mark."""
    wanted = [n for n in dict.fromkeys(needles) if n]
    if not wanted:
        return text
    pattern = re.compile("|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True)),
                         re.IGNORECASE)
    return pattern.sub(lambda m: MARK_OPEN + m.group() + MARK_CLOSE, text)


def _strip_marks(text: str) -> str:
    return text.replace(MARK_OPEN, "").replace(MARK_CLOSE, "")


def best_window(marked: str, *, max_chars: int) -> SnippetWindow:
    """The best window of whole lines of one chunk (see the module docstring) within
    ``max_chars`` code points (``> 0``); ``marked``: the chunk text with matches wrapped in
    :data:`MARK_OPEN` / :data:`MARK_CLOSE`, or none. A single line longer than the budget is
    cut around its first mark (the only case where a line is not whole)."""
    budget = max(1, max_chars)
    whole = _strip_marks(marked)
    if len(whole) <= budget:
        return SnippetWindow(whole, 0, whole.count("\n"))
    lines = whole.split("\n")
    sizes = [len(line) for line in lines]
    marked_lines = marked.split("\n")
    forms, weight, scores = _line_weights(marked_lines)
    total = len(lines)
    seed = scores.index(max(scores))  # the first line of the best score
    if sizes[seed] > budget:
        return SnippetWindow(_cut_line(marked_lines[seed], budget), seed, seed)
    first = last = seed
    size = sizes[seed]
    covered = set(forms[seed])

    def value(pick: int) -> float:  # the uncovered weight a line adds, plus its own share
        new = forms[pick] - covered if forms[pick] else forms[pick]
        return (math.fsum([weight[f] for f in new]) if new else 0.0) + DENSITY_SHARE * scores[pick]

    while True:
        up, down = first - 1, last + 1
        fits_up = up >= 0 and size + 1 + sizes[up] <= budget
        fits_down = down < total and size + 1 + sizes[down] <= budget
        if fits_up and fits_down:
            # the larger value; on a tie the side grown less, then the lower line
            pick = down if (value(down), seed - last) >= (value(up), first - seed) else up
        elif fits_up or fits_down:
            pick = up if fits_up else down
        else:
            break
        if pick < first:
            first = pick
        else:
            last = pick
        size += 1 + sizes[pick]
        covered |= forms[pick]
    return SnippetWindow("\n".join(lines[first:last + 1]), first, last)


def _line_weights(marked_lines: Sequence[str]
                  ) -> tuple[list[frozenset[str]], dict[str, float], list[float]]:
    """Per line, its set of marked forms; each form's weight (step 1 of the module docstring);
    each line's score. Sums over a set use ``math.fsum`` (correctly rounded, so independent of
    the set's iteration order: ties hold in every run)."""
    forms: list[frozenset[str]] = []
    counts: dict[str, int] = {}
    unmarked: frozenset[str] = frozenset()
    for line in marked_lines:
        if MARK_OPEN not in line:
            forms.append(unmarked)
            continue
        line_forms = frozenset([_form(f) for f in _MARK_RE.findall(line)])
        forms.append(line_forms)
        for f in line_forms:
            counts[f] = counts.get(f, 0) + 1
    total = len(marked_lines)
    weight = {f: UBIQUITOUS_WEIGHT if n > total / 2 else math.log(1 + total / n)
              for f, n in counts.items()}
    return forms, weight, [math.fsum([weight[f] for f in line_forms]) if line_forms else 0.0
                           for line_forms in forms]


def _cut_line(marked_line: str, budget: int) -> str:
    """At most ``budget`` code points of one long line, starting about a third of the budget
    before its first mark (or at the start when it has none): it starts at the first word
    there and ends after its last word that fits (:func:`~fallback.text.chunking.word_start`,
    ``truncate_chars(at_words=True)``); a word longer than that is cut on grapheme-cluster
    boundaries, so no emoji family or accented letter is split."""
    at = marked_line.find(MARK_OPEN)
    line = _strip_marks(marked_line)
    if at < 0:
        return truncate_chars(line, budget, at_words=True)
    wanted = max(0, min(at - budget // 3, len(line) - budget))
    start = max((end for end in [0, *grapheme_ends(line)] if end <= wanted), default=0)
    return truncate_chars(line[word_start(line, start, at):], budget, at_words=True)
