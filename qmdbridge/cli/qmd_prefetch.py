"""The one-shot ``qmdbridge search`` in qmd mode starts its qmd calls before it loads the config.

The calls are made with the backend's own functions (``qmdbridge/qmd/query_text.py``) in a
thread; the search takes them through ``qmdbridge/qmd/early.py``. Standard library and light
modules only. When nothing starts ahead: docs/cli.md, "In qmd mode".
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from qmdbridge.cli.common import verbose_note
from qmdbridge.qmd.early import EarlyCalls
from qmdbridge.qmd.streams import QmdProcess

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

    from qmdbridge.paths import QmdHome

__all__ = ["MAX_AHEAD", "ahead_limit", "breaker_healthy", "start_prefetch"]

# Calls started ahead running at once, at most (search_calls.MAX_PARALLEL_CALLS; ahead_limit: cores).
MAX_AHEAD = 4
# The fields of the recorded "qmd" settings and their types.
_FIELDS: dict[str, tuple[type, ...]] = {
    "command": (str,), "childPath": (str, type(None)), "stateDir": (str,), "agentId": (str,),
    "workspace": (str,), "collections": (list,), "maxResults": (int,), "marker": (str,),
    "indexYml": (list, type(None)), "probeCommand": (str, list)}


def ahead_limit() -> int:
    """How many calls may run ahead at once: the usable cores but one (the start-up's),
    from 1 to :data:`MAX_AHEAD`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_AHEAD, cores - 1))


def breaker_healthy(breaker: Path) -> bool:
    """Whether a breaker file records no failure (or is absent); an unreadable one counts as one."""
    try:
        state = json.loads(breaker.read_bytes())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("failures", 0) == 0


def _unchanged(qmd: dict[str, Any], home: QmdHome) -> bool:
    """The reconcile marker and ``index.yml`` as recorded, and neither breaker holding a failure."""
    from qmdbridge.qmd.index_stats import file_stamp

    try:
        marker = home.reconciled.read_text()
    except OSError:
        return False
    stamp = file_stamp(home.index_yml)
    return (marker == qmd["marker"] and stamp is not None and list(stamp) == qmd["indexYml"]
            and breaker_healthy(home.breaker) and breaker_healthy(home.startup_breaker))


def start_prefetch(args: argparse.Namespace, doc: dict[str, Any], env: Mapping[str, str] | None = None,
                   *, calls: EarlyCalls | None = None) -> EarlyCalls | None:
    """Start the qmd calls of this ``search`` ahead (in a thread), from its recorded ``doc``
    (``backend`` ``qmd``), into ``calls`` (default a new :class:`EarlyCalls`; the CLI passes the
    one it closes, made before anything starts, so a signal still finds every call).

    Returns:
        The calls (their ``run_command`` is the search's qmd runner), or ``None`` when nothing
        is started.
    """
    from fallback.errors import UsageError
    from qmdbridge.paths import qmd_home

    e = os.environ if env is None else env
    qmd = doc.get("qmd")
    if os.name != "posix" or not isinstance(qmd, dict) or not all(
            isinstance(qmd.get(k), t) for k, t in _FIELDS.items()):
        return None
    try:
        home = qmd_home(Path(qmd["stateDir"]), qmd["agentId"])
    except UsageError:  # not an agent id this version recorded
        return None
    if not _unchanged(qmd, home) or not home.index_db.is_file() or not _probed(qmd, home, e):
        return None
    calls = EarlyCalls() if calls is None else calls
    thread = threading.Thread(target=_start_calls, name="qmd-prefetch", daemon=True,
                              args=(calls, args, qmd, dict(e)))
    calls.attach(thread)
    thread.start()
    return calls


def _probed(qmd: dict[str, Any], home: QmdHome, env: Mapping[str, str]) -> bool:
    """Whether the search will run the recorded qmd without probing it first: the probe
    cache holds it, as the sidecar looks it up, at the recorded path and child ``PATH``."""
    from qmdbridge.qmd.probe_cache import cached_location

    if isinstance(qmd["probeCommand"], list) and not all(isinstance(a, str) for a in qmd["probeCommand"]):
        return False
    loc = cached_location(home.probe_cache, qmd["probeCommand"], env)
    return loc is not None and loc.get("path") == qmd["command"] and loc.get("child_path") == qmd["childPath"]


def _start_calls(calls: EarlyCalls, args: argparse.Namespace, qmd: dict[str, Any],
                 env: dict[str, str]) -> None:
    """The thread: one call per collection qmd's index holds documents of, as the backend makes
    it; a defect only costs the head start (noted with ``-v``)."""
    try:
        from qmdbridge.paths import child_env, qmd_home
        from qmdbridge.qmd.index_stats import index_counts
        from qmdbridge.qmd.query_text import (
            lex_queries,
            qmd_argv,
            search_call,
            search_env,
            search_limits,
            search_words,
            without_stray_quote,
        )

        home = qmd_home(Path(qmd["stateDir"]), qmd["agentId"])
        counts, err = index_counts(home.index_db, log_errors=False)  # logging is not set up yet
        if err is not None:  # (the search reads it again and logs it)
            verbose_note(args, f"qmd calls not started ahead: {err}")
            return
        colls = [str(c) for c in qmd["collections"] if not counts or counts.get(str(c), 0) > 0]
        if not colls:
            return
        child = search_env(child_env(home, parent_env=env, path_env=qmd["childPath"] or env.get("PATH", "")))
        limit, _ = search_limits(qmd["maxResults"], args.max_results, None)
        first, words = search_words(without_stray_quote(args.query.strip()), "search")
        lex = lex_queries(first, words)
        started: list[QmdProcess] = []
        running = ahead_limit()  # at most this many at once; stop once one is not started
        for coll in colls:       # (the search took it first, it failed to start, or discarded)
            flags, positional, _ = search_call(first, coll, mode="search", limit=limit, lex=lex)
            if not calls.wait(started, running_below=running) or (call := calls.start(
                    qmd_argv(qmd["command"], flags, [positional]), child, qmd["workspace"])) is None:
                return
            started.append(call)
    except Exception as exc:  # the CLI edge: nothing may reach stderr from this thread
        verbose_note(args, f"qmd calls not started ahead: {exc!r}")
