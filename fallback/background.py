"""Background work of one memory service: one anyio task group, supervised tasks, capped backoff.

The manager opens one :class:`BackgroundTasks` for its whole life and every background task of
both backends is started through it (docs/architecture.md, "Background work and deadlines"): a
task that raises is reported and retried after :class:`RetryPolicy`'s delay, never escaping
into the group; :meth:`BackgroundTasks.aclose` cancels the group (or one
:meth:`~BackgroundTasks.subgroup`) from any task of the same event loop and returns once every
task has finished.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from fallback.errors import ManagerClosedError, MemorySearchError, UsageError
from fallback.models import BackgroundError, BackgroundStatus

__all__ = ["BackgroundTasks", "RetryPolicy", "describe_error"]

log = logging.getLogger("qmdbridge.background")

# First retry delay after a failure, ms: quick enough for a transient lock or network blip.
RETRY_BASE_MS = 1_000
# Longest retry delay, ms: a permanent failure (revoked API key) costs one attempt per 5 min.
RETRY_MAX_MS = 300_000

Job = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with a cap (pure): ``base_ms`` after the first failure, times
    ``factor`` per further one, at most ``max_ms``."""

    base_ms: int = RETRY_BASE_MS
    factor: float = 2.0
    max_ms: int = RETRY_MAX_MS

    def delay_ms(self, failures: int) -> int:
        """Delay in ms after ``failures`` consecutive failures (0 when ``failures < 1``)."""
        if failures < 1:
            return 0
        # the exponent is capped so that a long failure run cannot overflow the float
        return int(min(self.max_ms, self.base_ms * self.factor ** min(failures - 1, 64)))


def describe_error(exc: BaseException) -> str:
    """One line naming an exception and its cause: ``Type: message (caused by Type: message)``."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None and cause is not exc:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text


class _StartedProxy:
    """Forwards ``started()`` to anyio's task status and remembers that it was called."""

    def __init__(self, inner: anyio.abc.TaskStatus[Any]) -> None:
        self.inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        self.called = True
        self.inner.started(value)


class BackgroundTasks:
    """One task group for a service's background work (``async with BackgroundTasks()``):
    ``policy`` sets the retry delays, ``now_ms`` (epoch ms) stamps the reported failures."""

    def __init__(self, *, policy: RetryPolicy | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.policy = policy or RetryPolicy()
        self._now = now_ms or (lambda: int(time.time() * 1000))
        self._root: BackgroundTasks = self
        self._parent: BackgroundTasks | None = None
        self._label = ""
        self._tg: anyio.abc.TaskGroup | None = None
        self._outer: anyio.abc.TaskGroup | None = None
        self._host_done: anyio.Event | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._active: Counter[str] = Counter()  # this handle's tasks by name
        self._names: Counter[str] = Counter()  # root only: every task by labelled name
        self._running = 0
        self._idle: anyio.Event | None = None
        self._closed = False
        self._last_error: BackgroundError | None = None
        self._failing: dict[str, BackgroundError] = {}

    async def __aenter__(self) -> BackgroundTasks:
        if self._outer is not None or self._closed or self._root is not self:
            raise UsageError("background tasks can be opened once" if self._root is self else
                             "a subgroup shares its parent's task group; open the parent instead")
        outer = anyio.create_task_group()
        await outer.__aenter__()
        self._outer = outer
        await outer.start(self._host)
        return self

    async def __aexit__(self, *exc: object) -> bool:
        with anyio.CancelScope(shield=True):
            await self.aclose()
        outer, self._outer = self._outer, None
        if outer is not None:
            # The host task has finished: returns at once, the body's exception unwrapped.
            await outer.__aexit__(None, None, None)
        return False

    async def _host(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._host_done = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            self._host_done.set()

    @property
    def is_open(self) -> bool:
        """Whether tasks can be started (the group is open and this handle is not closed)."""
        return self._root._tg is not None and not self._closed and not self._root._closed

    @property
    def running(self) -> int:
        """Tasks of this handle (and its subgroups) started and not finished yet."""
        return self._running

    def subgroup(self, label: str) -> BackgroundTasks:
        """A handle on the same group whose tasks :meth:`aclose` can cancel on their own;
        ``label`` prefixes the task names it reports."""
        sub = BackgroundTasks(policy=self.policy, now_ms=self._now)
        sub._root = self._root
        sub._label = f"{self._label}{label}: "
        sub._parent = self
        return sub

    async def aclose(self) -> None:
        """Cancel every task of this handle (the root: the whole group) and wait until all
        have finished; idempotent."""
        self._closed = True
        if self._root is self and self._tg is not None:
            self._tg.cancel_scope.cancel()
        for scope in list(self._scopes):
            scope.cancel()
        while self._running and self._idle is not None:
            await self._idle.wait()
        if self._root is self and self._host_done is not None:
            await self._host_done.wait()

    def _check(self) -> anyio.abc.TaskGroup:
        tg = self._root._tg
        if tg is None:
            raise UsageError("background tasks need an open task group: use "
                             "`async with MemoryManager(...)` (or `async with BackgroundTasks()`)")
        return tg

    def _chain(self) -> Iterator[BackgroundTasks]:
        node: BackgroundTasks | None = self
        while node is not None:
            yield node
            node = node._parent

    def _begin(self, name: str) -> None:
        for node in self._chain():
            if node._running == 0:
                node._idle = anyio.Event()
            node._running += 1
        self._active[name] += 1
        self._root._names[f"{self._label}{name}"] += 1

    def _end(self, name: str) -> None:
        self._active -= Counter({name: 1})  # in place, dropping counts that reach 0
        self._root._names -= Counter({f"{self._label}{name}": 1})
        for node in self._chain():
            node._running -= 1
            if node._running == 0 and node._idle is not None:
                node._idle.set()

    def is_active(self, name: str) -> bool:
        """Whether a task of that name is running or waiting to retry."""
        return self._active[name] > 0

    def start_soon(self, name: str, job: Job, *, retry: bool = True, dedupe: bool = False) -> bool:
        """Run ``job()`` (async, no arguments) in the background under supervision, as ``name``
        (for logs and status: ``boot sync``); after a failure it runs again after the policy's
        delay until it succeeds, unless not ``retry``; with ``dedupe``, not while a task of this
        name runs or retries. Returns whether a task was started.

        Raises ``UsageError``: the group is not open.
        """
        if self._closed or self._root._closed or (dedupe and self.is_active(name)):
            return False
        tg = self._check()
        self._begin(name)
        tg.start_soon(self._supervise, name, job, retry, None, name=f"qmdbridge {self._label}{name}")
        return True

    async def start(self, name: str, job: Callable[..., Awaitable[object]]) -> Any:
        """Run ``job(task_status=...)`` in the background, supervised as :meth:`start_soon`, and
        return the value it passes to ``task_status.started()``.

        Raises ``UsageError`` (the group is not open, or this handle is closed), or whatever
        ``job`` raised before it started.
        """
        tg = self._check()
        if self._closed or self._root._closed:
            raise UsageError("background tasks are closed")
        self._begin(name)  # ended by _supervise, also when the job fails before it started
        return await tg.start(self._supervise_started, name, job,
                              name=f"qmdbridge {self._label}{name}")

    def every(self, name: str, period_ms: int, tick: Job, *, first_ms: int | None = None) -> bool:
        """Run ``tick()`` every ``period_ms`` (first after ``first_ms``, default one period); a
        failed tick is reported and the next waits ``max(period, backoff)``. Returns whether the
        timer was started; raises ``UsageError`` when the group is not open."""
        async def loop() -> None:
            await anyio.sleep((period_ms if first_ms is None else first_ms) / 1000)
            while await self._until_done(name, tick, lambda failures: max(
                    period_ms, self.policy.delay_ms(failures))):
                await anyio.sleep(period_ms / 1000)

        return self.start_soon(name, loop, retry=True)

    async def _supervise(self, name: str, job: Callable[..., Awaitable[object]], retry: bool,
                         status: _StartedProxy | None) -> None:
        try:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                if self._closed or self._root._closed:
                    scope.cancel()
                await self._until_done(
                    name, lambda: job(task_status=status) if status is not None and not status.called
                    else job(), lambda failures: self.policy.delay_ms(failures) if retry else None,
                    status)
        finally:
            self._scopes.discard(scope)
            self._end(name)

    async def _until_done(self, name: str, call: Job, delay_ms: Callable[[int], int | None],
                          status: _StartedProxy | None = None) -> bool:
        """Run ``call()`` until it succeeds, each failure reported and retried after
        ``delay_ms(failures in a row)`` ms (``None``: not retried); False when the owner closed.
        Raises what ``call`` raised before ``status.started()`` was called."""
        failures = 0
        while True:
            try:
                await call()
            except ManagerClosedError:
                return False  # closing: the owner is gone, nothing to retry
            except Exception as exc:  # the background edge: report, back off, retry
                if status is not None and not status.called:
                    raise  # failed before it started: the caller of start() gets it
                failures += 1
                delay = delay_ms(failures)
                self.report(name, exc, failures=failures, retry_in_ms=delay)
                if delay is None:
                    return True
                await anyio.sleep(delay / 1000)
                continue
            if failures:
                self.recovered(name, failures)
            return True

    async def _supervise_started(self, name: str, job: Callable[..., Awaitable[object]], *,
                                 task_status: anyio.abc.TaskStatus[Any]) -> None:
        await self._supervise(name, job, True, _StartedProxy(task_status))

    def report(self, name: str, exc: BaseException, *, failures: int,
               retry_in_ms: int | None) -> BackgroundError:
        """Record and log a failure of the task ``name`` (``failures`` in a row, retried in
        ``retry_in_ms`` or not) and return it; an unexpected exception is logged with its
        traceback the first time."""
        full = f"{self._label}{name}"
        err = BackgroundError(task=full, message=describe_error(exc), at_ms=self._now(),
                              failures=failures, retry_in_ms=retry_in_ms)
        root = self._root
        root._last_error = err
        root._failing[full] = err
        when = "not retried" if retry_in_ms is None else f"retry in {retry_in_ms / 1000:g}s"
        log.warning("background %s failed (%d in a row; %s): %s", full, failures, when,
                    err.message,
                    exc_info=exc if failures == 1 and not isinstance(exc, MemorySearchError) else None)
        return err

    def recovered(self, name: str, failures: int) -> None:
        """Record that ``name`` succeeded again after ``failures`` failures (logged at info)."""
        full = f"{self._label}{name}"
        if self._root._failing.pop(full, None) is not None:
            log.info("background %s recovered after %d failure(s)", full, failures)

    def status(self) -> BackgroundStatus:
        """``{running, tasks, failing, lastError}`` of the whole group (for
        ``MemoryStatus.background``)."""
        root = self._root
        return BackgroundStatus(running=root._running, tasks=sorted(root._names),
                                failing=sorted(root._failing), last_error=root._last_error)
