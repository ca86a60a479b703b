"""The store seam holds: the search pipeline and the engine read a store only through
``fallback/store/seam.py`` ``SearchStore``, so no SQL is written in their modules (the SQL lives
in ``fallback/store/``), and both stores run the same ranking code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fallback"
# A statement sent to a database: sqlite3's execute / executemany, the stores' query().
SQL_CALL = re.compile(r"\.(query|execute|executemany)\(")


@pytest.mark.parametrize("package", ["search", "engine"])
def test_no_sql_outside_the_store_modules(package: str) -> None:
    found = [f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()}"
             for path in sorted((ROOT / package).glob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if SQL_CALL.search(line)]
    assert found == []
