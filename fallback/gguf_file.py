"""Whether a file on disk can be a whole GGUF model: the magic, a header that parses, and tensor
data that starts inside the file.

A download cut short keeps a valid header, on which llama.cpp fails or hangs; the header lists
every tensor's offset, so a file ending before the last tensor's data is truncated. Reads only
the header.

Source: the GGUF file format (ggml, ``docs/gguf.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUF_MAGIC", "gguf_problem"]

# The first bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"
# Alignment of the tensor data when the file does not set general.alignment (GGUF spec).
DEFAULT_ALIGNMENT = 32
# Byte sizes of the fixed-size metadata value types, by type id (GGUF spec).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
# More entries than this in a header is a damaged count, not a model.
_MAX_COUNT = 1 << 24


class _Truncated(Exception):
    """The header ends before what it declares."""


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Truncated
    return data


def _uint(fh: BinaryIO, size: int) -> int:
    """The next little-endian unsigned integer of ``size`` bytes."""
    return int.from_bytes(_read(fh, size), "little")


def _count(fh: BinaryIO) -> int:
    n = _uint(fh, 8)
    if n > _MAX_COUNT:
        raise ValueError(f"implausible count {n}")
    return n


def _string(fh: BinaryIO) -> bytes:
    return _read(fh, _count(fh))


def _value(fh: BinaryIO, kind: int) -> int | None:
    """Skip one metadata value of type ``kind``; its integer value when it is an unsigned
    integer (for ``general.alignment``), else ``None``."""
    if kind in _FIXED:
        raw = _read(fh, _FIXED[kind])
        return int.from_bytes(raw, "little") if kind in (0, 2, 4, 10) else None
    if kind == _STRING:
        _string(fh)
        return None
    if kind == _ARRAY:
        item, n = _uint(fh, 4), _count(fh)
        if item in _FIXED:
            _read(fh, _FIXED[item] * n)
        else:
            for _ in range(n):
                _value(fh, item)
        return None
    raise ValueError(f"unknown metadata type {kind}")


def gguf_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a whole GGUF model (``empty file``, ``not a GGUF file``,
    ``truncated (...)``, ``damaged header (...)``), or ``None`` when it can.

    Raises:
        OSError: the file cannot be opened or read.
    """
    size = path.stat().st_size
    if size == 0:
        return "empty file"
    with path.open("rb") as fh:
        if fh.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            return "not a GGUF file"
        try:
            _uint(fh, 4)  # version
            tensors, kvs = _count(fh), _count(fh)
            alignment = DEFAULT_ALIGNMENT
            for _ in range(kvs):
                key, kind = _string(fh), _uint(fh, 4)
                value = _value(fh, kind)
                if key == b"general.alignment" and value:
                    alignment = value
            last = 0
            for _ in range(tensors):
                _string(fh)
                dims = _uint(fh, 4)
                _read(fh, 8 * dims + 4)  # the dimensions, the tensor type
                last = max(last, _uint(fh, 8))
            start = -(-fh.tell() // alignment) * alignment
        except _Truncated:
            return "truncated (the header ends early)"
        except ValueError as exc:
            return f"damaged header ({exc})"
    if tensors and start + last >= size:
        return f"truncated ({size} bytes, the tensor data reaches past {start + last})"
    return None
