"""Files of qmd collections on disk: ``memory_get`` of ``qmd/<collection>/...`` and the check
that a hit's file is really there, both through the builtin engine's safe reader
(``fallback.sources.read_page``) with the collection as the root, so they follow the
memory-file rule and never cross a symlink."""

from __future__ import annotations

import os
import re
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from fallback.errors import MemoryFileNotFoundError, PathRefusedError
from fallback.models import MemoryReadResult
from fallback.sources.memory_files import (
    DREAMS_FILE,
    LEGACY_ROOT_MEMORY_FILE,
    is_root_level_auxiliary,
    root_memory_file,
)
from fallback.sources.read_page import DREAMS_REFUSED, LEGACY_SHADOWED, open_memory_file, read_page_in_root
from fallback.text.chunking import file_lines as file_lines_of
from qmdbridge.qmd.collections import ManagedCollection

__all__ = ["RACY_NS", "Listings", "clamp_range", "file_lines", "hit_lines", "read_in_root",
           "read_qmd_path", "resolve_hit_file", "slugify_path"]

# Most files a normalised path may stand for before the lookup gives up (folders x names).
_MAX_CANDIDATES = 64
# Most folder listings a backend keeps (then they are dropped and listed again as needed).
_MAX_LISTINGS = 256
# A file or folder changed less than this long ago (ns) may change again within the same
# file-time tick without a new stamp: what was read from it is not kept.
RACY_NS = 2_000_000_000
# Line ends as memory_get reads them (``fallback.text.chunking.split_lines``), on bytes.
_LINE_BREAK_BYTES = re.compile(rb"\r\n|\r|\n")


def _follow_base(coll: ManagedCollection, workspace: Path) -> bool:
    """The workspace and a single file's folder may be reached through a symlink; a memory or
    custom folder may not (the rule never follows a symlinked memory folder)."""
    return coll.path == workspace or coll.single_file


def slugify_path(path: str) -> str:
    """qmd's old "handelize" normalisation of each segment: NFKD, lower-case, non-alphanumeric
    runs -> ``-``, trimmed; the lower-cased extension of the last segment is kept."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    out = []
    for i, seg in enumerate(parts):
        ext = ""
        if i == len(parts) - 1 and "." in seg[1:]:
            seg, ext = seg.rsplit(".", 1)
            ext = "." + ext.lower()
        s = unicodedata.normalize("NFKD", seg).lower()
        s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
        out.append(s + ext)
    return "/".join(out)


# Folder listings kept between searches: path -> ((st_mtime_ns, st_ino), {slug: [names]}).
Listings = dict[str, tuple[tuple[int, int], dict[str, list[str]]]]


def _slugged_names(folder: Path, listings: Listings | None) -> dict[str, list[str]]:
    """The names of ``folder`` by their :func:`slugify_path` (each list sorted); reused from
    ``listings`` while the folder's mtime and inode are unchanged (an entry added, removed or
    renamed changes them). A folder changed less than :data:`RACY_NS` ago is not kept: file
    times tick coarsely, so a second change within the same tick would leave the stamp as it
    was (git's "racily clean" entries have the same cure).

    Raises:
        OSError: the folder cannot be listed.
    """
    st = os.stat(folder)
    key, stamp = str(folder), (st.st_mtime_ns, st.st_ino)
    known = listings.get(key) if listings is not None else None
    if known is not None and known[0] == stamp:
        return known[1]
    by_slug: dict[str, list[str]] = {}
    for name in sorted(os.listdir(folder)):
        by_slug.setdefault(slugify_path(name), []).append(name)
    if listings is not None and time.time_ns() - st.st_mtime_ns >= RACY_NS:
        if len(listings) >= _MAX_LISTINGS:
            listings.clear()
        listings[key] = (stamp, by_slug)
    return by_slug


def _alike(root: Path, rel: str, listings: Listings | None = None) -> list[str]:
    """Files under ``root`` whose path normalises like ``rel`` (:func:`slugify_path`), sorted.
    One dictionary lookup per path segment and folder (a name equal to the segment has the
    segment's slug), not a scan of the folder: a search checks every note it cites."""
    paths = [""]
    for seg in [p for p in rel.split("/") if p]:
        target, found = slugify_path(seg), []
        for base in paths:
            try:
                names = _slugged_names(root / base, listings)
            except OSError:
                continue
            found += [f"{base}/{n}".lstrip("/") for n in names.get(target, ())]
        paths = found[:_MAX_CANDIDATES]
    return [p for p in paths if (root / p).is_file()]


def _needle(snippet: str) -> str:
    """The first non-blank line of a snippet, without the ``...`` qmd appends when it cuts and
    without a note's leading BOM (qmd keeps it; :func:`file_lines` drops it, as ``memory_get``
    does)."""
    for line in snippet.removeprefix("\ufeff").splitlines():
        text = line.strip().removesuffix("...").strip()
        if text:
            return text
    return ""


def resolve_hit_file(coll: ManagedCollection, rel: str, snippet: str, start: int, end: int, *,
                     workspace: Path, listings: Listings | None = None) -> tuple[str | None, str | None]:
    """Which file on disk a qmd hit is, when qmd's index may hold an old build's path.

    qmd before 2.6 stored paths normalised (:func:`slugify_path`: ``Notes/My File.md`` ->
    ``notes/my-file.md``). A path that names a file literally is that file. Otherwise every
    file that normalises alike is a candidate, and the one whose lines ``start..end`` contain
    the snippet's first line is the hit; several candidates that all fit (or none of several
    with an empty snippet) are ambiguous, and no candidate that fits means the indexed file is
    gone (a look-alike must not be cited in its place).

    Args:
        coll: the hit's collection. rel: the path qmd reported, ``/``-separated.
        snippet: the hit's text without qmd's ``@@`` header. start / end: its 1-based lines.
        workspace: the agent workspace (for the memory-file rule's symlink policy).
        listings: folder listings kept between calls (a backend's; each is listed again once
            the folder changed), so a hit costs no listing of a large unchanged folder.

    Returns:
        ``(rel on disk, None)`` for a hit to keep; ``(None, note)`` for one to drop, ``note``
        saying why (``None`` when the file is simply gone).
    """
    if (coll.path / rel).is_file() and slugify_path(rel) != rel:
        return rel, None
    candidates = _alike(coll.path, rel, listings)
    if candidates == [rel]:
        return rel, None
    needle = _needle(snippet)
    fits = [c for c in candidates if (lines := file_lines(coll, c, workspace=workspace)) is not None
            and (not needle or needle in "\n".join(lines[max(0, start - 1):max(start, end)]))]
    if len(fits) == 1:
        return fits[0], None
    if len(fits) > 1:
        return None, (f"qmd hit dropped: {rel} in qmd's index (a path normalised by a qmd older "
                      f"than 2.6) matches {len(fits)} files ({', '.join(fits)}); run `qmdbridge "
                      "qmd update` so qmd stores the real paths")
    return None, None


def file_lines(coll: ManagedCollection, rel: str, *, workspace: Path) -> list[str] | None:
    """The lines of a collection's file (``rel`` ``/``-separated), opened and numbered as
    ``memory_get`` opens and numbers them (UTF-8, a leading BOM removed, invalid bytes
    replaced; ``\\r\\n``, ``\\r`` and ``\\n`` end a line; line ``i`` is ``result[i - 1]``, line
    ends dropped); ``None`` when it is missing, reached through a symlink, not a regular file or
    unreadable."""
    fd = _open_hit_file(coll, rel, workspace=workspace)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        return file_lines_of(fh.read().decode("utf-8-sig", "replace"))


def _open_hit_file(coll: ManagedCollection, rel: str, *, workspace: Path) -> int | None:
    """A read-only descriptor of a hit's file opened as ``memory_get`` opens it; ``None`` when it
    is missing, reached through a symlink, not a regular file or unreadable."""
    try:
        return open_memory_file(coll.path, rel.split("/"), shown=rel,
                                follow_base=_follow_base(coll, workspace))
    except (PathRefusedError, MemoryFileNotFoundError, OSError):
        return None


def clamp_range(start: int, end: int, total: int) -> tuple[int, int] | None:
    """``start..end`` kept inside a file of ``total`` lines (an empty file has line 1);
    ``None`` when it starts past the end."""
    if start > max(total, 1):
        return None
    return start, max(start, min(end, max(total, 1)))


def hit_lines(coll: ManagedCollection, rel: str, *, workspace: Path,
              max_bytes: int) -> tuple[int, list[str] | None] | None:
    """A hit's file, opened as ``memory_get`` opens it: its number of lines, and its lines (as
    :func:`file_lines`) when it is at most ``max_bytes`` long (else ``None``: a larger file is
    counted as a stream, never held).

    Returns:
        ``(line count, lines or None)``; ``None`` when the file is missing, reached through a
        symlink, not a regular file or unreadable.
    """
    fd = _open_hit_file(coll, rel, workspace=workspace)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size <= max_bytes:
            lines = file_lines_of(fh.read().decode("utf-8-sig", "replace"))
            return len(lines), lines
        total, after_cr, last = 0, False, b""
        for n, block in enumerate(iter(lambda: fh.read(1 << 20), b"")):
            if n == 0:  # a leading BOM is no text (memory_get drops it)
                block = block.removeprefix(b"\xef\xbb\xbf")
            if after_cr and block.startswith(b"\n"):  # a \r\n split between blocks: counted
                block = block[1:]
            total += len(_LINE_BREAK_BYTES.findall(block))
            after_cr = block.endswith(b"\r")
            last = block[-1:] or last
        return total + (last not in (b"", b"\n", b"\r")), None


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
            once ``MEMORY.md`` exists, and for the workspace's ``memory.md`` or ``DREAMS.md``
            in a custom collection of the workspace itself), parent segments, symlinks,
            non-regular files.
        BackendUnavailableError: the file exists but cannot be read.
    """
    rel = "/".join(p for p in inner.split("/") if p not in ("", "."))
    if coll.is_root_file and coll.rule_root().admits(rel) and not coll.admits(rel):
        raise PathRefusedError(shown, "shadowed legacy root file")
    target = coll.path / rel
    if not coll.is_root_file and is_root_level_auxiliary(workspace, target) \
            and not (target.name == LEGACY_ROOT_MEMORY_FILE
                     and root_memory_file(workspace).name == LEGACY_ROOT_MEMORY_FILE):
        raise PathRefusedError(shown, DREAMS_REFUSED if target.name == DREAMS_FILE else LEGACY_SHADOWED)
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
