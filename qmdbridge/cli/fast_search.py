"""The one-shot ``qmdbridge search`` without a daemon: answered from a read-only connection when nothing changed.

Reads back what ``search_cache`` recorded, with the standard library only, and answers with the
engine's keyword-only steps (``fallback/engine/in_sync.py``) when the index is in sync; anything
else runs in-process. How, and what is checked: docs/cli.md, "One-shot search without a daemon".
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from collections.abc import Mapping

from fallback.errors import IndexStoreError, UsageError
from fallback.request import SearchRequest
from qmdbridge.cli.common import verbose_note
from qmdbridge.server.wire import client_fingerprint, turned_off

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

    from fallback.search.fts_only import Hit

__all__ = ["CACHE_DIR_NAME", "CACHE_ENV", "FORMAT", "answer_recorded", "code_stamped",
           "recorded_search", "search_doc", "settings_key", "settings_path", "untrusted"]

CACHE_ENV = "QMDBRIDGE_CLI_CACHE"
CACHE_DIR_NAME = "cli-cache"
# Bumped when the file's fields change; an older file is not used (and rewritten).
FORMAT = 3
# The sources that record settings and read them back (repo-relative): a change makes every record stale.
CODE_FILES = ("qmdbridge/config.py", "qmdbridge/config_compat.py", "qmdbridge/cli/fast_search.py",
              "qmdbridge/cli/search_cache.py", "fallback/settings.py", "fallback/index/identity.py",
              "fallback/embeddings/__init__.py", "fallback/engine/in_sync.py",
              "qmdbridge/cli/qmd_prefetch.py", "qmdbridge/qmd/query_text.py", "qmdbridge/paths.py")


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
    """What the command resolves its agent from, as a JSON-ready dict: the daemon's
    request fingerprint (:func:`qmdbridge.server.wire.client_fingerprint`), ``$HOME`` and the
    size and mtime of every file of :data:`CODE_FILES`."""
    return {"format": FORMAT,
            **client_fingerprint(agent=args.agent, workspace=args.workspace, config=args.config,
                                 backend=args.backend, env=env),
            "home": env.get("HOME"), "code": _code_stamp()}


def code_stamped(key: dict[str, Any]) -> bool:
    """Whether ``key`` stamps every file of :data:`CODE_FILES` (an install without
    them could not tell an upgrade from the recording version, so it records and reads none)."""
    return all(size is not None for _, size, _ in key["code"])


def settings_path(key: dict[str, Any]) -> str:
    """``<stateDir>/cli-cache/<CRC-32 of the key, 8 hex digits>.json`` for a
    :func:`settings_key` (the file holds its whole key, so two keys with one CRC only take
    turns)."""
    digest = zlib.crc32(json.dumps(key, sort_keys=True).encode())
    return os.path.join(key["stateDir"], CACHE_DIR_NAME, f"{digest:08x}.json")


def untrusted(path: str, st: os.stat_result | None = None) -> str | None:
    """Why the cache folder or file at ``path`` (``st``: its ``fstat`` when open) may hold what
    another user wrote (``/s/cli-cache is writable by group or others``), else ``None``;
    ``OSError`` when ``path`` cannot be stat'ed."""
    s = os.stat(path) if st is None else st
    if hasattr(os, "geteuid") and s.st_uid != os.geteuid():
        return f"{path} belongs to uid {s.st_uid}"
    if s.st_mode & 0o022:
        return f"{path} is writable by group or others"
    return None


def _recorded(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The recorded document of this command when it still holds (same key, cwd when it
    matters, each named path resolving as it did, no API-key variable set now); else ``None``."""
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
        verbose_note(args, f"one-shot search runs the engine: {why}")
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
            verbose_note(args, f"one-shot search runs the engine: {named} resolves to {now} now")
            return None
    if builtin and any(env.get(str(k), "").strip() for k in env_keys or ()):
        return None
    return doc


def search_doc(hits: list[Hit], *, citations: str, warnings: list[str]) -> dict[str, Any]:
    """The ``--json`` document of a builtin keyword-only answer to an owner call, built by
    ``fallback/answer.py`` as every route builds it, hits cited by
    :func:`qmdbridge.policy.citations.cite`."""
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
    """The settings recorded for this ``search`` command line, when they still hold.

    Returns:
        The recorded document (``backend`` ``builtin``: :func:`answer_recorded` answers from
        it; ``qmd``: the prefetch starts from it), or ``None`` (see the module docstring).
    """
    e = os.environ if env is None else env
    if (args.command != "search" or args.explain or args.session_key is not None
            or args.corpus not in (None, "all") or turned_off(e, CACHE_ENV)):
        return None
    try:
        SearchRequest.of(args.query, max_results=args.max_results, min_score=args.min_score)
    except UsageError:
        return None  # the in-process run reports it
    return _recorded(args, e)


def answer_recorded(args: argparse.Namespace, doc: dict[str, Any]) -> int | None:
    """Answer a parsed ``search`` from its recorded builtin settings (``doc``, as
    :func:`recorded_search` returned it) and an index in sync.

    Returns:
        The exit code after printing the answer, or ``None`` (nothing printed) when the
        command must run in-process.
    """
    from fallback.engine.in_sync import InSyncSettings, search_in_sync, stale_reason
    from fallback.store.errors import IndexStoreReadOnlyError
    from fallback.store.files import check_writable, read_only_warning
    from fallback.store.readonly import ReadOnlyStore
    from qmdbridge.cli.render import print_answer

    try:
        settings = InSyncSettings.from_json(doc["settings"])
    except (KeyError, TypeError, ValueError):  # a qmd record has none
        return None
    if not settings.workspace_dir.is_dir():
        return None
    if not os.access(settings.db_path.parent, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        # the engine's SQLite open is refused first then, in its own words
        verbose_note(args, f"one-shot search runs the engine: {settings.db_path.parent} cannot be written")
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
                verbose_note(args, f"one-shot search runs the engine: {why}")
                return None
            hits = search_in_sync(store, settings, SearchRequest.of(  # recorded_search checked it
                args.query, max_results=args.max_results, min_score=args.min_score))
    except IndexStoreError as exc:
        verbose_note(args, f"one-shot search runs the engine: {exc}")
        return None
    return print_answer(args, search_doc(hits, citations=doc["citations"], warnings=warnings),
                        served_by="process", keyword_notice=doc["keywordNotice"])
