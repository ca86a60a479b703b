"""Circuit breaker for the qmd sidecar: one failure never makes the fallback permanent.

A cooldown doubling per consecutive failure (30 s up to 10 min), then one trial call; the state
is a JSON file per agent, shared by one-shot CLI processes (docs/qmd.md, "Faults and fallback").

Source: the circuit-breaker pattern (M. Nygard, *Release It!*, 2007).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from fallback.fs.atomic import write_atomic

__all__ = ["CircuitBreaker", "BreakerState", "breaker_scope"]

# First cooldown after a failure, in ms: long enough not to hammer a broken sidecar.
BASE_COOLDOWN_MS = 30_000
# Longest cooldown, in ms: a recovered qmd is picked up again within 10 minutes at worst.
MAX_COOLDOWN_MS = 600_000
# A closed breaker's success rewrites the file it last wrote at most this often, ms (a rename costs).
SUCCESS_SAVE_INTERVAL_MS = 5_000


class BreakerState(BaseModel):
    """Persisted breaker fields (epoch ms), camelCase in the file."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    failures: int = 0
    open_until_ms: int = 0
    scope: str = ""
    last_failure: str | None = None
    last_failure_at_ms: int | None = None
    last_success_at_ms: int | None = None


def breaker_scope(command: str | list[str], search_mode: str, env: Mapping[str, str]) -> str:
    """The search breaker's scope: the qmd command, the search mode and whether ``CI``
    is set, so a failure recorded in another setting never explains a search now."""
    return f"{command}\0{search_mode}\0ci={'1' if env.get('CI') else '0'}"


@dataclass
class CircuitBreaker:
    """Open/half-open/closed breaker with exponential cooldown, its state in the JSON file
    ``path`` (``None``: in memory); ``scope`` says what the failures are about, and a state
    recorded for another scope is ignored."""

    path: Path | None = None
    state: BreakerState = field(default_factory=BreakerState)
    scope: str = ""

    def __post_init__(self) -> None:
        # (inode, mtime_ns, size, success ms) of the file this breaker last wrote
        self._saved: tuple[int, int, int, int] | None = None
        self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            self.state = BreakerState.model_validate_json(self.path.read_bytes())
            if self.state.scope != self.scope:
                self.state = BreakerState(scope=self.scope)
        except OSError:
            return  # no shared file (yet, or not writable here): keep what this process knows
        except ValidationError:
            self.state = BreakerState(scope=self.scope)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Saved after qmd searches: no fsync on that path (a lost state only costs a probe).
            write_atomic(self.path, self.state.model_dump_json(by_alias=True).encode(), durable=False)
            st = self.path.stat()
            self._saved = (st.st_ino, st.st_mtime_ns, st.st_size, self.state.last_success_at_ms or 0)
        except OSError:
            self._saved = None
            # the breaker is advisory: a read-only state dir must not break searches

    def _unchanged_since_saved(self, now_ms: int) -> bool:
        """Whether the file is as this breaker wrote it, a success less than the save interval ago."""
        if self._saved is None or self.path is None:
            return False
        try:
            st = self.path.stat()
        except OSError:
            return False
        inode, mtime_ns, size, success_ms = self._saved
        return ((st.st_ino, st.st_mtime_ns, st.st_size) == (inode, mtime_ns, size)
                and 0 <= now_ms - success_ms < SUCCESS_SAVE_INTERVAL_MS)

    def allow(self, now_ms: int) -> bool:
        """Whether a call to the primary may be tried at ``now_ms`` (closed, or cooldown over)."""
        self._load()
        return self.state.failures == 0 or now_ms >= self.state.open_until_ms

    def record_success(self, now_ms: int) -> None:
        """Close the breaker; the file is rewritten unless nothing changed since this
        breaker wrote a success less than :data:`SUCCESS_SAVE_INTERVAL_MS` ago."""
        changed = self.state.failures != 0
        self.state = BreakerState(last_success_at_ms=now_ms, scope=self.scope,
                                  last_failure=self.state.last_failure,
                                  last_failure_at_ms=self.state.last_failure_at_ms)
        if changed or (self.path is not None and not self._unchanged_since_saved(now_ms)):
            self._save()

    def record_failure(self, reason: str, now_ms: int) -> int:
        """Open the breaker at ``now_ms``; returns the cooldown in ms."""
        self._load()
        failures = self.state.failures + 1
        cooldown = min(MAX_COOLDOWN_MS, BASE_COOLDOWN_MS * 2 ** (failures - 1))
        self.state = BreakerState(failures=failures, open_until_ms=now_ms + cooldown, scope=self.scope,
                                  last_failure=reason, last_failure_at_ms=now_ms,
                                  last_success_at_ms=self.state.last_success_at_ms)
        self._save()
        return cooldown

    def describe(self, now_ms: int | None = None) -> dict[str, Any]:
        """Status view: ``{state, failures, retryInMs, lastFailure, ...}``."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        mode = ("closed" if self.state.failures == 0
                else "half-open" if now >= self.state.open_until_ms else "open")
        return {"state": mode, "retryInMs": max(0, self.state.open_until_ms - now) if mode == "open" else 0,
                **self.state.model_dump(by_alias=True)}
