"""qmd search calls: one call per collection, merged; each answer classified and repaired.

What is classified and how it is repaired: docs/qmd.md, "Faults and fallback".
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_any,
    wait_exponential,
)
from tenacity.stop import stop_base

from fallback.errors import BackendTimeoutError, BackendUnavailableError
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.errors import QmdBusyError, QmdCommandError, QmdOutputError, QmdQueryTooLongError, one_line
from qmdbridge.qmd.models import default_kinds, missing_models, model_kinds
from qmdbridge.qmd.parse import index_locked, merge_best
from qmdbridge.qmd.query_text import SEARCH_BUSY_TIMEOUT_MS, is_lex_call, search_call
from qmdbridge.qmd.results_json import QmdEntry, parse_qmd_json
from qmdbridge.qmd.runner import (
    RunResult,
    is_busy,
    is_crash_after_output,
    is_flag_rejection,
    is_missing_collection,
    is_vector_module_missing,
)
from qmdbridge.qmd.streams import DEFAULT_MAX_CHARS

__all__ = ["BUSY_ATTEMPTS", "MAX_PARALLEL_CALLS", "SEARCH_TIMEOUT_SETTING", "VEC0_HINT", "CallPlan",
           "FlagRejected", "MissingCollection", "VectorModuleMissing", "WarmSearch", "probe_search",
           "search_collections", "search_with_repairs"]

log = logging.getLogger("qmdbridge.qmd.backend")

# At most this many qmd processes per search at once (each is a Bun/Node start).
MAX_PARALLEL_CALLS = 4
# Attempts of a call answered SQLITE_BUSY (1 + retries), and the first backoff in seconds.
BUSY_ATTEMPTS = 4
BUSY_FIRST_WAIT_S = 0.1
# A busy answer is not retried when less than this is left of the search deadline, ms.
BUSY_MIN_LEFT_MS = 300
# The config key of the search deadline, named in timeout messages.
SEARCH_TIMEOUT_SETTING = "memory.qmd.limits.timeoutMs"
# The query of the health probe: one word that names no memory (a probe answers [] or hits).
PROBE_QUERY = "qmdbridge-health-probe"
# The hint when qmd cannot open its vector table (no such module: vec0).
VEC0_HINT = ("qmd cannot open its vector table (no such module: vec0): it runs under Bun while "
             "its sqlite-vec extension loads only under Node; searching with `search` (BM25) "
             "instead; run qmd with Node >= 22 (or set memory.qmd.searchMode to search)")

# run(args, positionals, timeout_ms) -> RunResult; raises BackendUnavailableError.
RunSearch = Callable[[list[str], list[str], int], Awaitable[RunResult]]
# What may answer a collection's call instead of a spawned qmd (``warm.WarmChild.search``); None: spawn.
WarmSearch = Callable[[str, ManagedCollection, "CallPlan"], Awaitable[list[QmdEntry] | None]]




class FlagRejected(Exception):
    """qmd rejected a flag of this mode."""


class MissingCollection(Exception):
    """qmd said a managed collection does not exist."""


class VectorModuleMissing(Exception):
    """qmd could not open its vector table (``no such module: vec0``)."""


class _NearDeadline(stop_base):
    """tenacity stop: too little of the deadline is left for another busy attempt."""

    def __init__(self, plan: CallPlan) -> None:
        self.plan = plan

    def __call__(self, retry_state: RetryCallState) -> bool:
        # another attempt takes as long as the busy one did (qmd's start and its busy wait)
        failed = retry_state.outcome.exception() if retry_state.outcome is not None else None
        took_ms = failed.result.duration_ms if isinstance(failed, _Busy) else SEARCH_BUSY_TIMEOUT_MS
        return self.plan.remaining_ms() < BUSY_MIN_LEFT_MS + took_ms


class _Busy(Exception):

    def __init__(self, result: RunResult) -> None:
        super().__init__(result.summary)
        self.result = result


@dataclass
class CallPlan:
    """What one search needs besides the query.

    Attributes:
        mode: ``search`` | ``vsearch`` | ``query``. limit: ``-n`` per call.
        no_rerank: pass ``--no-rerank``. deadline: ``anyio.current_time()`` all calls end by.
        timeout_ms: ``limits.timeoutMs``. models_dir / env: for the timeout hint.
        notes: receives one line per answer used despite a crash.
        index_db: qmd's index: a timeout while a writer holds it is busy (``None``: not checked).
        lex: a question's lexical searches, one ``lex`` call per collection (``()``: ``mode`` calls).
        repair: the mode switch made for good: ``"vec0"`` or ``"unsupported-search-flags"``.
    """

    mode: str
    limit: int
    no_rerank: bool
    deadline: float
    timeout_ms: int
    models_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    repair: str | None = None
    index_db: Path | None = None
    lex: tuple[str, ...] = ()

    def remaining_ms(self) -> int:
        """ms left before :attr:`deadline`."""
        return int((self.deadline - anyio.current_time()) * 1000)

    def timeout(self, summary: str) -> BackendTimeoutError:
        """The error of call ``summary`` past :attr:`deadline`, naming ``limits.timeoutMs``, with
        ``models missing or downloading? ...`` when ``mode`` needs models and qmd's cache has none."""
        wanted = default_kinds(model_kinds(self.mode, None), self.env)
        hint = None
        if wanted and len(missing_models(self.models_dir, wanted)) == len(wanted):
            hint = ("models missing or downloading? qmd's model cache is empty; run `qmdbridge warmup` "
                    "once, online")
        return BackendTimeoutError("qmd", summary, self.timeout_ms, setting=SEARCH_TIMEOUT_SETTING, hint=hint)


def _summary(args: list[str], q: str) -> str:
    return " ".join(["qmd", *args, "--", q])


async def _one(q: str, coll: ManagedCollection, plan: CallPlan, run: RunSearch) -> list[QmdEntry]:
    """One collection's call with the busy retries; the classified answer."""
    args, query, command = search_call(q, coll.name, mode=plan.mode, limit=plan.limit,
                                       no_rerank=plan.no_rerank, lex=plan.lex)
    summary = _summary(args, " | ".join(plan.lex) if is_lex_call(plan.mode, plan.lex) else q)
    attempts = 0
    busy_seen = False  # an attempt answered busy

    async def attempt() -> RunResult:
        nonlocal attempts, busy_seen
        attempts += 1
        remaining = plan.remaining_ms()
        if remaining <= 0:
            raise plan.timeout(summary)
        try:
            res = await run(args, [query], remaining)
        except BackendTimeoutError:
            # the deadline came while qmd waited for a writer: busy, not a qmd failure
            if busy_seen or (plan.index_db is not None
                             and await anyio.to_thread.run_sync(index_locked, plan.index_db)):
                raise QmdBusyError(summary, attempts=attempts) from None
            raise plan.timeout(summary) from None
        except QmdCommandError as exc:
            if exc.errno != errno.E2BIG:
                raise
            raise QmdQueryTooLongError(summary, query_bytes=len(os.fsencode(query)),
                                       os_error=exc.os_error or "", errno=exc.errno) from exc
        if not res.ok and is_busy(res.stderr):
            busy_seen = True
            raise _Busy(res)
        return res

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(_Busy),
        stop=stop_any(stop_after_attempt(BUSY_ATTEMPTS), _NearDeadline(plan)),
        wait=wait_exponential(multiplier=BUSY_FIRST_WAIT_S, min=BUSY_FIRST_WAIT_S, max=1.0),
        before_sleep=lambda state: log.info("qmd index busy (%s); retrying", summary), reraise=True)
    try:
        return _classify(await retrying(attempt), plan, command)
    except _Busy as busy:
        r = busy.result
        raise QmdBusyError(r.summary, attempts=attempts, returncode=r.returncode,
                           stdout_tail=r.stdout, stderr_tail=r.stderr) from None


def _classify(res: RunResult, plan: CallPlan, command: str) -> list[QmdEntry]:
    if res.stdout_truncated:
        raise QmdOutputError(f"{res.summary} produced too much output (limit {DEFAULT_MAX_CHARS} chars)")
    if res.ok:
        return parse_qmd_json(res.stdout, res.stderr, command=command)
    if is_flag_rejection(res.stderr):
        raise FlagRejected(f"{res.summary} rejected a flag: {res.stderr.strip()[:300]}")
    if is_missing_collection(res.stderr):
        raise MissingCollection(res.stderr.strip()[:300])
    if is_vector_module_missing(res.stderr):
        raise VectorModuleMissing(res.stderr.strip()[:300])
    if is_crash_after_output(res):
        try:
            entries = parse_qmd_json(res.stdout, "", command=command)
        except QmdOutputError:
            res.check()
            raise
        status = f"signal {res.signal}" if res.signal is not None else f"code {res.returncode}"
        crash = next((ln.strip() for ln in res.stderr.splitlines() if ln.strip()), "no message")
        note = (f"qmd {command} exited with {status} after printing a complete answer ({crash[:120]}); "
                "the answer was used")
        log.warning("%s", note)
        if note not in plan.notes:
            plan.notes.append(note)
        return entries
    res.check()
    return []


async def search_collections(q: str, colls: list[ManagedCollection], plan: CallPlan, *,
                             run: RunSearch, warm: WarmSearch | None = None,
                             limiter: anyio.CapacityLimiter | None = None
                             ) -> list[tuple[QmdEntry, str | None]]:
    """Search each of ``colls`` in its own call (``run``; the ``warm`` child first; at most ``limiter`` at once, default :data:`MAX_PARALLEL_CALLS`) and merge the hits.

    Returns:
        ``[(entry, collection name)]``, best score first, one per hit.

    Raises:
        FlagRejected / MissingCollection / VectorModuleMissing: from any call, in that order.
        BackendTimeoutError, QmdBusyError, QmdCommandError, QmdOutputError: a call failed.
    """
    answers: list[list[QmdEntry] | BaseException | None] = [None] * len(colls)
    limiter = limiter or anyio.CapacityLimiter(MAX_PARALLEL_CALLS)

    async def one(i: int, coll: ManagedCollection) -> None:
        async with limiter:
            try:
                answer = None if warm is None else await warm(q, coll, plan)
                answers[i] = answer if answer is not None else await _one(q, coll, plan, run)
            except (FlagRejected, MissingCollection, VectorModuleMissing, BackendUnavailableError) as exc:
                answers[i] = exc

    async with anyio.create_task_group() as tg:
        for i, coll in enumerate(colls):
            tg.start_soon(one, i, coll)
    failures = [a for a in answers if isinstance(a, BaseException)]
    for kind in (FlagRejected, MissingCollection, VectorModuleMissing, BackendTimeoutError,
                 QmdBusyError):
        picked = next((f for f in failures if isinstance(f, kind)), None)
        if picked is not None:
            raise picked
    if failures:
        raise failures[0]
    return merge_best((entry, coll.name) for coll, answer in zip(colls, answers, strict=True)
                      if isinstance(answer, list) for entry in answer)


async def search_with_repairs(q: str, colls: list[ManagedCollection], plan: CallPlan, *,
                              run: RunSearch, warm: WarmSearch | None,
                              reconcile: Callable[[], Awaitable[None]],
                              written: str | None = None, lexical: str | None = None
                              ) -> list[tuple[QmdEntry, str | None]]:
    """:func:`search_collections` with the repairs of its classified failures.

    A missing collection runs ``reconcile()`` and retries once; a rejected ``lex`` call becomes
    plain ``search`` calls (``plan.lex`` emptied); an unknown flag reruns with ``query`` (of
    ``written``); ``vec0`` reruns with ``search`` (of ``lexical``), both kept in ``plan.repair``.

    Raises:
        BackendUnavailableError: a repair did not help, or any failure of :func:`search_collections`.
    """
    def calls() -> Awaitable[list[tuple[QmdEntry, str | None]]]:
        return search_collections(q, colls, plan, run=run, warm=warm)

    try:
        try:
            return await calls()
        except MissingCollection:
            log.warning("qmd search failed because a managed collection is missing; "
                        "repairing collections and retrying once")
            await reconcile()
            return await calls()
    except VectorModuleMissing:
        if plan.mode != "search":
            log.warning("%s", VEC0_HINT)
            plan.repair = "vec0"
            plan.notes.append(VEC0_HINT)
            plan.mode, plan.no_rerank = "search", False
            q = lexical or q
            try:
                return await calls()
            except VectorModuleMissing:
                pass  # the lex call cannot open it either (below)
        if not is_lex_call(plan.mode, plan.lex):
            raise BackendUnavailableError("qmd", VEC0_HINT) from None
        # the lex call is a qmd query, which opened the vector table here: plain search calls
        log.warning("qmd query of lex searches cannot open the vector table; searching with "
                    "qmd search")
        plan.lex = ()
        return await calls()
    except FlagRejected as exc:
        if is_lex_call(plan.mode, plan.lex):  # no typed lex searches: the AND, then relaxed
            log.warning("qmd query rejected a flag of the lex searches; searching with qmd search")
            plan.lex = ()
            return await calls()
        if plan.mode == "query":
            raise BackendUnavailableError("qmd", str(exc)) from None
        log.warning("qmd %s does not support configured flags; retrying search with qmd query",
                    plan.mode)
        plan.repair = "unsupported-search-flags"
        plan.mode, plan.no_rerank = "query", False
        q = written or q
        try:
            return await calls()
        except (FlagRejected, MissingCollection, VectorModuleMissing) as again:
            raise BackendUnavailableError("qmd", f"qmd query fallback failed: {again}") from None
    except MissingCollection as exc:  # still missing after the repair
        raise BackendUnavailableError("qmd", str(exc)) from None


async def probe_search(run: RunSearch, *, timeout_ms: int) -> str | None:
    """One tiny real search (``qmd search --json -n 1``, no collection): ``None`` when qmd answered
    (or its index is busy), else why not, one line."""
    args = ["search", "--json", "-n", "1"]
    try:
        res = await run(args, [PROBE_QUERY], timeout_ms)
        if not res.ok and is_busy(res.stderr):
            return None  # qmd answered: a writer holds its index (status says indexing)
        parse_qmd_json(res.check().stdout, res.stderr, command="search")
    except BackendTimeoutError:
        return str(BackendTimeoutError("qmd", _summary(args, PROBE_QUERY), timeout_ms,
                                       setting=SEARCH_TIMEOUT_SETTING))
    except BackendUnavailableError as exc:
        return one_line(exc.reason)  # qmd's stack trace: the line naming the error
    return None
