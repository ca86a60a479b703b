"""Opening the builtin engine's store, and starting over when the file is corrupt.

The index is derived from the Markdown files, so a corrupt store is never repaired in place:
its files are moved aside (``<db>.corrupt-<utc time>``, kept for inspection, the newest
:data:`~fallback.store.files.CORRUPT_BACKUPS_KEPT` of them only,
:func:`fallback.store.files.quarantine_corrupt_store`) and an empty store is opened, which the
next sync fills from the memory files. The move is noted once in the engine's notes
(``status().issues``, and the warnings of the next answer: ``BuiltinEngine.take_notices``).
Both functions block: call them in a worker thread.
"""

from __future__ import annotations

import logging
from functools import partial

from fallback.errors import IndexStoreError
from fallback.settings import EngineSettings
from fallback.store.db import Store
from fallback.store.errors import IndexStoreCorruptError
from fallback.store.files import quarantine_corrupt_store

__all__ = ["open_store", "reopen_after_corruption"]

log = logging.getLogger("fallback.engine.builtin")


def _note(exc: IndexStoreError, moved: str, notes: list[str]) -> None:
    notes.append(f"index store was corrupt ({exc}); moved aside to {moved} and rebuilt from "
                 "the memory files")
    log.warning("%s", notes[-1])


def open_store(settings: EngineSettings, notes: list[str]) -> Store:
    """Open (or create) the store at ``settings.db_path``; a corrupt file is moved aside first.

    Args:
        settings: the engine settings (store path, FTS tokenizer).
        notes: the engine's one-off events (``status().issues``); a move is appended.

    Raises:
        IndexStoreError: the store cannot be opened (locked, read-only, or still corrupt).
    """
    opener = partial(Store, settings.db_path, fts_tokenizer=settings.search.store.fts.tokenizer)
    try:
        return opener()
    except IndexStoreCorruptError as exc:
        moved = quarantine_corrupt_store(settings.db_path, opener)
        if moved:
            _note(exc, moved, notes)
        return opener()


def reopen_after_corruption(settings: EngineSettings, exc: IndexStoreCorruptError,
                            notes: list[str]) -> None:
    """After ``exc`` was seen on an open store (which the caller has closed): move the files
    aside unless a ``PRAGMA quick_check`` finds the store sound now (another process repaired
    it), and note the move; the caller then opens the store again.

    Raises:
        IndexStoreError: the files could not be moved aside (the writer lock stayed held).
    """
    def verify() -> Store:
        store = Store(settings.db_path, fts_tokenizer=settings.search.store.fts.tokenizer)
        problem = store.quick_check()
        if problem != "ok":
            store.close()
            raise IndexStoreCorruptError(f"index store is corrupt: {problem}",
                                         db_path=str(settings.db_path))
        return store

    moved = quarantine_corrupt_store(settings.db_path, verify)
    if moved:
        _note(exc, moved, notes)
