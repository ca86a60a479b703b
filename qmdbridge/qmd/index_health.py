"""qmd's index lost or corrupt behind the bridge's back: noticed, moved aside, re-indexed.

Lost: no document of any managed collection while a collection's folder holds a file it
indexes; corrupt: reading it says so (docs/qmd.md, "Faults and fallback").
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from fallback.errors import BackendUnavailableError
from fallback.index.racy import wall_clock_ms
from fallback.sources.memory_files import SKIP_DIR_NAMES, root_memory_file
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.update import file_lock

if TYPE_CHECKING:
    from fallback.background import BackgroundTasks
    from qmdbridge.paths import QmdHome
    from qmdbridge.qmd.parse import IndexCounts

__all__ = ["IndexHealth", "IndexProblem", "db_identity", "holds_memory_file", "is_corrupt", "move_aside"]

log = logging.getLogger("qmdbridge.qmd.backend")

# What SQLite (Python's, or qmd's under Node and Bun) says of a damaged database file.
_CORRUPT_MARKERS = ("database disk image is malformed", "file is not a database",
                    "sqlite_corrupt", "sqlite_notadb")
# The name of the background task that re-indexes (deduplicated).
RESTORE_TASK = "index re-index"
_UNCHECKED = object()


def is_corrupt(text: str | None) -> bool:
    """Whether an error message (``sqlite3``'s, or qmd's stderr) says the index is damaged."""
    low = (text or "").lower()
    return any(m in low for m in _CORRUPT_MARKERS)


def db_identity(db: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``db`` (what a process that opened it keeps reading), or ``None``."""
    try:
        st = os.stat(db)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _has_text(path: str) -> bool:
    """Whether the file holds anything but ASCII whitespace (qmd skips such a file)."""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(65536):
                if chunk.strip(b" \t\r\n\x0b\x0c"):
                    return True
    except OSError:
        return False
    return False


def holds_memory_file(c: ManagedCollection) -> bool:
    """Whether ``c``'s folder holds a regular, non-blank file ``c`` indexes (no symlinks); blocking."""
    if c.is_root_file:
        name = root_memory_file(c.path).name
        return name is not None and _has_text(os.path.join(c.path, name))
    base = str(c.path)
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIR_NAMES]
        rel_dir = os.path.relpath(folder, base).replace(os.sep, "/")
        for name in files:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = os.path.join(folder, name)
            if c.admits(rel) and os.path.isfile(path) and not os.path.islink(path) and _has_text(path):
                return True
    return False


def move_aside(db: Path, now_ms: int) -> Path:
    """Rename a damaged ``db`` and its ``-wal``/``-shm`` to ``<name>.corrupt-<now_ms>...``; returns
    the new name of ``db``.

    Raises:
        OSError: ``db`` cannot be renamed.
    """
    target = db.with_name(f"{db.name}.corrupt-{now_ms}")
    os.replace(db, target)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(db.with_name(db.name + suffix), target.with_name(target.name + suffix))
    return target


@dataclass(frozen=True)
class IndexProblem:
    """What :meth:`IndexHealth.check` found: ``reason`` (one line), ``corrupt`` (moved aside before
    re-indexing) rather than lost."""

    reason: str
    corrupt: bool


class IndexHealth:
    """Whether one qmd index was lost or damaged, and its repair: ``home`` (its ``index.sqlite``, the
    update lock), ``counts`` (its cached document counts), ``reindex`` (runs ``qmd update`` now),
    ``update_timeout_ms`` (wait for the update lock, ms). :attr:`problem`: what is wrong now and
    what is done about it, or ``None``."""

    def __init__(self, home: QmdHome, counts: IndexCounts, *, reindex: Callable[[], Awaitable[None]],
                 update_timeout_ms: int) -> None:
        self.home = home
        self.counts = counts
        self.reindex = reindex
        self.update_timeout_ms = update_timeout_ms
        self.problem: str | None = None
        self._checked: object = _UNCHECKED  # db_identity of an index found without a problem
        self._restoring = False

    async def check(self, counts: Mapping[str, int], count_error: str | None, *,
                    managed: Sequence[ManagedCollection] = (),
                    yml_edited: bool = False) -> IndexProblem | None:
        """What is wrong with qmd's index given its ``counts`` (or ``count_error``), or ``None``;
        ``managed``: the collections qmd should hold; ``yml_edited``: left to the reconcile repairs."""
        db = self.home.index_db
        if count_error is not None:
            return IndexProblem(f"qmd's index {db} is corrupt ({count_error})", True) \
                if is_corrupt(count_error) else None
        if any(counts.get(c.name, 0) > 0 for c in managed) or yml_edited:
            return None  # (edited: the reconcile repairs; removed collections are re-added)
        ident = db_identity(db)
        if ident == self._checked:
            return None
        holders = await anyio.to_thread.run_sync(
            lambda: [c.name for c in managed if holds_memory_file(c)])
        if not holders:
            self._checked = ident
            return None
        return IndexProblem(f"qmd's index {db} holds no document of {', '.join(holders)}, whose "
                            "folders hold memory files (was it deleted or replaced?)", False)

    async def restore(self, why: IndexProblem) -> None:
        """Move a corrupt index aside and run ``qmd update``; :attr:`problem` says so meanwhile.

        Raises:
            BackendUnavailableError: the update failed (:attr:`problem` keeps the reason).
        """
        db = self.home.index_db
        self.problem = f"{why.reason}; re-indexing it (qmd update)"
        self._restoring = True
        log.warning("%s", self.problem)
        try:
            if why.corrupt:
                async with file_lock(self.home.write_lock, budget_ms=self.update_timeout_ms):
                    counts, err = await self.counts.read()  # an update may have repaired it
                    if await self.check(counts, err) == why:
                        try:
                            aside = move_aside(db, wall_clock_ms())
                        except OSError as exc:
                            raise BackendUnavailableError(
                                "qmd", f"cannot move the corrupt index {db} aside: {exc}") from exc
                        log.warning("moved the corrupt qmd index aside to %s", aside)
            await self.reindex()
        except BackendUnavailableError as exc:
            self.problem = f"{why.reason}; re-indexing failed: {exc.reason}"
            raise
        finally:
            self._restoring = False
        self.problem = None
        self._checked = db_identity(db)
        log.warning("qmd's index re-indexed (%s)", db)

    async def at_start(self, *, boot_update: bool, managed: Sequence[ManagedCollection],
                       yml_edited: bool) -> str | None:
        """Start-up step: :meth:`restore` a lost or corrupt index now (a lost one is left to an awaited
        ``boot_update``); returns the start-up problem, or ``None``."""
        counts, err = await self.counts.read()
        why = await self.check(counts, err, managed=managed, yml_edited=yml_edited)
        if why is not None and (not boot_update or why.corrupt):
            try:
                await self.restore(why)
            except BackendUnavailableError as exc:
                return f"re-indexing a lost qmd index failed: {exc.reason}"
        return None

    async def notice(self, counts: Mapping[str, int], count_error: str | None, *,
                     managed: Sequence[ManagedCollection], yml_edited: bool,
                     background: BackgroundTasks | None) -> str | None:
        """:meth:`check`, and on a problem start :meth:`restore` in ``background`` (one at a time);
        returns the problem with what is done about it, or ``None``. While a re-index runs the
        problem stands whatever the counts: ``qmd update`` fills one collection after another."""
        if self._restoring:
            return self.problem
        why = await self.check(counts, count_error, managed=managed, yml_edited=yml_edited)
        if why is None:
            self.problem = None
            return None
        if background is not None and background.is_open:
            self.problem = f"{why.reason}; re-indexing it (qmd update) in the background"
            background.start_soon(RESTORE_TASK, lambda: self.restore(why), retry=False, dedupe=True)
        elif self.problem is None:
            self.problem = f"{why.reason}; run `qmdbridge qmd update` to re-index it"
        return self.problem
