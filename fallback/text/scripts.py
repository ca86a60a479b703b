"""Small text helpers shared by chunking, keyword extraction, MMR and file access; the one script classifier.

Pure functions; lengths in code points. Which characters are CJK, and of which script, and
which text is searched as substrings (scripts without spaces between words), is decided only
here, from Unicode's script properties (``regex``, loaded only for non-ASCII text).
"""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import regex

__all__ = ["CJK_FLOOR", "UNSPACED_SCRIPTS", "Script", "contains_cjk", "contains_unspaced", "narrow_fullwidth",
           "occurrences", "script_of", "sha256_hex", "text_weight", "word_runs", "word_stretches"]

# A CJK/kana/Hangul character is roughly one token, so the chunk budget (4 chars a token) weighs it 4.
CJK_WEIGHT = 4

# The scripts written without spaces between words, whose characters weigh CJK_WEIGHT.
CJK_SCRIPTS = ("Han", "Hiragana", "Katakana", "Hangul", "Bopomofo", "Yi")

# The scripts written without spaces between words: unicode61 makes a whole run of them one
# token, so a word inside a run is found as a substring (the trigram index and LIKE), as CJK is.
# Thai, Lao, Khmer and Myanmar letters weigh 1 (they are not CJK_SCRIPTS).
UNSPACED_SCRIPTS = (*CJK_SCRIPTS, "Thai", "Lao", "Khmer", "Myanmar")


def _properties(scripts: tuple[str, ...]) -> str:
    """A character whose Script_Extensions name one of ``scripts`` (so shared punctuation such
    as 、。「」 counts) and not Latin."""
    return "[[" + "".join(rf"\p{{scx={name}}}" for name in scripts) + r"]--\p{scx=Latin}]"


_CJK_PROPERTIES = _properties(CJK_SCRIPTS)
# The lowest code point with those properties: Latin text below it skips the property lookups
# (no character of UNSPACED_SCRIPTS lies below it either).
CJK_FLOOR = "\u02ea"
_BELOW_FLOOR = rf"[^\x00-{chr(ord(CJK_FLOOR) - 1)}]"
_CJK_SET = rf"[{_BELOW_FLOOR}&&{_CJK_PROPERTIES}]"
# Katakana plus the marks only the two kana share (ー, the voicing marks).
_KATAKANA_SET = r"[\p{sc=Katakana}[\p{scx=Katakana}&&\p{scx=Hiragana}--\p{scx=Han}]]"
_WORD_SET = r"[\p{L}\p{M}\p{N}_]"

# A CJK stretch or an other-word stretch of a word run; marks stay with the stretch they follow.
_CJK_WORD = f"[{_CJK_SET}&&{_WORD_SET}]"
_OTHER_WORD = f"[{_WORD_SET}--{_CJK_SET}]"
_PATTERNS = {
    "cjk_run": _CJK_SET + "+",
    "cjk": _CJK_SET,
    "unspaced": rf"[{_BELOW_FLOOR}&&{_properties(UNSPACED_SCRIPTS)}]",
    # First match wins: the Script property decides a letter; the CJK set takes the rest.
    "script": (r"(?P<han>\p{sc=Han})|(?P<hiragana>\p{sc=Hiragana})|(?P<katakana>" + _KATAKANA_SET
               + r")|(?P<hangul>\p{sc=Hangul})|(?P<cjk>" + _CJK_SET + ")"),
    "stretch": (rf"(?P<cjk>{_CJK_WORD}(?:{_CJK_WORD}|\p{{M}})*)"
                rf"|(?P<other>{_OTHER_WORD}(?:{_OTHER_WORD}|\p{{M}})*)"),
}


@functools.cache
def _pattern(name: str) -> regex.Pattern[str]:
    """One of :data:`_PATTERNS`, compiled (``regex`` V1 syntax) on first use."""
    import regex

    return regex.compile(_PATTERNS[name], regex.V1)


Script = Literal["han", "hiragana", "katakana", "hangul", "cjk", "other"]


def script_of(ch: str) -> Script:
    """Classify one character: ``han``, ``hiragana``, ``katakana`` (with the marks only the
    two kana share, ``ー``), ``hangul``, ``cjk`` (Bopomofo, Yi, shared punctuation ``、。「」``)
    or ``other``.

    Source: Unicode Script and Script_Extensions properties (UAX #24), via ``regex``.
    """
    if ch < CJK_FLOOR:  # no character of these scripts lies below it
        return "other"
    m = _pattern("script").match(ch)
    return m.lastgroup if m is not None else "other"  # type: ignore[return-value]


def text_weight(s: str) -> int:
    """The size of ``s`` in "chars" for chunk budgets: code points, each CJK character
    (:func:`script_of` not ``other``) counting :data:`CJK_WEIGHT`.

    Source: OpenClaw ``estimateStringChars`` (E2), in code points, with the CJK set taken from
    Unicode's script properties instead of code-point ranges.
    """
    if s.isascii():
        return len(s)
    return len(s) + (CJK_WEIGHT - 1) * sum(map(len, _pattern("cjk_run").findall(s)))


def contains_cjk(text: str) -> bool:
    """Whether ``text`` contains a CJK character (as :func:`text_weight` counts them)."""
    return not text.isascii() and _pattern("cjk").search(text) is not None


def contains_unspaced(text: str) -> bool:
    """Whether ``text`` contains a character of :data:`UNSPACED_SCRIPTS` (CJK, Thai, Lao,
    Khmer, Myanmar): the one test of which text is searched as substrings (the trigram index
    and ``LIKE``) rather than by its unicode61 tokens."""
    return not text.isascii() and _pattern("unspaced").search(text) is not None


def word_stretches(text: str) -> Iterator[tuple[str, bool]]:
    """``(stretch, is_cjk)`` for the word runs of ``text`` cut where CJK starts or stops, in
    order: ``"2026年度 plan"`` -> ``("2026", False), ("年度", True), ("plan", False)``."""
    for m in _pattern("stretch").finditer(text):
        yield m.group(), m.lastgroup == "cjk"


def sha256_hex(data: str | bytes) -> str:
    """The lower-case hex SHA-256 of ``data`` (a str as UTF-8, lone surrogates passed)."""
    import hashlib  # here: the one-shot search path hashes nothing and skips loading OpenSSL

    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def occurrences(text: str, needles: str | tuple[str, ...]) -> list[int]:
    """Where each of ``needles`` (strings, or the characters of a string) occurs in ``text``,
    overlaps included, ascending (code point offsets)."""
    out: list[int] = []
    for needle in needles:
        at = text.find(needle)
        while at >= 0:
            out.append(at)
            at = text.find(needle, at + 1)
    return sorted(out)


def word_runs(text: str) -> list[str]:
    """The NFC runs of ``[\\p{L}\\p{M}\\p{N}_]+`` in ``text`` (letters, marks, digits and ``_``),
    in order, duplicates kept: the tokens of FTS queries, keyword extraction and MMR."""
    def in_word(ch: str) -> bool:
        return ch == "_" or unicodedata.category(ch)[0] in "LMN"

    runs = itertools.groupby(unicodedata.normalize("NFC", text), key=in_word)
    return ["".join(run) for inside, run in runs if inside]


# Full-width ASCII forms (U+FF01-U+FF5E) sit this far above the characters they stand for.
_FULLWIDTH_SHIFT = 0xFEE0


def narrow_fullwidth(text: str) -> str:
    """``text`` with its full-width ASCII forms (``ＡＰＩ``) as ASCII; every other character
    as it is (not NFKC)."""
    if text.isascii():
        return text
    return "".join(chr(ord(ch) - _FULLWIDTH_SHIFT) if "\uff01" <= ch <= "\uff5e" else ch
                   for ch in text)
