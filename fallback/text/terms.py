"""Derived search terms: the extra tokens indexed beside a chunk's text and looked for in queries.

The FTS5 tokenizer (``unicode61``, wrapped by ``porter``) cuts ``Wi-Fi`` into ``wi`` + ``fi`` and
``8 May 2023`` into three unrelated tokens, so neither ``wifi`` nor ``2023-05-08`` could find
them. The index therefore stores, beside each chunk's text, the terms this module derives from
it, and the query builder (``fallback/search/fts.py``) derives the same terms from the query:

- **compound joins**: a run of letter/digit parts joined by ``-``, ``‐``, ``‑`` or ``_`` also
  yields its parts glued together, lower-cased: ``Wi-Fi`` -> ``wifi``, ``ABC-1234`` ->
  ``abc1234``, ``snake_case`` -> ``snakecase``, ``2023-05-08`` -> ``20230508`` (dots and
  slashes are not connectors: ``e.g.``, URLs and paths would only add noise);
- **canonical dates**: ``2023-05-08``, ``2023/05/08``, ``8 May 2023``, ``8th of May, 2023``,
  ``May 8, 2023`` -> ``20230508`` plus the month ``202305``; ``May 2023`` and ``2023-05`` ->
  ``202305``. Month names are English (full or three-letter, ``Sept`` too).

Everything here is pure (no I/O). The indexer runs it over every chunk it writes, so the scans
start at rare characters (connectors, four-digit years) instead of at every word: deriving the
terms of a text costs about as much as FTS5 indexing it.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fallback.text.chunking import split_lines

if TYPE_CHECKING:
    import regex

__all__ = [
    "CONNECTORS",
    "Compound",
    "DateMention",
    "compounds",
    "date_mentions",
    "derived_terms",
    "first_heading",
    "title_text",
]

# Characters that glue the parts of one compound (hyphen-minus, U+2010 hyphen, U+2011 non-breaking
# hyphen, underscore).
CONNECTORS = "-\u2010\u2011_"
# The rest of a compound from its first connector on (possessive: no backtracking); compiled
# on first use (:func:`_tail_re`): a text without a connector never needs it.
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
    """The date forms around a year, compiled on first use (a text without a year needs none):
    those that start at the year (ISO day, ISO month) and those that end at it, searched in the
    few characters before it."""
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


@dataclass(frozen=True)
class Compound:
    """One compound found in a text (``Wi-Fi``, ``ABC-1234``, ``snake_case``).

    Attributes:
        start / end: its character span (``text[start:end]``).
        parts: its parts, lower-cased (``("wi", "fi")``).
        joined: the parts glued together (``"wifi"``).
    """

    start: int
    end: int
    parts: tuple[str, ...]
    joined: str


def _connectors(text: str) -> list[int]:
    """Positions of connectors between two part characters, ascending (substring search: a
    regex scan costs several times more on prose)."""
    out: list[int] = []
    end = len(text) - 1
    for ch in CONNECTORS:
        at = text.find(ch, 1)
        while 0 < at < end:
            if _is_part_char(text[at - 1]) and _is_part_char(text[at + 1]):
                out.append(at)
            at = text.find(ch, at + 1)
    out.sort()
    return out


def _is_part_char(ch: str) -> bool:
    return ch.isalnum() or (not ch.isascii() and unicodedata.category(ch)[0] == "M")


def _compound_spans(text: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` span of each maximal run of parts glued by connectors, left to
    right."""
    done = 0
    for at in _connectors(text):
        if at < done:
            continue
        start = at - 1
        while start > 0 and _is_part_char(text[start - 1]):
            start -= 1
        tail = _tail_re().match(text, at)
        done = tail.end() if tail else at
        yield start, done


def compounds(text: str) -> list[Compound]:
    """The compounds of ``text`` left to right (parts glued by :data:`CONNECTORS`).

    Args:
        text: NFC text.

    Returns:
        One :class:`Compound` per maximal run; joined forms over :data:`MAX_JOINED_CHARS` are
        left out.
    """
    out = []
    for start, end in _compound_spans(text):
        parts = tuple(p.lower() for p in _SPLIT_RE.split(text[start:end]) if p)
        joined = "".join(parts)
        if len(joined) <= MAX_JOINED_CHARS:
            out.append(Compound(start, end, parts, joined))
    return out


@dataclass(frozen=True)
class DateMention:
    """One date (or month) found in a text.

    Attributes:
        start / end: the character span of the mention in the text (``text[start:end]``).
        terms: its canonical terms: ``("20230508", "202305")`` for a day, ``("202305",)`` for
            a month.
    """

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


def _year_starts(text: str) -> list[int]:
    """Positions of ``19`` and ``20`` in ``text``, ascending: where a year may start. Substring
    search runs at memory speed; a regex scan for years costs ten times more on prose."""
    out: list[int] = []
    for prefix in ("19", "20"):
        at = text.find(prefix)
        while at >= 0:
            out.append(at)
            at = text.find(prefix, at + 1)
    out.sort()
    return out


def date_mentions(text: str) -> list[DateMention]:
    """Dates and months written in ``text``, left to right, spans never overlapping.

    Recognised: ``2023-05-08`` / ``2023/05/08`` / ``2023.05.08``, ``8 May 2023``,
    ``8th of May, 2023``, ``May 8, 2023``, ``May 8th 2023``, ``May 2023`` and ``2023-05``
    (English month names, full or abbreviated, any case; years 1900-2099). Impossible dates
    (``2023-02-30``) are skipped.

    Args:
        text: any text.

    Returns:
        The mentions with their canonical terms (see :class:`DateMention`).
    """
    found: list[DateMention] = []
    for start in _year_starts(text):
        y = _YEAR_RE.match(text, start)
        before = text[start - 1] if start else " "
        if (y is None or (found and start < found[-1].end) or before.isalnum()
                or before in "._-"):
            continue
        mention = None
        for pattern in _date_forms()[0]:
            m = pattern.match(text, y.start())
            if m is not None:
                terms = _canonical(int(m["year"]), int(m["num"]),
                                   int(m["day"]) if "day" in m.groupdict() else None)
                if terms is not None:
                    mention = DateMention(m.start(), m.end(), terms)
                    break
        if mention is None:
            lo = max(found[-1].end if found else 0, y.start() - _LOOKBACK_CHARS)
            for pattern in _date_forms()[1]:
                m = pattern.search(text, lo, y.end())
                if m is not None:
                    groups = m.groupdict()
                    day = int(groups["day"]) if groups.get("day") else None
                    terms = _canonical(int(m["year"]), _MONTHS[m["mon"].lower()], day)
                    if terms is not None:
                        mention = DateMention(m.start(), m.end(), terms)
                        break
        if mention is not None:
            found.append(mention)
    return found


def derived_terms(text: str) -> str:
    """The derived terms of ``text`` as one space-separated string (the FTS ``terms`` column).

    Compound joins and canonical dates (see the module docstring), each once,
    in first-seen order. ``"Wi-Fi on 8 May 2023"`` -> ``"wifi 20230508 202305"``.

    Args:
        text: chunk text, a file name or a heading.

    Returns:
        The terms joined by single spaces; ``""`` when there are none.
    """
    out: dict[str, None] = {}
    for start, end in _compound_spans(text):  # the joined forms, without building Compounds
        joined = text[start:end].translate(_DROP_CONNECTORS).lower()
        if len(joined) <= MAX_JOINED_CHARS:
            out[joined] = None
    for mention in date_mentions(text):
        out.update((t, None) for t in mention.terms)
    return " ".join(out)


def first_heading(text: str) -> str:
    """The text of the first ATX Markdown heading (``# Title``) in ``text``, or ``""``.

    Lines are those of :func:`fallback.text.chunking.split_lines` (``\\n``, ``\\r\\n`` or a lone
    ``\\r``), so a heading never runs past its line into the rest of the note.
    """
    for line in split_lines(text):
        if "#" in line:
            m = _HEADING_RE.fullmatch(line)
            if m:
                return m.group(1).strip()
    return ""


def title_text(path: str, heading: str) -> str:
    """The FTS ``title`` column of a note: its path, its first heading and their derived terms.

    ``title_text("memory/2023-05-08.md", "Standup")`` ->
    ``"memory/2023-05-08.md Standup 20230508 202305"``; the tokenizer then sees ``memory``,
    ``2023``, ``05``, ``08``, ``md``, ``standup`` and the canonical date terms, so a query naming
    the note's file, title or date finds it.

    Args:
        path: workspace-relative path (``/`` separators).
        heading: the note's first heading (:func:`first_heading`), or ``""``.
    """
    head = f"{path} {heading}".strip()
    # Derive from the path's folders and name without the extension, so "memory/x-y.md" gives
    # "xy" rather than one long join of the whole path.
    name_parts = _EXTENSION_RE.sub("", path).replace("/", " ").replace("\\", " ")
    extra = derived_terms(f"{name_parts} {heading}")
    return f"{head} {extra}" if extra else head
