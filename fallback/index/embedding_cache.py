"""The embedding cache: vectors by chunk text hash, bounded, least recently used pruned first.

Rows of ``embedding_cache`` are keyed by ``(provider, model, provider_key, hash)`` (spec §6.3)
with the vector as JSON and ``updated_at`` (epoch ms) as its recency. A sync looks hashes up on
the store's reader; then, per file and in one write transaction, :func:`store_and_prune` gives
the hits ``updated_at = now``, upserts the fresh vectors and deletes the least recently used
rows beyond ``cache.maxEntries``. The reference prunes oldest-written first and only after a
full reindex (spec §6.3 step 6); here every sync keeps the bound, and a hit counts as a use.

On the postgres store the cache is the database's ``embedding_cache``, shared by every agent
and keyed by ``(hash, fingerprint)`` (:func:`fingerprint`: the same provider, model and
provider key as a SQLite row's), so a text two agents hold is embedded once;
:func:`lookup_shared` reads it and, for the first sync of an agent moving from SQLite, carries
the hits of the agent's SQLite cache over into it.
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

__all__ = ["CACHE_LOOKUP_BATCH", "fingerprint", "lookup", "lookup_shared", "prune",
           "store_and_prune"]

# Hashes per SQL ``IN`` list when looking up the embedding cache (spec §6.3).
CACHE_LOOKUP_BATCH = 400


def lookup(store: Store | ReadOnlyStore, provider: EmbeddingProvider,
           hashes: list[str]) -> dict[str, list[float]]:
    """Cached vectors of ``provider`` for the chunk text ``hashes`` (sha256 hex).

    Returns:
        ``{hash: vector}`` for the hits; an empty cached vector is not a hit.

    Raises:
        IndexStoreError: the store cannot be read.
    """
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
                    hits: list[str], *, now_ms: int, max_entries: int) -> int:
    """In one write transaction: mark ``hits`` used at ``now_ms``, upsert the non-empty
    ``vectors`` (hash -> embedding) with ``updated_at = now_ms``, and :func:`prune`.

    Returns:
        The number of rows pruned.

    Raises:
        IndexStoreError: the store cannot be written (nothing of it is kept).
    """
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
        return prune(conn, max_entries=max_entries)


def prune(conn: Any, *, max_entries: int) -> int:
    """Delete the least recently used rows beyond ``max_entries`` inside the caller's
    transaction on ``conn``: oldest ``updated_at`` first, then the oldest row.

    Returns:
        The number of rows deleted.
    """
    count = int(conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0])
    if count <= max_entries:
        return 0
    conn.execute("DELETE FROM embedding_cache WHERE rowid IN (SELECT rowid FROM embedding_cache"
                 " ORDER BY updated_at ASC, rowid ASC LIMIT ?)", (count - max_entries,))
    return count - max_entries


def fingerprint(provider: EmbeddingProvider) -> str:
    """The shared cache's key of ``provider``'s vectors: provider id, model and provider key
    (what keys a SQLite cache row besides its hash)."""
    return "\x1f".join((provider.provider_id, provider.model, provider.provider_key))


def lookup_shared(store: PostgresStore, provider: EmbeddingProvider, hashes: list[str], *,
                  local: Path | None = None) -> dict[str, list[float]]:
    """Cached vectors of ``provider`` for the text ``hashes`` in the postgres store's shared
    cache; the misses found in the SQLite store file ``local`` (the agent's, on the first sync
    of an agent moving from it; opened for reading only, when it exists) are written to the
    shared cache and returned too.

    Returns:
        ``{hash: vector}`` of the hits.

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
        try:
            carried = lookup(reader, provider, misses)
        finally:
            reader.close()
        store.cache_embeddings(dict(carried), key)
        found.update(carried)
    return found
