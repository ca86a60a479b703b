"""``memory_get``: resolve a requested path safely and read a page of lines from it.

Path rules (spec ``builtin-engine-spec.md`` §7, tightened): a request names a default memory
file (:func:`fallback.sources.memory_files.is_memory_path`) relative to the workspace, or a Markdown file under
a configured extra path. Anything else is refused with :class:`~fallback.errors.PathRefusedError`
carrying a short reason (the reference answered a bare ``path required``):

================================  =====================================================
reason                            when
================================  =====================================================
``empty path``                    blank input
``invalid characters``            a NUL byte, another control character, or a backslash
``encoded characters``            any ``%XX`` escape (refused outright, never decoded)
``absolute path``                 ``/x``, ``C:x``
``parent segment``                a ``..`` segment, unless the result lands inside a
                                  configured extra path (the ``../notes/x.md`` display form
                                  of an extra folder outside the workspace)
``not a memory path``             neither a memory path nor under an extra path
``not markdown``                  the name does not end in ``.md`` (case-sensitive)
``symlinked directory``           a folder between the root (workspace or extra path)
                                  and the target is a symlink
``symlink``                       the target itself is a symlink
``not a regular file``            the target is a folder, FIFO, device ...
``escapes workspace``             the real path leaves the root (defence in depth)
================================  =====================================================

A missing file (or a missing folder, or a parent that is a regular file) is not an error: it
reads as empty text with ``missing=True``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from fallback.errors import BackendUnavailableError, PathRefusedError
from fallback.models import MemoryReadResult
from fallback.sources.memory_files import is_memory_path, normalize_extra_paths

__all__ = [
    "DEFAULT_READ_LINES",
    "DEFAULT_READ_MAX_CHARS",
    "page_text",
    "read_memory_page",
    "resolve_memory_path",
]

# Reference defaults for one memory_get page: 120 lines, 12,000 chars (code points here).
DEFAULT_READ_LINES = 120
DEFAULT_READ_MAX_CHARS = 12_000
# Transient read errors (EAGAIN/EINTR, "errno -11" upstream) are retried this many times in all.
READ_ATTEMPTS = 3

_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")
# A line ends at "\n" (removed) or after a lone "\r" (kept, as the "\r" of "\r\n" is kept), so
# memory_get line numbers agree with fallback.text.chunking for every line-ending style.
_PAGE_LINE_BREAK = re.compile(r"\n|(?<=\r)(?!\n)")
# Files larger than this are paged from a stream (memory bounded by the page, not the file).
STREAM_ABOVE_BYTES = 1 << 20
_TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _extra_root(target: str, workspace: str, extra_paths: list[str]) -> str | None:
    """Return the configured extra root that admits ``target`` (a folder containing it, or the
    ``.md`` file itself), or None. Symlinked or missing extra entries admit nothing."""
    for extra in normalize_extra_paths(Path(workspace), extra_paths):
        root = str(extra)
        st = _lstat(root)
        if st is None or stat.S_ISLNK(st.st_mode):
            continue
        if stat.S_ISDIR(st.st_mode) and _is_within(target, root):
            return root
        if stat.S_ISREG(st.st_mode) and target == root and root.endswith(".md"):
            return os.path.dirname(root)
    return None


def resolve_memory_path(workspace: Path, extra_paths: list[str], rel_path: str) -> tuple[Path, str]:
    """Resolve a ``memory_get`` path to a file we may read.

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths (as in ``memorySearch.extraPaths``).
        rel_path: the path as the caller gave it: workspace-relative, ``/`` separators; for
            files of an extra folder outside the workspace, the ``../...`` form that search
            results show.

    Returns:
        ``(absolute target, workspace-relative display path with "/" separators)``. The
        target may not exist (the caller reports it as missing).

    Raises:
        PathRefusedError: with one of the reasons in the module docstring.
    """
    def refuse(reason: str) -> PathRefusedError:
        return PathRefusedError(rel_path, reason)

    p = rel_path.strip()
    if not p:
        raise refuse("empty path")
    if "\\" in p or any(unicodedata.category(ch) == "Cc" for ch in p):
        raise refuse("invalid characters")
    if _PERCENT_ESCAPE.search(p):
        raise refuse("encoded characters")
    if os.path.isabs(p) or _WINDOWS_DRIVE.match(p):
        raise refuse("absolute path")
    segments = [s for s in p.split("/") if s not in ("", ".")]
    if not segments:
        raise refuse("not a memory path")
    ws = os.path.abspath(workspace)
    target = os.path.normpath(os.path.join(ws, *segments))
    has_parent = ".." in segments

    root: str | None = None
    if not has_parent and is_memory_path("/".join(segments)):
        root = ws
    else:
        root = _extra_root(target, ws, extra_paths)
    if root is None:
        raise refuse("parent segment" if has_parent else "not a memory path")
    if not target.endswith(".md"):
        raise refuse("not markdown")

    # Every folder between the root and the target must be a real folder, not a symlink.
    cursor = root
    parts = os.path.relpath(target, root).split(os.sep)
    target_reachable = True
    for part in parts[:-1]:
        cursor = os.path.join(cursor, part)
        st = _lstat(cursor)
        if st is None or not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            target_reachable = False  # missing folder, or a parent that is a regular file
            break
        if stat.S_ISLNK(st.st_mode):
            raise refuse("symlinked directory")
    if target_reachable:
        st = _lstat(target)
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise refuse("symlink")
            if not stat.S_ISREG(st.st_mode):
                raise refuse("not a regular file")
    if not _is_within(os.path.realpath(target), os.path.realpath(root)):
        raise refuse("escapes workspace")
    return Path(target), os.path.relpath(target, ws).replace(os.sep, "/")


def _continuation_notice(next_from: int | None, *, suggest_read_fallback: bool) -> str:
    if next_from is not None:
        return f"\n\n[More content available. Use from={next_from} to continue.]"
    hint = " If you need the full raw line, use read on the source file." if suggest_read_fallback else ""
    return f"\n\n[More content available. Requested excerpt exceeded the default maxChars budget.{hint}]"


def page_text(text: str, *, from_line: int | None, lines: int | None,
              default_lines: int = DEFAULT_READ_LINES, max_chars: int = DEFAULT_READ_MAX_CHARS,
              suggest_read_fallback: bool = True) -> tuple[str, int, int, bool, int | None]:
    """Select one page of lines from a file's text (E2 ``memory_get`` paging).

    Lines end at ``\\n``; a trailing ``\\n`` does not start an extra empty line and an empty
    text has zero lines. ``\\r`` characters are kept (``"one\\r\\ntwo\\r\\n"`` pages as
    ``"one\\r\\ntwo\\r"``); a lone ``\\r`` also ends a line, so line numbers agree with chunk
    line ranges.

    Args:
        text: the whole file.
        from_line: first line wanted, 1-based (``None``/``0`` -> 1; values below 1 -> 1).
        lines: number of lines wanted (``None``/``0`` -> ``default_lines``; minimum 1).
        default_lines: page length when ``lines`` is not given (minimum 1).
        max_chars: budget for the selected text in code points (minimum 1). Trailing lines
            are dropped until the text fits; a single line still too long is cut at
            ``max_chars`` code points.
        suggest_read_fallback: when a single line had to be cut, add the hint to read the
            source file directly (true for workspace files).

    Returns:
        ``(page text, start line, included line count, truncated, next_from)``. When
        truncated (lines remain after the page, lines were dropped, or a line was cut) the
        text ends with ``\\n\\n[More content available. Use from=<next_from> to continue.]``,
        or, after a cut line (``next_from`` is then ``None``), with the "Requested excerpt
        exceeded the default maxChars budget." notice.

    Source: OpenClaw ``buildMemoryReadResult`` / ``fitLinesToCharBudget`` (E2,
    ``packages/memory-host-sdk/src/host/read-file-shared.ts``), in code points.
    """
    default_lines = max(1, int(default_lines))
    max_chars = max(1, int(max_chars))
    all_lines = _PAGE_LINE_BREAK.split(text) if text else []
    if all_lines and all_lines[-1] == "":
        all_lines.pop()
    start = max(1, int(from_line or 1))
    count = max(1, int(lines or default_lines))
    selected = all_lines[start - 1:start - 1 + count]
    more_remain = start - 1 + len(selected) < len(all_lines)

    included = len(selected)
    page = "\n".join(selected)
    while included > 1 and len(page) > max_chars:
        included -= 1
        page = "\n".join(selected[:included])
    hard_truncated = len(page) > max_chars
    if hard_truncated:
        page = page[:max_chars]
    dropped = included < len(selected)
    truncated = hard_truncated or dropped or more_remain
    next_from = start + included if truncated and not hard_truncated else None
    if truncated:
        page += _continuation_notice(next_from, suggest_read_fallback=suggest_read_fallback)
    return page, start, included, truncated, next_from


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def _open_regular(target: Path, rel_path: str) -> int | None:
    """Open the target read-only without following a symlink; ``None`` when it is missing.

    Raises:
        PathRefusedError: a symlink or not a regular file (the descriptor is closed).
        OSError: any other failure to open.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        if exc.errno == errno.ELOOP:
            raise PathRefusedError(rel_path, "symlink") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PathRefusedError(rel_path, "not a regular file")
    return fd


def _read_once(target: Path, rel_path: str) -> bytes | None:
    """Read the target's bytes through one descriptor (symlinks not followed); None if missing."""
    fd = _open_regular(target, rel_path)
    if fd is None:
        return None
    try:
        parts: list[bytes] = []
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                return b"".join(parts)
            parts.append(block)
    finally:
        os.close(fd)


def _read_window(target: Path, rel_path: str, start: int, count: int) -> str | None:
    """A big file's text reduced to what paging needs, read as a stream: the lines before
    ``start`` as empty lines, lines ``start .. start+count-1`` as they are, plus one more line so
    :func:`page_text` can tell whether content remains. ``None`` when the file is missing.
    Memory stays bounded by the page, however large the file."""
    import io

    fd = _open_regular(target, rel_path)
    if fd is None:
        return None
    with io.TextIOWrapper(io.FileIO(fd, closefd=True), encoding="utf-8-sig", errors="replace",
                          newline="") as fh:
        parts: list[str] = []
        for number, line in enumerate(fh, start=1):  # newline="": ends at \n, \r\n or \r, kept
            if number < start:
                parts.append("\n")
            else:
                parts.append(line)
                if number >= start + count:  # the one line after the page
                    break
        return "".join(parts)


def read_memory_page(workspace: Path, extra_paths: list[str], rel_path: str, *,
                     from_line: int | None = None, lines: int | None = None,
                     default_lines: int = DEFAULT_READ_LINES,
                     max_chars: int = DEFAULT_READ_MAX_CHARS) -> MemoryReadResult:
    """Read one page of a memory file (the builtin ``memory_get``).

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths.
        rel_path: requested path (see :func:`resolve_memory_path`).
        from_line / lines / default_lines / max_chars: paging, as in :func:`page_text`
            (``max_chars`` in code points).

    Returns:
        A :class:`~fallback.models.MemoryReadResult` with the workspace-relative display
        path. Invalid UTF-8 is decoded with U+FFFD replacements; a leading BOM is removed.
        A missing file gives ``text=""``, ``from_line=1``, ``lines=0``, ``missing=True``.

    Raises:
        PathRefusedError: the path is not an allowed memory file (reasons in the module
            docstring).
        BackendUnavailableError: the file exists but cannot be read (permission denied, or a
            transient EAGAIN/EINTR that persisted over 3 attempts).
    """
    target, display = resolve_memory_path(workspace, extra_paths, rel_path)
    retrying = Retrying(retry=retry_if_exception(_is_transient), stop=stop_after_attempt(READ_ATTEMPTS),
                        wait=wait_exponential(multiplier=0.01, max=0.1), reraise=True)
    try:
        size = target.stat().st_size if target.is_file() else 0
    except OSError:
        size = 0
    try:
        if size > STREAM_ABOVE_BYTES:
            start = max(1, int(from_line or 1))
            count = max(1, int(lines or default_lines))
            text: str | None = retrying(_read_window, target, rel_path, start, count)
        else:
            data = retrying(_read_once, target, rel_path)
            if data is not None and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]
            text = None if data is None else data.decode("utf-8", errors="replace")
    except PathRefusedError:
        raise
    except OSError as exc:
        raise BackendUnavailableError(
            "builtin", f"cannot read {display}: {exc.strerror or exc}") from exc
    if text is None:
        return MemoryReadResult.model_validate(
            {"path": display, "text": "", "from_line": 1, "lines": 0, "missing": True})
    page, start, included, truncated, next_from = page_text(
        text, from_line=from_line, lines=lines, default_lines=default_lines, max_chars=max_chars)
    # model_validate by field name: the "from" alias cannot be a Python keyword argument.
    return MemoryReadResult.model_validate(
        {"path": display, "text": page, "from_line": start, "lines": included,
         "truncated": truncated, "next_from": next_from})
