"""Starting the qmd sidecar for one manager: probe (cached), build, start-up, start-up breaker.

The start-up runs under its own budgets, never a search deadline; concurrent callers join one
start-up; a qmd that cannot start opens the start-up breaker, never the search breaker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from functools import cached_property
from typing import Any, Literal

import anyio
from pydantic.alias_generators import to_camel

from fallback.background import BackgroundTasks
from fallback.contract import MemoryBackend
from fallback.errors import ManagerClosedError, MemorySearchError, UsageError
from qmdbridge.config import ResolvedAgent
from qmdbridge.paths import qmd_home
from qmdbridge.policy.breaker import CircuitBreaker
from qmdbridge.qmd.errors import one_line
from qmdbridge.qmd.probe_cache import ProbeCache, probe_key

__all__ = ["QmdSidecar"]

log = logging.getLogger("qmdbridge")


class QmdSidecar:
    """The qmd backend of one manager and its start-up; arguments as the manager's
    (:class:`~qmdbridge.manager.MemoryManager`), ``background`` returning its task group (raises
    ``UsageError`` when a long-lived manager was not entered)."""

    def __init__(self, agent: ResolvedAgent, *, mode: Literal["cli", "full"],
                 env: Mapping[str, str], now_ms: Callable[[], int],
                 background: Callable[[], BackgroundTasks], runner: Any = None) -> None:
        self.agent = agent
        self._runner = runner
        self.mode = mode
        self._env = dict(env)
        self._now = now_ms
        self._background = background
        command = agent.memory.qmd.command  # the scope: as one string, a list's words joined by U+001F
        self.breaker = CircuitBreaker(qmd_home(agent.state_dir, agent.agent_id).startup_breaker,
                                      scope=command if isinstance(command, str) else "\x1f".join(command))
        self.backend: MemoryBackend | None = None
        self.ready = False
        self.unavailable: str | None = None  # why the last start-up failed
        self.location: Any = None  # the last probe (reason, folders searched, PATH)
        self._starting: anyio.Event | None = None

    @cached_property
    def probe_cache(self) -> ProbeCache:
        """The on-disk cache of qmd probe results (``qmdbridge/qmd/probe_cache.py``)."""
        return ProbeCache(qmd_home(self.agent.state_dir, self.agent.agent_id).probe_cache, now_ms=self._now)

    @property
    def _probe_key(self) -> str:
        return probe_key(self.agent.memory.qmd.command, self._env.get("PATH", ""))

    def forget_probe(self) -> None:
        """Probe qmd again next time (it may have changed)."""
        self.probe_cache.forget(self._probe_key)

    async def get(self, *, wait: bool) -> tuple[MemoryBackend | None, str | None]:
        """``(backend, None)`` once qmd has started, else ``(None, reason)``; ``wait``: run or
        join the start-up here, else only make sure it runs in the background.

        Raises ``UsageError`` (a long-lived manager not entered) or ``ManagerClosedError``.
        """
        if self.ready:
            return self.backend, None
        running = self._starting
        now = self._now()
        if running is None and not self.breaker.allow(now):
            retry_s = self.breaker.describe(now)["retryInMs"] // 1000
            reason = self.unavailable or self.breaker.state.last_failure or "qmd did not start"
            return None, f"{reason} (start-up retry in {retry_s}s)"
        if not wait:
            if running is None:
                self._background().start_soon("qmd start-up", self._start, retry=False, dedupe=True)
            return None, "qmd is still starting (collections, boot update)"
        if running is not None:
            await running.wait()
        else:
            await self._start()
        return (self.backend, None) if self.ready else (None, self.unavailable or "qmd did not start")

    async def _start(self) -> None:
        """One start-up (probe, build, ``start``); the outcome goes to ``ready`` /
        ``unavailable`` and the start-up breaker."""
        if self.ready or self._starting is not None:
            return
        done = self._starting = anyio.Event()
        ok = False
        try:
            backend = self.backend or await self._build()
            if backend is not None:
                self.backend = backend
                await backend.start(self._background())
                ok = True
        except (ManagerClosedError, UsageError):
            raise
        except MemorySearchError as exc:
            self.unavailable = getattr(exc, "reason", None) or str(exc)
        except Exception as exc:  # fallback boundary: a qmd defect must not silence memory
            self.unavailable = f"{type(exc).__name__}: {exc}"
            log.exception("qmd start-up raised unexpectedly; the builtin engine answers")
        finally:
            if ok:
                self.ready, self.unavailable = True, None
                self.breaker.record_success(self._now())
            else:
                failed, self.backend = self.backend, None  # the next attempt starts afresh
                if failed is not None:
                    with anyio.CancelScope(shield=True):
                        await failed.close()
                if self.unavailable is not None:
                    reason = one_line(self.unavailable)
                    self.breaker.record_failure(reason, self._now())
                    self.forget_probe()
                    log.warning("qmd did not start; the builtin engine answers: %s", reason)
            self._starting = None
            done.set()

    async def _build(self) -> MemoryBackend | None:
        """Probe qmd (cached; at most ``limits.timeoutMs``) and build the backend; ``None`` with
        ``unavailable`` set when it is missing or not runnable."""
        from qmdbridge.qmd.backend import QmdBackend
        from qmdbridge.qmd.locate import PROBE_TIMEOUT_MS, probe_qmd

        location = self.probe_cache.get(self._probe_key)
        if location is None:
            # a hung qmd costs the first search no more than its own deadline
            probe_ms = min(PROBE_TIMEOUT_MS, self.agent.memory.qmd.limits.timeout_ms)
            location = await probe_qmd(self.agent.memory.qmd.command, env=self._env,
                                       timeout_ms=probe_ms)
            self.location = location
            if not location.usable:
                self.unavailable = location.reason or "qmd not available"
                return None
            self.probe_cache.put(self._probe_key, location)
        return QmdBackend(self.agent, location=location, mode=self.mode, env=self._env,
                          now_ms=self._now, runner=self._runner)

    def describe(self) -> dict[str, Any]:
        """Status view: ``{"startup": {state, lastError, breaker}, "locate": {...} | absent}``."""
        state = ("ready" if self.ready else "starting" if self._starting is not None
                 else "failed" if self.unavailable else "not started")
        out: dict[str, Any] = {"startup": {"state": state, "lastError": self.unavailable,
                                           "breaker": self.breaker.describe(self._now())}}
        if self.location is not None:  # the last probe, without the children's PATH
            out["locate"] = {to_camel(k): v for k, v in asdict(self.location).items() if k != "child_path"}
        return out

    async def close(self) -> None:
        """Close the backend (if one was built); idempotent."""
        backend, self.backend = self.backend, None
        self.ready = False
        if backend is not None:
            await backend.close()
