"""The memory-file rule: which files of a workspace are memory, and discovering them.

The one place that decides it: discovery, the watcher, ``memory_get``, ``doctor`` and the qmd
collections all call it, so a file is searchable exactly when it is readable. The rule is in
docs/architecture.md ("Which files are memory"). Discovery never raises for a bad file or a
missing folder: problems become :class:`~fallback.skipped.SkippedFile` entries or issue strings.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

from fallback.skipped import DEFAULT_MAX_FILE_BYTES, SkippedFile
from fallback.sources.globs import escape_glob, glob_matcher, never_ends_with, split_pattern
from fallback.sources.stamps import change_time_ns
from fallback.text.path_names import printable_path

__all__ = ["DEFAULT_PATTERN", "DREAMS_FILE", "EXTRA_PATH_MISSING", "LEGACY_ROOT_MEMORY_FILE", "LEGACY_SPLIT",
           "MARKDOWN_SUFFIX", "MEMORY_DIR_NAME", "NEVER_MATCHES", "NOFOLLOW_READ", "ROOT_MEMORY_FILE",
           "SKIP_DIR_NAMES", "SYMLINK_ERRNOS", "SYMLINK_SKIP", "Discovery", "ExtraPathEntry", "MemoryFile",
           "MemoryRoot", "PatternedPath", "RootFile", "classify_changed_path", "describe_extra_path",
           "escape_glob", "extra_roots", "is_excluded", "is_root_level_auxiliary", "list_memory_files",
           "locate_memory_path", "memory_roots", "root_memory_file", "split_pattern"]

# Folders never descended below a root: tool, VCS and build folders that hold no notes.
SKIP_DIR_NAMES = frozenset({
    "node_modules", "vendor", "dist", "build", "venv", "__pycache__",
    ".openclaw-repair", ".git", ".cache", ".venv", ".tox", ".pnpm-store",
})
ROOT_MEMORY_FILE = "MEMORY.md"
LEGACY_ROOT_MEMORY_FILE = "memory.md"
# The scan issue of a workspace holding both root files (status lists it, doctor --fix merges them).
LEGACY_SPLIT = "both MEMORY.md and legacy memory.md exist; only MEMORY.md is indexed (merge memory.md into MEMORY.md)"
# The dreaming diary at the workspace root: never memory, whatever root holds it.
DREAMS_FILE = "DREAMS.md"
MEMORY_DIR_NAME = "memory"
MARKDOWN_SUFFIX = ".md"
# Pattern of every memory folder unless the config says otherwise (qmd's default too).
DEFAULT_PATTERN = "**/*.md"
# How the scan issue of an extra folder whose pattern admits no memory file starts.
NEVER_MATCHES = "extra path pattern can never match a memory file:"
# How the scan issue of an extra path that does not exist starts (then the path).
EXTRA_PATH_MISSING = "extra path missing:"
# The skip reason of a symlinked note, memory folder entry or root file (never followed).
SYMLINK_SKIP = "symlink (not followed)"
# How a memory file is opened: never through a symlink, never blocking (a FIFO named like a note);
# a symlink then fails with one of SYMLINK_ERRNOS (BSDs answer EMLINK rather than ELOOP).
NOFOLLOW_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
# Discovery stops walking after this many directory entries (an extra path such as the home
# folder would walk the whole disk); the cut is reported.
MAX_WALK_ENTRIES = 200_000


class PatternedPath(Protocol):
    """An ``extraPaths[]`` entry in object form (``fallback.settings.ExtraPath``): a folder or
    file and its glob (``None``: ``**/*.md``); read by attribute, so discovery needs no pydantic."""

    @property
    def path(self) -> str: ...

    @property
    def pattern(self) -> str | None: ...


# A configured ``extraPaths[]`` entry: a path string, or an object with ``path`` and ``pattern``.
ExtraPathEntry = str | PatternedPath


@dataclass(frozen=True)
class MemoryRoot:
    """One place memory files live, and which of the files below it are memory.

    Attributes:
        path: absolute folder the pattern is relative to (the workspace for the root file).
        pattern: glob relative to ``path`` (commas outside ``{}``/``[]`` join alternatives, as
            in qmd's ``--mask``); the root file's name for the root file.
        kind: ``root``, ``memory`` (``memory/``) or ``extra``.
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
        text part (suffix, segments, pattern); nothing is looked up on disk."""
        parts = rel.split("/")
        if not rel or not rel.endswith(MARKDOWN_SUFFIX) or any(p in ("", ".", "..") for p in parts):
            return False
        if self.kind == "root":
            return rel == self.pattern
        if is_excluded(parts):
            return False
        # "**/*.md" admits every path the checks above let through: no glob engine for it.
        return self.pattern == DEFAULT_PATTERN or glob_matcher(self.pattern).match(rel)


class RootFile(NamedTuple):
    """The workspace's root memory file: its ``name`` (``None``: neither name is a regular
    file), whether a legacy ``memory.md`` is ``legacy_shadowed`` by a distinct ``MEMORY.md``,
    and the root file names present as (never followed) symlinks."""

    name: str | None
    legacy_shadowed: bool
    symlinked: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryFile:
    """One discovered memory file.

    Attributes:
        abs_path: absolute path (not symlink-resolved).
        rel_path: workspace-relative path with ``/`` separators (``../...`` outside it).
        source: ``memory``.
        size: size in bytes at discovery.
        mtime_ms: modification time at discovery, epoch ms.
        ctime_ns: status-change time, epoch ns, or ``None`` (``fallback/sources/stamps.py``).
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
    """The outcome of :func:`list_memory_files`: the ``files`` to index (one per real path),
    the files ``skipped`` with reasons, and ``issues`` with folders and configuration."""

    files: list[MemoryFile]
    skipped: list[SkippedFile]
    issues: list[str]


def _rel(path: str, base: str) -> str:
    """``os.path.relpath(path, base)`` with ``/`` separators (by prefix when it can)."""
    prefix = base if base.endswith(os.sep) else base + os.sep
    if path.startswith(prefix):
        parts = path[len(prefix):].split(os.sep)
        if "" not in parts and "." not in parts and ".." not in parts:
            return "/".join(parts)
    return os.path.relpath(path, base).replace(os.sep, "/")


def _shown(path: str, workspace: str) -> str:
    """The workspace-relative path as it is stored and shown (:func:`printable_path`)."""
    return printable_path(_rel(path, workspace))


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in a configured path
        return None


def is_root_level_auxiliary(workspace: str | Path, path: str | Path) -> bool:
    """Spec §2.4: whether ``path`` is a workspace-root file only the root-file rule may admit
    (``memory.md``, ``DREAMS.md``, ``.openclaw-repair/``), so an extra path of the workspace
    itself does not pick it up. Both paths absolute and normalised; nothing is read."""
    rel = _rel(str(path), str(workspace))
    return rel in (LEGACY_ROOT_MEMORY_FILE, DREAMS_FILE) or rel.startswith(".openclaw-repair/")


def is_excluded(parts: Sequence[str]) -> bool:
    """Whether a path below a root (its segments) has a hidden or skipped segment."""
    return any(p.startswith(".") for p in parts) or any(p in SKIP_DIR_NAMES for p in parts[:-1])


def _entry_parts(entry: ExtraPathEntry) -> tuple[str, str | None]:
    if isinstance(entry, str):
        return entry.strip(), None
    return entry.path.strip(), (entry.pattern or "").strip() or None


def describe_extra_path(entry: ExtraPathEntry) -> str:
    """One configured extra path as status shows it: ``notes (pattern *.md)``."""
    raw, pattern = _entry_parts(entry)
    return f"{raw} (pattern {pattern})" if pattern else raw


def extra_roots(workspace: Path, extra_paths: Sequence[ExtraPathEntry]) -> list[MemoryRoot]:
    """The configured extra paths as :class:`MemoryRoot` entries, in configured order: each
    path trimmed, ``~`` expanded, resolved against ``workspace`` and collapsed lexically (no
    symlink resolved; its ``entry``), blanks and duplicates dropped; a folder with its pattern,
    a regular file as its folder with the glob-escaped name as the pattern (as qmd indexes a file)."""
    ws = os.path.abspath(workspace)
    out: list[MemoryRoot] = []
    for entry in extra_paths:
        raw, pattern = _entry_parts(entry)
        if not raw:
            continue
        if raw == "~" or raw.startswith("~/"):
            raw = os.path.expanduser(raw)
        absolute = os.path.normpath(os.path.join(ws, raw))
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
    """Decide the root memory file from the workspace listing (exact-case names; two names
    of one file on a case-insensitive file system shadow nothing)."""
    ws = os.path.abspath(workspace)
    try:
        with os.scandir(ws) as it:
            entries = {e.name: e for e in it if e.name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE)}
    except OSError:
        return RootFile(None, False)
    usable: list[str] = []
    symlinked: list[str] = []
    for name, entry in sorted(entries.items(), key=lambda item: item[0] != ROOT_MEMORY_FILE):
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
        with contextlib.suppress(OSError):
            shadowed = not os.path.samefile(os.path.join(ws, usable[0]), os.path.join(ws, usable[1]))
    return RootFile(usable[0], shadowed, tuple(symlinked))


def memory_roots(workspace: Path, extra_paths: Sequence[ExtraPathEntry], *,
                 root: RootFile | None = None) -> list[MemoryRoot]:
    """Every place memory lives: ``[root file, memory/, *extra paths]`` (the root file's
    pattern is its name, ``MEMORY.md`` when there is none); ``root``: the root-file decision
    when the caller already has it."""
    ws = Path(os.path.abspath(workspace))
    name = (root or root_memory_file(ws)).name or ROOT_MEMORY_FILE
    return [MemoryRoot(ws, name, "root", ws / name),
            MemoryRoot(ws / MEMORY_DIR_NAME, DEFAULT_PATTERN, "memory", ws / MEMORY_DIR_NAME),
            *extra_roots(ws, extra_paths)]


def _is_within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def locate_memory_path(roots: Sequence[MemoryRoot], path: str | Path) -> tuple[MemoryRoot, str] | None:
    """``(root, "/"-separated path relative to root.path)`` for the first root that admits
    the absolute ``path`` by the rule's text part, else ``None``."""
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
    """Accumulates discovered files, skips and issues for one discovery run over ``roots``."""

    def __init__(self, workspace: str, max_file_bytes: int, roots: Sequence[MemoryRoot]) -> None:
        self.workspace = workspace
        self.max_file_bytes = max_file_bytes
        self.roots = roots
        self.candidates: list[tuple[str, os.stat_result]] = []
        self.skipped: list[SkippedFile] = []
        self.issues: list[str] = []
        self.entries_left = MAX_WALK_ENTRIES

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append(SkippedFile(path=_shown(path, self.workspace), reason=reason))

    def followed_elsewhere(self, link: str) -> bool:
        """Whether what the symlink ``link`` points to is memory through a root that is no
        symlink (a note its pattern admits; a folder where a note directly inside would be),
        so not following the link leaves nothing out: it is then neither skipped nor an issue."""
        target = os.path.realpath(link)
        is_dir = os.path.isdir(target)
        for r in self.roots:
            if os.path.islink(r.entry) or (is_dir and not os.path.isdir(r.entry)):
                continue
            folder = os.path.realpath(r.path)
            if target != folder and not _is_within(target, folder):
                continue
            rel = _rel(target, folder)
            if is_dir:  # a note directly inside that folder
                rel = ("" if rel == "." else rel + "/") + "x" + MARKDOWN_SUFFIX
            if r.admits(rel):
                return True
        return False

    def add_file(self, path: str, st: os.stat_result) -> None:
        """Accept a regular, non-symlink file seen by lstat, unless too large or unreadable."""
        if st.st_size > self.max_file_bytes:
            self.skip(path, f"too large ({st.st_size} bytes > cap {self.max_file_bytes})")
            return
        try:
            fd = os.open(path, NOFOLLOW_READ)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return
            self.skip(path, f"unreadable: {exc.strerror or exc}")
            return
        os.close(fd)
        self.candidates.append((path, st))

    def walk(self, root: MemoryRoot, directory: str, prefix: str = "") -> None:
        """Walk ``directory`` (``root``'s folder, or ``prefix``, ending in ``/``, below it) in
        name order without following symlinks."""
        # only a file at the workspace root or under .openclaw-repair/ can be auxiliary
        at = _rel(directory, self.workspace)
        maybe_auxiliary = at == "." or at.split("/", 1)[0] == ".openclaw-repair"
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
            rel = prefix + entry.name
            try:
                if entry.is_symlink():
                    if (entry.name.endswith(MARKDOWN_SUFFIX) or entry.is_dir()) and (
                            not self.followed_elsewhere(entry.path)):
                        self.skip(entry.path, SYMLINK_SKIP)
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if root.recursive and entry.name not in SKIP_DIR_NAMES:
                        self.walk(root, entry.path, rel + "/")
                    continue
                if not root.admits(rel) or maybe_auxiliary and is_root_level_auxiliary(
                        self.workspace, entry.path):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    self.skip(entry.path, f"unreadable: {exc.strerror or exc}")
                continue
            if stat.S_ISREG(st.st_mode):
                self.add_file(entry.path, st)
            else:  # a FIFO, socket or device with a memory file's name
                self.skip(entry.path, "not a regular file")


def _add_root_file(col: _Collector, workspace: str, root: RootFile) -> None:
    for name in root.symlinked:
        if not col.followed_elsewhere(os.path.join(workspace, name)):
            col.skip(os.path.join(workspace, name), SYMLINK_SKIP)
    path = os.path.join(workspace, root.name or ROOT_MEMORY_FILE)
    if root.name is not None and (st := _lstat(path)) is not None and stat.S_ISREG(st.st_mode):
        col.add_file(path, st)
    if root.legacy_shadowed:
        col.issues.append(LEGACY_SPLIT)


def _add_folder_root(col: _Collector, r: MemoryRoot) -> None:
    path = str(r.entry)
    what = "memory directory" if r.kind == "memory" else "extra path"
    if r.kind == "extra" and os.path.dirname(path) == path:
        col.issues.append(f"extra path is the filesystem root, ignored: {path}")
        return
    st = _lstat(path)
    if st is None:
        col.issues.append(f"{EXTRA_PATH_MISSING} {path}" if r.kind == "extra" else f"{what} missing: {path}")
    elif stat.S_ISLNK(st.st_mode):
        if not col.followed_elsewhere(path):
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
        extra_paths: configured extra paths (see :func:`extra_roots`).
        max_file_bytes: size cap in bytes; larger files are skipped as ``too large``.

    Returns:
        A :class:`Discovery`: files in order root file, ``memory/``, extra paths (names
        sorted), de-duplicated by real path keeping the first. Never raises for a file.
    """
    ws = os.path.abspath(workspace)
    root = root_memory_file(Path(ws))
    roots = memory_roots(Path(ws), extra_paths, root=root)
    col = _Collector(ws, max_file_bytes, roots)
    if not os.path.isdir(ws):
        col.issues.append(f"cannot list workspace {ws}: not a folder")
    _add_root_file(col, ws, root)
    for r in roots[1:]:
        _add_folder_root(col, r)

    by_real: dict[str, MemoryFile] = {}
    real_dirs: dict[str, str] = {}
    for path, fst in col.candidates:
        # Only a candidate's folders can be symlinks: resolve each folder once.
        folder, name = os.path.split(path)
        if folder not in real_dirs:
            real_dirs[folder] = os.path.realpath(folder)
        if (real := os.path.join(real_dirs[folder], name)) not in by_real:
            by_real[real] = MemoryFile.from_stat(Path(path), _shown(path, ws), fst)
    return Discovery(files=list(by_real.values()), skipped=col.skipped, issues=col.issues)


def classify_changed_path(workspace: Path, extra_paths: Sequence[ExtraPathEntry],
                          path: str) -> tuple[str, MemoryFile | str | None]:
    """Decide what one changed path (a watcher event) means for the index, without walking.

    Returns:
        ``("file", MemoryFile)`` for a file the rule admits; ``("gone", rel_path)`` for a
        ``.md`` path in a memory folder that is no longer memory; ``("full", None)`` when only
        a full scan can tell (root files, folders, paths outside the memory folders).
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
