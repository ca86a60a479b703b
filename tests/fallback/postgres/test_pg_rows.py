"""``fallback/store/postgres/rows.py``: rows written from column-wise arrays by binary ``COPY``
and by the ``INSERT`` a role under row-level security uses read back exactly alike, for every
column kind, on the real server."""

# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

import pytest

from tests.pg_fixtures import require_postgres

require_postgres()
pytestmark = pytest.mark.postgres

import numpy as np
import psycopg

from fallback.store.postgres.rows import Column, write_rows

TEXTS = ["walrus", "tab\there", "back\\slash", 'quote"d', "new\nline", "", "中文字符 😀", "{a,b}"]


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "insert"])
def test_every_column_kind_reads_back_as_written(pg_dsn: str, copy: bool) -> None:
    rows = len(TEXTS)
    big = np.array([1, 2**33 + 5, -7, 2**62, 0, 42, 3, 2**31], dtype=np.int64)
    counts = np.array([1, 3, 2, 1, 4, 1, 2, 1], dtype=np.int64)
    ints = np.arange(int(counts.sum()), dtype=np.int64) * 1_048_577 - 5
    longs = np.arange(int(counts.sum()), dtype=np.int64) * (2**40 + 3)
    dims = np.full(rows, 3, dtype=np.int64)
    floats = np.linspace(-1, 1, 3 * rows, dtype=np.float32) / 7
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE t (g bigint GENERATED ALWAYS AS IDENTITY (START 10), k int,"
                     " s text, b bigint, i int, n int, bs bigint[], xs int[], v vector)")
        with conn.transaction(), conn.cursor() as cur:
            drawn = write_rows(cur, "t", [
                Column("k", "int4", np.arange(rows)), Column("s", "text", TEXTS),
                Column("b", "int8", big), Column("i", "int4", big % 1000 - 500),
                Column("n", "int4", np.ma.masked_array(np.arange(rows) - 3, mask=np.arange(rows) % 3 == 1)),
                Column("bs", "int8[]", longs, counts), Column("xs", "int4[]", ints, counts),
                Column("v", "vector", floats, dims)], copy=copy, returning=None if copy else "g")
        # a float4 printed shortest reads back as the same float4
        got = [(*r[:6], np.asarray(r[6], dtype=np.float32).tolist())
               for r in conn.execute("SELECT s, b, i, n, bs, xs, v::real[] FROM t ORDER BY k")]
        # the INSERT returns the identity drawn for each row, in row order
        assert drawn == ([] if copy else list(range(10, 10 + rows)))
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends[:-1]]
    assert got == [(TEXTS[r], int(big[r]), int(big[r] % 1000 - 500), None if r % 3 == 1 else r - 3,
                    longs[starts[r]:ends[r]].tolist(),
                    ints[starts[r]:ends[r]].tolist(), floats[3 * r:3 * r + 3].tolist())
                   for r in range(rows)]
