"""Derived search terms: the extra tokens indexed beside a chunk's text and looked for in queries.

FTS5's ``unicode61`` cuts ``Wi-Fi`` into ``wi`` + ``fi`` and ``8 May 2023`` into unrelated tokens,
so the index stores, beside each chunk's text, the terms derived here, and the query builder
(``fallback/search/fts.py``) derives the same from the query (pure functions):

- **compound joins**: ``Wi-Fi`` -> ``wifi``, ``ABC-1234`` -> ``abc1234``, ``snake_case`` ->
  ``snakecase`` (connectors: :data:`CONNECTORS`; not dots or slashes);
- **canonical dates**: ``2023-05-08``, ``8 May 2023``, ``May 8, 2023`` ... -> ``20230508`` plus
  the month ``202305``; ``May 2023`` and ``2023-05`` -> ``202305`` (English month names).
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
import unicodedata
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from fallback.text.chunking import split_lines
from fallback.text.scripts import occurrences

if TYPE_CHECKING:
    import regex

__all__ = ["Compound", "DateMention", "compounds", "date_mentions", "derived_terms", "first_heading",
           "title_text"]

# Characters that glue the parts of one compound (hyphen-minus, U+2010 hyphen, U+2011 non-breaking
# hyphen, underscore).
CONNECTORS = "-\u2010\u2011_"
# The rest of a compound from its first connector on (possessive: no backtracking).
_TAIL_PATTERN = "(?:[" + re.escape(CONNECTORS) + r"][\p{L}\p{M}\p{N}]++)+"
_SPLIT_RE = re.compile("[" + re.escape(CONNECTORS) + "]")
_DROP_CONNECTORS = str.maketrans("", "", CONNECTORS)
# Joined forms longer than this are not worth indexing (URLs, long paths).
MAX_JOINED_CHARS = 48


@functools.cache
def _tail_re() -> regex.Pattern[str]:
    import regex

    return regex.compile(_TAIL_PATTERN)


_MONTHS = {
    "jan": 1, "january": 1, "feb": 2, "february": 2, "mar": 3, "march": 3, "apr": 4, "april": 4,
    "may": 5, "jun": 6, "june": 6, "jul": 7, "july": 7, "aug": 8, "august": 8, "sep": 9,
    "sept": 9, "september": 9, "oct": 10, "october": 10, "nov": 11, "november": 11, "dec": 12,
    "december": 12,
}
_MONTH = r"(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
# Every date form has a year; the scan finds years first and reads the rest around them.
_YEAR_RE = re.compile(r"(?:19|20)\d\d(?!\d)")


@functools.cache
def _date_forms() -> tuple[tuple[re.Pattern[str], ...], tuple[re.Pattern[str], ...]]:
    """The date forms that start at a year and those that end at it, compiled on first use."""
    from_year = (
        re.compile(r"(?P<year>\d{4})[-/.](?P<num>[01]?\d)[-/.](?P<day>[0-3]?\d)(?![\w])"),
        re.compile(r"(?P<year>\d{4})-(?P<num>[01]\d)(?![\w-])"),
    )
    to_year = (
        re.compile(r"(?<!\w)" + _DAY + r"\s+(?:of\s+)?" + _MONTH + r",?\s+(?P<year>\d{4})\Z", re.I),
        re.compile(r"(?<!\w)" + _MONTH + r"\s+" + _DAY + r",?\s+(?P<year>\d{4})\Z", re.I),
        re.compile(r"(?<!\w)" + _MONTH + r",?\s+(?P<year>\d{4})\Z", re.I),
    )
    return from_year, to_year


# How far before a year a written date may start ("28th of September, 2023" is 23 chars).
_LOOKBACK_CHARS = 32
_EXTENSION_RE = re.compile(r"\.[A-Za-z0-9]{1,10}$")
_HEADING_RE = re.compile(r"[ ]{0,3}#{1,6}[ \t]+(.+?)[ \t#]*")


class Compound(NamedTuple):
    """One compound found in a text: its span ``text[start:end]``, its lower-cased ``parts``
    (``("wi", "fi")``) and those ``joined`` (``"wifi"``)."""

    start: int
    end: int
    parts: tuple[str, ...]
    joined: str


def _is_part_char(ch: str) -> bool:
    return ch.isalnum() or (not ch.isascii() and unicodedata.category(ch)[0] == "M")


def _compound_spans(text: str) -> Iterator[tuple[int, int]]:
    """The span of each maximal run of parts glued by connectors, left to right."""
    done = 0
    for at in occurrences(text, CONNECTORS):  # a connector between two part characters
        if at < done or not 0 < at < len(text) - 1 or not (
                _is_part_char(text[at - 1]) and _is_part_char(text[at + 1])):
            continue
        start = at - 1
        while start > 0 and _is_part_char(text[start - 1]):
            start -= 1
        tail = _tail_re().match(text, at)
        done = tail.end() if tail else at
        yield start, done


def compounds(text: str) -> list[Compound]:
    """The compounds of NFC ``text`` left to right, one per maximal run (joined forms over
    :data:`MAX_JOINED_CHARS` left out)."""
    out = []
    for start, end in _compound_spans(text):
        parts = tuple(p.lower() for p in _SPLIT_RE.split(text[start:end]) if p)
        joined = "".join(parts)
        if len(joined) <= MAX_JOINED_CHARS:
            out.append(Compound(start, end, parts, joined))
    return out


class DateMention(NamedTuple):
    """One date (or month) found in a text: its span ``text[start:end]`` and canonical
    ``terms`` (``("20230508", "202305")`` for a day, ``("202305",)`` for a month)."""

    start: int
    end: int
    terms: tuple[str, ...]


def _canonical(year: int, month: int, day: int | None) -> tuple[str, ...] | None:
    if not 1 <= month <= 12:
        return None
    if day is None:
        return (f"{year:04d}{month:02d}",)
    try:
        dt.date(year, month, day)
    except ValueError:
        return None
    return (f"{year:04d}{month:02d}{day:02d}", f"{year:04d}{month:02d}")


def date_mentions(text: str) -> list[DateMention]:
    """Dates and months written in ``text`` (the forms of the module docstring, years
    1900-2099, impossible dates skipped), left to right, spans never overlapping."""
    found: list[DateMention] = []
    for start in occurrences(text, ("19", "20")):  # where a year may start
        y = _YEAR_RE.match(text, start)
        before = text[start - 1] if start else " "
        if (y is None or (found and start < found[-1].end) or before.isalnum()
                or before in "._-"):
            continue
        from_year, to_year = _date_forms()
        lo = max(found[-1].end if found else 0, y.start() - _LOOKBACK_CHARS)
        for m in itertools.chain((p.match(text, y.start()) for p in from_year),
                                 (p.search(text, lo, y.end()) for p in to_year)):
            if m is None:
                continue
            g = m.groupdict()
            month = int(g["num"]) if g.get("num") else _MONTHS[g["mon"].lower()]
            terms = _canonical(int(g["year"]), month, int(g["day"]) if g.get("day") else None)
            if terms is not None:
                found.append(DateMention(m.start(), m.end(), terms))
                break
    return found


def derived_terms(text: str) -> str:
    """The derived terms of ``text`` (chunk text, a file name or a heading) as one
    space-separated string, each once, in first-seen order (the FTS ``terms`` column):
    ``"Wi-Fi on 8 May 2023"`` -> ``"wifi 20230508 202305"``."""
    out: dict[str, None] = {}
    for start, end in _compound_spans(text):  # the joined forms, without building Compounds
        joined = text[start:end].translate(_DROP_CONNECTORS).lower()
        if len(joined) <= MAX_JOINED_CHARS:
            out[joined] = None
    for mention in date_mentions(text):
        out.update((t, None) for t in mention.terms)
    return " ".join(out)


def first_heading(text: str) -> str:
    """The text of the first ATX Markdown heading (``# Title``) in ``text``, or ``""``."""
    for line in split_lines(text):
        if "#" in line:
            m = _HEADING_RE.fullmatch(line)
            if m:
                return m.group(1).strip()
    return ""


def title_text(path: str, heading: str) -> str:
    """The FTS ``title`` column of a note: its ``path``, its first ``heading`` and their derived
    terms (``"memory/2023-05-08.md Standup 20230508 202305"``)."""
    head = f"{path} {heading}".strip()
    # Derive from the path's parts without the extension: "memory/x-y.md" gives "xy".
    name_parts = _EXTENSION_RE.sub("", path).replace("/", " ").replace("\\", " ")
    extra = derived_terms(f"{name_parts} {heading}")
    return f"{head} {extra}" if extra else head
