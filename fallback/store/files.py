"""File-level operations on a store's SQLite files (the main file and its ``-wal``, ``-shm``,
``-journal``: a trio): temp paths, rename swap, crash recovery. A live ``-wal`` must never end up
beside another database; :func:`recover_db_files` runs under the writer lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fallback.errors import IndexStoreError
from fallback.store.errors import IndexStoreCorruptError, IndexStoreFullError, IndexStoreReadOnlyError

__all__ = ["BACKUP_MARK", "CORRUPT_BACKUPS_KEPT", "DB_SUFFIXES", "TEMP_MARK", "check_writable",
           "file_id", "has_leftovers", "has_wal_frames", "leftover_bases", "prune_corrupt_backups",
           "quarantine_corrupt_store", "read_only_warning", "recover_db_files", "remove_db_files",
           "swap_db_files", "temp_db_path"]

# Suffixes of the files one SQLite database consists of; the main file first.
DB_SUFFIXES = ("", "-wal", "-shm", "-journal")
# Name markers of a rebuild's temporary database and of a parked (swapped-out) live database.
TEMP_MARK = ".tmp-"
BACKUP_MARK = ".backup-"
# Lock file suffix (``fallback/store/lock.py``); a leftover trio's lock file goes with it.
_LOCK_SUFFIX = ".lock"
# Corrupt stores moved aside that are kept for inspection, newest first (a store that keeps
# getting damaged must not fill the disk with copies).
CORRUPT_BACKUPS_KEPT = 3


def check_writable(db_path: Path) -> None:
    """Refuse a store whose files this process may not write (SQLite would open them
    read-only without a word): the main file, ``-wal``, ``-shm`` and the writer lock
    ``<db>.lock`` (or, while there is none, its folder), asked with ``faccessat`` and the
    effective ids, never opened (closing a descriptor drops this process's POSIX locks).

    Raises ``IndexStoreReadOnlyError``: ``index store is read-only (the file cannot be
    written): Permission denied (<db>)`` (``its -wal``, ``its writer lock <db>.lock``, ``...
    cannot be created``; ``Read-only file system`` on a read-only mount).
    """
    effective = os.access in os.supports_effective_ids
    lock = f"{db_path}{_LOCK_SUFFIX}"
    checks = [(f"{db_path}{suffix}", "the file cannot be written" if not suffix
               else f"its {suffix} cannot be written") for suffix in ("", "-wal", "-shm")]
    # the lock file is created by the first writer: until then its folder must take it
    checks.append((lock, f"its writer lock {lock} cannot be written") if os.path.exists(lock)
                  else (str(db_path.parent), f"its writer lock {lock} cannot be created"))
    for path, what in checks:
        if not os.path.exists(path) or os.access(path, os.W_OK, effective_ids=effective):
            continue
        try:
            read_only_mount = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError:
            continue  # gone meanwhile
        reason = os.strerror(errno.EROFS if read_only_mount else errno.EACCES)
        raise IndexStoreReadOnlyError(f"index store is read-only ({what}): {reason}",
                                      db_path=str(db_path))


def read_only_warning(exc: IndexStoreError, db_path: Path) -> str:
    """The warning of an answer from the store at ``db_path`` that this process cannot write
    (``exc`` says why; one line). Every route that answers from such a store words it so."""
    fix = (f"free disk space for {db_path.parent}" if isinstance(exc, IndexStoreFullError)
           else f"check the permissions of {db_path.parent}")
    return f"{exc}; answered from the index as it was last written, without updating it ({fix})"


def temp_db_path(db_path: Path) -> Path:
    """Return a fresh ``<db>.tmp-<id>`` path next to ``db_path`` for a safe rebuild (``<id>``:
    32 random hex digits)."""
    return db_path.with_name(f"{db_path.name}{TEMP_MARK}{os.urandom(16).hex()}")


def file_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` (symlinks followed), or None when missing."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


def remove_db_files(db_path: Path) -> None:
    """Delete ``db_path`` and its ``-wal``/``-shm``/``-journal`` companions; missing ones are
    ignored."""
    for suffix in DB_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{db_path}{suffix}")


def has_wal_frames(db_path: Path) -> bool:
    """Whether a ``-wal`` holding frames lies beside ``db_path``."""
    try:
        return os.path.getsize(f"{db_path}-wal") > 0
    except OSError:
        return False


def swap_db_files(temp_path: Path, db_path: Path) -> None:
    """Publish the closed database at ``temp_path`` (no write-ahead log) as ``db_path`` by
    renaming files, under the writer lock: the live trio is parked as ``<db>.backup-<uuid>``
    (main file first), the temp file renamed onto ``<db>``, then the backup deleted; a failed
    rename puts the backup back and deletes the temp trio. Raises ``IndexStoreError``: the
    temp database still has a write-ahead log, or the files cannot be renamed."""
    if has_wal_frames(temp_path):
        raise IndexStoreError(f"could not swap in the rebuilt index: {temp_path.name} still has"
                              " a write-ahead log (checkpoint and close it first)",
                              db_path=str(db_path))
    backup = db_path.with_name(f"{db_path.name}{BACKUP_MARK}{os.urandom(16).hex()}")
    moved: list[str] = []
    try:
        for suffix in DB_SUFFIXES:
            if os.path.exists(f"{db_path}{suffix}"):
                os.replace(f"{db_path}{suffix}", f"{backup}{suffix}")
                moved.append(suffix)
        os.replace(temp_path, db_path)
    except OSError as exc:
        for suffix in sorted(moved, key=lambda s: s == ""):
            with contextlib.suppress(OSError):
                os.replace(f"{backup}{suffix}", f"{db_path}{suffix}")
        _remove_trio(temp_path)
        raise IndexStoreError(f"could not swap in the rebuilt index: {exc}",
                              db_path=str(db_path)) from exc
    _remove_trio(temp_path)
    _remove_trio(backup)


def _base_of(name: str) -> str:
    for suffix in (*DB_SUFFIXES[1:], _LOCK_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def leftover_bases(db_path: Path) -> tuple[list[Path], list[Path]]:
    """Leftover trios next to ``db_path``: ``(temp bases, backup bases)``, sorted; a base is
    the trio's main file path (which may be missing)."""
    temps: set[Path] = set()
    backups: set[Path] = set()
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return [], []
    for name in names:
        if name.startswith(f"{db_path.name}{TEMP_MARK}"):
            temps.add(db_path.with_name(_base_of(name)))
        elif name.startswith(f"{db_path.name}{BACKUP_MARK}"):
            backups.add(db_path.with_name(_base_of(name)))
    return sorted(temps), sorted(backups)


def has_leftovers(db_path: Path) -> bool:
    """Whether any ``<db>.tmp-*`` or ``<db>.backup-*`` file lies next to ``db_path``."""
    temps, backups = leftover_bases(db_path)
    return bool(temps or backups)


def _remove_trio(base: Path) -> None:
    """Delete a leftover trio and a lock file a store opened at its path may have made."""
    remove_db_files(base)
    with contextlib.suppress(FileNotFoundError):
        os.remove(f"{base}{_LOCK_SUFFIX}")


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def recover_db_files(db_path: Path) -> list[str]:
    """Repair what a killed rebuild or swap left next to ``db_path``; call under the writer lock.
    Temp trios are deleted; with ``<db>`` missing the newest backup is restored (companions
    first; a ``-wal`` at the live name is kept unless the backup has its own), or, with none,
    stray companions are deleted; with ``<db>`` present backups are deleted. Returns one line
    per action (``removed temp main.sqlite.tmp-ab12``, ``restored main.sqlite.backup-cd34``).

    Raises ``IndexStoreError``: a file cannot be renamed or deleted.
    """
    actions: list[str] = []
    temps, backups = leftover_bases(db_path)
    try:
        for base in temps:
            _remove_trio(base)
            actions.append(f"removed temp {base.name}")
        if not os.path.exists(db_path):
            candidates = [b for b in backups if os.path.exists(b)]
            if candidates:
                chosen = max(candidates, key=lambda b: (_mtime_ns(b), b.name))
                for stale in (f"{db_path}-shm", f"{chosen}-shm", f"{chosen}{_LOCK_SUFFIX}"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(stale)
                for suffix in ("-wal", "-journal"):  # companions first, the main file last
                    if os.path.exists(f"{chosen}{suffix}"):
                        os.replace(f"{chosen}{suffix}", f"{db_path}{suffix}")
                os.replace(chosen, db_path)
                backups.remove(chosen)
                actions.append(f"restored {chosen.name}")
            else:
                for suffix in DB_SUFFIXES[1:]:
                    if os.path.exists(f"{db_path}{suffix}"):
                        os.remove(f"{db_path}{suffix}")
                        actions.append(f"removed stray {db_path.name}{suffix}")
        for base in backups:
            _remove_trio(base)
            actions.append(f"removed backup {base.name}")
    except OSError as exc:
        raise IndexStoreError(f"could not recover the index files: {exc}",
                              db_path=str(db_path)) from exc
    return actions


def prune_corrupt_backups(db_path: Path, *, keep: int = CORRUPT_BACKUPS_KEPT) -> list[str]:
    """Delete all but the newest ``keep`` (>= 0) stores moved aside next to ``db_path``
    (``<db>.corrupt-<YYYYmmddTHHMMSSZ>[-<n>]`` trios; newest: latest time, then highest ``n``).

    Returns: The names of the main files deleted, oldest first (never raises).
    """
    pattern = re.compile(re.escape(db_path.name) + r"\.corrupt-(\d{8}T\d{6}Z)(?:-(\d+))?")
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return []
    found = sorted(((m.group(1), int(m.group(2) or 1)), name)
                   for name in names if (m := pattern.fullmatch(name)))
    removed: list[str] = []
    for _, name in found[: max(0, len(found) - max(0, keep))]:
        try:
            _remove_trio(db_path.with_name(name))
        except OSError:
            continue
        removed.append(name)
    return removed


def quarantine_corrupt_store(db_path: Path, opener: Callable[[], Any]) -> str | None:
    """Move a corrupt store trio aside as ``<db>.corrupt-<utc time>``, under the writer lock,
    when ``opener`` (tried again: another process may have repaired it) raises
    :class:`IndexStoreCorruptError`; keeps :data:`CORRUPT_BACKUPS_KEPT` of them. Returns the
    new name of the main file, or ``None`` when nothing moved.

    Raises ``IndexStoreError``: the writer lock was not taken in time, or ``opener`` failed
    otherwise (a locked or read-only store is never moved aside).
    """
    import time as _time

    from fallback.store.lock import StoreWriteLock

    lock = StoreWriteLock(db_path)
    try:
        with lock.hold_blocking():
            with contextlib.suppress(IndexStoreCorruptError):
                opener().close()
                return None
            stamp = _time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime())
            target = db_path.with_name(f"{db_path.name}.corrupt-{stamp}")
            n = 2
            while target.exists():
                target = db_path.with_name(f"{db_path.name}.corrupt-{stamp}-{n}")
                n += 1
            for suffix in ("", "-wal", "-shm"):
                src = Path(f"{db_path}{suffix}")
                if src.exists():
                    os.replace(src, f"{target}{suffix}")
            prune_corrupt_backups(db_path)
            return target.name
    finally:
        lock.close()
