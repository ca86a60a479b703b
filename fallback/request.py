"""A search or read request's arguments, checked once where a request comes in (standard
library only): every edge builds it with ``SearchRequest.of`` / ``ReadRequest.of``, and the
manager and backends check nothing again."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fallback.errors import UsageError

__all__ = ["MAX_LIMIT", "ReadRequest", "SearchRequest", "check_limits", "require_workspace", "workspace_relative"]

# Upper bound of counts and line numbers a caller may pass (keeps JSON integers in range).
MAX_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class SearchRequest:
    """One ``memory_search`` request, as checked by :meth:`of`: the ``query`` (stripped, never
    empty), hits wanted (``1..MAX_LIMIT``) and score floor (``[0, 1]``), each ``None`` for the
    backend's default, the ``session_key`` (``None``: owner call), the ``sources`` asked for
    (``None``: all) and whether to ``explain`` (attach the ranking trace where there is one)."""

    query: str
    max_results: int | None = None
    min_score: float | None = None
    session_key: str | None = None
    sources: tuple[str, ...] | None = None
    explain: bool = False

    @classmethod
    def of(cls, query: object, *, max_results: int | None = None, min_score: float | None = None,
           session_key: object = None, sources: Sequence[str] | None = None,
           explain: bool = False) -> SearchRequest:
        """The request of a caller's arguments (the one check of them).

        Raises ``UsageError``: ``query must be a string, not <type>``, ``query must not be
        empty``, ``session key must be a string``, or as :func:`check_limits`.
        """
        if not isinstance(query, str):
            raise UsageError(f"query must be a string, not {type(query).__name__}")
        text = query.strip()
        if not text:
            raise UsageError("query must not be empty")
        if session_key is not None and not isinstance(session_key, str):
            raise UsageError("session key must be a string")
        check_limits(max_results=max_results, min_score=min_score)
        return cls(text, max_results, min_score, session_key,
                   None if sources is None else tuple(sources), bool(explain))

    def limits(self, max_results: int, min_score: float) -> tuple[int, float]:
        """``(hits wanted, score floor)``: the request's, else the backend's defaults
        ``max_results`` / ``min_score`` (the builtin's: ``query.maxResults`` / ``query.minScore``)."""
        return (max_results if self.max_results is None else self.max_results,
                min_score if self.min_score is None else self.min_score)


def check_limits(*, max_results: int | None, min_score: float | None) -> None:
    """Check a search's hits wanted (``1..MAX_LIMIT``) and score floor (``[0, 1]``); ``None``: the
    backend's default. Raises ``UsageError``: ``max results must be between 1 and 2147483647``
    or ``min score must be between 0 and 1``."""
    if max_results is not None and not 1 <= max_results <= MAX_LIMIT:
        raise UsageError(f"max results must be between 1 and {MAX_LIMIT}")
    if min_score is not None and not 0.0 <= min_score <= 1.0:
        raise UsageError("min score must be between 0 and 1")


@dataclass(frozen=True)
class ReadRequest:
    """One ``memory_get`` request, as checked by :meth:`of`: the ``path`` as given (whether it
    is a memory file is ``fallback/sources/read_page.py``'s rule), the first line
    (``from_line``), the ``lines`` wanted and the code point of line ``from_line`` the page
    starts at (``from_char``: how a line longer than the page's char budget is read on), each
    ``1..MAX_LIMIT`` or ``None`` (line 1, the page default, code point 1)."""

    path: str
    from_line: int | None = None
    lines: int | None = None
    from_char: int | None = None

    @classmethod
    def of(cls, path: object, *, from_line: int | None = None,
           lines: int | None = None, from_char: int | None = None) -> ReadRequest:
        """The request of a caller's arguments (the one check of them).

        Raises ``UsageError``: ``path must be a string, not <type>``, ``from must be between 1
        and 2147483647``, ``lines must be ...`` or ``fromChar must be ...``.
        """
        if not isinstance(path, str):
            raise UsageError(f"path must be a string, not {type(path).__name__}")
        for name, value in (("from", from_line), ("lines", lines), ("fromChar", from_char)):
            if value is not None and not 1 <= value <= MAX_LIMIT:
                raise UsageError(f"{name} must be between 1 and {MAX_LIMIT}")
        return cls(path, from_line, lines, from_char)


def workspace_relative(path: str, workspace: Path) -> str:
    """A ``memory_get`` path as the memory-file rule takes it: an absolute path relative to
    the absolute ``workspace`` (``/ws/memory/x.md`` -> ``memory/x.md``, also through a
    symlinked parent; ``../notes/x.md`` outside it); a relative path as it is."""
    if not os.path.isabs(path):
        return path
    p = Path(os.path.normpath(path))
    for candidate in (p, Path(os.path.realpath(p.parent)) / p.name):
        if candidate.is_relative_to(workspace):
            return candidate.relative_to(workspace).as_posix()
    return Path(os.path.relpath(p, workspace)).as_posix()


def require_workspace(workspace_dir: Path) -> None:
    """Refuse a workspace that is not a folder: a caller's mistake, not an empty memory (a sync
    of it would empty the index, and ``status`` would create a store for nothing).

    Raises ``UsageError``: ``workspace does not exist: <path> (create it, pass --workspace or
    set agents.defaults.workspace)`` (``is not a directory`` for a file, without ``create it``).
    """
    if not workspace_dir.is_dir():
        exists = workspace_dir.exists()
        raise UsageError(f"workspace {'is not a directory' if exists else 'does not exist'}: "
                         f"{workspace_dir} ({'' if exists else 'create it, '}pass --workspace or set "
                         "agents.defaults.workspace)")
