"""Opening the builtin engine's store: a corrupt file moved aside and started over, a store this
process cannot write read without writing, or the agent's scope of the postgres store
(docs/architecture.md "Safety"). The functions block: call them in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from fallback.engine.sync_record import FailureKind, read_failure, write_failure
from fallback.errors import BackendUnavailableError, IndexStoreError
from fallback.settings import EngineSettings
from fallback.store.db import Store
from fallback.store.errors import IndexStoreCorruptError, IndexStoreFullError, IndexStoreReadOnlyError
from fallback.store.files import quarantine_corrupt_store
from fallback.store.readonly import ReadOnlyStore

if TYPE_CHECKING:
    from fallback.store.postgres.seam import PostgresSearchStore

__all__ = ["EngineStore", "open_postgres", "open_store", "reopen_after_corruption"]

log = logging.getLogger("fallback.engine.builtin")


def _move_aside(settings: EngineSettings, exc: IndexStoreError, notes: list[str],
                opener: Callable[[], Store]) -> None:
    """Move the corrupt store aside unless ``opener`` opens it now; the move noted in ``notes``."""
    moved = quarantine_corrupt_store(settings.db_path, opener)
    if moved:
        notes.append(f"index store was corrupt ({exc}); moved aside to {moved} and rebuilt from "
                     "the memory files")
        log.warning("%s", notes[-1])


def open_store(settings: EngineSettings, notes: list[str]) -> Store:
    """Open (or create) the store at ``settings.db_path``; a corrupt file is moved aside first
    (noted in ``notes``, the engine's one-off events).

    Raises ``IndexStoreError``: the store cannot be opened (locked, read-only, or still corrupt).
    """
    opener = partial(Store, settings.db_path, fts_tokenizer=settings.search.store.fts.tokenizer)
    try:
        return opener()
    except IndexStoreCorruptError as exc:
        _move_aside(settings, exc, notes, opener)
    return opener()


def open_postgres(settings: EngineSettings) -> PostgresSearchStore:
    """The agent's scope (agent id + workspace path) of the postgres store ``store.dsn`` /
    ``store.schema``, migrated, with ``store.shareWith`` (less the agent itself) recorded when
    the config sets it (an empty list unshares; left out, what the schema owner recorded stays).

    Raises ``ConfigError`` (the DSN or schema), ``PostgresUnavailableError`` (unreachable,
    login refused, no pgvector, or the role may not change the recorded ``shareWith``).
    """
    from fallback.store.postgres.seam import PostgresSearchStore
    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target

    st = settings.search.store
    store = PostgresStore(resolve_target(st.dsn, schema=st.schema_), agent_id=settings.agent_id,
                          workspace=str(settings.workspace_dir),
                          connect_timeout_ms=st.connect_timeout_ms,
                          statement_timeout_ms=st.statement_timeout_ms)
    try:
        if "share_with" in st.model_fields_set:  # an agent reads its own rows anyway
            store.register_agent(settings.agent_id, share_with=[
                a for a in st.share_with if a != settings.agent_id])
    except BaseException:
        store.close()
        raise
    return PostgresSearchStore(store)


def reopen_after_corruption(settings: EngineSettings, exc: IndexStoreCorruptError,
                            notes: list[str]) -> None:
    """After ``exc`` was seen on the (closed) store: move its files aside unless a
    ``PRAGMA quick_check`` and FTS5's ``integrity-check`` find it sound now, and note the move.
    Raises ``IndexStoreError``."""
    def verify() -> Store:
        store = Store(settings.db_path, fts_tokenizer=settings.search.store.fts.tokenizer)
        problem = store.integrity_problem()
        if problem != "ok":
            store.close()
            raise IndexStoreCorruptError(f"index store is corrupt: {problem}",
                                         db_path=str(settings.db_path))
        return store

    _move_aside(settings, exc, notes, verify)


class EngineStore:
    """The builtin engine's handles on its store: the store (opened on first use, reopened when
    another process swapped the file), the file opened for reading only while this process
    cannot write it, or the postgres store. Async; moves aside are appended to ``notes``, the
    engine's one-off events."""

    def __init__(self, settings: EngineSettings, notes: list[str]) -> None:
        self.settings = settings
        self.notes = notes
        self.store: Store | None = None
        self.reader: ReadOnlyStore | None = None
        self.shared: PostgresSearchStore | None = None
        self._lock = anyio.Lock()

    @property
    def is_postgres(self) -> bool:
        """Whether the settings name the postgres store (``store.driver``)."""
        return self.settings.search.store.driver == "postgres"

    async def open_search(self) -> tuple[Store | ReadOnlyStore | PostgresSearchStore,
                                         IndexStoreError | None]:
        """The store a search reads: the postgres store, else :meth:`open_reader`'s. Raises
        ``IndexStoreError``."""
        return (await self.open_postgres(), None) if self.is_postgres else await self.open_reader()

    async def open_postgres(self) -> PostgresSearchStore:
        """The postgres store, opened on first use (:func:`open_postgres`)."""
        async with self._lock:
            if self.shared is None:
                self.shared = await anyio.to_thread.run_sync(open_postgres, self.settings)
            return self.shared

    async def keep_failure(self, kind: FailureKind, doc: Mapping[str, Any] | None) -> None:
        """Keep how the last ``kind`` (sync, or search's query embedding) failed (``doc``:
        ``sync_record.failure_doc``; ``None``: it succeeded) where every process's status reads
        it: beside the SQLite store file, or as ``<kind>Failed`` of the postgres store's row of
        this agent's scope. Never raises: a record that cannot be kept is logged."""
        try:
            await anyio.to_thread.run_sync(
                partial(write_failure, self.settings.db_path, kind, doc) if not self.is_postgres
                else partial((await self.open_postgres()).keep_failure, f"{kind}Failed", doc))
        except (OSError, BackendUnavailableError, IndexStoreError) as exc:
            log.warning("cannot keep the record of the last %s's failure (agent %s): %s", kind,
                        self.settings.agent_id, exc)

    async def failure(self, kind: FailureKind) -> dict[str, Any] | None:
        """How the last ``kind`` failed, as any process recorded it (:meth:`keep_failure`);
        ``None`` when it succeeded, or the record or the store cannot be read (status tells that)."""
        try:
            doc = await anyio.to_thread.run_sync(
                partial(read_failure, self.settings.db_path, kind) if not self.is_postgres
                else partial((await self.open_postgres()).failure, f"{kind}Failed"))
        except (BackendUnavailableError, IndexStoreError):
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None

    async def open(self) -> Store:
        """The store, opened on first use, reopened when another process swapped its file.
        Raises ``IndexStoreError``."""
        async with self._lock:
            if self.store is None:
                self.store = await anyio.to_thread.run_sync(open_store, self.settings, self.notes)
            elif self.store.is_replaced():  # one stat here; the reopen in a worker thread
                await anyio.to_thread.run_sync(self.store.reopen_if_replaced)
            return self.store

    async def open_reader(self) -> tuple[Store | ReadOnlyStore, IndexStoreError | None]:
        """``(store, None)``, or, when this process cannot write the store (its permissions, a
        full disk), the file opened for reading only and the error that says why. Raises
        ``IndexStoreError``."""
        try:
            return await self.open(), None
        except (IndexStoreReadOnlyError, IndexStoreFullError) as exc:
            if self.reader is not None:
                await anyio.to_thread.run_sync(self.reader.close)
            self.reader = await anyio.to_thread.run_sync(ReadOnlyStore.open, self.settings.db_path)
            if self.reader is None:  # no store file: nothing to answer from
                raise
            return self.reader, exc

    async def recover_corrupt(self, exc: IndexStoreCorruptError, *,
                              before_move: Callable[[], None]) -> None:
        """Close the corrupt store, call ``before_move`` (blocking), move the files aside; the
        next :meth:`open` opens an empty store. Raises ``IndexStoreError``."""
        async with self._lock:
            if self.store is not None:
                await anyio.to_thread.run_sync(self.store.close)
                self.store = None
            await anyio.to_thread.run_sync(before_move)
            await anyio.to_thread.run_sync(reopen_after_corruption, self.settings, exc, self.notes)

    async def close(self) -> None:
        """Close the store and the reader; idempotent."""
        for handle in (self.store, self.reader, self.shared):
            if handle is not None:
                await anyio.to_thread.run_sync(handle.close)
        self.store = self.reader = self.shared = None
