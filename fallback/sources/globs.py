"""Collection patterns in qmd's glob dialect (fast-glob/picomatch): alternatives, escaping, matching.

``**`` spans folders, braces expand, matching is case-sensitive, and commas outside ``{}`` and
``[]`` join alternatives as in qmd's ``--mask``. The memory-file rule
(``fallback/sources/memory_files.py``) and the qmd collections use these; the compiled matcher
loads wcmatch on first use (the default ``**/*.md`` needs none, see ``MemoryRoot.admits``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wcmatch import glob as wcglob

__all__ = ["escape_glob", "glob_matcher", "split_pattern"]

# Characters qmd's glob treats as syntax; a literal file name escapes them.
_GLOB_SPECIALS = frozenset("\\*?[]{}()!+@")


def split_pattern(pattern: str) -> list[str]:
    """Split a collection pattern into alternatives at commas outside ``{...}`` and ``[...]``
    (qmd reads ``--mask "a.md,*.txt"`` as a union); blank alternatives are dropped."""
    parts: list[str] = []
    current: list[str] = []
    braces = brackets = 0
    for ch in pattern:
        if ch == "," and braces == 0 and brackets == 0:
            parts.append("".join(current))
            current = []
            continue
        if ch == "{":
            braces += 1
        elif ch == "}" and braces:
            braces -= 1
        elif ch == "[":
            brackets += 1
        elif ch == "]" and brackets:
            brackets -= 1
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


@functools.lru_cache(maxsize=256)
def glob_matcher(pattern: str) -> wcglob.WcMatcher:
    """The compiled glob of a pattern in the dialect of qmd's fast-glob/picomatch (``**`` spans
    folders, braces, case-sensitive); compiling costs ~0.1 ms, so it is memoised."""
    from wcmatch import glob as wcglob

    return wcglob.compile(split_pattern(pattern) or ["\0"],
                          flags=wcglob.GLOBSTAR | wcglob.BRACE | wcglob.CASE)


def escape_glob(name: str) -> str:
    """Escape glob syntax (``\\ * ? [ ] { } ( ) ! + @``) in a literal file name with ``\\``."""
    return "".join("\\" + ch if ch in _GLOB_SPECIALS else ch for ch in name)
