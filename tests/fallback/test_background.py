"""BackgroundTasks: supervision with capped exponential backoff, failure reporting, shutdown
from any task, subgroups, and the retry policy itself. Every wait is on an event against a
deadline; nothing asserts on timing."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest

from fallback.background import BackgroundTasks, RetryPolicy, describe_error
from fallback.errors import EmbeddingProviderError, ManagerClosedError, UsageError

pytestmark = pytest.mark.anyio

DEADLINE_S = 60.0
NOW_MS = 1_770_681_600_000
FAST = RetryPolicy(base_ms=1, factor=2.0, max_ms=4)


def test_retry_policy_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base_ms=1000, factor=2.0, max_ms=300_000)
    assert [policy.delay_ms(n) for n in range(0, 11)] == [
        0, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000]
    assert policy.delay_ms(10_000) == 300_000  # no overflow however long it failed
    assert RetryPolicy().delay_ms(1) == 1000 and RetryPolicy().delay_ms(30) == 300_000


def test_describe_error_names_the_cause() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise EmbeddingProviderError("openai", "request failed", status=None) from exc
    except EmbeddingProviderError as exc:
        text = describe_error(exc)
    assert text == ("EmbeddingProviderError: openai embedding failed: request failed "
                    "(caused by ConnectionRefusedError: [Errno 111] Connection refused)")
    assert describe_error(RuntimeError()) == "RuntimeError"


async def test_a_failing_task_is_reported_once_per_failure_and_retried_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    attempts = 0
    done = anyio.Event()

    async def flaky() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise EmbeddingProviderError("openai", f"invalid key (attempt {attempts})", status=401)
        done.set()

    caplog.set_level(logging.INFO, logger="qmdbridge.background")
    async with BackgroundTasks(policy=FAST, now_ms=lambda: NOW_MS) as tasks:
        assert tasks.start_soon("boot sync", flaky)
        with anyio.fail_after(DEADLINE_S):
            await done.wait()
        status = tasks.status()
    assert attempts == 4
    assert status.failing == []  # it recovered
    assert status.last_error is not None
    assert status.last_error.model_dump() == {
        "task": "boot sync",
        "message": "EmbeddingProviderError: openai embedding failed (HTTP 401): invalid key (attempt 3)",
        "at_ms": NOW_MS, "failures": 3, "retry_in_ms": 4}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "background boot sync failed (1 in a row; retry in 0.001s): "
        "EmbeddingProviderError: openai embedding failed (HTTP 401): invalid key (attempt 1)",
        "background boot sync failed (2 in a row; retry in 0.002s): "
        "EmbeddingProviderError: openai embedding failed (HTTP 401): invalid key (attempt 2)",
        "background boot sync failed (3 in a row; retry in 0.004s): "
        "EmbeddingProviderError: openai embedding failed (HTTP 401): invalid key (attempt 3)"]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["background boot sync recovered after 3 failure(s)"]
    assert status.to_json_dict()["lastError"]["retryInMs"] == 4


async def test_status_lists_a_task_that_keeps_failing_and_close_stops_it() -> None:
    failures = 0
    third = anyio.Event()

    async def broken() -> None:
        nonlocal failures
        failures += 1
        if failures == 3:
            third.set()
        raise RuntimeError("revoked key")

    async with BackgroundTasks(policy=FAST) as tasks:
        sub = tasks.subgroup("builtin")
        sub.start_soon("watch sync", broken)
        with anyio.fail_after(DEADLINE_S):
            await third.wait()
        status = tasks.status()
        assert status.failing == ["builtin: watch sync"] and status.running == 1
        assert status.last_error is not None and status.last_error.task == "builtin: watch sync"
    assert tasks.running == 0 and not tasks.is_open


async def test_a_subgroup_is_opened_by_its_parent() -> None:
    async with BackgroundTasks(policy=FAST) as tasks:
        with pytest.raises(UsageError) as caught:
            async with tasks.subgroup("qmd"):
                pass
    assert str(caught.value) == "a subgroup shares its parent's task group; open the parent instead"
    with pytest.raises(UsageError) as caught:
        async with tasks:
            pass
    assert str(caught.value) == "background tasks can be opened once"


async def test_not_retried_and_closed_owner_stop_quietly() -> None:
    calls: list[str] = []

    async def once() -> None:
        calls.append("once")
        raise RuntimeError("no retry wanted")

    async def owner_closed() -> None:
        calls.append("closed")
        raise ManagerClosedError("builtin engine is closed")

    async with BackgroundTasks(policy=FAST) as tasks:
        tasks.start_soon("one shot", once, retry=False)
        tasks.start_soon("after close", owner_closed)
        with anyio.fail_after(DEADLINE_S):
            while tasks.running:
                await anyio.sleep(0.01)
        status = tasks.status()
    assert sorted(calls) == ["closed", "once"]
    assert status.last_error is not None and status.last_error.task == "one shot"
    assert status.last_error.retry_in_ms is None and status.failing == ["one shot"]


async def test_dedupe_runs_one_task_per_name() -> None:
    gate = anyio.Event()
    runs = 0

    async def job() -> None:
        nonlocal runs
        runs += 1
        await gate.wait()

    async with BackgroundTasks() as tasks:
        assert tasks.start_soon("search sync", job, dedupe=True) is True
        assert tasks.start_soon("search sync", job, dedupe=True) is False
        assert tasks.is_active("search sync")
        gate.set()
        with anyio.fail_after(DEADLINE_S):
            while tasks.is_active("search sync"):
                await anyio.sleep(0.01)
        assert tasks.start_soon("search sync", job, dedupe=True) is True
    assert runs == 2


async def test_start_waits_for_started_and_raises_an_early_failure() -> None:
    async def bad(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        raise OSError(28, "inotify watch limit reached")

    restarts = 0
    failed_once = anyio.Event()

    async def watcher(*, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
        nonlocal restarts
        restarts += 1
        task_status.started("watching")
        if restarts == 1:
            failed_once.set()
            raise RuntimeError("observer loop broke")
        await anyio.sleep_forever()

    async with BackgroundTasks(policy=FAST) as tasks:
        with pytest.raises(OSError, match="inotify watch limit reached"):
            await tasks.start("file watcher", bad)
        assert tasks.running == 0
        assert await tasks.start("file watcher", watcher) == "watching"
        with anyio.fail_after(DEADLINE_S):
            await failed_once.wait()
            while restarts < 2:
                await anyio.sleep(0.01)
        assert tasks.running == 1  # restarted after its backoff, without task_status
        assert tasks.status().last_error.message == "RuntimeError: observer loop broke"  # type: ignore[union-attr]


async def test_every_waits_at_least_a_period_and_backs_off_on_failures() -> None:
    ticks: list[bool] = []
    enough = anyio.Event()

    async def tick() -> None:
        ticks.append(True)
        if len(ticks) == 5:
            enough.set()
        if len(ticks) in (2, 3):
            raise RuntimeError(f"tick {len(ticks)} failed")

    async with BackgroundTasks(policy=RetryPolicy(base_ms=1, max_ms=2)) as tasks:
        tasks.every("interval sync", 1, tick, first_ms=0)
        with anyio.fail_after(DEADLINE_S):
            await enough.wait()
        status = tasks.status()
    assert status.last_error is not None
    assert (status.last_error.message, status.last_error.failures, status.last_error.retry_in_ms) == (
        "RuntimeError: tick 3 failed", 2, 2)
    assert status.failing == []  # tick 4 succeeded


async def test_the_body_is_not_cancelled_and_its_errors_pass_through_unchanged() -> None:
    async def forever() -> None:
        await anyio.sleep_forever()

    with pytest.raises(UsageError, match="mine"):
        async with BackgroundTasks() as tasks:
            tasks.start_soon("watcher", forever)
            raise UsageError("mine")
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.05):
            async with BackgroundTasks() as tasks:
                tasks.start_soon("watcher", forever)
                await anyio.sleep_forever()
    async with BackgroundTasks() as tasks:
        tasks.start_soon("watcher", forever)
        async with anyio.create_task_group() as tg:  # closed from another task
            tg.start_soon(tasks.aclose)
        assert tasks.running == 0 and not tasks.is_open
        await anyio.sleep(0)  # the body itself goes on
        assert tasks.start_soon("late", forever) is False


async def test_closing_leaves_no_pending_asyncio_task() -> None:
    before = {t for t in asyncio.all_tasks() if not t.done()}

    async def forever() -> None:
        await anyio.sleep_forever()

    async with BackgroundTasks() as tasks:
        for name in ("watcher", "interval sync", "rescan"):
            tasks.start_soon(name, forever)
        sub = tasks.subgroup("qmd")
        sub.start_soon("embed timer", forever)
        assert (tasks.running, sub.running) == (4, 1)
        await sub.aclose()
        assert (tasks.running, sub.running) == (3, 0)
    assert {t for t in asyncio.all_tasks() if not t.done()} == before


async def test_starting_without_an_open_group_is_a_usage_error() -> None:
    tasks = BackgroundTasks()

    async def job() -> None:
        return None

    with pytest.raises(UsageError, match="use `async with MemoryManager"):
        tasks.start_soon("boot sync", job)
    with pytest.raises(UsageError, match="use `async with MemoryManager"):
        await tasks.start("file watcher", job)
