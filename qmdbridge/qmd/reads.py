"""Files of qmd collections on disk: ``memory_get`` of ``qmd/<collection>/...`` and the check
that a hit's file is really there, both through the builtin engine's safe reader
(``fallback.sources.read_page``) with the collection as the root, so they follow the
memory-file rule and never cross a symlink."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fallback.errors import MemoryFileNotFoundError, PathRefusedError
from fallback.models import MemoryReadResult
from fallback.sources.read_page import open_memory_file, read_page_in_root
from qmdbridge.qmd.collections import ManagedCollection

__all__ = ["clamp_lines", "read_in_root", "read_qmd_path"]


def _follow_base(coll: ManagedCollection, workspace: Path) -> bool:
    """The workspace and a single file's folder may be reached through a symlink; a memory or
    custom folder may not (the rule never follows a symlinked memory folder)."""
    return coll.path == workspace or coll.single_file


def clamp_lines(coll: ManagedCollection, rel: str, start: int, end: int, *,
                 workspace: Path) -> tuple[int, int] | None:
    """Keep a hit's line range inside its file, opened as ``memory_get`` opens it.

    Returns:
        The range; ``None`` when the hit must go (reached through a symlink, not a regular
        file, or starting past the end). A file that is gone keeps its range (the index is
        stale; ``memory_get`` reports the file missing).
    """
    try:
        fd = open_memory_file(coll.path, rel.split("/"), shown=rel,
                              follow_base=_follow_base(coll, workspace))
    except PathRefusedError:
        return None
    except (MemoryFileNotFoundError, OSError):
        return start, end
    with os.fdopen(fd, "rb") as fh:
        total = sum(1 for _ in fh)
    if start > max(total, 1):
        return None
    return start, max(start, min(end, max(total, 1)))


def read_in_root(coll: ManagedCollection, inner: str, shown: str, from_line: int | None,
                 lines: int | None, *, workspace: Path) -> MemoryReadResult:
    """Read one page of a collection's file (``qmd/<collection>/<inner>``) through the same safe
    reader as workspace paths (``fallback.sources.read_page``): the memory-file rule with the
    collection's pattern, symlinks never followed, files over 1 MiB streamed, the same
    refusals.

    Args:
        coll: the collection; its folder is the root of the walk.
        inner: path inside the collection, ``/``-separated.
        shown: the path as the caller gave it (used in results and errors).
        from_line / lines: paging as in ``fallback.sources.read_page.page_text`` (120 lines
            and 12,000 chars by default).
        workspace: the agent workspace (the root-file collection's folder).

    Returns:
        The page; ``missing=True`` with empty text when the file does not exist.

    Raises:
        PathRefusedError: a file the collection does not index (reasons of
            ``fallback.sources.read_page``; ``shadowed legacy root file`` for ``memory.md``
            once ``MEMORY.md`` exists), parent segments, symlinks, non-regular files.
        BackendUnavailableError: the file exists but cannot be read.
    """
    rel = "/".join(p for p in inner.split("/") if p not in ("", "."))
    if coll.is_root_file and coll.rule_root().admits(rel) and not coll.admits(rel):
        raise PathRefusedError(shown, "shadowed legacy root file")
    return read_page_in_root(coll.rule_root(), inner, shown=shown,
                             follow_base=_follow_base(coll, workspace), from_line=from_line,
                             lines=lines, backend="qmd")


def read_qmd_path(collections: Mapping[str, ManagedCollection], rel: str, from_line: int | None,
                  lines: int | None, *, workspace: Path) -> MemoryReadResult:
    """Read ``qmd/<collection>/<rest>`` inside that collection (see :func:`read_in_root`).

    Raises:
        PathRefusedError: ``invalid qmd path``, ``unknown qmd collection: <c>``, or a refusal
            of :func:`read_in_root`.
        BackendUnavailableError: the file exists but cannot be read.
    """
    parts = rel.split("/", 2)
    if len(parts) < 3 or not parts[1] or not parts[2]:
        raise PathRefusedError(rel, "invalid qmd path")
    coll = collections.get(parts[1])
    if coll is None:
        raise PathRefusedError(rel, f"unknown qmd collection: {parts[1]}")
    return read_in_root(coll, parts[2], rel, from_line, lines, workspace=workspace)
