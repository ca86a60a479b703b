"""Collection patterns in qmd's glob dialect (fast-glob/picomatch): alternatives, escaping, matching.

``**`` spans folders, braces expand, matching is case-sensitive, and commas outside ``{}`` and
``[]`` join alternatives as in qmd's ``--mask``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wcmatch import glob as wcglob

__all__ = ["escape_glob", "glob_matcher", "never_ends_with", "split_pattern"]

# Characters qmd's glob treats as syntax; a literal file name escapes them.
_GLOB_SPECIALS = frozenset("\\*?[]{}()!+@")


def split_pattern(pattern: str) -> list[str]:
    """Split a collection pattern into alternatives at commas outside ``{...}`` and ``[...]``
    (qmd reads ``--mask "a.md,*.txt"`` as a union); blank alternatives are dropped."""
    parts: list[str] = []
    start = braces = brackets = 0
    for i, ch in enumerate(pattern):
        if ch == "," and braces == brackets == 0:
            parts.append(pattern[start:i])
            start = i + 1
        elif ch == "{":
            braces += 1
        elif ch == "}" and braces:
            braces -= 1
        elif ch == "[":
            brackets += 1
        elif ch == "]" and brackets:
            brackets -= 1
    parts.append(pattern[start:])
    return [p.strip() for p in parts if p.strip()]


@functools.lru_cache(maxsize=256)
def glob_matcher(pattern: str) -> wcglob.WcMatcher:
    """The compiled glob of a pattern, memoised."""
    from wcmatch import glob as wcglob

    return wcglob.compile(split_pattern(pattern) or ["\0"],
                          flags=wcglob.GLOBSTAR | wcglob.BRACE | wcglob.CASE)


def escape_glob(name: str) -> str:
    """Escape glob syntax (``\\ * ? [ ] { } ( ) ! + @``) in a literal file name with ``\\``."""
    return "".join("\\" + ch if ch in _GLOB_SPECIALS else ch for ch in name)


def _group_end(text: str, start: int) -> int:
    """The index of the ``]`` or ``}`` closing the group opened at ``start``, or -1."""
    opener, closer = text[start], "]" if text[start] == "[" else "}"
    depth, i = 0, start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == opener and (opener == "{" or i == start):
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _literal_tail(alternative: str) -> str | None:
    """The literal text every name an alternative matches ends with (escapes resolved), or
    ``None`` when it ends in syntax (``*``, ``?``, ``[...]``, ``{...}``): any ending then."""
    tail: str | None = ""  # None: the text so far ends in syntax
    i = 0
    while i < len(alternative):
        ch = alternative[i]
        if ch == "\\" and i + 1 < len(alternative):
            tail, i = (tail or "") + alternative[i + 1], i + 2
        elif ch in "*?":
            tail, i = None, i + 1
        elif ch in "[{" and (close := _group_end(alternative, i)) > i:
            tail, i = None, close + 1
        else:
            tail, i = (tail or "") + ch, i + 1
    return tail


def never_ends_with(pattern: str, suffix: str) -> bool:
    """Whether no name the collection ``pattern`` matches can end with ``suffix``
    (``*.txt`` never ends with ``.md``; ``*md``, ``*.m?`` and ``*.{md,txt}`` may); ``False``
    whenever a wildcard could supply the ending."""
    for alternative in split_pattern(pattern):
        tail = _literal_tail(alternative.rsplit("/", 1)[-1])
        if tail is None or tail.endswith(suffix) or suffix.endswith(tail):
            return False
    return bool(split_pattern(pattern))
