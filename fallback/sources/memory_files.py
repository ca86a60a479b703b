"""The memory-file rule: which files of a workspace are memory, and discovering them.

This module is the one place that decides it. Discovery (indexing), the watcher's path
classification, ``memory_get``, ``doctor`` and the qmd collections all call it, so a file is
searchable exactly when it is readable, whichever backend answers.

The rule (the reference system's, with our decisions listed in docs/architecture.md, aligned with what
qmd 2.8.3 indexes so both backends see the same files):

- **root file**: ``MEMORY.md`` (exact case, from the workspace listing, regular file, not a
  symlink). When it is absent and a legacy ``memory.md`` is present, ``memory.md`` is the root
  file. When both exist only ``MEMORY.md`` is memory and the split is reported (``status``,
  ``doctor``; ``doctor --fix`` merges them).
- **memory folder**: ``memory/**/*.md``.
- **extra paths**: each configured folder with its glob pattern (``**/*.md`` unless an object
  entry or a qmd custom collection sets one), or a single configured file.
- everywhere: names end in ``.md`` (case-sensitive: ``notes.MD`` is not memory); symlinks are
  never followed (a symlinked file or folder below a root is skipped, a symlinked extra path
  or ``memory/`` admits nothing); below a root no segment may be hidden (start with ``.``) or
  be one of :data:`SKIP_DIR_NAMES`. qmd skips the same (its scanner drops dot entries and
  ``node_modules .git .cache vendor dist build``), so qmd never indexes a file the builtin
  engine would not, and hits outside the rule are dropped anyway.
- ``DREAMS.md`` is **not** memory (neither indexed nor readable): it is the dreaming diary, a
  review log whose lasting findings are promoted into ``MEMORY.md``. Indexing it would return
  each promoted fact twice and surface candidates that were rejected; reading it without
  indexing it would make ``memory_get`` admit a file search can never cite.

Discovery never raises for a bad file or a missing folder: problems become
:class:`~fallback.skipped.SkippedFile` entries (a file we saw but will not index, and why) or
issue strings (a folder or configured path that is missing or unusable).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from fallback.skipped import SkippedFile
from fallback.sources.globs import escape_glob, glob_matcher, never_ends_with, split_pattern
from fallback.sources.stamps import change_time_ns
from fallback.text.path_names import printable_path

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_PATTERN",
    "DREAMS_FILE",
    "Discovery",
    "ExtraPathEntry",
    "LEGACY_ROOT_MEMORY_FILE",
    "MARKDOWN_SUFFIX",
    "NEVER_MATCHES",
    "MEMORY_DIR_NAME",
    "MemoryFile",
    "MemoryRoot",
    "PatternedPath",
    "ROOT_MEMORY_FILE",
    "RootFile",
    "SKIP_DIR_NAMES",
    "classify_changed_path",
    "describe_extra_path",
    "escape_glob",
    "extra_roots",
    "is_excluded",
    "is_root_level_auxiliary",
    "list_memory_files",
    "locate_memory_path",
    "memory_roots",
    "normalize_extra_paths",
    "root_memory_file",
    "split_pattern",
]

# Files above this size (10 MiB) are not memory notes; indexing them would only bloat the store.
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
# Folders never descended below a root: tool, VCS and build folders that hold no notes (qmd's
# scanner skips node_modules, .git, .cache, vendor, dist and build; hidden names are skipped too).
SKIP_DIR_NAMES = frozenset({
    "node_modules", "vendor", "dist", "build", "venv", "__pycache__",
    ".openclaw-repair", ".git", ".cache", ".venv", ".tox", ".pnpm-store",
})
ROOT_MEMORY_FILE = "MEMORY.md"
LEGACY_ROOT_MEMORY_FILE = "memory.md"
# The dreaming diary at the workspace root: never memory, whatever root holds it.
DREAMS_FILE = "DREAMS.md"
MEMORY_DIR_NAME = "memory"
MARKDOWN_SUFFIX = ".md"
# Pattern of every memory folder unless the config says otherwise (qmd's default too).
DEFAULT_PATTERN = "**/*.md"
# How the scan issue of an extra folder whose pattern admits no memory file starts.
NEVER_MATCHES = "extra path pattern can never match a memory file:"
# Discovery stops walking after this many directory entries in all (an extra path such as the
# home folder would otherwise make every sync walk the whole disk); the cut is reported.
MAX_WALK_ENTRIES = 200_000



class PatternedPath(Protocol):
    """An ``extraPaths[]`` entry in object form (``fallback.settings.ExtraPath`` is one): a
    folder or file and its glob (``None``: ``**/*.md``). Read by attribute, so discovery
    imports no pydantic (it runs on the one-shot search path)."""

    @property
    def path(self) -> str:
        """The configured folder or file."""
        ...

    @property
    def pattern(self) -> str | None:
        """The glob relative to the folder, or ``None``."""
        ...


# A configured ``extraPaths[]`` entry: a path string, or an object with ``path`` and ``pattern``.
ExtraPathEntry = str | PatternedPath


@dataclass(frozen=True)
class MemoryRoot:
    """One place memory files live, and which of the files below it are memory.

    Attributes:
        path: absolute folder the pattern is relative to (the workspace for the root file).
        pattern: glob relative to ``path``; commas outside ``{}``/``[]`` join alternatives,
            as in qmd's ``--mask``. For the root file it is the root file's name.
        kind: ``root`` (the root memory file), ``memory`` (``memory/``) or ``extra``.
        entry: the configured path (a folder, or the single file of a file entry).
    """

    path: Path
    pattern: str
    kind: Literal["root", "memory", "extra"]
    entry: Path

    @property
    def recursive(self) -> bool:
        """Whether the pattern can match below the top folder (a walk must descend)."""
        return any("/" in p or "**" in p for p in split_pattern(self.pattern))

    def admits(self, rel: str) -> bool:
        """Whether ``rel`` (``/``-separated, relative to :attr:`path`) is memory by the rule's
        text part: ``.md`` suffix (case-sensitive), no hidden or skipped segment, the
        pattern matches. Nothing is looked up on disk (symlinks are refused where files are
        opened or walked)."""
        parts = rel.split("/")
        if not rel or not rel.endswith(MARKDOWN_SUFFIX) or any(p in ("", ".", "..") for p in parts):
            return False
        if self.kind == "root":
            return rel == self.pattern
        if is_excluded(parts):
            return False
        # "**/*.md" admits every path the checks above let through: no glob engine for it
        # (wcmatch is loaded for other patterns only; a test pins that both agree).
        return self.pattern == DEFAULT_PATTERN or glob_matcher(self.pattern).match(rel)


@dataclass(frozen=True)
class RootFile:
    """The workspace's root memory file, as the rule decides it.

    Attributes:
        name: ``MEMORY.md``, ``memory.md`` (legacy, only when ``MEMORY.md`` is absent) or
            ``None`` (neither is a regular, non-symlink file).
        legacy_shadowed: both exist as distinct files; ``memory.md`` is not memory.
        symlinked: root file names present as symlinks (never followed).
    """

    name: str | None
    legacy_shadowed: bool
    symlinked: tuple[str, ...] = ()


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
        ctime_ns: status-change time at discovery, epoch ns; ``None`` where the platform gives
            none that rewrites move (``fallback/sources/stamps.py``).
    """

    abs_path: Path
    rel_path: str
    source: str = "memory"
    size: int = 0
    mtime_ms: int = 0
    ctime_ns: int | None = None

    @classmethod
    def from_stat(cls, abs_path: Path, rel_path: str, st: os.stat_result, *,
                  source: str = "memory") -> MemoryFile:
        """The file with the stamps of ``st`` (an ``lstat``/``stat`` result)."""
        return cls(abs_path=abs_path, rel_path=rel_path, source=source, size=st.st_size,
                   mtime_ms=st.st_mtime_ns // 1_000_000, ctime_ns=change_time_ns(st))


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


def _rel(path: str, base: str) -> str:
    """``os.path.relpath(path, base)`` with ``/`` separators. A path below ``base`` as the walk
    builds it (``base`` + separator + plain segments) is cut by prefix: ``relpath`` normalises
    both paths first and cost more than the rest of discovering a file."""
    prefix = base if base.endswith(os.sep) else base + os.sep
    if path.startswith(prefix):
        parts = path[len(prefix):].split(os.sep)
        if "" not in parts and "." not in parts and ".." not in parts:
            return "/".join(parts)
    return os.path.relpath(path, base).replace(os.sep, "/")


def _shown(path: str, workspace: str) -> str:
    """The workspace-relative path as it is stored and shown (the printable form of
    :mod:`fallback.text.path_names`: a name that is not UTF-8 gets ``\\xHH`` escapes)."""
    return printable_path(_rel(path, workspace))


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in a configured path
        return None


def is_root_level_auxiliary(workspace: str | Path, path: str | Path) -> bool:
    """Spec §2.4: whether ``path`` is a file at the workspace root that no root but the
    root-file rule may admit (walks never pick it up), so that an extra path or custom collection of the workspace itself (``"."``) picks
    up only what the rule makes memory there: the legacy ``memory.md`` (memory only as the root
    file, when ``MEMORY.md`` is absent), ``DREAMS.md`` (never memory) and anything under
    ``.openclaw-repair/`` (repair backups). Both paths absolute and normalised; nothing is read."""
    rel = _rel(str(path), str(workspace))
    return rel in (LEGACY_ROOT_MEMORY_FILE, DREAMS_FILE) or rel.startswith(".openclaw-repair/")


def is_excluded(parts: Sequence[str]) -> bool:
    """Whether a path below a root (its segments) is outside the rule: a hidden segment (one
    that starts with ``.``) or a folder named in :data:`SKIP_DIR_NAMES`."""
    return any(p.startswith(".") for p in parts) or any(p in SKIP_DIR_NAMES for p in parts[:-1])


def _entry_parts(entry: ExtraPathEntry) -> tuple[str, str | None]:
    if isinstance(entry, str):
        return entry.strip(), None
    return entry.path.strip(), (entry.pattern or "").strip() or None


def _absolute(workspace: str, raw: str) -> str:
    if raw == "~" or raw.startswith("~/"):
        raw = os.path.expanduser(raw)
    return os.path.normpath(os.path.join(workspace, raw))


def describe_extra_path(entry: ExtraPathEntry) -> str:
    """One configured extra path as text for status: the path, and its pattern when set
    (``notes (pattern *.md)``)."""
    raw, pattern = _entry_parts(entry)
    return f"{raw} (pattern {pattern})" if pattern else raw


def normalize_extra_paths(workspace: Path, extra_paths: Sequence[ExtraPathEntry]) -> list[Path]:
    """Normalise the configured ``extraPaths`` into absolute paths (patterns dropped).

    Each entry is trimmed and empty entries dropped; a leading ``~`` or ``~/`` is expanded to
    the home directory (the E3 rule); relative
    entries are resolved against ``workspace``; ``.``/``..`` segments are collapsed lexically
    (symlinks are not resolved). Duplicates are removed keeping the first occurrence.

    Args:
        workspace: the agent workspace directory.
        extra_paths: the configured entries, as written (strings or :class:`ExtraPath`).

    Returns:
        Absolute paths in configured order, without duplicates. Nothing is checked on disk.
    """
    ws = os.path.abspath(workspace)
    out: list[Path] = []
    for entry in extra_paths:
        raw, _ = _entry_parts(entry)
        if raw and Path(_absolute(ws, raw)) not in out:
            out.append(Path(_absolute(ws, raw)))
    return out


def extra_roots(workspace: Path, extra_paths: Sequence[ExtraPathEntry]) -> list[MemoryRoot]:
    """The configured extra paths as :class:`MemoryRoot` entries, in configured order.

    A folder entry keeps its pattern (``**/*.md`` by default); an entry that is an existing
    regular file becomes its folder with the glob-escaped file name as the pattern (what qmd
    indexes for a file collection). Entries are normalised as in :func:`normalize_extra_paths`;
    duplicates of (folder, pattern) are dropped. Only ``lstat`` is used (nothing is followed).
    """
    ws = os.path.abspath(workspace)
    out: list[MemoryRoot] = []
    for entry in extra_paths:
        raw, pattern = _entry_parts(entry)
        if not raw:
            continue
        absolute = _absolute(ws, raw)
        st = _lstat(absolute)
        if st is not None and stat.S_ISREG(st.st_mode):
            root = MemoryRoot(Path(os.path.dirname(absolute)), escape_glob(os.path.basename(absolute)),
                              "extra", Path(absolute))
        else:
            root = MemoryRoot(Path(absolute), pattern or DEFAULT_PATTERN, "extra", Path(absolute))
        if all((r.path, r.pattern) != (root.path, root.pattern) for r in out):
            out.append(root)
    return out


def root_memory_file(workspace: Path) -> RootFile:
    """Decide the root memory file from the workspace listing (exact-case names).

    Returns:
        A :class:`RootFile`; an unlistable workspace gives ``RootFile(None, False)``. On a
        case-insensitive file system where both names are one file, ``MEMORY.md`` wins and
        nothing is shadowed.
    """
    ws = os.path.abspath(workspace)
    try:
        with os.scandir(ws) as it:
            entries = {e.name: e for e in it if e.name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE)}
    except OSError:
        return RootFile(None, False)
    usable: list[str] = []
    symlinked: list[str] = []
    for name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE):
        entry = entries.get(name)
        if entry is None:
            continue
        try:
            if entry.is_symlink():
                symlinked.append(name)
            elif entry.is_file(follow_symlinks=False):
                usable.append(name)
        except OSError:
            continue
    if not usable:
        return RootFile(None, False, tuple(symlinked))
    shadowed = len(usable) == 2
    if shadowed:
        try:
            shadowed = not os.path.samefile(os.path.join(ws, usable[0]), os.path.join(ws, usable[1]))
        except OSError:
            pass
    return RootFile(usable[0], shadowed, tuple(symlinked))


def memory_roots(workspace: Path, extra_paths: Sequence[ExtraPathEntry], *,
                 root: RootFile | None = None) -> list[MemoryRoot]:
    """Every place memory lives: the root file, ``memory/``, then the extra paths in order.

    Args:
        workspace: the agent workspace.
        extra_paths: configured extra paths (strings or :class:`ExtraPath`).
        root: the root-file decision when the caller already has it (else read from disk).

    Returns:
        ``[root file (pattern = its name, MEMORY.md when there is none), memory/, *extras]``.
    """
    ws = Path(os.path.abspath(workspace))
    name = (root or root_memory_file(ws)).name or ROOT_MEMORY_FILE
    return [MemoryRoot(ws, name, "root", ws / name),
            MemoryRoot(ws / MEMORY_DIR_NAME, DEFAULT_PATTERN, "memory", ws / MEMORY_DIR_NAME),
            *extra_roots(ws, extra_paths)]


def _is_within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def locate_memory_path(roots: Sequence[MemoryRoot], path: str | Path) -> tuple[MemoryRoot, str] | None:
    """Find the root that admits an absolute path by the rule's text part.

    Returns:
        ``(root, path relative to root.path with "/" separators)`` for the first root whose
        folder contains the path and whose pattern admits it, else ``None``. Nothing is looked
        up on disk.
    """
    p = os.path.normpath(os.path.abspath(path))
    for r in roots:
        folder = str(r.path)
        if not _is_within(p, folder):
            continue
        rel = os.path.relpath(p, folder).replace(os.sep, "/")
        if r.admits(rel):
            return r, rel
    return None


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
        self.skipped.append(SkippedFile(path=_shown(path, self.workspace), reason=reason))

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

    def walk(self, root: MemoryRoot, directory: str) -> None:
        """Walk ``directory`` (below ``root``) in name order without following symlinks."""
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.issues.append(f"cannot list {printable_path(directory)}: {exc.strerror or exc}")
            return
        self.entries_left -= len(entries)
        if self.entries_left < 0:
            self.issues.append(f"stopped walking at {printable_path(directory)}: more than {MAX_WALK_ENTRIES} "
                               "entries under the memory folders (is an extra path too broad?)")
            return
        for entry in entries:
            if entry.name.startswith("."):
                if entry.name.endswith(MARKDOWN_SUFFIX) and entry.is_file(follow_symlinks=False):
                    self.skip(entry.path, "hidden name (not memory)")  # a draft, say so
                continue
            rel = _rel(entry.path, str(root.path))
            try:
                if entry.is_symlink():
                    if entry.name.endswith(MARKDOWN_SUFFIX) or entry.is_dir():
                        self.skip(entry.path, "symlink (not followed)")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if root.recursive and entry.name not in SKIP_DIR_NAMES:
                        self.walk(root, entry.path)
                    continue
                if not root.admits(rel) or is_root_level_auxiliary(self.workspace, entry.path):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    self.skip(entry.path, f"unreadable: {exc.strerror or exc}")
                continue
            if stat.S_ISREG(st.st_mode):
                self.add_file(entry.path, st)


def _add_root_file(col: _Collector, workspace: str, root: RootFile) -> None:
    for name in root.symlinked:
        col.skip(os.path.join(workspace, name), "symlink (not followed)")
    if root.name is None:
        return
    path = os.path.join(workspace, root.name)
    st = _lstat(path)
    if st is not None and stat.S_ISREG(st.st_mode):
        col.add_file(path, st)
    if root.legacy_shadowed:
        col.issues.append("both MEMORY.md and legacy memory.md exist; only MEMORY.md is indexed "
                          "(merge memory.md into MEMORY.md)")


def _add_folder_root(col: _Collector, r: MemoryRoot) -> None:
    path = str(r.entry)
    what = "memory directory" if r.kind == "memory" else "extra path"
    if r.kind == "extra" and os.path.dirname(path) == path:
        col.issues.append(f"extra path is the filesystem root, ignored: {path}")
        return
    st = _lstat(path)
    if st is None:
        col.issues.append(f"{what} missing: {path}")
    elif stat.S_ISLNK(st.st_mode):
        col.issues.append(f"{what} is a symlink (not followed): {path}")
    elif stat.S_ISDIR(st.st_mode):
        if r.kind == "extra" and never_ends_with(r.pattern, MARKDOWN_SUFFIX):
            col.issues.append(f"{NEVER_MATCHES} {path} (pattern {r.pattern}; memory files end "
                              f"in {MARKDOWN_SUFFIX})")
            return
        col.walk(r, path)
    elif r.kind == "memory":
        col.issues.append(f"memory is not a directory: {path}")
    elif not stat.S_ISREG(st.st_mode):
        col.issues.append(f"extra path is not a regular file or folder: {path}")
    elif not r.admits(os.path.basename(path)):
        col.issues.append(f"extra path is not a Markdown file: {path}")
    elif not is_root_level_auxiliary(col.workspace, path):
        col.add_file(path, st)


def list_memory_files(workspace: Path, extra_paths: Sequence[ExtraPathEntry], *,
                      max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Discovery:
    """Discover the memory files of a workspace by the rule in the module docstring.

    Args:
        workspace: the agent workspace directory.
        extra_paths: configured extra paths (folders or files, strings or
            :class:`ExtraPath` with a pattern; see :func:`extra_roots`).
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
    root = root_memory_file(Path(ws))
    if not os.path.isdir(ws):
        col.issues.append(f"cannot list workspace {ws}: not a folder")
    _add_root_file(col, ws, root)
    for r in memory_roots(Path(ws), extra_paths, root=root)[1:]:
        _add_folder_root(col, r)

    files: list[MemoryFile] = []
    seen: set[str] = set()
    real_dirs: dict[str, str] = {}
    for path, fst in col.candidates:
        # A candidate is a regular file seen by lstat, so only its folders can be symlinks:
        # its real path is its folder's real path (resolved once per folder) plus its name.
        folder, name = os.path.split(path)
        if folder not in real_dirs:
            try:
                real_dirs[folder] = os.path.realpath(folder)
            except OSError:
                real_dirs[folder] = folder
        real = os.path.join(real_dirs[folder], name)
        if real in seen:
            continue
        seen.add(real)
        files.append(MemoryFile.from_stat(Path(path), _shown(path, ws), fst))
    return Discovery(files=files, skipped=col.skipped, issues=col.issues)


def classify_changed_path(workspace: Path, extra_paths: Sequence[ExtraPathEntry],
                          path: str) -> tuple[str, MemoryFile | str | None]:
    """Decide what one changed path means for the index, without walking anything.

    Used for watcher events, so a save re-indexes one file instead of re-scanning all of them.

    Returns:
        ``("file", MemoryFile)`` for a file the rule admits (regular, not a symlink, no
        symlinked folder between its root and it); ``("gone", rel_path)`` for a ``.md`` path
        inside a memory folder that no longer exists or is not memory (its rows must go);
        ``("full", None)`` when only a full scan can tell (the root memory files, folders,
        paths outside the memory folders, a symlinked memory folder).
    """
    ws = os.path.abspath(workspace)
    p = os.path.normpath(os.path.abspath(path))
    if not p.endswith(MARKDOWN_SUFFIX) or os.path.dirname(p) == ws:
        return "full", None  # folders, other files, MEMORY.md / memory.md (the root-file rule)
    folders = memory_roots(Path(ws), extra_paths, root=RootFile(None, False))[1:]
    found = locate_memory_path(folders, p)
    if found is None:
        if any(_is_within(p, str(r.path)) for r in folders):
            return "gone", _shown(p, ws)  # in a memory folder, but hidden, skipped or unmatched
        return "full", None
    r, rel = found
    st = _lstat(str(r.entry))
    if st is None or stat.S_ISLNK(st.st_mode):
        return "full", None
    inner = rel.split("/")
    for i in range(len(inner) - 1):  # no symlinked folder between the root and the file
        if os.path.islink(os.path.join(str(r.path), *inner[: i + 1])):
            return "gone", _shown(p, ws)
    fst = _lstat(p)
    if fst is None or not stat.S_ISREG(fst.st_mode):
        return "gone", _shown(p, ws)
    return "file", MemoryFile.from_stat(Path(p), _shown(p, ws), fst)
