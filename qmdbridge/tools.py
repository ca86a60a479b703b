"""The ``memory_search`` and ``memory_get`` agent tools: JSON schemas, handlers and routing.

Handlers never raise: a failure becomes ``{..., "disabled": true, "error"}`` (shapes in
``docs/serve-protocol.md``). :func:`call_tool` is the one routing of a named call.
"""

from __future__ import annotations

import logging
from typing import Any

from fallback.errors import (
    BackendUnavailableError,
    IndexStoreError,
    MemorySearchError,
    PathRefusedError,
    UsageError,
)
from fallback.request import MAX_LIMIT
from fallback.settings import QuerySettings
from fallback.sources.read_page import DEFAULT_READ_LINES
from fallback.text.path_names import printable_path
from qmdbridge.config import QmdLimits
from qmdbridge.manager import MemoryManager
from qmdbridge.policy.corpus import GET_CORPORA, SEARCH_CORPORA

__all__ = ["MEMORY_GET_SCHEMA", "MEMORY_SEARCH_SCHEMA", "SYNC_SCHEMA", "call_tool", "handle_memory_get",
           "handle_memory_search", "param_error"]

log = logging.getLogger("qmdbridge")

_QUERY = QuerySettings.model_fields
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A tool's schema, its ``parameters`` a JSON Schema object that takes no other key."""
    return {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}


# The tools' schemas; their ``parameters`` are docs/serve-protocol.schema.json's ``*Params``.
# Defaults are read from their owners (the settings models, the read page), never restated.
MEMORY_SEARCH_SCHEMA = _tool("memory_search", (
    "Search long-term memory (MEMORY.md, memory/*.md and configured notes) with hybrid "
    "keyword + semantic search. Returns snippets with path, line range and score; use "
    "memory_get to read more of a file."), {
        "query": {"type": "string", "description": "What to look for (a blank query is refused)."},
        "maxResults": {**_COUNT, "description": (
            f"Hits wanted (default query.maxResults, {_QUERY['max_results'].default}, on the builtin "
            f"engine; memory.qmd.limits.maxResults, {QmdLimits.model_fields['max_results'].default},"
            " on the qmd backend).")},
        "minScore": {"type": "number", "minimum": 0, "maximum": 1, "description": (
            f"Score floor (default query.minScore, {_QUERY['min_score'].default}, on the builtin "
            "engine; none on the qmd backend).")},
        "corpus": {"type": "string", "enum": list(SEARCH_CORPORA), "description": (
            "What to search: memory files, session transcripts (when indexed), all (default: every "
            "indexed source) or wiki (no wiki corpus is configured: no hits, a warning).")},
    }, ["query"])

MEMORY_GET_SCHEMA = _tool("memory_get", (
    "Read a memory file (or a line range of it) returned by memory_search. Pages of "
    f"{DEFAULT_READ_LINES} lines; follow the continuation notice's 'from' (and 'fromChar' for a long line) "
    "to read on."), {
        "path": {"type": "string", "description": (
            "Workspace-relative path, e.g. memory/2026-03-01.md (qmd/<collection>/... for qmd "
            "collections, sessions/<file>.jsonl for a builtin session hit).")},
        "from": {**_COUNT, "description": "First line, 1-based (default 1)."},
        "lines": {**_COUNT, "description": f"Lines wanted (default {DEFAULT_READ_LINES})."},
        "fromChar": {**_COUNT, "description": (
            "First character (code point) of line from, 1-based (default 1): how a line cut at "
            "the page's character budget is read on.")},
        "corpus": {"type": "string", "enum": list(GET_CORPORA), "description": (
            "all (default) reads memory files and session transcripts, memory only memory files (a "
            "transcript is refused); wiki refuses every path (no wiki corpus is configured).")},
    }, ["path"])

# serve's ``sync`` request (no MCP tool).
SYNC_SCHEMA = _tool(
    "sync", "Index the memory files now (force: rebuild from scratch, swapped in atomically).",
    {"force": {"type": "boolean",
               "description": "Rebuild the index from scratch (swapped in atomically)."}}, [])

_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "a boolean"}


def _fits(value: Any, json_type: str) -> bool:
    """Whether a JSON-decoded ``value`` is of a JSON Schema type (``integer``, ``number``,
    ``string``, ``boolean``; a bool is never a number, nor ``"false"`` a boolean)."""
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return json_type == "number" or isinstance(value, int) or value.is_integer()


def param_error(schema: dict[str, Any], params: dict[str, Any]) -> str | None:
    """How ``params`` break a tool's ``schema`` as JSON Schema validation would see it
    (a required parameter missing, an unknown one, an optional one of the wrong type), or
    ``None``; values and ranges are the manager's request's check. E.g. ``query required``,
    ``unknown parameter 'max_results' (memory_search takes query, maxResults, minScore)``,
    ``maxResults must be an integer, not '5'``."""
    props: dict[str, Any] = schema["parameters"]["properties"]
    missing = [key for key in schema["parameters"]["required"] if key not in params]
    if missing:
        return f"{missing[0]} required"
    for key, value in params.items():
        if key not in props:
            return f"unknown parameter {key!r} ({schema['name']} takes {', '.join(props)})"
        json_type = props[key]["type"]
        if key not in schema["parameters"]["required"] and not _fits(value, json_type):
            return f"{key} must be {_TYPE_NAMES[json_type]}, not {value!r}"
    return None


def _number(params: dict[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    """``params[key]`` as ``kind``, ``None`` when absent (:func:`param_error` checked its type;
    the range is the manager's check)."""
    value = params.get(key)
    return None if value is None else kind(value)


async def handle_memory_search(manager: MemoryManager, params: dict[str, Any], *,
                               session_key: str | None = None,
                               session_keys: list[str] | None = None) -> dict[str, Any]:
    """Handle a ``memory_search`` call (``params``: :data:`MEMORY_SEARCH_SCHEMA`'s); never raises.

    Args:
        session_key / session_keys: the caller's session key (``None``: owner call) and the keys it inherits.

    Returns:
        The answer's JSON document (``SearchResponse.to_json_dict``), or ``{results: [], disabled:
        true, error}`` on failure.
    """
    error = "params must be an object" if not isinstance(params, dict) else param_error(
        MEMORY_SEARCH_SCHEMA, params)
    if error is None:
        try:
            response = await manager.search(
                params["query"], max_results=_number(params, "maxResults", int),
                min_score=_number(params, "minScore", float),
                session_key=session_key, inherited_session_keys=session_keys or (),
                corpus=params.get("corpus"))
            return response.to_json_dict()
        except MemorySearchError as exc:
            if isinstance(exc, (BackendUnavailableError, IndexStoreError)):  # not the caller's fault
                log.warning("memory_search failed: %s", exc)
            error = str(exc)
        except Exception as exc:  # tool edge: the agent gets an error payload, never a crash
            log.exception("memory_search failed")
            error = f"{type(exc).__name__}: {exc}"
    return {"results": [], "disabled": True, "error": error}


async def handle_memory_get(manager: MemoryManager, params: dict[str, Any]) -> dict[str, Any]:
    """Handle a ``memory_get`` call (``params``: :data:`MEMORY_GET_SCHEMA`'s); never raises.

    Returns:
        ``{path, text, from, lines, truncated, nextFrom, missing}``, or ``{path, text: "", disabled:
        true, error, refused}`` on failure (``refused``: not a memory file; ``path``: the request's,
        printable, so a name byte not UTF-8 can be encoded).
    """
    path = params.get("path") if isinstance(params, dict) else None
    refused = False
    error = "params must be an object" if not isinstance(params, dict) else param_error(
        MEMORY_GET_SCHEMA, params)
    if error is None:
        try:
            result = await manager.read_file(params["path"], from_line=_number(params, "from", int),
                                             lines=_number(params, "lines", int),
                                             corpus=params.get("corpus"),
                                             from_char=_number(params, "fromChar", int))
            return result.to_json_dict()
        except MemorySearchError as exc:
            error, refused = str(exc), isinstance(exc, PathRefusedError)
        except Exception as exc:  # tool edge
            log.exception("memory_get failed")
            error = f"{type(exc).__name__}: {exc}"
    return {"path": printable_path(path) if isinstance(path, str) else "", "text": "", "disabled": True,
            "error": error, "refused": refused}


async def call_tool(manager: MemoryManager, name: object, params: dict[str, Any], *,
                    session_key: str | None = None,
                    session_keys: list[str] | None = None) -> dict[str, Any]:
    """Answer one named tool call (``memory_search``, ``memory_get``, ``status``), as the
    MCP server and ``serve`` (stdin and socket) route them; session keys as for
    :func:`handle_memory_search`.

    Raises ``UsageError`` (``unknown tool: 'memory_delete'``), or what ``status`` raises (the
    handlers never raise).
    """
    if name == "memory_search":
        return await handle_memory_search(manager, params, session_key=session_key,
                                          session_keys=session_keys)
    if name == "memory_get":
        return await handle_memory_get(manager, params)
    if name == "status":
        return (await manager.status()).to_json_dict()
    raise UsageError(f"unknown tool: {name!r}")
