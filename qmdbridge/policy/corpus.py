"""The ``corpus`` parameter of ``memory_search`` and ``memory_get``: which indexed sources a call covers.

Agent runtimes written for the reference system pass ``corpus``: ``memory`` (the memory files),
``sessions`` (session transcripts), ``all`` (the default: every enabled source) or ``wiki``
(``memory_search``); ``memory``, ``wiki`` or ``all`` (``memory_get``). Each surface (the agent
tools, MCP, ``serve``, the CLI's ``--corpus``, the library) hands the value to the manager,
which calls :func:`search_corpus` / :func:`get_corpus` once; the answer names the corpus that
was searched. No wiki corpus exists here: ``wiki`` searches nothing and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fallback.errors import UsageError

__all__ = ["DEFAULT_CORPUS", "GET_CORPORA", "NO_WIKI", "SEARCH_CORPORA", "CorpusChoice", "get_corpus",
           "search_corpus", "sessions_off_reason"]

SEARCH_CORPORA = ("memory", "sessions", "all", "wiki")
GET_CORPORA = ("memory", "wiki", "all")
# The reference's default: every source the agent indexes.
DEFAULT_CORPUS = "all"
NO_WIKI = "no wiki corpus is configured: corpus 'wiki' has nothing to search (use memory, sessions or all)"


@dataclass(frozen=True)
class CorpusChoice:
    """What one call's ``corpus`` covers.

    Attributes:
        corpus: the corpus searched (``memory`` | ``sessions`` | ``all`` | ``wiki``).
        sources: the sources to search (``("memory",)``, ``("sessions",)``), ``None`` for every
            enabled source, or ``()`` when there is nothing to search.
        note: why nothing is searched (``wiki``, or ``sessions`` while transcripts are not
            indexed), for the answer's ``warnings``; ``None`` otherwise.
    """

    corpus: str
    sources: tuple[Literal["memory", "sessions"], ...] | None
    note: str | None = None


def _checked(corpus: object, allowed: tuple[str, ...], tool: str) -> str:
    if corpus is None:
        return DEFAULT_CORPUS
    if not isinstance(corpus, str) or corpus not in allowed:
        raise UsageError(f"corpus must be one of {', '.join(allowed)} ({tool}), not {corpus!r}")
    return corpus


def search_corpus(corpus: object, *, sessions_off: str | None) -> CorpusChoice:
    """The sources ``memory_search`` covers for ``corpus``.

    Args:
        corpus: the call's ``corpus`` (``None``: ``all``).
        sessions_off: why session transcripts are not searchable (:func:`sessions_off_reason`),
            or ``None`` when they are.

    Returns:
        ``memory`` -> ``("memory",)``; ``all`` -> ``None`` (every enabled source);
        ``sessions`` -> ``("sessions",)``, or ``()`` with ``sessions_off`` as the note;
        ``wiki`` -> ``()`` with :data:`NO_WIKI`.

    Raises:
        UsageError: any other value (``corpus must be one of memory, sessions, all, wiki ...``).
    """
    name = _checked(corpus, SEARCH_CORPORA, "memory_search")
    if name == "wiki":
        return CorpusChoice(name, (), NO_WIKI)
    if name == "sessions":
        return CorpusChoice(name, (), sessions_off) if sessions_off else CorpusChoice(name, ("sessions",))
    return CorpusChoice(name, ("memory",) if name == "memory" else None)


def get_corpus(corpus: object) -> CorpusChoice:
    """What ``memory_get`` may read for ``corpus``.

    Returns:
        ``memory`` / ``all`` (``None``: ``all``) -> every memory file (``sources`` ``None``);
        ``wiki`` -> ``()`` with :data:`NO_WIKI`.

    Raises:
        UsageError: any other value.
    """
    name = _checked(corpus, GET_CORPORA, "memory_get")
    return CorpusChoice(name, (), NO_WIKI) if name == "wiki" else CorpusChoice(name, None)


def sessions_off_reason(*, backend: str, qmd_sessions: bool, builtin_sources: Sequence[str]) -> str | None:
    """Why ``corpus: "sessions"`` finds nothing for this agent, naming the config key that turns
    transcripts on, or ``None`` when they are searched.

    Args:
        backend: the configured backend (``qmd`` searches qmd's sessions collection, the builtin
            engine its own transcript index, which also answers qmd's fallback).
        qmd_sessions: ``memory.qmd.sessions.enabled``.
        builtin_sources: the builtin engine's enabled sources (``memorySearch.sources`` after
            ``experimental.sessionMemory``).
    """
    if backend == "qmd":
        if qmd_sessions:
            return None
        return "session transcripts are not indexed: set memory.qmd.sessions.enabled to true"
    if "sessions" in builtin_sources:
        return None
    return ("session transcripts are not indexed: add \"sessions\" to memorySearch.sources and "
            "set memorySearch.experimental.sessionMemory to true")
