"""The qmd update/embed cycle of one agent: queueing, debounce, retries, repairs, locks (spec 2.7).

Update and embed never overlap on one index (an ``anyio.Lock`` plus the store's
``qmd-write.lock``); embeds across agents are serialised by ``<stateDir>/qmd/embed.lock``,
taken before the store lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_chain,
    wait_fixed,
)

from fallback.errors import BackendTimeoutError, BackendUnavailableError, LockTimeoutError
from fallback.fs.lock import PidFileLock
from fallback.index.racy import wall_clock_ms
from qmdbridge.qmd.runner import is_busy

__all__ = ["EmbedState", "UpdateCycle", "file_lock", "embed_jitter_ms", "needs_null_byte_repair",
           "needs_duplicate_repair", "indexing_in_progress"]

log = logging.getLogger("qmdbridge.qmd.backend")

# Boot updates are retried on busy/timeout after these delays (ms); other runs get one attempt.
BOOT_RETRY_DELAYS_MS = (500, 1000)
# Embed backoff: 60 s doubled per consecutive failure, capped at one hour.
EMBED_BACKOFF_BASE_MS = 60_000
EMBED_BACKOFF_MAX_MS = 3_600_000
# Latest epoch ms a JavaScript Date can hold; a clock beyond it is invalid (spec case 19).
MAX_VALID_EPOCH_MS = 8_640_000_000_000_000
_NUL_MARKERS = ("^@", "\\0", "\x00", "\\x00", "\\u0000", "null byte", "nul byte")


def embed_jitter_ms(agent_id: str, custom: list[tuple[str, str]], embed_interval_ms: int) -> int:
    """Stable delay (ms) before the first embed-timer run (spec 2.7.3): the first 4 bytes of
    ``sha256("<agent>:<sorted path\\0pattern joined by \\x01>")`` modulo ``embed_interval_ms + 1``;
    0 without custom collections."""
    if not custom:
        return 0
    joined = "\x01".join(sorted(f"{p}\0{pat}" for p, pat in custom))
    digest = hashlib.sha256(f"{agent_id}:{joined}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (embed_interval_ms + 1)


def needs_null_byte_repair(message: str) -> bool:
    """ENOTDIR/ENOENT together with a NUL marker: collection metadata holds a null byte."""
    low = message.lower()
    fs = any(m in low for m in ("enotdir", "not a directory", "enoent", "no such file"))
    return fs and any(m in low for m in _NUL_MARKERS)


def needs_duplicate_repair(message: str) -> bool:
    """``UNIQUE constraint failed: documents.collection, documents.path``."""
    low = message.lower()
    return "unique constraint failed" in low and "documents.collection" in low \
        and "documents.path" in low


@contextlib.asynccontextmanager
async def file_lock(path: Path, *, budget_ms: int) -> AsyncIterator[None]:
    """Hold the exclusive inter-process lock ``path`` (a :class:`~fallback.fs.lock.PidFileLock`,
    created if needed) for the block, waiting at most ``budget_ms``.

    Raises:
        BackendTimeoutError: not acquired within ``budget_ms``.
        BackendUnavailableError: the lock file cannot be created or opened.
    """
    lock = PidFileLock(path, timeout_ms=budget_ms)
    try:
        await lock.acquire()
    except LockTimeoutError as exc:
        raise BackendTimeoutError("qmd", f"waiting for lock {path}", budget_ms) from exc
    except OSError as exc:
        raise BackendUnavailableError("qmd", f"cannot open lock {path}: {exc}") from exc
    try:
        yield
    finally:
        lock.close()


@dataclass
class EmbedState:
    """Embed bookkeeping reported by ``status()`` (epoch ms, or ``None``)."""

    last_embed_at: int | None = None
    failures: int = 0
    backoff_until: int | None = None
    last_error: str | None = None


# run_update_cmd() / run_embed_cmd() raise BackendUnavailableError (incl. timeout) on failure.
Command = Callable[[], Awaitable[None]]


class UpdateCycle:
    """Runs ``qmd update`` (and maybe ``qmd embed``) for one agent with the spec 2.7 rules.

    Args:
        update / embed / repair: run ``qmd update``, ``qmd embed``, rebuild the collections;
            raise ``BackendUnavailableError``.
        export_sessions: exports transcripts before the update, or ``None``.
        after_update: called after every completed update.
        write_lock / embed_lock: the per-store and global lock files.
        search_mode: ``search`` never embeds.
        debounce_ms / embed_interval_ms: unforced runs' spacing, and the embed period (0: forced only), ms.
        lock_budget_ms / embed_lock_budget_ms: waits for the file locks, ms.
        now_ms: clock in epoch ms. boot_retry_delays_ms: waits before a boot update's retries, ms.
    """

    def __init__(self, *, update: Command, embed: Command, repair: Command,
                 export_sessions: Command | None, after_update: Callable[[], None],
                 write_lock: Path, embed_lock: Path, search_mode: str, debounce_ms: int,
                 embed_interval_ms: int, lock_budget_ms: int, embed_lock_budget_ms: int,
                 now_ms: Callable[[], int],
                 boot_retry_delays_ms: tuple[int, ...] = BOOT_RETRY_DELAYS_MS) -> None:
        self._update, self._embed, self._repair = update, embed, repair
        self._export = export_sessions
        self._after = after_update
        self._write_lock, self._embed_lock = write_lock, embed_lock
        self._search_mode = search_mode
        self._debounce_ms = debounce_ms
        self._embed_interval_ms = embed_interval_ms
        self._lock_budget_ms, self._embed_budget_ms = lock_budget_ms, embed_lock_budget_ms
        self._now = now_ms
        self._boot_retry_delays_ms = boot_retry_delays_ms
        self._lock = anyio.Lock()
        self._running: anyio.Event | None = None
        self._last_done_ms: int | None = None
        self._null_repair_used = False
        self._dup_repair_used = False
        self.closed = False
        self.updates_run = 0
        self.last_update_at: int | None = None
        # when the last completed ``qmd update`` began, wall clock epoch ms: it read every file
        # changed clearly before then (fallback.index.racy)
        self.scan_started_ms: int | None = None
        self.last_error: str | None = None
        self.embed = EmbedState()

    @property
    def is_running(self) -> bool:
        """Whether an update is in progress."""
        return self._running is not None

    async def wait_running(self, *, max_ms: int) -> None:
        """Wait at most ``max_ms`` for a running update to finish (spec 2.7.4)."""
        ev = self._running
        if ev is not None:
            with anyio.move_on_after(max_ms / 1000):
                await ev.wait()

    async def run(self, reason: str, *, force: bool = False, debounce: bool = True) -> None:
        """``runUpdate(reason, force)`` (spec 2.7.1): a forced request while an update runs queues one
        more run, an unforced one waits for it; unforced runs within ``debounce_ms`` of the last are
        skipped. ``debounce=False`` (a ``sync``) is never skipped and runs again after a running
        update, embedding only when an unforced run would. Closed: no-op.

        Raises:
            BackendUnavailableError: ``qmd update`` failed after its retries and repairs. Embed
                failures never raise.
        """
        if self.closed:
            return
        if not force and debounce:
            if self._running is not None:
                await self._running.wait()
                return
            if self._debounce_ms > 0 and self._last_done_ms is not None and \
                    self._now() - self._last_done_ms < self._debounce_ms:
                return
        async with self._lock:
            if self.closed:
                return
            ev = self._running = anyio.Event()
            try:
                await self._body(reason, force=force)
            finally:
                self._running = None
                ev.set()

    async def _body(self, reason: str, *, force: bool) -> None:
        start = self._now()
        async with file_lock(self._write_lock, budget_ms=self._lock_budget_ms):
            scan_started = wall_clock_ms()
            if self._export is not None:
                await self._export()
            await self._update_with_retries(reason)
        self.scan_started_ms = scan_started
        self.updates_run += 1
        self._last_done_ms = self._now()
        self.last_error = None
        if self._should_embed(force=force):
            await self._run_embed(reason)
        self.last_update_at = self._now()
        self._after()
        log.info("qmd sync completed reason=%s durationMs=%d", reason, self._now() - start)

    async def _update_with_retries(self, reason: str) -> None:
        """``qmd update``; a busy or timed-out boot run is retried after each of ``boot_retry_delays_ms``."""
        boot = reason == "boot" or reason.startswith("boot:")
        delays_ms = self._boot_retry_delays_ms if boot else ()

        async def attempt() -> None:
            try:
                await self._update_once()
            except BackendUnavailableError as exc:
                self.last_error = str(exc)
                raise

        def warn(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.warning("qmd update retry %d/%d after failure (%s): %s", state.attempt_number,
                        len(delays_ms), reason, exc)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(1 + len(delays_ms)),
            wait=wait_chain(*(wait_fixed(ms / 1000) for ms in delays_ms)) if delays_ms else wait_fixed(0),
            retry=retry_if_exception(lambda exc: isinstance(exc, BackendUnavailableError) and (
                is_busy(str(exc)) or "timed out" in str(exc).lower())),
            before_sleep=warn, sleep=anyio.sleep, reraise=True)
        await retrying(attempt)

    async def _update_once(self) -> None:
        try:
            await self._update()
        except BackendTimeoutError:
            raise
        except BackendUnavailableError as exc:
            msg = f"{exc} {getattr(exc, 'stderr_tail', '') or ''}"
            if needs_null_byte_repair(msg) and not self._null_repair_used:
                self._null_repair_used = True
                log.warning("qmd update failed with suspected null-byte collection metadata (%s); "
                            "rebuilding managed collections and retrying once", exc)
            elif needs_duplicate_repair(msg) and not self._dup_repair_used:
                self._dup_repair_used = True
                log.warning("qmd update failed with duplicate document rows (%s); rebuilding "
                            "managed collections and retrying once", exc)
            else:
                raise
            await self._repair()
            await self._update()

    def _should_embed(self, *, force: bool) -> bool:
        if self._search_mode == "search":
            return False
        now = self._now()
        if self.embed.backoff_until is not None and now < self.embed.backoff_until:
            return False
        if force or self.embed.last_embed_at is None:
            return True
        return self._embed_interval_ms > 0 and now - self.embed.last_embed_at > self._embed_interval_ms

    async def _run_embed(self, reason: str) -> None:
        try:
            async with file_lock(self._embed_lock, budget_ms=self._embed_budget_ms), \
                    file_lock(self._write_lock, budget_ms=self._lock_budget_ms):
                await self._embed()
        except BackendUnavailableError as exc:
            self.embed.failures += 1
            self.embed.last_error = str(exc)
            wait_ms = min(EMBED_BACKOFF_MAX_MS, EMBED_BACKOFF_BASE_MS * 2 ** (self.embed.failures - 1))
            until = self._now() + wait_ms
            self.embed.backoff_until = until if 0 <= until <= MAX_VALID_EPOCH_MS else None
            log.warning("qmd embed failed (%s): %s; backing off for %ds", reason, exc,
                        wait_ms // 1000)
            return
        self.embed = EmbedState(last_embed_at=self._now())  # no failure, no backoff


def indexing_in_progress(*, running: bool, locks: Sequence[Path], index_locked: bool) -> str | None:
    """``indexing in progress (...)`` while qmd's index is being written (this cycle runs, a live
    process holds one of ``locks``, or ``index_locked``), else ``None``."""
    if running:
        return "indexing in progress (qmd update or embed run by this process)"
    for path in locks:
        pid = PidFileLock(path, timeout_ms=0).holder_pid()
        if pid is not None:
            return f"indexing in progress (pid {pid} holds {path.name})"
    return "indexing in progress (a writer holds qmd's index)" if index_locked else None
