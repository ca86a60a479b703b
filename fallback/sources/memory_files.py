"""Memory file discovery: which Markdown files of a workspace are indexed, and reading them.

Discovery never raises for a bad file or a missing folder: problems become
:class:`~fallback.models.SkippedFile` entries (a file we saw but will not index, and why) or
issue strings (a folder or configured path that is missing or unusable).

Rules (spec ``builtin-engine-spec.md`` §2, with the decisions of DESIGN.md):

- root file: ``MEMORY.md`` (exact case, regular file, not a symlink). If it is absent and a
  legacy ``memory.md`` is present, ``memory.md`` is indexed instead. When both exist only
  ``MEMORY.md`` is indexed and the split is reported as an issue.
- ``memory/**/*.md``: walked without following symlinks; ``.openclaw-repair`` and the usual
  junk folders (:data:`SKIP_DIR_NAMES`) are not descended; names end in ``.md`` (case-sensitive).
- extra paths: resolved against the workspace (a leading ``~`` is expanded), walked the same
  way; a symlinked entry is skipped; a missing one is an issue.
- order: root file, ``memory/`` tree, then each extra path in configured order; folders are
  walked in sorted name order so the result is deterministic; de-duplicated by real path.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from fallback.models import SkippedFile
from fallback.text.scripts import sha256_hex

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "Discovery",
    "FileContent",
    "MemoryFile",
    "SKIP_DIR_NAMES",
    "is_memory_path",
    "list_memory_files",
    "normalize_extra_paths",
    "read_memory_text",
]

# Files above this size (10 MiB) are not memory notes; indexing them would only bloat the store.
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
# Folders never descended: repair backups (spec §2.2) and tool/VCS folders that hold no notes.
SKIP_DIR_NAMES = frozenset({
    ".openclaw-repair", ".git", "node_modules", ".venv", "venv", "__pycache__", ".tox",
    ".pnpm-store",
})
ROOT_MEMORY_FILE = "MEMORY.md"
LEGACY_ROOT_MEMORY_FILE = "memory.md"
_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class MemoryFile:
    """One discovered memory file.

    Attributes:
        abs_path: absolute path (not symlink-resolved).
        rel_path: workspace-relative path with ``/`` separators; files of extra paths outside
            the workspace get a ``../...`` path.
        source: ``memory`` (session transcripts are discovered elsewhere).
        size: size in bytes at discovery.
        mtime_ms: modification time at discovery, epoch ms.
    """

    abs_path: Path
    rel_path: str
    source: str = "memory"
    size: int = 0
    mtime_ms: int = 0


@dataclass(frozen=True)
class Discovery:
    """The outcome of :func:`list_memory_files`.

    Attributes:
        files: files to index, in discovery order, one per real path.
        skipped: files seen but not indexed (symlink, too large, unreadable), with reasons.
        issues: human-readable problems with folders and configuration (missing ``memory/``,
            missing extra path, legacy ``memory.md`` next to ``MEMORY.md`` ...).
    """

    files: list[MemoryFile]
    skipped: list[SkippedFile]
    issues: list[str]


@dataclass(frozen=True)
class FileContent:
    """The text of one memory file as it will be indexed.

    Attributes:
        text: the file decoded as UTF-8 (a leading BOM removed; invalid bytes replaced by
            U+FFFD when ``invalid_utf8``).
        content_hash: sha256 hex of the raw bytes on disk.
        invalid_utf8: True when the bytes were not valid UTF-8.
        size: size in bytes.
        mtime_ms: modification time, epoch ms.
    """

    text: str
    content_hash: str
    invalid_utf8: bool
    size: int
    mtime_ms: int


def _rel(path: str, workspace: str) -> str:
    return os.path.relpath(path, workspace).replace(os.sep, "/")


def normalize_extra_paths(workspace: Path, extra_paths: list[str]) -> list[Path]:
    """Normalise the configured ``extraPaths`` into absolute paths.

    Each entry is trimmed and empty entries dropped; a leading ``~`` or ``~/`` is expanded to
    the home directory (the E3 rule; E1/E2 did not expand it, but users expect it); relative
    entries are resolved against ``workspace``; ``.``/``..`` segments are collapsed lexically
    (symlinks are not resolved). Duplicates are removed keeping the first occurrence.

    Args:
        workspace: the agent workspace directory.
        extra_paths: the configured entries, as written.

    Returns:
        Absolute paths in configured order, without duplicates. Nothing is checked on disk.
    """
    seen: set[str] = set()
    out: list[Path] = []
    for raw in extra_paths:
        entry = raw.strip()
        if not entry:
            continue
        if entry == "~" or entry.startswith("~/"):
            entry = os.path.expanduser(entry)
        resolved = os.path.normpath(os.path.join(os.path.abspath(workspace), entry))
        if resolved not in seen:
            seen.add(resolved)
            out.append(Path(resolved))
    return out


def is_memory_path(rel_path: str) -> bool:
    """Return True when a workspace-relative path names a default memory file.

    Backslashes count as ``/`` and leading ``./`` and ``/`` prefixes are ignored. True for
    ``MEMORY.md``, ``memory.md`` (legacy root), ``DREAMS.md``, ``dreams.md`` and anything
    under ``memory/`` (spec §7 step 4). The check is textual: it does not look at the disk
    and does not reject ``..`` (callers resolve and refuse those).
    """
    p = rel_path.strip().replace("\\", "/")
    while True:
        if p.startswith("./"):
            p = p[2:]
        elif p.startswith("/"):
            p = p[1:]
        else:
            break
    if p in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE, "DREAMS.md", "dreams.md"):
        return True
    return p.startswith("memory/") and len(p) > len("memory/")


# Discovery stops walking after this many directory entries in all (an extra path such as the
# home folder would otherwise make every sync walk the whole disk); the cut is reported.
MAX_WALK_ENTRIES = 200_000

class _Collector:
    """Accumulates discovered files, skips and issues for one discovery run."""

    def __init__(self, workspace: str, max_file_bytes: int) -> None:
        self.workspace = workspace
        self.max_file_bytes = max_file_bytes
        self.candidates: list[tuple[str, os.stat_result]] = []
        self.skipped: list[SkippedFile] = []
        self.issues: list[str] = []
        self.entries_left = MAX_WALK_ENTRIES

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append(SkippedFile(path=_rel(path, self.workspace), reason=reason))

    def add_file(self, path: str, st: os.stat_result) -> None:
        """Accept a regular, non-symlink file seen by lstat, unless too large or unreadable."""
        if st.st_size > self.max_file_bytes:
            self.skip(path, f"too large ({st.st_size} bytes > cap {self.max_file_bytes})")
            return
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return
            self.skip(path, f"unreadable: {exc.strerror or exc}")
            return
        os.close(fd)
        self.candidates.append((path, st))

    def is_auxiliary(self, path: str) -> bool:
        """Spec §2.4: the legacy root file and repair backups are never picked up by walks."""
        rel = _rel(path, self.workspace)
        return (rel == LEGACY_ROOT_MEMORY_FILE or rel == ".openclaw-repair/root-memory"
                or rel.startswith(".openclaw-repair/root-memory/"))

    def walk(self, directory: str) -> None:
        """Walk ``directory`` recursively in name order without following symlinks."""
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.issues.append(f"cannot list {directory}: {exc.strerror or exc}")
            return
        self.entries_left -= len(entries)
        if self.entries_left < 0:
            self.issues.append(f"stopped walking at {directory}: more than {MAX_WALK_ENTRIES} "
                               "entries under the memory folders (is an extra path too broad?)")
            return
        for entry in entries:
            try:
                if entry.is_symlink():
                    if entry.name.endswith(".md") or entry.is_dir():
                        self.skip(entry.path, "symlink (not followed)")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIP_DIR_NAMES:
                        self.walk(entry.path)
                    continue
                if not entry.name.endswith(".md") or self.is_auxiliary(entry.path):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    self.skip(entry.path, f"unreadable: {exc.strerror or exc}")
                continue
            if stat.S_ISREG(st.st_mode):
                self.add_file(entry.path, st)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _add_root_file(col: _Collector, workspace: str) -> None:
    try:
        with os.scandir(workspace) as it:
            names = {e.name: e for e in it if e.name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE)}
    except OSError as exc:
        col.issues.append(f"cannot list workspace {workspace}: {exc.strerror or exc}")
        return
    usable: dict[str, tuple[str, os.stat_result]] = {}
    for name, entry in names.items():
        if entry.is_symlink():
            col.skip(entry.path, "symlink (not followed)")
            continue
        st = _lstat(entry.path)
        if st is not None and stat.S_ISREG(st.st_mode):
            usable[name] = (entry.path, st)
    if ROOT_MEMORY_FILE in usable:
        col.add_file(*usable[ROOT_MEMORY_FILE])
        if LEGACY_ROOT_MEMORY_FILE in usable:
            col.issues.append(
                "both MEMORY.md and legacy memory.md exist; only MEMORY.md is indexed "
                "(merge memory.md into MEMORY.md)")
    elif LEGACY_ROOT_MEMORY_FILE in usable:
        col.add_file(*usable[LEGACY_ROOT_MEMORY_FILE])


def _add_extra_path(col: _Collector, path: str) -> None:
    if os.path.dirname(path) == path:
        col.issues.append(f"extra path is the filesystem root, ignored: {path}")
        return
    st = _lstat(path)
    if st is None:
        col.issues.append(f"extra path missing: {path}")
    elif stat.S_ISLNK(st.st_mode):
        col.issues.append(f"extra path is a symlink (not followed): {path}")
    elif stat.S_ISDIR(st.st_mode):
        col.walk(path)
    elif not stat.S_ISREG(st.st_mode):
        col.issues.append(f"extra path is not a regular file or folder: {path}")
    elif not path.endswith(".md"):
        col.issues.append(f"extra path is not a Markdown file: {path}")
    elif not col.is_auxiliary(path):
        col.add_file(path, st)


def list_memory_files(workspace: Path, extra_paths: list[str], *,
                      max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Discovery:
    """Discover the memory files of a workspace (spec §2 with DESIGN.md's root-file rule).

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths (files or folders; see
            :func:`normalize_extra_paths`).
        max_file_bytes: size cap in bytes; larger files are skipped with reason
            ``too large (N bytes > cap M)``.

    Returns:
        A :class:`Discovery`: files in order root file, ``memory/`` tree, extra paths
        (folders in sorted name order), de-duplicated by real path keeping the first; skipped
        files with reasons; issues (missing ``memory/``, missing extra path, legacy split).
        Never raises for a missing or unreadable file or folder.
    """
    ws = os.path.abspath(workspace)
    col = _Collector(ws, max_file_bytes)
    _add_root_file(col, ws)
    memory_dir = os.path.join(ws, "memory")
    st = _lstat(memory_dir)
    if st is None:
        col.issues.append(f"memory directory missing: {memory_dir}")
    elif stat.S_ISLNK(st.st_mode):
        col.issues.append(f"memory directory is a symlink (not followed): {memory_dir}")
    elif not stat.S_ISDIR(st.st_mode):
        col.issues.append(f"memory is not a directory: {memory_dir}")
    else:
        col.walk(memory_dir)
    for extra in normalize_extra_paths(Path(ws), extra_paths):
        _add_extra_path(col, str(extra))

    files: list[MemoryFile] = []
    seen: set[str] = set()
    for path, fst in col.candidates:
        try:
            real = os.path.realpath(path)
        except OSError:
            real = path
        if real in seen:
            continue
        seen.add(real)
        files.append(MemoryFile(abs_path=Path(path), rel_path=_rel(path, ws), size=fst.st_size,
                                mtime_ms=int(fst.st_mtime_ns // 1_000_000)))
    return Discovery(files=files, skipped=col.skipped, issues=col.issues)


def read_memory_text(f: MemoryFile, *, max_file_bytes: int) -> FileContent | SkippedFile:
    """Read one memory file for indexing; never raises for a bad file.

    The bytes are read once (through one descriptor, symlinks not followed), so the hash,
    size and text describe the same content.

    Args:
        f: the discovered file.
        max_file_bytes: size cap in bytes.

    Returns:
        :class:`FileContent`, or :class:`~fallback.models.SkippedFile` with ``path =
        f.rel_path`` and reason ``vanished before read``, ``symlink (not followed)``,
        ``unreadable: <OS reason>``, ``not a regular file``,
        ``too large (N bytes > cap M)`` or ``binary file (NUL bytes)``.
    """
    def skipped(reason: str) -> SkippedFile:
        return SkippedFile(path=f.rel_path, reason=reason)

    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(f.abs_path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return skipped("vanished before read")
        if exc.errno == errno.ELOOP:
            return skipped("symlink (not followed)")
        return skipped(f"unreadable: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return skipped("not a regular file")
        if st.st_size > max_file_bytes:
            return skipped(f"too large ({st.st_size} bytes > cap {max_file_bytes})")
        parts: list[bytes] = []
        total = 0
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            total += len(block)
            if total > max_file_bytes:
                return skipped(f"too large ({total} bytes > cap {max_file_bytes})")
            parts.append(block)
    except OSError as exc:
        return skipped(f"unreadable: {exc.strerror or exc}")
    finally:
        os.close(fd)
    data = b"".join(parts)
    if b"\x00" in data:
        return skipped("binary file (NUL bytes)")
    body = data[len(_UTF8_BOM):] if data.startswith(_UTF8_BOM) else data
    try:
        text = body.decode("utf-8")
        invalid = False
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="replace")
        invalid = True
    return FileContent(text=text, content_hash=sha256_hex(data), invalid_utf8=invalid,
                       size=len(data), mtime_ms=int(st.st_mtime_ns // 1_000_000))


def classify_changed_path(workspace: Path, extra_paths: list[str],
                          path: str) -> tuple[str, MemoryFile | str | None]:
    """Decide what one changed path means for the index, without walking anything.

    Used for watcher events, so a save re-indexes one file instead of re-scanning all of them.

    Returns:
        ``("file", MemoryFile)`` for a Markdown file discovery would list (regular, not a
        symlink, no symlinked or skipped folder on the way, within the size cap);
        ``("gone", rel_path)`` for a ``.md`` path at such a place that no longer exists or no
        longer qualifies (its rows must go); ``("full", None)`` when only a full scan can tell
        (the root memory files, folders, paths outside the memory folders).
    """
    ws = os.path.abspath(workspace)
    p = os.path.abspath(path)
    if not p.endswith(".md") or os.path.dirname(p) == ws:
        return "full", None  # folders, other files, MEMORY.md / memory.md (the root-file rule)
    roots = [os.path.join(ws, "memory")] + [str(e) for e in normalize_extra_paths(Path(ws), extra_paths)]
    for root in roots:
        if p == root and root.endswith(".md"):  # an extra path that is a single file
            break
        if p.startswith(root.rstrip(os.sep) + os.sep):
            inner = os.path.relpath(p, root).split(os.sep)
            if any(part in SKIP_DIR_NAMES for part in inner[:-1]):
                return "gone", _rel(p, ws)
            for i in range(len(inner) - 1):  # no symlinked folder between the root and the file
                if os.path.islink(os.path.join(root, *inner[: i + 1])):
                    return "gone", _rel(p, ws)
            break
    else:
        return "full", None
    if os.path.islink(root) or (_rel(p, ws) == LEGACY_ROOT_MEMORY_FILE):
        return "full", None
    st = _lstat(p)
    if st is None or stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        return "gone", _rel(p, ws)
    return "file", MemoryFile(abs_path=Path(p), rel_path=_rel(p, ws), size=st.st_size,
                              mtime_ms=int(st.st_mtime_ns // 1_000_000))
