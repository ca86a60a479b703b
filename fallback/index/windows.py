"""Embedding windows: a chunk is embedded as windows of a few whole lines (:func:`chunk_windows`),
stored together in ``chunks.vector`` (:func:`pack_windows`); the sizes are part of the index identity.
"""

from __future__ import annotations

import struct

from fallback.text.chunking import Chunk, chunk_markdown, split_by_utf8_bytes

__all__ = ["EMBED_WINDOW_OVERLAP", "EMBED_WINDOW_TOKENS", "chunk_windows", "pack_windows"]

# Embedding inputs are capped at this many UTF-8 bytes, whatever the provider allows (spec §3).
MAX_EMBED_INPUT_BYTES = 8000
# Embedding windows: 192 tokens (under the 256 word pieces all-MiniLM-class models are trained
# on) with 96 tokens of overlap, about 3 windows per 400-token chunk.
EMBED_WINDOW_TOKENS = 192
EMBED_WINDOW_OVERLAP = 96


def chunk_windows(chunk: Chunk, *, max_input_tokens: int) -> list[Chunk]:
    """The texts ``chunk`` is embedded as, in order, never empty: its text chunked again into
    windows of :data:`EMBED_WINDOW_TOKENS` whole lines overlapping by
    :data:`EMBED_WINDOW_OVERLAP`, each cut to ``min(max_input_tokens, MAX_EMBED_INPUT_BYTES)``
    UTF-8 bytes (spec §3); line numbers relative to the chunk text."""
    cap = max(4, min(max_input_tokens, MAX_EMBED_INPUT_BYTES))
    windows = chunk_markdown(chunk.text, tokens=EMBED_WINDOW_TOKENS,
                             overlap=EMBED_WINDOW_OVERLAP) or [chunk]
    return [piece for w in windows for piece in split_by_utf8_bytes(w, cap)]


def pack_windows(vectors: list[list[float]]) -> tuple[bytes, int] | None:
    """A chunk's window vectors as the ``chunks.vector`` BLOB (float32 little-endian, one after
    the other) and ``dims``, the first non-empty vector's length (empty vectors and those of
    another length left out); ``None`` when no vector is left."""
    kept = [v for v in vectors if v]
    if not kept:
        return None
    dims = len(kept[0])
    return b"".join(struct.pack(f"<{dims}f", *v) for v in kept if len(v) == dims), dims
