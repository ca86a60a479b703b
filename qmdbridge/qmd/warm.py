"""The warm qmd child: one ``qmd mcp`` per agent in long-lived mode, answering ``query`` searches and ``search``-mode questions over stdio.

How and why: docs/qmd.md, "The warm qmd child".
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream

from fallback.background import BackgroundTasks, RetryPolicy
from fallback.index.racy import wall_clock_ms
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.errors import QmdMcpError
from qmdbridge.qmd.index_health import db_identity
from qmdbridge.qmd.mcp_client import EOF_REASON, McpStdioClient
from qmdbridge.qmd.query_text import POOL_FACTOR, encode_query
from qmdbridge.qmd.results_json import QmdEntry, entry_from_json, is_result_object
from qmdbridge.qmd.runner import kill_and_reap, parent_death_argv, process_command
from qmdbridge.qmd.search_calls import CallPlan
from qmdbridge.qmd.streams import TailBuffer

__all__ = ["WarmChild", "entries_from_mcp", "strip_line_numbers"]

log = logging.getLogger("qmdbridge.qmd.warm")

# What the child serves, as status reports it: ``query`` searches and ``search``-mode questions.
SERVES = ("query", "search")
# A child that served this long before it died restarts after the first backoff step again, ms.
STABLE_UPTIME_MS = 60_000
# A child that closed its stdout gets this long to exit, so its exit status is reported, seconds.
EXIT_GRACE_S = 1.0
# Characters of the child's stderr kept for error messages (the tail).
TAIL_CHARS = 4_000


def strip_line_numbers(snippet: str, first_line: int) -> str:
    """Undo qmd's ``addLineNumbers(snippet, first_line)``.

    Raises:
        QmdMcpError: a line without its exact prefix (``transport=False``).
    """
    out = []
    for i, line in enumerate(snippet.split("\n")):
        prefix = f"{first_line + i}: "
        if not line.startswith(prefix):
            raise QmdMcpError(f"qmd mcp query: snippet line {i + 1} lacks its {prefix!r} prefix",
                              transport=False)
        out.append(line[len(prefix):])
    return "\n".join(out)


def entries_from_mcp(structured: Mapping[str, Any]) -> list[QmdEntry]:
    """The ``query`` tool's ``structuredContent`` as the entries ``qmd query --json`` would give
    (``file`` as a ``qmd://`` URI, line numbers stripped, through ``results_json.entry_from_json``).

    Raises:
        QmdMcpError: not ``{"results": [objects]}``, a result naming no file, or a malformed
            snippet (``transport=False``).
    """
    results = structured.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise QmdMcpError("qmd mcp query: structuredContent.results is not a list of objects",
                          transport=False)
    out: list[QmdEntry] = []
    for item in results:
        if not is_result_object(item):
            raise QmdMcpError(f"qmd mcp query: a result names no file: {str(item)[:120]}",
                              transport=False)
        obj = dict(item)
        if isinstance(obj.get("file"), str) and not obj["file"].lower().startswith("qmd://"):
            obj["file"] = f"qmd://{obj['file']}"
        if obj.get("docid") in ("#", ""):
            obj.pop("docid")
        snippet, line = obj.get("snippet"), obj.get("line")
        if isinstance(snippet, str):
            first = line if isinstance(line, int) and not isinstance(line, bool) else 1
            obj["snippet"] = strip_line_numbers(snippet, first) or None
        out.append(entry_from_json(obj))
    return out


class _StartFailed(Exception):
    """One start of the child failed (the reason is the message)."""


class WarmChild:
    """A supervised ``qmd mcp`` child (stdio transport) that answers ``query``-mode searches.

    ``startup_budget_ms``: how long one start may take until ``initialize`` answers (> 0);
    ``index_db``: a child whose ``index.sqlite`` was replaced is restarted, the call spawned
    (``None``: not checked); ``policy``: restart backoff (default 1 s doubling to 5 min).
    :meth:`attach` a task group, :meth:`launch` it (or let the first search), :meth:`close` it.
    """

    name = "qmd mcp child"

    def __init__(self, *, argv: list[str], env: Mapping[str, str], cwd: Path,
                 startup_budget_ms: int, policy: RetryPolicy | None = None,
                 now_ms: Callable[[], int] | None = None, index_db: Path | None = None) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._index_db = index_db
        self._db_ident: tuple[int, int] | None = None  # the index file the ready child opened
        self.startup_budget_ms = startup_budget_ms
        self.policy = policy or RetryPolicy()
        self._now = now_ms or wall_clock_ms
        self._tasks: BackgroundTasks | None = None
        self._client: McpStdioClient | None = None
        self._calls = anyio.Lock()  # one call in flight at a time (module docstring)
        self._failed: anyio.Event | None = None
        self._changed: anyio.Event | None = None  # set (and replaced) on every state change
        self._scope: anyio.CancelScope | None = None
        self._closed = False
        self.state = "idle"  # idle | starting | ready | down | stopped
        self.pid: int | None = None
        self.starts = 0  # times a child became ready
        self.restarts = 0  # children started after the first
        self.answered = 0  # collection searches the child answered
        self.spawn_fallbacks = 0  # collection searches spawned instead
        self.last_error: str | None = None
        self.last_error_at_ms: int | None = None
        self.ready_at_ms: int | None = None
        self.startup_ms: int | None = None
        self.retry_at_ms: int | None = None
        self.server_version: str | None = None

    def attach(self, tasks: BackgroundTasks) -> None:
        """Remember the task group the supervisor runs in."""
        self._tasks = tasks

    def launch(self) -> bool:
        """Start the supervisor unless it runs or the child is closed; whether it started now."""
        if self._closed or self._tasks is None or not self._tasks.is_open:
            return False
        return self._tasks.start_soon(self.name, self._supervise, retry=True, dedupe=True)

    @property
    def ready(self) -> bool:
        """Whether a child answers now."""
        return self.state == "ready" and self._client is not None

    async def wait_for(self, predicate: Callable[[WarmChild], bool]) -> None:
        """Return once ``predicate(self)`` holds, re-checked on every state change."""
        while not predicate(self):
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    async def close(self) -> None:
        """Stop the supervisor and kill the child's process group; idempotent."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        await self.wait_for(lambda w: w.state in ("stopped", "idle"))
        if self.state != "stopped":  # the task group was cancelled first, or it never ran
            self.state = "stopped"
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        if changed is not None:
            changed.set()

    def _error(self, message: str) -> None:
        self.last_error, self.last_error_at_ms = message, self._now()
        log.warning("%s", message)

    async def _supervise(self) -> None:
        failures = 0
        try:
            with anyio.CancelScope() as self._scope:
                if self._closed:
                    return
                while True:
                    served_ms = await self._generation()
                    failures = 1 if served_ms >= STABLE_UPTIME_MS else failures + 1
                    delay_ms = self.policy.delay_ms(failures)
                    self.state, self.retry_at_ms = "down", self._now() + delay_ms
                    self._notify()
                    await anyio.sleep(delay_ms / 1000)
                    self.restarts += 1
        finally:
            self._scope, self.retry_at_ms = None, None
            self.state = "stopped" if self._closed else "idle"
            self._notify()

    async def _generation(self) -> int:
        """One child from spawn to death; how long it served in ms (-1: never ready)."""
        self.state, self.pid, self.retry_at_ms = "starting", None, None
        self._notify()
        started = time.monotonic()
        try:
            process = await anyio.open_process(
                process_command(parent_death_argv(self._argv)), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(self._cwd), env=self._env,
                start_new_session=True)
        except OSError as exc:
            self._error(f"qmd mcp child could not start: {exc}")
            return -1
        assert process.stdin is not None and process.stdout is not None
        self.pid = process.pid
        self._notify()
        client = McpStdioClient(process.stdin, process.stdout)
        tail = TailBuffer(TAIL_CHARS)
        start_failure: str | None = None
        ready_at: float | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, process.stderr, tail)
                tg.start_soon(_cancel_after, client.run, tg.cancel_scope)
                tg.start_soon(_cancel_after, process.wait, tg.cancel_scope)
                try:
                    await self._wait_ready(client)
                except _StartFailed as exc:
                    start_failure = str(exc)
                    tg.cancel_scope.cancel()
                else:
                    ready_at = time.monotonic()
                    failed = self._failed = anyio.Event()  # set by a call whose connection failed
                    self._client, self.state, self.starts = client, "ready", self.starts + 1
                    self._db_ident = db_identity(self._index_db) if self._index_db is not None else None
                    self.ready_at_ms, self.startup_ms = self._now(), int((ready_at - started) * 1000)
                    log.info("qmd mcp child ready (pid %s, stdio, %d ms)", self.pid, self.startup_ms)
                    self._notify()
                    await failed.wait()
                    tg.cancel_scope.cancel()
        finally:
            self._client, self._failed = None, None
            broken = client.broken  # set when the child ended the connection, not by us
            with anyio.CancelScope(shield=True):
                if process.returncode is None and broken == EOF_REASON:
                    with anyio.move_on_after(EXIT_GRACE_S):  # report its exit status if it exits
                        await process.wait()
                exited = process.returncode is not None
                client.close()
                await kill_and_reap(process)
                with anyio.move_on_after(EXIT_GRACE_S):  # what it wrote last, to its end
                    await _drain(process.stderr, tail)
                await process.aclose()  # its pipes
        when = "before it answered" if ready_at is None else "while serving"
        if exited:
            code = process.returncode
            status = f"signal {-code}" if code is not None and code < 0 else f"code {code}"
            self._error(f"qmd mcp child (pid {process.pid}) exited ({status}; last output: "
                        f"{_last_line(tail.text())}) {when}")
        elif broken is not None:
            self._error(f"qmd mcp child (pid {process.pid}) {when}: {broken} "
                        f"(last stderr: {_last_line(tail.text())})")
        elif start_failure is not None:
            self._error(f"qmd mcp child (pid {process.pid}) did not start: {start_failure}")
        return -1 if ready_at is None else int((time.monotonic() - ready_at) * 1000)

    async def _wait_ready(self, client: McpStdioClient) -> None:
        with anyio.move_on_after(self.startup_budget_ms / 1000) as budget:
            try:
                info = await client.initialize()
            except QmdMcpError as exc:
                raise _StartFailed(exc.reason) from None
            self.server_version = info.serverInfo.version or None
        if budget.cancelled_caught:
            raise _StartFailed(f"no answer within {self.startup_budget_ms}ms "
                               "(memory.qmd.update.commandTimeoutMs)")

    async def search(self, q: str, coll: ManagedCollection, plan: CallPlan) -> list[QmdEntry] | None:
        """One collection's call through the child, in qmd's order as ``qmd query --json`` gives it:
        in ``search`` mode with ``plan.lex`` one call of typed ``lex`` sub-searches (no model, no
        rerank; ``POOL_FACTOR * plan.limit`` documents, score ``1 / rank``), in ``query`` mode the
        query ``-n plan.limit`` (``plan.no_rerank``). ``None`` when the spawn path must answer
        (another mode, the child not ready, which launches it, or the call failed).

        Raises:
            BackendTimeoutError: past the search deadline (names ``memory.qmd.limits.timeoutMs``).
        """
        target = {"minScore": 0, "collections": [coll.name]}
        if plan.mode == "search" and plan.lex:
            limit = POOL_FACTOR * plan.limit
            searches = [{"type": "lex", "query": t} for t in plan.lex]
            return await self._call({**target, "searches": searches, "limit": limit, "rerank": False},
                                    plan, f"qmd lex searches -n {limit} -c {coll.name} -- "
                                    f"{' | '.join(plan.lex)}", hung_on_timeout=True)
        if plan.mode != "query" or self._closed:
            return None
        args: dict[str, Any] = {**target, "query": encode_query(q, "query"), "limit": plan.limit}
        if plan.no_rerank:
            args["rerank"] = False
        return await self._call(args, plan, f"qmd query --json -n {plan.limit}"
                                f"{' --no-rerank' if plan.no_rerank else ''} -c {coll.name} -- {q}")

    async def _call(self, args: dict[str, Any], plan: CallPlan, what: str, *,
                    hung_on_timeout: bool = False) -> list[QmdEntry] | None:
        """One ``query`` tool call; ``what`` names it in messages. With ``hung_on_timeout`` a call past
        the deadline also restarts the child (``lex`` searches take milliseconds)."""
        client, failed = self._client, self._failed  # both set when the child became ready
        if not self.ready or client is None or failed is None:
            self.launch()
            self.spawn_fallbacks += 1
            return None
        summary = f"{what} (warm qmd mcp, pid {self.pid})"
        ident = db_identity(self._index_db) if self._index_db is not None else None
        if self._db_ident is None:
            self._db_ident = ident
        elif ident != self._db_ident:
            self.spawn_fallbacks += 1
            self._error(f"qmd's index {self._index_db} was replaced since the qmd mcp child (pid "
                        f"{self.pid}) opened it; restarting the child, spawning qmd meanwhile")
            failed.set()  # the supervisor kills and restarts this child
            return None
        try:
            with anyio.fail_after(max(0, plan.remaining_ms()) / 1000):
                async with self._calls:
                    structured = await client.call_tool("query", args)
            entries = entries_from_mcp(structured)
        except TimeoutError:
            if hung_on_timeout:
                self._error(f"{summary} did not answer within {plan.timeout_ms} ms; restarting it")
                failed.set()  # the supervisor kills and restarts this child
            raise plan.timeout(summary) from None
        except QmdMcpError as exc:
            self.spawn_fallbacks += 1
            self._error(f"{exc.reason}; spawning qmd for this search")
            if exc.transport:
                failed.set()  # the supervisor kills and restarts this child
            return None
        self.answered += 1
        return entries

    def describe(self) -> dict[str, Any]:
        """Status view: ``{enabled, state, serves, transport, pid, restarts, answered, spawnFallbacks,
        lastError, lastErrorAtMs, readyAtMs, startupMs, retryInMs, serverVersion}``."""
        running = self.state in ("starting", "ready")
        retry_in = None if self.retry_at_ms is None else max(0, self.retry_at_ms - self._now())
        return {"enabled": True, "state": self.state, "serves": list(SERVES), "transport": "stdio",
                "pid": self.pid if running else None, "restarts": self.restarts,
                "answered": self.answered, "spawnFallbacks": self.spawn_fallbacks,
                "lastError": self.last_error, "lastErrorAtMs": self.last_error_at_ms,
                "readyAtMs": self.ready_at_ms, "startupMs": self.startup_ms, "retryInMs": retry_in,
                "serverVersion": self.server_version}


async def _drain(stream: ByteReceiveStream | None, tail: TailBuffer) -> None:
    """Read the child's stderr to its end into ``tail`` (the pipe must never fill)."""
    if stream is None:
        return
    async for chunk in stream:
        tail.feed(chunk)


async def _cancel_after(wait: Callable[[], Awaitable[object]], scope: anyio.CancelScope) -> None:
    """End the child's generation once ``wait()`` returns (the connection ended, the child exited)."""
    await wait()
    scope.cancel()


def _last_line(text: str) -> str:
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return last[:200]
