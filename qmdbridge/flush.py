"""Pre-compaction memory flush planner: whether the agent's extra "store durable memories" turn is due.

Running the turn is the agent runtime's job. It fires at most once per compaction cycle: the
count it last fired for is kept per session key in ``<state_dir>/memory-flush/<key>.json``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from fallback.errors import UsageError
from fallback.fs.atomic import write_atomic
from qmdbridge.config import CompactionSettings

__all__ = ["FlushPlan", "FlushPlanner", "flush_threshold_tokens", "should_flush",
           "workspace_is_writable"]

# Longest readable part of a state file name; a hash suffix keeps distinct keys distinct.
_MAX_KEY_NAME_CHARS = 80
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_DEFAULTS = CompactionSettings()  # the functions' defaults are agents.defaults.compaction's


def _is_count(value: object) -> bool:
    return not isinstance(value, bool) and (
        isinstance(value, int) or isinstance(value, float) and math.isfinite(value))


def flush_threshold_tokens(context_window: int, *, reserve_tokens_floor: int = _DEFAULTS.reserve_tokens_floor,
                           soft_threshold_tokens: int = _DEFAULTS.memory_flush.soft_threshold_tokens) -> int | None:
    """The session size (tokens) at which the flush is due: ``context_window`` (the model's, >
    0) minus ``reserve_tokens_floor`` (kept free for the reply and compaction, >= 0) minus
    ``soft_threshold_tokens`` (how far before compaction the flush fires, >= 0); ``None`` for an
    input that is not a finite number or out of range, or a threshold that is not positive."""
    values = (context_window, reserve_tokens_floor, soft_threshold_tokens)
    if not all(_is_count(v) for v in values):
        return None
    if context_window <= 0 or reserve_tokens_floor < 0 or soft_threshold_tokens < 0:
        return None
    threshold = int(context_window - reserve_tokens_floor - soft_threshold_tokens)
    return threshold if threshold > 0 else None


def should_flush(session_tokens: int, context_window: int, *, reserve_tokens_floor: int = _DEFAULTS.reserve_tokens_floor,
                 soft_threshold_tokens: int = _DEFAULTS.memory_flush.soft_threshold_tokens) -> bool:
    """Whether ``session_tokens`` (> 0) reached :func:`flush_threshold_tokens` of the other
    arguments (tokens, as there); False for an invalid input or threshold."""
    if not _is_count(session_tokens) or session_tokens <= 0:
        return False
    threshold = flush_threshold_tokens(context_window, reserve_tokens_floor=reserve_tokens_floor,
                                       soft_threshold_tokens=soft_threshold_tokens)
    return threshold is not None and session_tokens >= threshold


def _owner_writable(path: Path) -> bool:
    """``os.access`` and the owner's write bit (root passes ``os.access`` everywhere)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IWUSR) and os.access(path, os.W_OK)


def workspace_is_writable(workspace_dir: Path) -> bool:
    """Whether the agent could write ``memory/YYYY-MM-DD.md`` in ``workspace_dir``: the
    workspace is a writable folder and ``memory`` is missing or a writable folder."""
    if not workspace_dir.is_dir() or not _owner_writable(workspace_dir):
        return False
    memory_dir = workspace_dir / "memory"
    if memory_dir.is_symlink() or memory_dir.exists():
        return memory_dir.is_dir() and _owner_writable(memory_dir)
    return True


@dataclass(frozen=True)
class FlushPlan:
    """A due memory flush turn: its extra system prompt and user-side prompt, the session it is
    for, and the compaction cycle it belongs to (pass it to ``mark_fired``)."""

    system_prompt: str
    prompt: str
    session_key: str
    compaction_count: int


class FlushPlanner:
    """Plan pre-compaction memory flushes, at most one per session per compaction cycle:
    :meth:`plan` decides, :meth:`mark_fired` records once the turn ran, in
    ``<state_dir>/memory-flush/``; ``settings``: ``agents.defaults.compaction``. Every method
    raises ``UsageError`` for an empty session key."""

    def __init__(self, state_dir: Path, settings: CompactionSettings) -> None:
        self.state_dir = Path(state_dir)
        self.settings = settings

    def record_path(self, session_key: str) -> Path:
        """The state file of a session key: ``agent:main:main`` ->
        ``agent_main_main-<12 hex of its sha256>.json``."""
        if not session_key or not session_key.strip():
            raise UsageError("session key required for the memory flush planner")
        readable = _UNSAFE_NAME_CHARS.sub("_", session_key.strip())[:_MAX_KEY_NAME_CHARS]
        readable = readable.strip(".") or "session"
        digest = hashlib.sha256(session_key.encode("utf-8")).hexdigest()[:12]
        return self.state_dir / "memory-flush" / f"{readable}-{digest}.json"

    def last_fired(self, session_key: str) -> int | None:
        """The compaction count the flush last fired for; ``None`` without a readable record."""
        path = self.record_path(session_key)
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        count = data.get("compactionCount") if isinstance(data, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def plan(self, session_key: str, *, session_tokens: int, context_window: int,
             compaction_count: int, workspace_dir: Path) -> FlushPlan | None:
        """The flush turn to run now; ``None`` when disabled, below :func:`should_flush`
        (``session_tokens`` in the context now, ``context_window`` tokens), already fired for
        ``compaction_count`` (compactions so far, >= 0), or ``workspace_dir`` is read-only."""
        flush = self.settings.memory_flush
        due = (flush.enabled and should_flush(session_tokens, context_window,
                                              reserve_tokens_floor=self.settings.reserve_tokens_floor,
                                              soft_threshold_tokens=flush.soft_threshold_tokens)
               and self.last_fired(session_key) != compaction_count
               and workspace_is_writable(Path(workspace_dir)))
        return FlushPlan(system_prompt=flush.system_prompt, prompt=flush.prompt, session_key=session_key,
                         compaction_count=compaction_count) if due else None

    def mark_fired(self, session_key: str, *, compaction_count: int,
                   now_ms: int | None = None) -> Path:
        """Record ``{"sessionKey", "compactionCount", "firedAtMs"}`` atomically (``now_ms``: epoch
        ms, default now) for the cycle the flush ran in; returns its file.

        Raises ``OSError``: the state directory is not writable.
        """
        path = self.record_path(session_key)
        payload = orjson.dumps({"sessionKey": session_key, "compactionCount": compaction_count,
                                "firedAtMs": int(time.time() * 1000) if now_ms is None else now_ms})
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, payload)
        return path

    def forget(self, session_key: str) -> None:
        """Delete the record of a session."""
        self.record_path(session_key).unlink(missing_ok=True)
