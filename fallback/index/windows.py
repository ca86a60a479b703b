"""Embedding windows: which texts of a chunk are embedded, and how its vectors are stored.

A ~400-token chunk is more than an all-MiniLM-class model reads well (trained on 256 word
pieces, cut at 512), and one vector of a whole chunk blurs the line that answers a question. So
each chunk is embedded as windows of a few whole lines (:func:`chunk_windows`), and its window
vectors are stored together in ``chunks.vector`` (:func:`pack_windows`); vector search scores a
chunk by its best window (``fallback/store/vectors.py``). The window sizes are part of the
index identity: changing them rebuilds the index.
"""

from __future__ import annotations

import struct

from fallback.text.chunking import Chunk, chunk_markdown, split_by_utf8_bytes

__all__ = [
    "EMBED_WINDOW_OVERLAP",
    "EMBED_WINDOW_TOKENS",
    "MAX_EMBED_INPUT_BYTES",
    "chunk_windows",
    "pack_vector",
    "pack_windows",
]

# Embedding inputs are capped at this many UTF-8 bytes, whatever the provider allows (spec §3).
MAX_EMBED_INPUT_BYTES = 8000
# Embedding windows: 192 tokens (~770 chars, under the 256 word pieces all-MiniLM-class models
# are trained on) with 96 tokens of overlap, about 3 windows per 400-token chunk. On LoCoMo with
# all-MiniLM-L6-v2 this found 0.59 of the evidence lines in the top 5 by vectors alone where
# whole-chunk vectors found 0.45; 2-line windows did as well with three times the windows.
EMBED_WINDOW_TOKENS = 192
EMBED_WINDOW_OVERLAP = 96


def chunk_windows(chunk: Chunk, *, max_input_tokens: int) -> list[Chunk]:
    """The texts ``chunk`` is embedded as: its text chunked again
    (:func:`~fallback.text.chunking.chunk_markdown`) into windows of whole lines (a long line
    cut) of :data:`EMBED_WINDOW_TOKENS`, each repeating up to :data:`EMBED_WINDOW_OVERLAP` of
    the one before, each cut to the provider's input limit.

    Args:
        chunk: the chunk.
        max_input_tokens: the provider's input limit; windows longer than
            ``min(max_input_tokens, MAX_EMBED_INPUT_BYTES)`` UTF-8 bytes are cut (spec §3).

    Returns:
        The windows in order (line numbers relative to the chunk text), never empty: a chunk
        too short to window is its own single window.
    """
    cap = max(4, min(max_input_tokens, MAX_EMBED_INPUT_BYTES))
    windows = chunk_markdown(chunk.text, tokens=EMBED_WINDOW_TOKENS,
                             overlap=EMBED_WINDOW_OVERLAP) or [chunk]
    return [piece for w in windows for piece in split_by_utf8_bytes(w, cap)]


def pack_vector(vector: list[float]) -> bytes:
    """Encode a vector as float32 little-endian bytes."""
    return struct.pack(f"<{len(vector)}f", *vector)


def pack_windows(vectors: list[list[float]]) -> tuple[bytes, int] | None:
    """Encode a chunk's window vectors as the ``chunks.vector`` BLOB: each as float32
    little-endian, one after the other.

    Returns:
        ``(blob, dims)``: ``dims`` is the length of the first non-empty vector; empty vectors and
        those of another length are left out. ``None`` when no vector is left.
    """
    kept = [v for v in vectors if v]
    if not kept:
        return None
    dims = len(kept[0])
    return b"".join(pack_vector(v) for v in kept if len(v) == dims), dims
