"""A small on-disk cache of qmd probe results, so one-shot CLI calls don't pay for them.

Each ``qmdbridge search`` in qmd mode would otherwise start qmd three times: ``--version``
(is this a real qmd, is its runtime there?), ``--help`` (does it take several ``-c``?) and
the search itself; under Bun each start costs ~100 ms. Successful probes are remembered in
``<stateDir>/qmd/probe-cache.json`` keyed by the configured command and ``PATH``, and are valid
while the executable's size and mtime are unchanged and the entry is younger than
``PROBE_CACHE_TTL_MS``. A failed search through qmd drops the entry (the manager calls
:meth:`ProbeCache.forget`), so a broken or replaced qmd is probed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from fallback.fs.atomic import write_atomic
from qmdbridge.qmd.locate import QmdLocation

__all__ = ["PROBE_CACHE_TTL_MS", "ProbeCache"]

# How long a successful probe is trusted without looking again (ms): one hour.
PROBE_CACHE_TTL_MS = 3_600_000


def _stat_key(path: str | None) -> list[int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


class ProbeCache:
    """Probe results per (command, PATH).

    Args:
        path: the JSON file (``<stateDir>/qmd/probe-cache.json``).
        now_ms: clock in epoch ms.
    """

    def __init__(self, path: Path, *, now_ms: Any = None) -> None:
        self.path = path
        self._now = now_ms or (lambda: int(time.time() * 1000))

    @staticmethod
    def key(command: str | Sequence[str], path_env: str) -> str:
        """Cache key of a configured command (string or list form) under a ``PATH``."""
        text = command if isinstance(command, str) else "\x1f".join(command)
        return hashlib.sha256(f"{text}\0{path_env}".encode()).hexdigest()[:32]

    def _load(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, orjson.dumps(data))
        except OSError:
            pass  # a cache that cannot be written only costs a probe

    def get(self, key: str) -> tuple[QmdLocation, dict[str, Any]] | None:
        """The cached usable location and its extras (e.g. ``multiC``), or ``None``."""
        entry = self._load().get(key)
        if not isinstance(entry, dict):
            return None
        try:
            location = QmdLocation(**entry["location"])
        except (KeyError, TypeError):
            return None
        fresh = self._now() - int(entry.get("atMs", 0)) < PROBE_CACHE_TTL_MS
        if not fresh or not location.usable or _stat_key(location.path) != entry.get("stat"):
            return None
        return location, dict(entry.get("extras") or {})

    def put(self, key: str, location: QmdLocation, **extras: Any) -> None:
        """Remember a usable location (and extras, merged with earlier ones)."""
        if not location.usable:
            return
        data = self._load()
        found = data.get(key)
        old: dict[str, Any] = found if isinstance(found, dict) else {}
        data[key] = {"location": dataclasses.asdict(location), "stat": _stat_key(location.path),
                     "atMs": self._now(), "extras": {**(old.get("extras") or {}), **extras}}
        self._save(data)

    def forget(self, key: str) -> None:
        """Drop an entry (after a failure through qmd)."""
        data = self._load()
        if data.pop(key, None) is not None:
            self._save(data)
