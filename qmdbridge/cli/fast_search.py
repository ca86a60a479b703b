"""The one-shot ``qmdbridge search`` without a daemon: answered from a read-only connection when nothing changed.

An in-process search builds everything: the config's pydantic models, anyio and the
``MemoryManager``, the store's writer, the pre-search sync under the writer lock. Most one-shot
searches change nothing (the config file is the one the last search read, the workspace's
files are the indexed ones), so:

1. After an in-process search succeeds, ``qmdbridge/cli/search_cache.py`` records what a
   keyword-only search of that agent reads, as plain values (workspace, store, extra paths,
   query knobs, the index identity, the citations mode), to
   ``<stateDir>/cli-cache/<key>.json``. The key is what the command resolves from: the daemon's
   request fingerprint (state dir, ``--agent``, ``--workspace`` resolved against the cwd,
   ``--backend``, the config file with its size, mtime, ctime and inode:
   :func:`qmdbridge.server.wire.client_fingerprint`), ``$HOME``, and the size and mtime of the
   source files that turn a config into settings; the cwd too when the config names a
   relative workspace or store path. It is written only when such a search needs no engine:
   builtin backend, keyword-only (``provider: "none"``, or ``"auto"`` without
   ``local.modelPath`` and ``remote.apiKey``, whose API-key variables are recorded and must be
   unset on every use), the ``memory`` source, no reranker.
2. :func:`try_fast_search` reads it back (standard-library JSON: no pydantic, no anyio),
   checks that the index is in sync with the workspace and answers with the engine's own
   keyword-only steps (``fallback/engine/in_sync.py``), citations decorated as the manager
   does, printed as the in-process command prints (``"servedBy": "process"``).
3. Anything else returns ``None`` and the command runs in-process as before, with its own
   errors and messages: no snapshot, a changed config file, environment or code, a dirty,
   missing or unreadable index, ``--explain``, ``--session-key``, a ``--corpus`` other than
   ``all``, a blank query or a bad limit.
   So a dirty index is still synced before the search, and config errors are the loader's.
4. In qmd mode the search always runs in-process; what is recorded for it (``backend``
   ``qmd``, :func:`recorded_search`) only lets ``qmdbridge/cli/qmd_prefetch.py`` start its
   qmd calls while the in-process search loads.

``QMDBRIDGE_CLI_CACHE=off`` (or ``0``, ``false``, ``no``) turns reading and writing off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from collections.abc import Mapping

from fallback.errors import UsageError
from fallback.request import SearchRequest
from qmdbridge.server.wire import client_fingerprint

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

    from fallback.search.fts_only import Hit

__all__ = ["CACHE_DIR_NAME", "CACHE_ENV", "FORMAT", "answer_recorded", "cache_disabled", "code_stamped",
           "recorded_search", "search_doc", "settings_key", "settings_path", "try_fast_search", "untrusted"]

CACHE_ENV = "QMDBRIDGE_CLI_CACHE"
CACHE_DIR_NAME = "cli-cache"
# Bumped when the file's fields change; an older file is simply not used (and rewritten).
FORMAT = 3
# The source files that turn a config into recorded settings and read them back: a changed one
# (an upgrade, an edit in a development checkout) makes every recorded file stale. Relative to
# the folder holding both packages.
CODE_FILES = ("qmdbridge/config.py", "qmdbridge/config_compat.py", "qmdbridge/cli/fast_search.py",
              "qmdbridge/cli/search_cache.py", "fallback/settings.py", "fallback/index/identity.py",
              "fallback/embeddings/__init__.py", "fallback/engine/in_sync.py",
              "qmdbridge/cli/qmd_prefetch.py", "qmdbridge/qmd/query_text.py", "qmdbridge/paths.py")


def cache_disabled(env: Mapping[str, str]) -> bool:
    """True when ``$QMDBRIDGE_CLI_CACHE`` is ``off``, ``0``, ``false`` or ``no`` (any case)."""
    return env.get(CACHE_ENV, "").strip().lower() in ("off", "0", "false", "no")


def _note(args: argparse.Namespace, message: str) -> None:
    """With ``-v``, say on stderr why the search runs in-process (the logging module is not
    loaded on this path; the line looks like the ``-v`` log lines)."""
    if getattr(args, "verbose", False):
        sys.stderr.write(f"INFO qmdbridge.cli: {message}\n")


def _code_stamp() -> list[list[Any]]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stamp: list[list[Any]] = []
    for rel in CODE_FILES:
        try:
            st = os.stat(os.path.join(root, rel))
            stamp.append([rel, st.st_size, st.st_mtime_ns])
        except OSError:
            stamp.append([rel, None, None])
    return stamp


def settings_key(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """What the command resolves its agent from (see the module docstring), as a JSON-ready
    dict; the recorded settings are used only under the same key, and only when it stamps
    every source file of :data:`CODE_FILES` (:func:`code_stamped`)."""
    return {"format": FORMAT,
            **client_fingerprint(agent=args.agent, workspace=args.workspace, config=args.config,
                                 backend=args.backend, env=env),
            "home": env.get("HOME"), "code": _code_stamp()}


def code_stamped(key: dict[str, Any]) -> bool:
    """Whether ``key`` holds the size and mtime of every file of :data:`CODE_FILES`: an
    install without them (a zip, bytecode only) could not tell an upgrade from the version
    that recorded the settings, so it records and reads none."""
    return all(size is not None for _, size, _ in key["code"])


def settings_path(key: dict[str, Any]) -> str:
    """``<stateDir>/cli-cache/<CRC-32 of the key, 8 hex digits>.json`` for a :func:`settings_key`.

    The file holds its whole key and is used only under an equal one, so two keys with one
    CRC (about one chance in two million among the 64 files kept) only take turns in the file.
    """
    digest = zlib.crc32(json.dumps(key, sort_keys=True).encode())
    return os.path.join(key["stateDir"], CACHE_DIR_NAME, f"{digest:08x}.json")


def untrusted(path: str, st: os.stat_result | None = None) -> str | None:
    """Why the cache folder or file at ``path`` (``st``: its ``fstat`` when open) may hold
    what another user wrote: it belongs to another user, or group or others may write it.

    Returns:
        ``None`` when only this user could have written it, else one line such as
        ``/s/cli-cache is writable by group or others`` or ``/s/cli-cache/x.json belongs to
        uid 1001``.

    Raises:
        OSError: ``path`` cannot be stat'ed.
    """
    s = os.stat(path) if st is None else st
    if hasattr(os, "geteuid") and s.st_uid != os.geteuid():
        return f"{path} belongs to uid {s.st_uid}"
    if s.st_mode & 0o022:
        return f"{path} is writable by group or others"
    return None


def _recorded(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The recorded settings of this command, when they still hold (same key, cwd when it
    matters, the workspace and store resolving where they did, for a builtin search no API-key
    variable set); else ``None``."""
    key = settings_key(args, env)
    if not code_stamped(key):
        return None
    path = settings_path(key)
    doc: Any = None
    try:
        why = untrusted(os.path.dirname(path))  # first: only its owner could have put a FIFO there
        if why is None:
            with open(path, "rb") as f:
                why = untrusted(path, os.fstat(f.fileno()))
                if why is None:
                    doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if why is not None:
        _note(args, f"one-shot search runs the engine: {why}")
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    env_keys, paths = doc.get("providerEnvKeys"), doc.get("paths")
    builtin = (isinstance(doc.get("settings"), dict) and isinstance(doc.get("citations"), str)
               and isinstance(doc.get("keywordNotice"), bool) and isinstance(env_keys, list))
    if not ((builtin if doc.get("backend") == "builtin" else doc.get("backend") == "qmd"
             and isinstance(doc.get("qmd"), dict))
            and isinstance(paths, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                for p in paths)):
        return None  # not a file this version wrote
    if doc.get("cwd") is not None and doc["cwd"] != os.getcwd():
        return None
    for named, real in paths:
        now = os.path.realpath(named)
        if now != real:
            _note(args, f"one-shot search runs the engine: {named} resolves to {now} now")
            return None
    if builtin and any(env.get(str(k), "").strip() for k in env_keys or ()):
        return None
    return doc


def search_doc(hits: list[Hit], *, citations: str, warnings: list[str]) -> dict[str, Any]:
    """The ``--json`` document of a builtin keyword-only answer to an owner call (no session
    key), built as ``SearchResponse.to_json_dict()`` builds it (``fallback/answer.py``), each
    hit cited as the manager cites it (:func:`qmdbridge.policy.citations.cite`)."""
    from fallback.answer import answer_doc, hit_doc
    from qmdbridge.policy.citations import citations_enabled, cite

    include = citations_enabled(citations, None)
    results = []
    for h in hits:
        citation, snippet = cite(h.path, h.snippet_start_line, h.snippet_end_line, h.snippet,
                                 include=include)
        results.append(hit_doc(path=h.path, start_line=h.start_line, end_line=h.end_line,
                               score=h.score, snippet=snippet,
                               snippet_start_line=h.snippet_start_line,
                               snippet_end_line=h.snippet_end_line, source=h.source,
                               citation=citation, text_score=h.text_score))
    return answer_doc(backend="builtin", results=results, provider="none", mode="fts-only",
                      citations=citations, warnings=warnings, corpus="all")


def recorded_search(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The settings recorded for this ``search`` command line, when they still hold (same
    key, cwd when it matters, the workspace and store resolving where they did).

    Args:
        args: the parsed command line.
        env: the environment (default ``os.environ``).

    Returns:
        The recorded document (``backend`` ``builtin``: :func:`answer_recorded` may answer
        from it; ``qmd``: ``qmdbridge/cli/qmd_prefetch.py`` starts the search's qmd calls
        from it), or ``None``: no snapshot, caching off, an API-key variable now set,
        ``--explain``, ``--session-key``, a ``--corpus`` other than ``all`` (the recorded
        answer covers every indexed source), a blank query or a bad limit (the in-process run
        reports those).
    """
    e = os.environ if env is None else env
    if (args.command != "search" or args.explain or args.session_key is not None
            or getattr(args, "corpus", None) not in (None, "all") or cache_disabled(e)):
        return None
    try:
        SearchRequest.of(args.query, max_results=args.max_results, min_score=args.min_score)
    except UsageError:
        return None  # the in-process run reports it
    return _recorded(args, e)


def try_fast_search(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int | None:
    """Answer a parsed ``search`` from the recorded settings and an index in sync
    (:func:`recorded_search`, then :func:`answer_recorded`).

    Args:
        args: the parsed command line.
        env: the environment (default ``os.environ``).

    Returns:
        The exit code after printing the answer, or ``None`` when the command must run
        in-process (see the module docstring); nothing is printed then.
    """
    doc = recorded_search(args, env)
    return answer_recorded(args, doc) if doc is not None else None


def answer_recorded(args: argparse.Namespace, doc: dict[str, Any]) -> int | None:
    """Answer a parsed ``search`` from its recorded builtin settings (:func:`recorded_search`)
    and an index in sync.

    Args:
        args: the parsed command line.
        doc: the recorded document.

    Returns:
        The exit code after printing the answer, or ``None`` when the command must run
        in-process (see the module docstring); nothing is printed then.
    """
    from fallback.engine.in_sync import InSyncSettings, search_in_sync, stale_reason
    from fallback.errors import IndexStoreError
    from fallback.store.errors import IndexStoreReadOnlyError
    from fallback.store.files import check_writable, read_only_warning
    from fallback.store.readonly import ReadOnlyStore
    from qmdbridge.cli.common import EXIT_OK, emit_plain_json
    from qmdbridge.cli.render import print_search_doc

    if doc.get("backend") != "builtin":
        return None
    try:
        settings = InSyncSettings.from_json(doc["settings"])
    except (KeyError, TypeError, ValueError):
        return None
    if not settings.workspace_dir.is_dir():
        return None
    if not os.access(settings.db_path.parent, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        # the engine's SQLite open is refused first then, in its own words
        _note(args, f"one-shot search runs the engine: {settings.db_path.parent} cannot be written")
        return None
    warnings: list[str] = []
    try:
        check_writable(settings.db_path)
    except IndexStoreReadOnlyError as exc:  # the engine answers without a sync, and says so
        warnings.append(read_only_warning(exc, settings.db_path))
    try:
        store = ReadOnlyStore.open(settings.db_path)
        if store is None:
            return None
        with store:
            why = stale_reason(store, settings)
            if why is not None:
                _note(args, f"one-shot search runs the engine: {why}")
                return None
            hits = search_in_sync(store, settings, args.query, max_results=args.max_results,
                                  min_score=args.min_score)
    except IndexStoreError as exc:
        _note(args, f"one-shot search runs the engine: {exc}")
        return None
    answer = search_doc(hits, citations=doc["citations"], warnings=warnings)
    if args.json:
        emit_plain_json({**answer, "servedBy": "process"})
    else:
        print_search_doc(answer, keyword_notice=doc["keywordNotice"])
    return EXIT_OK
