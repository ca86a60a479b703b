"""Many rows into one table of the postgres store from column-wise arrays, in one statement.

A sync's rows (posting blocks, trigram postings, chunk vectors) come as one value per row per
column: numpy arrays of numbers, lists of strings, and for an array column the elements of
every row one row after another with each row's element count. :func:`write_rows` sends them
as ``COPY ... FROM STDIN (FORMAT BINARY)``, its bytes laid out by numpy over all rows at once
(no Python work per element, a few C-level steps per row), or, where PostgreSQL refuses ``COPY
FROM`` (row-level security applies to the writing role), as one ``INSERT ... SELECT`` over
``unnest`` of the per-row values with each array column sliced out of one array parameter.

Source: the binary ``COPY`` file format and the binary (``send``/``recv``) forms of ``bigint``,
``int``, their arrays (PostgreSQL ``array_send``) and pgvector's ``vector`` (``vector_send``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

__all__ = ["Column", "int_array", "text_array", "write_rows"]

# The binary COPY header (signature, no flags, no extension) and trailer.
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_TRAILER = struct.pack(">h", -1)
# kind -> (SQL type, element oid, 32-bit words per element); a scalar is one element.
_KINDS = {"text": ("text", 0, 0), "int8": ("bigint", 20, 2), "int4": ("int", 23, 1),
          "int8[]": ("bigint[]", 20, 2), "int4[]": ("int[]", 23, 1), "vector": ("vector", 0, 1)}


@dataclass(frozen=True)
class Column:
    """One column's values for every row written.

    Attributes:
        name: the column.
        kind: ``text``, ``int8``, ``int4`` (one value per row), ``int8[]``, ``int4[]`` (an
            array per row) or ``vector`` (pgvector, an array of float4 per row).
        values: ``text``: a sequence of ``str``, one per row; ``int8`` / ``int4``: a numpy
            integer array, one per row (a masked array: its masked rows are ``NULL``); an
            array kind: all rows' elements, row after row (a
            numpy array: integers, float32 for ``vector``).
        counts: an array kind's element count per row (numpy integers); else ``None``.
    """

    name: str
    kind: str
    values: Any
    counts: Any = None


def write_rows(cur: Any, table: str, columns: Sequence[Column], *, copy: bool,
               returning: str | None = None) -> list[Any]:
    """Write the rows given by ``columns`` (each with a value for every row) into ``table``.

    Args:
        cur: a psycopg cursor (in the caller's transaction).
        table: the schema-qualified table.
        columns: the columns written, one value per row each (``NULL`` only where an integer
            column's values are masked).
        copy: send ``COPY ... FROM STDIN (FORMAT BINARY)``; else one ``INSERT ... SELECT``
            (for a role that row-level security applies to: PostgreSQL refuses it ``COPY``).
        returning: with the ``INSERT``, a column whose values to return (a column the table
            generates, drawn in row order).

    Returns:
        The ``returning`` column's values of the rows in row order (``[]`` without it).

    Raises:
        psycopg.Error: for the caller to translate.
    """
    rows = len(columns[0].values) if columns[0].counts is None else len(columns[0].counts)
    if not rows:
        return []
    if copy:  # the text columns first (see _copy_data)
        columns = sorted(columns, key=lambda c: c.kind != "text")
        with cur.copy(f"COPY {table} ({', '.join(c.name for c in columns)}) FROM STDIN (FORMAT BINARY)") as out:
            out.write(_copy_data(columns, rows))
        return []
    names = ", ".join(c.name for c in columns)
    items, selects, args = [], [], {}
    for i, c in enumerate(columns):
        sql_type = _KINDS[c.kind][0]
        if c.counts is None:
            args[f"v{i}"] = text_array(c.values) if c.kind == "text" else int_array(c.values)
            items.append((f"%(v{i})s::{sql_type}[]", f"v{i}"))
            selects.append(f"x.v{i}")
        else:
            import numpy as np

            ends = np.cumsum(c.counts)
            args[f"a{i}"] = int_array(c.values)
            args[f"s{i}"] = int_array(ends - c.counts + 1)
            args[f"e{i}"] = int_array(ends)
            items += [(f"%(s{i})s::int[]", f"s{i}"), (f"%(e{i})s::int[]", f"e{i}")]
            element = "real" if c.kind == "vector" else sql_type.removesuffix("[]")
            selects.append(f"(%(a{i})s::{element}[])[x.s{i}:x.e{i}]"
                           + ("::vector" if c.kind == "vector" else ""))
    # Identity values are drawn in the order the SELECT gives its rows.
    order = (" WITH ORDINALITY", ", i", f" ORDER BY x.i RETURNING {returning}") if returning else ("", "", "")
    cur.execute(f"INSERT INTO {table} ({names}) SELECT {', '.join(selects)}"
                f" FROM unnest({', '.join(a for a, _ in items)}){order[0]}"
                f" AS x({', '.join(n for _, n in items)}{order[1]}){order[2]}", args)
    return [r[0] for r in cur.fetchall()] if returning else []


def _copy_data(columns: Sequence[Column], rows: int) -> bytes:
    """The binary ``COPY`` stream of the rows (``columns``: the text ones first): per row its
    field count, then its text fields
    (each its length and UTF-8 bytes), then its other fields, which are whole 32-bit words
    (a length word, then the value's words: a ``bigint`` is two, an array a five-word header
    and per element a length word and its value's words, a ``vector`` its dims and its
    float4s), laid out by numpy for all rows at once."""
    import numpy as np

    texts = [c for c in columns if c.kind == "text"]
    numeric = [c for c in columns if c.kind != "text"]
    head = struct.pack(">h", len(columns))
    encoded = {v: struct.pack(">i", len(b)) + b
               for v in set(chain.from_iterable(c.values for c in texts)) for b in (v.encode(),)}
    prefixes = list(map(b"".join, zip([head] * rows, *(map(encoded.__getitem__, c.values) for c in texts),
                                      strict=True)))
    sizes = []
    for c in numeric:
        per = _KINDS[c.kind][2]
        if c.counts is None:  # a NULL is its length word alone
            sizes.append(1 + per * ~np.ma.getmaskarray(c.values))
        elif c.kind == "vector":
            sizes.append(2 + np.asarray(c.counts, dtype=np.int64))
        else:
            sizes.append(6 + (1 + per) * np.asarray(c.counts, dtype=np.int64))
    words = np.sum(sizes, axis=0) if sizes else np.zeros(rows, dtype=np.int64)
    at = np.cumsum(words) - words
    out = np.zeros(int(words.sum()), dtype=np.uint32)
    for c, size in zip(numeric, sizes, strict=True):
        _, oid, per = _KINDS[c.kind]
        if c.counts is None:
            null = np.ma.getmaskarray(c.values)
            out[at] = np.where(null, 0xFFFFFFFF, 4 * per)  # length -1: NULL
            _put(out, (at + 1)[~null], np.ma.getdata(c.values)[~null], per)
        else:
            counts = np.asarray(c.counts, dtype=np.int64)
            row = np.repeat(np.arange(rows), counts)
            j = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
            if c.kind == "vector":
                out[at] = 4 + 4 * counts
                out[at + 1] = counts << 16  # int16 dims, int16 unused
                out[at[row] + 2 + j] = np.asarray(c.values, dtype=np.float32).view(np.uint32)
            else:
                out[at] = 20 + 4 * (1 + per) * counts
                out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5] = 1, 0, oid, counts, 1
                element = at[row] + 6 + (1 + per) * j
                out[element] = 4 * per
                _put(out, element + 1, np.asarray(c.values), per)
        at = at + size
    body = memoryview(out.astype(">u4").tobytes())
    ends = (4 * np.cumsum(words)).tolist()
    numbers = map(body.__getitem__, map(slice, [0, *ends[:-1]], ends))
    return b"".join(chain((_SIGNATURE,), chain.from_iterable(zip(prefixes, numbers, strict=True)), (_TRAILER,)))


def _put(out: Any, at: Any, values: Any, words: int) -> None:
    """Store integers ``values`` at word offsets ``at`` of ``out``: as one 32-bit word, or as
    two (a ``bigint``: high word first)."""
    import numpy as np

    v = values.astype(np.int64)
    if words == 1:
        out[at] = v.astype(np.uint32)
    else:
        out[at] = (v >> 32).astype(np.uint32)
        out[at + 1] = (v & 0xFFFFFFFF).astype(np.uint32)


def text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of strings (every element quoted), for ``%s::text[]``: one
    string parameter is sent instead of a list adapted element by element."""
    items = list(values)
    joined = "".join(items)  # escaping is needed only when an element holds a quote or backslash
    if '"' in joined or "\\" in joined:
        return '{"' + '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in items) + '"}'
    return '{"' + '","'.join(items) + '"}' if items else "{}"


def int_array(values: Iterable[int | None] | Any) -> str:
    """A PostgreSQL array literal of numbers (a numpy array or an iterable; ``None`` as
    ``NULL``)."""
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    if None in items:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in items) + "}"
    return "{" + ",".join(map(str, items)) + "}"
