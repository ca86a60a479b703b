"""Index sync: discover memory files and transcripts, diff by content hash, chunk, embed, write.

An identity change or ``force`` rebuilds into ``<db>.tmp-<uuid>`` and swaps it in; otherwise
the files the sync planner (``fallback/index/plan.py``) says to read are read and each changed
file is written in one transaction, so a cancelled sync keeps its progress. Embedding failures
never stop a sync (``fallback/index/embedding_step.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio

from fallback.contract import ProgressCallback
from fallback.embeddings.base import EmbeddingProvider
from fallback.errors import EmbeddingProviderError, IndexStoreError
from fallback.index import embedding_cache
from fallback.index.embedding_step import DimensionsChanged, EmbeddingStep
from fallback.index.identity import (
    FTS_ONLY_MODEL,
    WORKSPACE_META,
    chunk_id,
    full_reindex_reason,
    index_identity,
    other_workspace,
    workspace_switch_note,
)
from fallback.index.plan import RecordedFiles, Stamp, file_stamp, read_reason, recorded_files
from fallback.index.racy import SCAN_STARTED_META, wall_clock_ms
from fallback.index.report import SyncReport
from fallback.index.windows import pack_windows
from fallback.settings import EngineSettings
from fallback.skipped import SkippedFile
from fallback.sources.file_text import (
    VANISHED,
    FileContent,
    list_session_files,
    read_memory_text,
    read_session_text,
)
from fallback.sources.memory_files import Discovery, MemoryFile, classify_changed_path, list_memory_files
from fallback.store.db import META_KEY, Store, remove_db_files, temp_db_path
from fallback.store.errors import IndexStoreReadOnlyError
from fallback.store.fts_rows import delete_file_fts, insert_chunk_fts, merge_segments, note_title
from fallback.text.chunking import Chunk, chunk_markdown, remap_lines
from fallback.text.path_names import has_escapes, parse_printable_path

__all__ = ["FTS_ONLY_MODEL", "Indexer", "SyncReport", "chunk_id", "discover", "file_chunks",
           "full_reindex_reason", "index_identity", "read_file"]

log = logging.getLogger(__name__)

# Note recorded for a file indexed with invalid UTF-8 bytes replaced.
INVALID_UTF8_NOTE = "invalid UTF-8 (bytes replaced with U+FFFD)"
# Note recorded for a note padded with NUL bytes, indexed without them (fallback/sources/file_text.py).
NUL_BYTES_NOTE = "NUL bytes stripped ({count} bytes)"
# Notes recorded for a file whose name is shown with escapes (fallback/text/path_names.py): its
# bytes are not UTF-8, or it is UTF-8 holding a control character or a backslash.
ESCAPED_NAME_NOTE = "file name is not valid UTF-8 (path shown with \\xHH escapes)"
CONTROL_NAME_NOTE = "file name holds a control character or backslash (path shown with \\xHH escapes)"


class Indexer:
    """Runs syncs of one engine's store.

    Args:
        settings: the engine settings.
        provider: the embedding provider, or ``None`` (FTS-only).
        write_limiter: ``CapacityLimiter(1)`` serialising every write to the store.
        now_ms: clock in epoch ms.
        on_progress: :data:`~fallback.contract.ProgressCallback`.
        embed_deadline: anyio clock time after which the provider is not called (``None``).
    """

    def __init__(self, settings: EngineSettings, *, provider: EmbeddingProvider | None,
                 write_limiter: anyio.CapacityLimiter, now_ms: Callable[[], int],
                 on_progress: ProgressCallback | None = None,
                 embed_deadline: float | None = None) -> None:
        self.settings = settings
        self.provider = provider
        self._limiter = write_limiter
        self._now_ms = now_ms
        self.on_progress = on_progress
        self._embed_deadline = embed_deadline
        self._fresh_store: Store | None = None  # the empty temporary store of a full rebuild
        self._live_store: Store | None = None  # the published store while a rebuild runs
        self._files_done = 0
        self._model = provider.model if provider else FTS_ONLY_MODEL
        self._step: EmbeddingStep | None = None
        # stamps of the files this sync read and skipped, or found skipped at the same stamps
        self._skip_stamps: dict[tuple[str, str], Stamp] = {}

    def _new_step(self, index_dims: int | None) -> EmbeddingStep | None:
        if self.provider is None:
            return None
        return EmbeddingStep(self.provider, write=self._write, commit=self._commit_batch,
                             on_batch=self._report_progress,
                             cache_enabled=self.settings.search.cache.enabled,
                             deadline=self._embed_deadline, index_dims=index_dims)

    async def sync(self, store: Store, *, force: bool = False,
                   paths: set[str] | None = None) -> SyncReport:
        """Bring ``store`` up to date with the workspace (embedding failures never fail it;
        vectors of another length than the index's make it a full reindex).

        Args:
            store: the live store (swapped in place after a full reindex).
            force: rebuild everything, into a temporary database.
            paths: absolute paths a watcher saw change (only those are re-indexed when each
                can be judged on its own).

        Raises:
            IndexStoreError: the store is locked, read-only or corrupt.
            EmbeddingProviderError: the provider changed its vector size twice in a rebuild.
        """
        held = await anyio.to_thread.run_sync(store.get_meta_json, WORKSPACE_META)
        self._skip_stamps = {}
        report = await self._sync(store, force=force, paths=paths)
        if not report.full and (report.files_indexed or report.files_deleted):
            await self._write(store, partial(_in_transaction, store, merge_segments, whole=False))
        workspace = str(self.settings.workspace_dir)
        if (switched := other_workspace(held, workspace)) is not None:
            report.notes.append(workspace_switch_note(str(store.path), switched, workspace))
        return report

    async def _sync(self, store: Store, *, force: bool, paths: set[str] | None) -> SyncReport:
        meta = await anyio.to_thread.run_sync(store.get_meta_json, META_KEY)
        reason = "force" if force else full_reindex_reason(meta, index_identity(self.settings, self.provider))
        if reason is not None:
            return await self._full_reindex(store, reason)
        dims = meta.get("vectorDims") if isinstance(meta, dict) else None
        self._step = self._new_step(dims if isinstance(dims, int) else None)
        report = SyncReport()
        try:
            if paths is None or not await self._index_paths(store, report, paths):
                await self._index_into(store, report, full=False)
        except DimensionsChanged as exc:
            return await self._full_reindex(store, str(exc))
        return report

    async def sync_recovering_readonly(self, store: Store, *, force: bool = False,
                                       paths: set[str] | None = None) -> SyncReport:
        """:meth:`sync`; on ``SQLITE_READONLY`` reopen the store and retry once (spec §5.3
        step 6), counted in ``store.readonly_recovery``.

        Raises ``IndexStoreError``: as :meth:`sync`, or the retry failed too.
        """
        recovery = store.readonly_recovery
        try:
            return await self.sync(store, force=force, paths=paths)
        except IndexStoreReadOnlyError as exc:
            recovery.attempts += 1
            recovery.last_error = str(exc)
            log.warning("index store is read-only, reopening and retrying once: %s", exc)
        try:
            await anyio.to_thread.run_sync(store.reopen)
            report = await self.sync(store, force=force, paths=paths)
        except Exception as exc:
            recovery.failures += 1
            recovery.last_error = str(exc)
            raise
        recovery.successes += 1
        return report

    async def _index_paths(self, store: Store, report: SyncReport, paths: set[str]) -> bool:
        """Re-index only ``paths`` (watcher events) when each of them can be judged on its own
        (:func:`~fallback.sources.memory_files.classify_changed_path`); ``False`` = a full scan is needed."""
        s = self.settings.search
        verdicts = [await anyio.to_thread.run_sync(
            classify_changed_path, self.settings.workspace_dir, s.extra_paths, p) for p in sorted(paths)]
        if not verdicts or any(kind == "full" for kind, _ in verdicts):
            return False
        files = [mf for kind, mf in verdicts if kind == "file" and isinstance(mf, MemoryFile)]
        gone = sorted({rel for kind, rel in verdicts if kind == "gone" and isinstance(rel, str)})
        known = dict(await anyio.to_thread.run_sync(
            store.query, f"SELECT path, hash FROM files WHERE source = 'memory' AND path IN"
                         f" ({', '.join('?' for _ in files) or 'NULL'})", [f.rel_path for f in files]))
        report.files_total = len(files)
        skipped: list[SkippedFile] = []
        for mf in files:
            if not await self._read_file(store, report, mf, known.get(mf.rel_path), skipped):
                gone.append(mf.rel_path)
        await self._write(store, partial(self._delete_paths, store, gone, "memory"))
        report.files_deleted = len(gone)
        touched = [mf.rel_path for mf in files] + gone
        await self._write(store, partial(self._record_path_skips, store, touched, skipped))
        await self._finish_embedding(store, report)
        return True

    def _record_path_skips(self, store: Store, paths: list[str], skipped: list[SkippedFile]) -> None:
        with store.transaction() as conn:
            conn.executemany("DELETE FROM skipped_files WHERE source = 'memory' AND path = ?",
                             [(p,) for p in paths])
            conn.executemany(_INSERT_SKIP, [self._skip_row("memory", x) for x in skipped])

    def _skip_row(self, source: str, item: SkippedFile) -> tuple[Any, ...]:
        """A ``skipped_files`` row: a file read and skipped keeps the stamps it was read at
        (``fallback/index/plan.py``), a discovery skip or a caveat none."""
        return (item.path, source, item.reason,
                *self._skip_stamps.get((source, item.path), (None, None, None)))

    async def _full_reindex(self, live: Store, reason: str) -> SyncReport:
        try:
            return await self._rebuild(live, reason)
        except DimensionsChanged:
            # the provider switched its vector size during the rebuild: once more, at the new size
            try:
                return await self._rebuild(live, reason)
            except DimensionsChanged as exc:
                assert self.provider is not None
                raise EmbeddingProviderError(self.provider.provider_id,
                                             f"{exc} twice during one rebuild") from exc

    async def _rebuild(self, live: Store, reason: str) -> SyncReport:
        meta = index_identity(self.settings, self.provider)
        self._step = self._new_step(None)
        report = SyncReport(full=True, full_reason=reason)
        temp_path = temp_db_path(live.path)
        try:
            # The temporary database is scratch until it is published: no fsync per file, and
            # nothing to delete before writing a file (it starts empty).
            temp = await anyio.to_thread.run_sync(partial(
                Store, temp_path, fts_tokenizer=self.settings.search.store.fts.tokenizer,
                writer_lock=live.writer_lock, scratch=True))
            self._fresh_store = temp
            self._live_store = live
            try:
                if self.settings.search.cache.enabled:
                    # an unreadable live store is exactly what a rebuild replaces
                    with contextlib.suppress(IndexStoreError):
                        await anyio.to_thread.run_sync(temp.attach_copy_cache, live.path)
                await self._index_into(temp, report, full=True)
                if reason == "force" and self._step is not None and self._step.error is not None:
                    # a forced rebuild of the same index must not trade its vectors for a
                    # provider outage: keep the live index and say why
                    raise self._step.error
                dims = await anyio.to_thread.run_sync(
                    temp.query, "SELECT dims FROM chunks WHERE dims IS NOT NULL LIMIT 1")
                if dims:
                    meta["vectorDims"] = int(dims[0][0])
                await self._write(temp, partial(temp.set_meta, META_KEY, meta))
                await self._write(temp, partial(_in_transaction, temp, embedding_cache.prune,
                                                max_entries=self.settings.search.cache.max_entries))
                await self._write(temp, partial(_in_transaction, temp, merge_segments, whole=True))
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(temp.close)
            # Once built, the swap completes even if the caller is cancelled meanwhile.
            with anyio.CancelScope(shield=True):
                async with self._limiter:
                    await anyio.to_thread.run_sync(live.swap_from, temp_path)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_db_files, temp_path)
        return report

    async def _write(self, store: Store, fn: Callable[[], Any]) -> Any:
        async with self._limiter:
            return await anyio.to_thread.run_sync(fn)

    async def _index_into(self, store: Store, report: SyncReport, *, full: bool) -> None:
        started = wall_clock_ms()  # before any file is looked at (fallback/index/racy.py)
        last = None if full else await anyio.to_thread.run_sync(store.get_meta_json, SCAN_STARTED_META)
        last_started = last if isinstance(last, int) else None
        discovery, session_files, report.issues = await anyio.to_thread.run_sync(
            discover, self.settings)
        memory_skipped: list[SkippedFile] = list(discovery.skipped)
        report.files_total = len(discovery.files) + len(session_files)
        self._files_done = 0
        await self._index_source(store, report, "memory", discovery.files, memory_skipped,
                                 full=full, last_started=last_started)
        session_skipped: list[SkippedFile] = []
        if "sessions" in self.settings.search.sources:
            await self._index_source(store, report, "sessions", session_files, session_skipped,
                                     full=full, last_started=last_started)
        report.skipped = memory_skipped + session_skipped
        await self._finish_embedding(store, report)
        await self._write(store, partial(self._record_scan, store, report,
                                         {"memory": memory_skipped, "sessions": session_skipped},
                                         started=started))

    async def _finish_embedding(self, store: Store, report: SyncReport) -> None:
        if self._step is not None:
            await self._step.finish(store, report, model=self._model,
                                    sources=list(self.settings.search.sources))
            self._report_progress(report)  # the chunks filled in count as embedded

    async def _index_source(self, store: Store, report: SyncReport, source: str,
                            files: list[MemoryFile], skipped: list[SkippedFile], *, full: bool,
                            last_started: int | None) -> None:
        """Index the files of one source (those :func:`~fallback.index.plan.read_reason`
        says to read) and delete its stale rows."""
        recorded = (RecordedFiles({}, {}, []) if full
                    else await anyio.to_thread.run_sync(recorded_files, store, source))
        # caveats of unchanged files and skips of files still skipped are carried over
        carried: dict[str, list[SkippedFile]] = {}
        for path, reason, _ in recorded.skips:
            carried.setdefault(path, []).append(SkippedFile(path=path, reason=reason))
        active: set[str] = set()
        for mf in files:
            prev = recorded.rows.get(mf.rel_path)
            if read_reason(mf, recorded, last_started=last_started) is None:
                skipped.extend(carried.get(mf.rel_path, []))
                if prev is None:  # read and skipped before, at these stamps
                    self._skip_stamps[(source, mf.rel_path)] = file_stamp(mf)
                else:
                    active.add(mf.rel_path)
            elif await self._read_file(store, report, mf, prev and prev[0], skipped):
                active.add(mf.rel_path)
            if source == "sessions" and mf.rel_path in active:
                report.session_sizes[str(mf.abs_path)] = mf.size
            self._files_done += 1
            self._report_progress(report)
        if not full:
            stale = sorted(set(recorded.rows) - active)
            await self._write(store, partial(self._delete_paths, store, stale, source))
            report.files_deleted += len(stale)

    async def _read_file(self, store: Store, report: SyncReport, mf: MemoryFile,
                         known_hash: str | None, skipped: list[SkippedFile]) -> bool:
        """Read ``mf`` and write it (only its stamps when its content hash is ``known_hash``);
        False when it vanished or is skipped (then in ``skipped``, with the stamps read at)."""
        count = len(skipped)
        read, line_map = await anyio.to_thread.run_sync(
            read_file, mf, self.settings.search.max_file_bytes, report, skipped)
        if read is None:
            if len(skipped) > count:  # read and skipped: keep the stamps it was read at
                self._skip_stamps[(mf.source, mf.rel_path)] = file_stamp(mf)
            return False
        if known_hash == read.content_hash:
            await self._write(store, partial(_in_transaction, store, _touch_file, mf, read))
            return True
        chunks = file_chunks(self.settings, mf, read.text, line_map=line_map, model=self._model)
        vectors: list[list[list[float]]] = [[] for _ in chunks]
        if self._step is not None and chunks:
            vectors = await self._step.window_vectors(store, [c for _, c in chunks], report)
        await self._write(store, partial(self._write_file, store, mf, read, chunks, vectors))
        report.files_indexed += 1
        report.chunks_written += len(chunks)
        return True

    def _report_progress(self, report: SyncReport) -> None:
        if self.on_progress is not None:
            self.on_progress(self._files_done, report.files_total, report.chunks_embedded,
                             report.chunks_written)

    async def _commit_batch(self, store: Store, new: dict[str, list[float]], hits: list[str]) -> None:
        """Cache one embedded batch; during a rebuild in the live store too, where it outlives
        an interrupted rebuild's temporary database."""
        await self._write(store, partial(self._cache_write, store, new, hits))
        live = self._live_store
        if live is not None and store is self._fresh_store and new:
            try:
                await self._write(live, partial(self._cache_write, live, new, []))
            except IndexStoreError:
                self._live_store = None  # a broken live store is what the rebuild replaces

    def _cache_write(self, store: Store, vectors: dict[str, list[float]], hits: list[str]) -> None:
        assert self.provider is not None
        embedding_cache.store_and_prune(store, self.provider, vectors, hits, now_ms=self._now_ms(),
                                        max_entries=self.settings.search.cache.max_entries)

    def _write_file(self, store: Store, mf: MemoryFile, content: FileContent,
                    chunks: list[tuple[str, Chunk]], vectors: list[list[list[float]]]) -> None:
        now = self._now_ms()
        fts_ok = store.fts_error is None
        # the trigram table only serves CJK substring queries (fallback/search/fts.py)
        fill_trigram = fts_ok and store.fts_tokenizer != "trigram"
        with store.transaction() as conn:
            if store is not self._fresh_store:
                _delete_rows(conn, mf.rel_path, mf.source)
            written: list[tuple[int, str]] = []
            for (cid, c), windows in zip(chunks, vectors, strict=True):
                cur = conn.execute(
                    "INSERT OR REPLACE INTO chunks(id, path, source, start_line, end_line, hash,"
                    " model, text, vector, dims, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (cid, mf.rel_path, mf.source, c.start_line, c.end_line, c.content_hash,
                     self._model, c.text, *(pack_windows(windows) or (None, None)), now))
                if cur.lastrowid is not None:
                    written.append((cur.lastrowid, c.text))
            if fts_ok:
                insert_chunk_fts(conn, written, title=note_title(mf.rel_path, content.text),
                                 fill_trigram=fill_trigram)
            conn.execute("INSERT OR REPLACE INTO files(path, source, hash, mtime, size, ctime)"
                         " VALUES (?, ?, ?, ?, ?, ?)",
                         (mf.rel_path, mf.source, content.content_hash, content.mtime_ms,
                          content.size, content.ctime_ns))

    @staticmethod
    def _delete_paths(store: Store, paths: list[str], source: str) -> None:
        if not paths:
            return
        with store.transaction() as conn:
            for path in paths:
                _delete_rows(conn, path, source)
                conn.execute("DELETE FROM files WHERE path = ? AND source = ?", (path, source))

    def _record_scan(self, store: Store, report: SyncReport,
                     skipped: dict[str, list[SkippedFile]], *, started: int) -> None:
        with store.transaction() as conn:
            for source, items in skipped.items():
                conn.execute("DELETE FROM skipped_files WHERE source = ?", (source,))
                conn.executemany(_INSERT_SKIP, [self._skip_row(source, x) for x in items])
            store.set_meta("scan_issues", report.issues, conn=conn)
            store.set_meta("last_sync_at_ms", self._now_ms(), conn=conn)
            store.set_meta(SCAN_STARTED_META, started, conn=conn)
            store.set_meta(WORKSPACE_META, str(self.settings.workspace_dir), conn=conn)


# A skipped_files row with the stamps (ms, bytes, ns) of a file read and skipped, else NULLs.
_INSERT_SKIP = ("INSERT OR IGNORE INTO skipped_files(path, source, reason, mtime, size, ctime)"
                " VALUES (?, ?, ?, ?, ?, ?)")


def discover(settings: EngineSettings) -> tuple[Discovery, list[MemoryFile], list[str]]:
    """What a sync of ``settings`` sees (blocking): the memory files' discovery, the transcripts
    (``[]`` unless the ``sessions`` source is on) and the scan issues of both."""
    s = settings.search
    found = list_memory_files(settings.workspace_dir, s.extra_paths, max_file_bytes=s.max_file_bytes)
    issues = list(found.issues)
    transcripts: list[MemoryFile] = []
    if "sessions" in s.sources:
        transcripts, error = list_session_files(settings.sessions_dir)
        if error is not None:
            issues.append(error)
    return found, transcripts, issues


def read_file(mf: MemoryFile, max_file_bytes: int, report: SyncReport,
              skipped: list[SkippedFile]) -> tuple[FileContent | None, list[int] | None]:
    """Read a discovered file as a sync indexes it (blocking; counted in ``report.files_read``):
    its content and, for a transcript, the JSONL line of each line of its text; ``(None, None)``
    when it vanished or is skipped. Its skip, or the caveats of a file that is indexed (a name
    shown with escapes, invalid UTF-8 replaced, NUL bytes stripped; kept in ``skipped_files``
    while the file is unchanged), are added to ``skipped``."""
    read, line_map = (read_session_text(mf) if mf.source == "sessions"
                      else (read_memory_text(mf, max_file_bytes=max_file_bytes), None))
    report.files_read += 1
    if isinstance(read, SkippedFile):
        if read.reason != VANISHED:
            skipped.append(read)
        return None, None
    if has_escapes(mf.rel_path):
        utf8 = not any("\udc80" <= ch <= "\udcff" for ch in parse_printable_path(mf.rel_path))
        skipped.append(SkippedFile(path=mf.rel_path, reason=CONTROL_NAME_NOTE if utf8 else ESCAPED_NAME_NOTE))
    if read.invalid_utf8:
        skipped.append(SkippedFile(path=mf.rel_path, reason=INVALID_UTF8_NOTE))
    if read.nul_bytes:
        skipped.append(SkippedFile(path=mf.rel_path, reason=NUL_BYTES_NOTE.format(count=read.nul_bytes)))
    return read, line_map


def file_chunks(settings: EngineSettings, mf: MemoryFile, text: str, *,
                line_map: list[int] | None, model: str) -> list[tuple[str, Chunk]]:
    """``[(chunk id, chunk)]`` of one file's text as every store indexes them: ``chunking.*``
    applied, blank chunks dropped, lines remapped by ``line_map``, the first of equal ids kept."""
    c = settings.search.chunking
    chunks = remap_lines([ch for ch in chunk_markdown(text, tokens=c.tokens, overlap=c.overlap,
                                                      sections=c.sections) if ch.text.strip()],
                         line_map)
    out: dict[str, Chunk] = {}
    for chunk in chunks:
        out.setdefault(chunk_id(source=mf.source, path=mf.rel_path, start_line=chunk.start_line,
                                end_line=chunk.end_line, content_hash=chunk.content_hash,
                                model=model), chunk)
    return list(out.items())


def _in_transaction(store: Store, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(conn, *args, **kwargs)`` in one write transaction of ``store``."""
    with store.transaction() as conn:
        return fn(conn, *args, **kwargs)


def _touch_file(conn: Any, mf: MemoryFile, content: FileContent) -> None:
    """Record the stamps of a file read again whose content hash is unchanged (its chunks
    stay as they are)."""
    conn.execute("UPDATE files SET mtime = ?, size = ?, ctime = ? WHERE path = ? AND source = ?",
                 (content.mtime_ms, content.size, content.ctime_ns, mf.rel_path, mf.source))


def _delete_rows(conn: Any, path: str, source: str) -> None:
    """Delete one file's chunk rows and their FTS rows (inside the caller's transaction)."""
    delete_file_fts(conn, path, source)
    conn.execute("DELETE FROM chunks WHERE path = ? AND source = ?", (path, source))
