"""``memory_get``: resolve a requested path by the memory-file rule and read a page of it.

A request names a memory file by the rule of :mod:`fallback.sources.memory_files`, relative to
the workspace (``../notes/x.md`` for an extra folder outside it), or, for qmd, relative to a
collection's root. Anything else raises :class:`~fallback.errors.PathRefusedError` with a reason:

- ``empty path``; ``invalid characters`` (a control character, or a backslash that starts no
  ``\\xHH`` escape: ``fallback/text/path_names.py``); ``absolute path`` (``/x``, ``C:x``);
- ``encoded characters``: a ``%XX`` escape in a path that names no memory file (never decoded:
  ``20%Deal.md`` is read under that name);
- ``parent segment``: a ``..`` segment, unless the result lands inside an extra path;
- ``not a memory path``; ``not markdown``; ``hidden or skipped segment``;
  ``outside the pattern <glob>``;
- :data:`LEGACY_SHADOWED` / :data:`NOT_THE_ROOT_FILE`: ``memory.md`` once ``MEMORY.md`` exists;
  :data:`DREAMS_REFUSED`: ``DREAMS.md`` under an extra path of the workspace itself;
- ``symlinked directory``, ``symlink``, ``not a regular file``; ``binary file (NUL bytes)`` (by
  indexing's rule over the first ``maxFileBytes`` bytes).

The symlink-safe open (:func:`open_memory_file`) is described in docs/architecture.md ("Which
files are memory"). A missing file reads as empty text with ``missing=True``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import re
import stat
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from fallback.errors import (
    BackendUnavailableError,
    MemoryFileNotFoundError,
    PathRefusedError,
    UsageError,
)
from fallback.models import MemoryReadResult
from fallback.skipped import DEFAULT_MAX_FILE_BYTES
from fallback.sources.file_text import BINARY_FILE, is_binary, is_binary_file
from fallback.sources.memory_files import (
    DREAMS_FILE,
    LEGACY_ROOT_MEMORY_FILE,
    MARKDOWN_SUFFIX,
    MEMORY_DIR_NAME,
    NOFOLLOW_READ,
    ROOT_MEMORY_FILE,
    SYMLINK_ERRNOS,
    ExtraPathEntry,
    MemoryRoot,
    is_excluded,
    is_root_level_auxiliary,
    locate_memory_path,
    memory_roots,
    root_memory_file,
)
from fallback.sources.transcripts import (
    SESSIONS_DIR_NAME,
    is_transcript_name,
    message_line,
    parse_transcript,
    transcript_path,
)
from fallback.text.chunking import file_lines, truncate_chars
from fallback.text.path_names import parse_printable_path, printable_path

__all__ = ["DEFAULT_READ_LINES", "LEGACY_SHADOWED", "ResolvedMemoryPath", "auxiliary_refusal",
           "open_memory_file", "page_text", "read_memory_page", "read_page_in_root", "read_shared_page",
           "resolve_memory_path", "shared_name", "shared_path", "transcript_name"]

# Refusals of ``memory.md`` once ``MEMORY.md`` exists: as another file, or as the only one.
LEGACY_SHADOWED = "shadowed legacy root file"
NOT_THE_ROOT_FILE = f"the root file is {ROOT_MEMORY_FILE} (names are case-sensitive)"
# How a refused symlink's target can be read: the rule follows no link, an extra path can.
SYMLINK_HINT = "links are not followed; add the target's real path to memorySearch.extraPaths to allow it"
DREAMS_REFUSED = f"the dreaming diary ({DREAMS_FILE}) is not memory"
# A hit of a scope another agent shares is cited as shared/<owner>/<path> (shared_path).
SHARED_DIR_NAME = "shared"
# Transient read errors (EAGAIN/EINTR) are retried this many times in all.
READ_ATTEMPTS = 3

_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")
# Files larger than this are paged from a stream (memory bounded by the page, not the file).
STREAM_ABOVE_BYTES = 1 << 20
# Bytes counted at a time while a stream skips the lines before a page.
SKIP_BLOCK_BYTES = 1 << 16
_BYTE_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
# openat-style walks need os.open(..., dir_fd=...) (every POSIX platform; not Windows).
_HAS_DIR_FD = os.open in os.supports_dir_fd


# Reference defaults for one memory_get page: 120 lines, 12,000 chars (code points here).
DEFAULT_READ_LINES = 120
DEFAULT_READ_MAX_CHARS = 12_000


def _page_window(from_line: int | None, lines: int | None) -> tuple[int, int]:
    """``(first line, line count)`` of a request: line 1 and :data:`DEFAULT_READ_LINES` by default."""
    return max(1, int(from_line or 1)), max(1, int(lines or DEFAULT_READ_LINES))


def page_text(text: str, *, from_line: int | None, lines: int | None,
              max_chars: int = DEFAULT_READ_MAX_CHARS, line_offset: int = 0,
              from_char: int | None = None) -> tuple[str, int, int, bool, int | None]:
    """Select one page of lines from a file's text (E2 ``memory_get`` paging).

    Lines are those of :func:`fallback.text.chunking.file_lines`, so line numbers agree with
    chunk line ranges. The page is the text as it is, less the last line's final ``\\n``.

    Args:
        text: the whole file (or its lines from ``line_offset + 1`` on).
        from_line: first line wanted, 1-based (``None`` or below 1 -> 1).
        lines: number of lines wanted (``None``/``0`` -> :data:`DEFAULT_READ_LINES`; minimum 1).
        max_chars: budget in code points (minimum 1); trailing lines are dropped until the
            text fits, a single line still too long is cut on a grapheme-cluster boundary.
        line_offset: lines of the file before ``text`` (at most ``from_line - 1``).
        from_char: the page starts at this code point of line ``from_line`` (1-based;
            ``None`` -> 1): how a line longer than ``max_chars`` is read on.

    Returns:
        ``(page text, start line, included line count, truncated, next_from)``. A truncated
        page ends with ``[More content available. Use from=<next_from> to continue.]``, or,
        after a cut line (``next_from`` ``None``), with ``[More content available. Line <n>
        is cut at the maxChars budget. Use from=<n> fromChar=<c> to continue.]``.

    Source: OpenClaw ``buildMemoryReadResult`` / ``fitLinesToCharBudget`` (E2,
    ``packages/memory-host-sdk/src/host/read-file-shared.ts``), in code points; the reference
    tells to read a cut line's source file instead of ``fromChar``.
    """
    max_chars = max(1, int(max_chars))
    start, count = _page_window(from_line, lines)
    skip = max(1, int(from_char or 1)) - 1  # code points of the first line before the page
    # More than max_chars + 1 lines cannot fit, so no more are split off.
    take = min(count, max_chars + 1)
    before = max(0, start - 1 - line_offset)  # lines of ``text`` before the page
    all_lines = file_lines(text, keep_ends=True, max_lines=before + take)
    selected = all_lines[before:before + take]
    more_remain = before + len(selected) < len(all_lines)
    if skip and selected:  # the rest of the first line, its line break kept
        selected[0] = selected[0][min(skip, len(selected[0].rstrip("\r\n"))):]

    included, size = 0, 0
    for line in selected:  # the longest run of whole lines within the budget (at least one)
        grown = size + len(line)
        if included and grown - line.endswith("\n") > max_chars:
            break
        included, size = included + 1, grown
    page = "".join(selected[:included]).removesuffix("\n")
    next_from, truncated = None, True
    if len(page) > max_chars:  # one line (included == 1) too long: cut, read on by character
        page = truncate_chars(page, max_chars)
        page += (f"\n\n[More content available. Line {start} is cut at the maxChars budget. "
                 f"Use from={start} fromChar={skip + len(page) + 1} to continue.]")
    elif included < len(selected) or more_remain:
        next_from = start + included
        page += f"\n\n[More content available. Use from={next_from} to continue.]"
    else:
        truncated = False
    return page, start, included, truncated, next_from


@dataclass(frozen=True)
class ResolvedMemoryPath:
    """Where a ``memory_get`` path leads: the folder the walk starts at (``base``, which may
    be a symlink when ``follow_base``), the components below it (``inner``) and the
    workspace-relative ``display`` path."""

    base: Path
    inner: tuple[str, ...]
    display: str
    follow_base: bool


# A backslash that starts no ``\xHH`` escape of the printable form (a Windows separator).
_BARE_BACKSLASH = re.compile(r"\\(?!x[0-9a-fA-F]{2})")


def _check_text(path: str, shown: str) -> list[str]:
    """The request's own checks (no disk): returns the segments without ``""``/``"."``."""
    p = path.strip()
    if not p:
        raise PathRefusedError(shown, "empty path")
    if any(unicodedata.category(ch) == "Cc" for ch in p):
        raise PathRefusedError(shown, "invalid characters")
    if any(unicodedata.category(ch) == "Cs" for ch in p):  # a name's own bytes, as a shell passes them
        raise PathRefusedError(shown, "invalid characters", hint="a file name that is not UTF-8 is "
                               f"written with \\xHH escapes, as search cites it: {printable_path(p)}")
    try:
        p = parse_printable_path(p)  # "\xHH": a name byte that is not UTF-8 (or "\", a control)
    except UsageError:  # a bare backslash: a Windows separator, most likely
        raise PathRefusedError(shown, "invalid characters", hint="folders are separated by '/' (a "
                               f"backslash in a file name is written \\x5c): {_BARE_BACKSLASH.sub('/', p)}") from None
    if "\x00" in p:
        raise PathRefusedError(shown, "invalid characters")
    if os.path.isabs(p) or _WINDOWS_DRIVE.match(p):
        raise PathRefusedError(shown, "absolute path")
    segments = [s for s in p.split("/") if s not in ("", ".")]
    if not segments:
        raise PathRefusedError(shown, "not a memory path")
    return segments


def _encoded(shown: str) -> PathRefusedError | None:
    """The ``encoded characters`` refusal for a path holding a ``%XX`` escape, else ``None``
    (called only once the literal path led to no memory file)."""
    return PathRefusedError(shown, "encoded characters") if _PERCENT_ESCAPE.search(shown) else None


def _why_not(root: MemoryRoot, rel: str) -> str:
    """The refusal reason for a path inside ``root``'s folder that the rule does not admit."""
    if not rel.endswith(MARKDOWN_SUFFIX):
        return "not markdown"
    if is_excluded(rel.split("/")):
        return "hidden or skipped segment"
    return f"outside the pattern {root.pattern}"


def _usable_extra(root: MemoryRoot) -> bool:
    try:
        st = os.lstat(root.entry)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)


def resolve_memory_path(workspace: Path, extra_paths: Sequence[ExtraPathEntry],
                        rel_path: str) -> ResolvedMemoryPath:
    """Decide which root of the memory-file rule a ``memory_get`` path belongs to (the file
    and the folders on the way are checked when :func:`open_memory_file` opens them).

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths.
        rel_path: workspace-relative, ``/`` separators (``../...`` outside the workspace).

    Raises:
        PathRefusedError: with one of the reasons in the module docstring.
    """
    try:
        return _resolve(workspace, extra_paths, rel_path)
    except PathRefusedError as exc:
        raise _encoded(rel_path) or exc from None


def auxiliary_refusal(workspace: Path, target: str | Path) -> str | None:
    """Why a read of a root-level file only the root-file rule admits (:func:`is_root_level_auxiliary`)
    through a folder of the workspace itself is refused: :data:`DREAMS_REFUSED`, :data:`LEGACY_SHADOWED`
    or ``not a memory path``; ``None`` for any other file and for ``memory.md`` as the root file."""
    if not is_root_level_auxiliary(workspace, target):
        return None
    name = os.path.basename(target)
    if name == LEGACY_ROOT_MEMORY_FILE:
        return None if root_memory_file(workspace).name == LEGACY_ROOT_MEMORY_FILE else LEGACY_SHADOWED
    return DREAMS_REFUSED if name == DREAMS_FILE else "not a memory path"


def _resolve(workspace: Path, extra_paths: Sequence[ExtraPathEntry], rel_path: str) -> ResolvedMemoryPath:
    segments = _check_text(rel_path, rel_path)
    ws = os.path.abspath(workspace)
    target = os.path.normpath(os.path.join(ws, *segments))
    display = printable_path(os.path.relpath(target, ws).replace(os.sep, "/"))
    has_parent = ".." in segments
    roots = memory_roots(Path(ws), extra_paths)
    if not has_parent and len(segments) == 1 and segments[0] in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE):
        if segments[0] == LEGACY_ROOT_MEMORY_FILE and roots[0].pattern == ROOT_MEMORY_FILE \
                and os.path.lexists(os.path.join(ws, ROOT_MEMORY_FILE)):
            shadowed = root_memory_file(Path(ws)).legacy_shadowed
            raise PathRefusedError(rel_path, LEGACY_SHADOWED if shadowed else NOT_THE_ROOT_FILE)
        return ResolvedMemoryPath(Path(ws), (segments[0],), display, True)
    candidates = [r for r in roots[2:] if _usable_extra(r)]
    if not has_parent:
        candidates.insert(0, roots[1])
    found = locate_memory_path(candidates, target)
    if found is None:
        holder = next((r for r in candidates if r.entry == r.path  # folders, not single files
                       and target.startswith(str(r.path).rstrip(os.sep) + os.sep)), None)
        if holder is None:
            raise PathRefusedError(rel_path, "parent segment" if has_parent else "not a memory path")
        rel = os.path.relpath(target, holder.path).replace(os.sep, "/")
        raise PathRefusedError(rel_path, _why_not(holder, rel))
    root, rel = found
    refused = auxiliary_refusal(Path(ws), target)  # an extra path of the workspace itself holds it
    if refused is not None:
        raise PathRefusedError(rel_path, refused)
    if root.kind == "memory":
        return ResolvedMemoryPath(Path(ws), (MEMORY_DIR_NAME, *rel.split("/")), display, True)
    return ResolvedMemoryPath(root.path, tuple(rel.split("/")), display, root.entry != root.path)


def _open_dir(name: str | Path, dir_fd: int | None, *, follow: bool, shown: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in SYMLINK_ERRNOS:
            raise PathRefusedError(shown, "symlinked directory", hint=SYMLINK_HINT) from exc
        if exc.errno == errno.ENOTDIR:  # a symlink (O_NOFOLLOW | O_DIRECTORY on Linux) or a file
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise PathRefusedError(shown, "symlinked directory", hint=SYMLINK_HINT) from exc
            raise MemoryFileNotFoundError(shown, "a parent is not a folder") from exc
        if exc.errno == errno.ENOENT:
            raise MemoryFileNotFoundError(shown) from exc
        raise


def open_memory_file(base: Path, inner: Sequence[str], *, shown: str, follow_base: bool = True) -> int:
    """Open ``base/inner...`` read-only without following any symlink below ``base``; a name
    that is not there as given is opened in its other Unicode form (NFC or NFD: macOS writes
    names decomposed, most text and most agents compose them).

    Args:
        base: the root folder (absolute).
        inner: path components below ``base``; none may be ``..``.
        shown: the path as the caller gave it (for errors).
        follow_base: whether ``base`` itself may be a symlink.

    Returns:
        The open file descriptor of a regular file (the caller closes it).

    Raises:
        PathRefusedError: ``symlinked directory``, ``symlink`` or ``not a regular file``.
        MemoryFileNotFoundError: no such file or folder, or a parent is a regular file.
        OSError: any other failure to open (permission denied, ...).
    """
    try:
        return _open_exact(base, inner, shown=shown, follow_base=follow_base)
    except MemoryFileNotFoundError:
        for form in ("NFC", "NFD"):
            other = [unicodedata.normalize(form, part) for part in inner]
            if other != list(inner):
                with contextlib.suppress(MemoryFileNotFoundError):
                    return _open_exact(base, other, shown=shown, follow_base=follow_base)
        raise


def _open_exact(base: Path, inner: Sequence[str], *, shown: str, follow_base: bool) -> int:
    if not inner or any(part in ("", ".", "..") or "/" in part for part in inner):
        raise PathRefusedError(shown, "parent segment")
    if not _HAS_DIR_FD:
        raise BackendUnavailableError("builtin", "memory_get needs a platform with dir_fd "
                                      "support for symlink-safe reads")
    dfd = _open_dir(base, None, follow=follow_base, shown=shown)
    try:
        for part in inner[:-1]:
            nfd = _open_dir(part, dfd, follow=False, shown=shown)
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(inner[-1], NOFOLLOW_READ | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in SYMLINK_ERRNOS:
                raise PathRefusedError(shown, "symlink", hint=SYMLINK_HINT) from exc
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise MemoryFileNotFoundError(shown) from exc
            raise
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefusedError(shown, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _skip_lines(fd: int, count: int) -> tuple[int, int]:
    """Where line ``count + 1`` of the file behind ``fd`` starts: ``(byte offset, lines
    skipped)``, fewer lines when the file ends first; breaks are counted a block at a time."""
    offset = skipped = 0
    cr_before = False  # the byte before ``offset`` is "\r": a "\n" at ``offset`` ends that break
    while skipped < count:
        block = os.pread(fd, SKIP_BLOCK_BYTES, offset)
        if not block:
            break
        lead = 1 if cr_before and block[:1] == b"\n" else 0
        breaks = block.count(b"\n") - lead
        if b"\r" in block:  # (most files have none: one search, not two counts)
            breaks += block.count(b"\r") - block.count(b"\r\n")
        if skipped + breaks < count:
            skipped += breaks
            offset += len(block)
            cr_before = block.endswith(b"\r")
            continue
        for found in _BYTE_LINE_BREAK.finditer(block, lead):
            skipped += 1
            if skipped == count:
                end = offset + found.end()
                if found.group() == b"\r" and os.pread(fd, 1, end) == b"\n":
                    end += 1  # a "\r\n" cut by the block's end
                return end, skipped
    return offset, skipped


def _read_text(fd: int, start: int, count: int, max_chars: int,
               max_file_bytes: int) -> tuple[str, int] | None:
    """The text behind ``fd`` for paging and the number of file lines before it, or ``None``
    for a binary file (indexing's rule over the first ``max_file_bytes``); closes ``fd``.

    A file above :data:`STREAM_ABOVE_BYTES` is streamed from line ``start`` for ``count``
    lines (or ``max_chars``) plus one, so memory is bounded by the page, not the file.
    """
    with io.FileIO(fd, closefd=True) as raw:
        if os.fstat(fd).st_size <= min(STREAM_ABOVE_BYTES, max_file_bytes):
            data = raw.readall()
            if b"\x00" in data and is_binary([data]):
                return None
            return data.decode("utf-8-sig", errors="replace"), 0
        if is_binary_file(fd, max_bytes=max_file_bytes):
            return None
        offset, skipped = _skip_lines(fd, start - 1)
        raw.seek(offset)
        with io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8-sig" if offset == 0 else "utf-8",
                              errors="replace", newline="") as fh:
            parts: list[str] = []
            page_chars = 0
            for number, line in enumerate(fh, start=skipped + 1):  # newline="": ends kept
                parts.append(line)
                page_chars += len(line)
                if number >= start + count or page_chars > max_chars + 1:
                    break  # the line after the page, or one the budget cannot hold
            return "".join(parts), skipped


def _read_page(read: Callable[[], tuple[str, int] | None], *, shown: str, display: str,
               from_line: int | None, lines: int | None, max_chars: int,
               backend: str, from_char: int | None = None) -> MemoryReadResult:
    """One page of what ``read()`` returns, a transient error retried; turns a missing,
    unreadable or binary file into its answer."""
    try:
        got = Retrying(retry=retry_if_exception(lambda e: isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS),
                       stop=stop_after_attempt(READ_ATTEMPTS),
                       wait=wait_exponential(multiplier=0.01, max=0.1), reraise=True)(read)
    except MemoryFileNotFoundError:
        if (encoded := _encoded(shown)) is not None:
            raise encoded from None
        return MemoryReadResult.model_validate(
            {"path": display, "text": "", "from_line": 1, "lines": 0, "missing": True})
    except OSError as exc:
        raise BackendUnavailableError(backend, f"cannot read {display}: {exc.strerror or exc}") from exc
    if got is None:  # what indexing skips, no reader may return
        raise PathRefusedError(shown, BINARY_FILE)
    text, lines_before = got
    page, first, included, truncated, next_from = page_text(
        text, from_line=from_line, lines=lines, max_chars=max_chars, line_offset=lines_before,
        from_char=from_char)
    # model_validate by field name: the "from" alias cannot be a Python keyword argument.
    return MemoryReadResult.model_validate(
        {"path": display, "text": page, "from_line": first, "lines": included,
         "truncated": truncated, "next_from": next_from})


def _file_page(at: ResolvedMemoryPath, *, shown: str, from_line: int | None, lines: int | None,
               max_chars: int = DEFAULT_READ_MAX_CHARS, backend: str,
               max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
               from_char: int | None = None) -> MemoryReadResult:
    """:func:`_read_page` of the memory file ``at`` (opened by :func:`open_memory_file`)."""
    start, count = _page_window(from_line, lines)
    # a stream reads as many more code points as the page skips of its first line
    budget = max(1, int(max_chars)) + max(1, int(from_char or 1)) - 1
    return _read_page(lambda: _read_text(
        open_memory_file(at.base, at.inner, shown=shown, follow_base=at.follow_base), start, count,
        budget, max_file_bytes), shown=shown, display=at.display,
        from_line=from_line, lines=lines, max_chars=max_chars, backend=backend, from_char=from_char)


def read_memory_page(workspace: Path, extra_paths: Sequence[ExtraPathEntry], rel_path: str, *,
                     from_line: int | None = None, lines: int | None = None,
                     max_chars: int = DEFAULT_READ_MAX_CHARS, sessions_dir: Path | None = None,
                     max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                     from_char: int | None = None) -> MemoryReadResult:
    """Read one page of a workspace memory file (the builtin ``memory_get``).

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths.
        rel_path: requested path (see :func:`resolve_memory_path`).
        from_line / lines / max_chars / from_char: paging, as in :func:`page_text`.
        sessions_dir: the transcript folder when the ``sessions`` source is on (a
            ``sessions/<transcript>`` path then reads that transcript's JSONL lines).
        max_file_bytes: the index's size cap in bytes: the most read to tell binary files.

    Returns:
        A :class:`~fallback.models.MemoryReadResult` (BOM removed, invalid UTF-8 as U+FFFD);
        a missing file gives ``text=""``, ``lines=0``, ``missing=True``.

    Raises:
        PathRefusedError: not a memory file, or binary (reasons in the module docstring).
        BackendUnavailableError: the file exists but cannot be read.
    """
    if sessions_dir is not None and (name := transcript_name(rel_path)) is not None:
        return _transcript_page(sessions_dir, name, rel_path, from_line=from_line, lines=lines,
                                max_chars=max_chars, from_char=from_char)
    return _file_page(resolve_memory_path(workspace, extra_paths, rel_path), shown=rel_path,
                      from_line=from_line, lines=lines, max_chars=max_chars, backend="builtin",
                      max_file_bytes=max_file_bytes, from_char=from_char)


def read_page_in_root(root: MemoryRoot, inner: str, *, shown: str, follow_base: bool,
                      from_line: int | None = None, lines: int | None = None,
                      backend: str = "qmd", from_char: int | None = None) -> MemoryReadResult:
    """Read one page of ``root.path/inner`` (a qmd collection's file) with the rule's
    refusals and the same safe open; returns and raises as :func:`read_memory_page`.

    Args:
        root: the collection as a memory root (its folder and pattern).
        inner: path inside the root, ``/``-separated.
        shown: the path as the caller gave it (in results and errors).
        follow_base: whether the root folder itself may be a symlink.
        from_line / lines / from_char: as in :func:`read_memory_page`.
        backend: names the backend in :class:`~fallback.errors.BackendUnavailableError`.
    """
    segments = _check_text(inner, shown)
    if ".." in segments:
        raise PathRefusedError(shown, "parent segment")
    rel = "/".join(segments)
    if not root.admits(rel):
        raise _encoded(shown) or PathRefusedError(
            shown, _why_not(root, rel) if root.kind != "root" else "not a memory path")
    return _file_page(ResolvedMemoryPath(root.path, tuple(segments), shown, follow_base), shown=shown,
                      from_line=from_line, lines=lines, backend=backend, from_char=from_char)


def shared_path(owner: str, rel_path: str) -> str:
    """The path a hit of the scope ``owner`` shares with an agent is cited by:
    ``shared/<owner>/<rel_path>`` (``rel_path`` relative to the owner's workspace)."""
    return f"{SHARED_DIR_NAME}/{owner}/{rel_path}"


def shared_name(rel_path: str) -> tuple[str, str] | None:
    """``(owner, path in the owner's workspace)`` of a :func:`shared_path`, else ``None``."""
    parts = rel_path.strip().split("/", 2)
    if len(parts) == 3 and parts[0] == SHARED_DIR_NAME and parts[1] and parts[2]:
        return parts[1], parts[2]
    return None


def read_shared_page(read_text: Callable[[str], str | None], rel_path: str, *,
                     from_line: int | None = None, lines: int | None = None,
                     from_char: int | None = None) -> MemoryReadResult:
    """One page of a shared file (:func:`shared_path`) from the text its owner's sync stored,
    paged as :func:`read_memory_page` pages a local file.

    The owner's path is refused as a local request is (:func:`resolve_memory_path`): empty,
    invalid characters, absolute, or a ``..`` segment that does not land in one of the owner's
    extra paths (a file of the owner's index other than its root file and ``memory/``).

    Args:
        read_text: returns the text of the owner's memory file at a path relative to the
            owner's workspace, or ``None`` when the owner's index holds no such file (blocking).
        rel_path: the ``shared/<owner>/<path>`` asked for.
        from_line / lines / from_char: as :func:`page_text`.

    Returns:
        The page, its ``path`` the shared path with the owner's path normalised (no such file:
        ``missing=True``, as :func:`read_memory_page`).

    Raises:
        PathRefusedError: with a reason of the module docstring.
        IndexStoreError: the owner's index cannot be read.
    """
    if (named := shared_name(rel_path)) is None:
        raise PathRefusedError(rel_path, "not a memory path")
    segments = _check_text(named[1], rel_path)
    path = posixpath.normpath("/".join(segments))
    has_parent = ".." in segments

    def read() -> tuple[str, int]:
        text = read_text(path)
        if has_parent and (text is None or path in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE)
                           or path.split("/", 1)[0] == MEMORY_DIR_NAME):
            raise PathRefusedError(rel_path, "parent segment")
        if text is None:
            raise MemoryFileNotFoundError(rel_path)
        return text, 0

    return _read_page(read, shown=rel_path, display=shared_path(named[0], printable_path(path)),
                      from_line=from_line, lines=lines, max_chars=DEFAULT_READ_MAX_CHARS,
                      backend="builtin", from_char=from_char)


def transcript_name(rel_path: str) -> str | None:
    """The transcript file name (surrogate-escaped ``str``) a session citation
    ``sessions/<name>`` names, or ``None`` for any other path."""
    try:
        segments = _check_text(rel_path, rel_path)
    except PathRefusedError:
        return None
    if len(segments) == 2 and segments[0] == SESSIONS_DIR_NAME and is_transcript_name(segments[1]):
        return segments[1]
    return None


def _transcript_page(sessions_dir: Path, name: str, rel_path: str, *, from_line: int | None,
                     lines: int | None, max_chars: int, from_char: int | None) -> MemoryReadResult:
    """One page of the transcript ``name``, opened as memory files are: line ``n`` is JSONL
    line ``n``, a kept message as its indexed line (``User: <text>``), every other line empty."""
    def read() -> tuple[str, int]:
        parsed = parse_transcript(open_memory_file(sessions_dir, (name,), shown=rel_path))
        if parsed.read_failed:
            raise OSError("; ".join(parsed.errors))
        text = [""] * parsed.line_count
        for message in parsed.messages:
            text[message.line_no - 1] = message_line(message)
        return "".join(f"{line}\n" for line in text), 0

    return _read_page(read, shown=rel_path, display=transcript_path(name), from_line=from_line,
                      lines=lines, max_chars=max_chars, backend="builtin", from_char=from_char)
