"""The embedding cache: vectors by window text hash, bounded by ``cache.maxEntries``, least
recently used pruned first (spec §6.3); on the postgres store one cache shared by every agent,
keyed by :func:`fingerprint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from fallback.embeddings.base import EmbeddingProvider
from fallback.store.db import Store
from fallback.store.readonly import ReadOnlyStore

if TYPE_CHECKING:
    from fallback.store.postgres.store import PostgresStore

__all__ = ["fingerprint", "lookup", "lookup_shared", "prune", "store_and_prune"]

# Hashes per SQL ``IN`` list when looking up the embedding cache (spec §6.3).
CACHE_LOOKUP_BATCH = 400


def lookup(store: Store | ReadOnlyStore, provider: EmbeddingProvider,
           hashes: list[str]) -> dict[str, list[float]]:
    """Cached vectors of ``provider`` for the text ``hashes`` (sha256 hex): ``{hash: vector}``
    of the hits (an empty vector is none). Raises ``IndexStoreError``."""
    out: dict[str, list[float]] = {}
    for i in range(0, len(hashes), CACHE_LOOKUP_BATCH):
        part = hashes[i:i + CACHE_LOOKUP_BATCH]
        marks = ", ".join("?" for _ in part)
        rows = store.query(
            f"SELECT hash, embedding FROM embedding_cache WHERE provider = ? AND model = ?"
            f" AND provider_key = ? AND hash IN ({marks})",
            [provider.provider_id, provider.model, provider.provider_key, *part])
        for content_hash, embedding in rows:
            vector = orjson.loads(embedding)
            if vector:
                out[content_hash] = vector
    return out


def store_and_prune(store: Store, provider: EmbeddingProvider, vectors: dict[str, list[float]],
                    hits: list[str], *, now_ms: int, max_entries: int) -> None:
    """In one write transaction: mark ``hits`` used at ``now_ms``, upsert the non-empty
    ``vectors`` (hash -> embedding) and :func:`prune`. Raises ``IndexStoreError`` (nothing of
    it is kept)."""
    p = provider
    with store.transaction() as conn:
        conn.executemany(
            "UPDATE embedding_cache SET updated_at = ? WHERE provider = ? AND model = ?"
            " AND provider_key = ? AND hash = ?",
            [(now_ms, p.provider_id, p.model, p.provider_key, h) for h in hits])
        conn.executemany(
            "INSERT OR REPLACE INTO embedding_cache(provider, model, provider_key, hash,"
            " embedding, dims, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(p.provider_id, p.model, p.provider_key, h, orjson.dumps(v).decode(), len(v), now_ms)
             for h, v in vectors.items() if v])
        prune(conn, max_entries=max_entries)


def prune(conn: Any, *, max_entries: int) -> None:
    """Delete the least recently used rows beyond ``max_entries`` in the caller's transaction
    on ``conn`` (oldest ``updated_at``, then oldest row, first)."""
    count = int(conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0])
    if count > max_entries:
        conn.execute("DELETE FROM embedding_cache WHERE rowid IN (SELECT rowid FROM embedding_cache"
                     " ORDER BY updated_at ASC, rowid ASC LIMIT ?)", (count - max_entries,))


def fingerprint(provider: EmbeddingProvider) -> str:
    """The shared cache's key of ``provider``'s vectors: provider id, model and provider key
    (what keys a SQLite cache row besides its hash)."""
    return "\x1f".join((provider.provider_id, provider.model, provider.provider_key))


def lookup_shared(store: PostgresStore, provider: EmbeddingProvider, hashes: list[str], *,
                  local: Path | None = None) -> dict[str, list[float]]:
    """``{hash: vector}`` of ``provider`` for the text ``hashes`` in the postgres store's
    shared cache; misses found in the agent's SQLite store file ``local`` (its first sync on
    postgres; read only) are copied into the shared cache and returned too.

    Raises:
        PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError: the database
            failed.
        IndexStoreError: ``local`` cannot be read.
    """
    key = fingerprint(provider)
    found = store.cached_embeddings(hashes, key)
    misses = [h for h in hashes if h not in found]
    reader = ReadOnlyStore.open(local) if local is not None and misses else None
    if reader is not None:
        with reader:
            carried = lookup(reader, provider, misses)
        store.cache_embeddings(dict(carried), key)
        found.update(carried)
    return found
