"""The ``corpus`` parameter of ``memory_search`` and ``memory_get``: which indexed sources a call covers.

``memory``, ``sessions`` (transcripts), ``all`` (the default) or ``wiki`` for a search; ``memory``,
``wiki`` or ``all`` for a read. Every surface hands the value to the manager, which calls
:func:`search_corpus` / :func:`get_corpus` once. No wiki corpus exists: ``wiki`` finds nothing
and says so. A read with ``memory`` refuses a session transcript (:func:`outside_corpus`), as a
search with ``memory`` leaves its hits out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fallback.errors import UsageError

__all__ = ["DEFAULT_CORPUS", "GET_CORPORA", "NO_WIKI", "NO_WIKI_GET", "SEARCH_CORPORA", "CorpusChoice", "get_corpus",
           "outside_corpus", "search_corpus", "sessions_off_reason"]

SEARCH_CORPORA = ("memory", "sessions", "all", "wiki")
GET_CORPORA = ("memory", "wiki", "all")
# The reference's default: every source the agent indexes.
DEFAULT_CORPUS = "all"
NO_WIKI = "no wiki corpus is configured: corpus 'wiki' has nothing to search (use memory, sessions or all)"
# memory_get takes no ``sessions``: its refusal names the corpora it does take
NO_WIKI_GET = "no wiki corpus is configured: corpus 'wiki' has nothing to read (use memory or all)"


@dataclass(frozen=True)
class CorpusChoice:
    """What one call's ``corpus`` covers: the ``corpus`` searched, the ``sources`` to
    search (``None``: every enabled source; ``()``: nothing) and the ``note`` saying why nothing
    is searched, for the answer's ``warnings``."""

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
    """The sources ``memory_search`` covers for ``corpus`` (``None``: ``all``);
    ``sessions_off``: :func:`sessions_off_reason`, the note when ``sessions`` finds nothing.
    Raises ``UsageError`` for a value other than ``memory``, ``sessions``, ``all``, ``wiki``."""
    name = _checked(corpus, SEARCH_CORPORA, "memory_search")
    if name == "wiki":
        return CorpusChoice(name, (), NO_WIKI)
    if name == "sessions":
        return CorpusChoice(name, (), sessions_off) if sessions_off else CorpusChoice(name, ("sessions",))
    return CorpusChoice(name, ("memory",) if name == "memory" else None)


def get_corpus(corpus: object) -> CorpusChoice:
    """What ``memory_get`` may read for ``corpus``: memory files only (``memory``), every
    indexed source (``all``, ``None``), or nothing with :data:`NO_WIKI_GET` (``wiki``).
    Raises ``UsageError`` for any other value."""
    name = _checked(corpus, GET_CORPORA, "memory_get")
    if name == "wiki":
        return CorpusChoice(name, (), NO_WIKI_GET)
    return CorpusChoice(name, ("memory",) if name == "memory" else None)


def outside_corpus(choice: CorpusChoice, source: Literal["memory", "sessions"]) -> str | None:
    """Why ``memory_get`` refuses a path of ``source`` under ``choice`` (:func:`get_corpus`),
    or ``None`` when the corpus covers it: ``a session transcript, outside corpus 'memory'
    (read it with corpus all)``."""
    if choice.sources is None or source in choice.sources:
        return None
    return f"a session transcript, outside corpus {choice.corpus!r} (read it with corpus all)"


def sessions_off_reason(*, backend: str, qmd_sessions: bool, builtin_sources: Sequence[str]) -> str | None:
    """Why ``corpus: "sessions"`` finds nothing for this agent, naming the config key
    that turns transcripts on, or ``None`` when they are searched (``qmd_sessions``:
    ``memory.qmd.sessions.enabled``; ``builtin_sources``: the builtin engine's sources)."""
    if backend == "qmd":
        if qmd_sessions:
            return None
        return "session transcripts are not indexed: set memory.qmd.sessions.enabled to true"
    if "sessions" in builtin_sources:
        return None
    return ("session transcripts are not indexed: add \"sessions\" to memorySearch.sources and "
            "set memorySearch.experimental.sessionMemory to true")
