"""Files of qmd collections on disk: ``memory_get`` of ``qmd/<collection>/...`` and the check that
a hit's file is there, both through the builtin engine's safe reader with the collection as
the root (the memory-file rule, never crossing a symlink)."""

from __future__ import annotations

import os
import re
import sys
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from fallback.errors import MemoryFileNotFoundError, PathRefusedError
from fallback.models import MemoryReadResult
from fallback.sources.read_page import LEGACY_SHADOWED, auxiliary_refusal, open_memory_file, read_page_in_root
from fallback.text.chunking import file_lines as file_lines_of
from qmdbridge.qmd.collections import ManagedCollection

__all__ = ["RACY_NS", "Listings", "clamp_range", "hit_lines", "read_qmd_path", "resolve_hit_file",
           "slugify_path"]

# Most files a normalised path may stand for before the lookup gives up (folders x names).
_MAX_CANDIDATES = 64
# Most folder listings a backend keeps (then they are dropped and listed again as needed).
_MAX_LISTINGS = 256
# What changed less than this long ago (ns) may change again in the same file-time tick: not kept.
RACY_NS = 2_000_000_000
# Line ends as memory_get reads them (``fallback.text.chunking.split_lines``), on bytes.
_LINE_BREAK_BYTES = re.compile(rb"\r\n|\r|\n")


def _follow_base(coll: ManagedCollection, workspace: Path) -> bool:
    """Whether the collection's folder may be reached through a symlink (the workspace, a single file's folder)."""
    return coll.path == workspace or coll.single_file


def slugify_path(path: str) -> str:
    """qmd's old "handelize" normalisation of each segment (NFKD, lower-case, non-alphanumeric runs
    -> ``-``), the last segment's extension kept lower-cased."""
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
    """The names of ``folder`` by :func:`slugify_path`, reused from ``listings`` while its mtime and
    inode hold (not kept when changed less than :data:`RACY_NS` ago); raises ``OSError``."""
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
    """Files under ``root`` whose path normalises like ``rel``, sorted (one lookup per segment)."""
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
    """The first non-blank line of a snippet, without qmd's trailing ``...`` and a leading BOM."""
    for line in snippet.removeprefix("\ufeff").splitlines():
        text = line.strip().removesuffix("...").strip()
        if text:
            return text
    return ""


def resolve_hit_file(coll: ManagedCollection, rel: str, snippet: str, start: int, end: int, *,
                     workspace: Path, listings: Listings | None = None) -> tuple[str | None, str | None]:
    """Which file on disk a qmd hit at ``rel`` in ``coll`` is, when qmd's index may hold a path
    normalised by qmd before 2.6: the file itself, else the look-alike (:func:`slugify_path`)
    whose lines ``start..end`` hold the snippet's first line (``listings`` kept between calls).

    Returns:
        ``(rel on disk, None)`` to keep; ``(None, note)`` to drop (several fit: a note; none:
        ``None``, the file is gone).
    """
    if (coll.path / rel).is_file() and slugify_path(rel) != rel:
        return rel, None
    candidates = _alike(coll.path, rel, listings)
    if candidates == [rel]:
        return rel, None
    needle = _needle(snippet)
    fits = [c for c in candidates
            if (read := hit_lines(coll, c, workspace=workspace, max_bytes=sys.maxsize)) is not None
            and (not needle or needle in "\n".join((read[1] or [])[max(0, start - 1):max(start, end)]))]
    if len(fits) == 1:
        return fits[0], None
    if len(fits) > 1:
        return None, (f"qmd hit dropped: {rel} in qmd's index (a path normalised by a qmd older "
                      f"than 2.6) matches {len(fits)} files ({', '.join(fits)}); run `qmdbridge "
                      "qmd update` so qmd stores the real paths")
    return None, None


def clamp_range(start: int, end: int, total: int) -> tuple[int, int] | None:
    """``start..end`` kept inside a file of ``total`` lines (an empty file has line 1); ``None``
    when it starts past the end."""
    if start > max(total, 1):
        return None
    return start, max(start, min(end, max(total, 1)))


def hit_lines(coll: ManagedCollection, rel: str, *, workspace: Path,
              max_bytes: int) -> tuple[int, list[str] | None] | None:
    """A hit's file opened as ``memory_get`` opens it: ``(line count, lines)``, the lines only when
    it is at most ``max_bytes`` long (else ``None``, counted as a stream); ``None`` when it is
    missing, behind a symlink, not a regular file or unreadable."""
    try:
        fd = open_memory_file(coll.path, rel.split("/"), shown=rel,
                              follow_base=_follow_base(coll, workspace))
    except (PathRefusedError, MemoryFileNotFoundError, OSError):
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


def read_qmd_path(collections: Mapping[str, ManagedCollection], rel: str, from_line: int | None,
                  lines: int | None, *, workspace: Path, from_char: int | None = None) -> MemoryReadResult:
    """Read one page of ``qmd/<collection>/<rest>`` through the builtin engine's safe reader, inside
    that collection with its pattern as the rule; ``from_line``/``lines``/``from_char`` page as
    ``read_page.page_text``.

    Returns:
        The page; ``missing=True`` with empty text when the file does not exist.

    Raises:
        PathRefusedError: ``invalid qmd path``, ``unknown qmd collection: <c>``, a file the
            collection does not index (a shadowed legacy root file, the workspace's
            ``DREAMS.md``), parent segments, symlinks, non-regular files.
        BackendUnavailableError: the file exists but cannot be read.
    """
    parts = rel.split("/", 2)
    if len(parts) < 3 or not parts[1] or not parts[2]:
        raise PathRefusedError(rel, "invalid qmd path")
    coll = collections.get(parts[1])
    if coll is None:
        raise PathRefusedError(rel, f"unknown qmd collection: {parts[1]}")
    inner = "/".join(p for p in parts[2].split("/") if p not in ("", "."))
    if coll.is_root_file and coll.rule_root().admits(inner) and not coll.admits(inner):
        raise PathRefusedError(rel, LEGACY_SHADOWED)
    refused = None if coll.is_root_file else auxiliary_refusal(workspace, coll.path / inner)
    if refused is not None:
        raise PathRefusedError(rel, refused)
    return read_page_in_root(coll.rule_root(), parts[2], shown=rel,
                             follow_base=_follow_base(coll, workspace), from_line=from_line,
                             lines=lines, backend="qmd", from_char=from_char)
