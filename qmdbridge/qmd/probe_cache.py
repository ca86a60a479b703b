"""An on-disk cache of successful qmd ``--version`` probes, so one-shot CLI calls don't pay for them.

Entries in ``<stateDir>/qmd/probe-cache.json`` are keyed by the configured command and
``PATH``, valid for :data:`PROBE_CACHE_TTL_MS` while the executable's stat is unchanged; a
failed search drops its entry. Reading takes the standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qmdbridge.qmd.locate import QmdLocation

__all__ = ["PROBE_CACHE_TTL_MS", "ProbeCache", "cached_location", "probe_key"]

# How long a successful probe is trusted without looking again (ms): one hour.
PROBE_CACHE_TTL_MS = 3_600_000


def _stat_key(path: str | None) -> list[int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino]


def probe_key(command: str | Sequence[str], path_env: str) -> str:
    """Cache key of a configured command (string or list form) under a ``PATH``."""
    text = command if isinstance(command, str) else "\x1f".join(command)
    return hashlib.sha256(f"{text}\0{path_env}".encode()).hexdigest()[:32]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _valid(entry: Any, now_ms: int) -> dict[str, Any] | None:
    """The location fields of a cache entry while it holds (fresh, usable, the executable unchanged)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("location"), dict):
        return None
    loc = entry["location"]
    try:
        fresh = now_ms - int(entry.get("atMs", 0)) < PROBE_CACHE_TTL_MS
    except (TypeError, ValueError):
        return None
    usable = loc.get("found") is True and loc.get("runtime_ok") is True and loc.get("version") is not None
    if not fresh or not usable or _stat_key(loc.get("path")) != entry.get("stat"):
        return None
    return loc


def cached_location(path: Path, command: str | Sequence[str], env: Mapping[str, str], *,
                    now_ms: int | None = None) -> dict[str, Any] | None:
    """The cached location (``path``, ``child_path`` ...) for ``memory.qmd.command`` under
    ``env``'s ``PATH`` in the cache file ``path``, or ``None`` when the sidecar would probe
    (``now_ms``: epoch ms, default now); standard library only."""
    entry = _load(path).get(probe_key(command, env.get("PATH", "")))
    return _valid(entry, int(time.time() * 1000) if now_ms is None else now_ms)


class ProbeCache:
    """Probe results per (command, PATH) in the JSON file ``path``; ``now_ms`` is the clock in epoch ms."""

    def __init__(self, path: Path, *, now_ms: Any = None) -> None:
        self.path = path
        self._now = now_ms or (lambda: int(time.time() * 1000))

    def _save(self, data: dict[str, Any]) -> None:
        import orjson

        from fallback.fs.atomic import write_atomic

        with contextlib.suppress(OSError):  # a cache that cannot be written only costs a probe
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, orjson.dumps(data))

    def get(self, key: str) -> QmdLocation | None:
        """The cached usable location, or ``None``."""
        from qmdbridge.qmd.locate import QmdLocation

        loc = _valid(_load(self.path).get(key), self._now())
        try:
            return None if loc is None else QmdLocation(**loc)
        except TypeError:
            return None

    def put(self, key: str, location: QmdLocation) -> None:
        """Remember a usable location."""
        if location.usable:
            data = _load(self.path)
            data[key] = {"location": dataclasses.asdict(location), "stat": _stat_key(location.path),
                         "atMs": self._now()}
            self._save(data)

    def forget(self, key: str) -> None:
        """Drop an entry (after a failure through qmd)."""
        data = _load(self.path)
        if data.pop(key, None) is not None:
            self._save(data)
