"""Temporal decay: half-life, dates from file names, evergreen files."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from fallback.search.fusion import CosineStats, fuse
from fallback.search.ranking import (
    Candidate,
    apply_temporal_decay,
    date_from_path,
    decay_multiplier,
    is_evergreen,
)

DAY_MS = 86_400_000
NOW_MS = int(dt.datetime(2026, 2, 10, tzinfo=dt.timezone.utc).timestamp() * 1000)


def cand(path: str, score: float, *, source: str = "memory", chunk_id: str | None = None) -> Candidate:
    return Candidate(chunk_id=chunk_id or path, path=path, source=source, start_line=1,
                     end_line=3, snippet="s", score=score)


class MtimeLog:
    """Records every (source, path) the ranking asks about."""

    def __init__(self, mtimes: dict[tuple[str, str], int | None]) -> None:
        self.mtimes = mtimes
        self.calls: list[tuple[str, str]] = []

    def __call__(self, source: str, path: str) -> int | None:
        self.calls.append((source, path))
        return self.mtimes.get((source, path))


def test_multiplier_values():
    assert decay_multiplier(10, 30) == pytest.approx(math.exp(-math.log(2) / 30 * 10), rel=1e-12)
    assert decay_multiplier(30, 30) == pytest.approx(0.5, rel=1e-12)
    assert decay_multiplier(-5, 30) == 1.0
    assert decay_multiplier(10, 0) == 1.0
    assert decay_multiplier(10, -1) == 1.0
    assert decay_multiplier(10, math.inf) == 1.0
    assert decay_multiplier(math.nan, 30) == 1.0


@pytest.mark.parametrize(("path", "expected"), [
    ("memory/2026-02-10.md", dt.date(2026, 2, 10)),
    ("memory/2026-02-10-standup.md", dt.date(2026, 2, 10)),
    ("memory/archive/2026-01-10.md", dt.date(2026, 1, 10)),
    ("memory/reference/2025-12-01-detail.md", dt.date(2025, 12, 1)),
    ("./memory/2024-02-29.md", dt.date(2024, 2, 29)),
    ("memory\\2026-02-10.md", dt.date(2026, 2, 10)),
    ("../team/memory/2026-01-01.md", dt.date(2026, 1, 1)),
    ("memory/2026-02-30.md", None),
    ("memory/2025-02-29.md", None),
    ("memory/2026-13-01.md", None),
    ("memory/ticket-92025-06-15.md", None),
    ("memory/morning-summary-2026-02-10.md", None),
    ("memory/2026-02-101.md", None),
    ("memory/2026-02-10.txt", None),
    ("2026-02-10.md", None),
    ("notes/2026-02-10.md", None),
    ("memory/projects.md", None),
    ("MEMORY.md", None),
])
def test_date_from_path(path, expected):
    assert date_from_path(path) == expected


def test_is_evergreen():
    assert is_evergreen("MEMORY.md", "memory") is True
    assert is_evergreen("memory.md", "memory") is True
    assert is_evergreen("memory/projects.md", "memory") is True
    assert is_evergreen("memory/2026-02-30.md", "memory") is True
    assert is_evergreen("notes/extra.md", "memory") is True
    assert is_evergreen("memory/2026-02-10.md", "memory") is False
    assert is_evergreen("sessions/thread.jsonl", "sessions") is False


def test_evergreen_files_unchanged_and_mtime_never_asked():
    old = int(dt.datetime(2010, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
    mtime = MtimeLog({("memory", "MEMORY.md"): old, ("memory", "memory/projects.md"): old})
    out = apply_temporal_decay([cand("MEMORY.md", 1.0), cand("memory/projects.md", 0.75)],
                               half_life_days=30, now_ms=NOW_MS, mtime_ms=mtime)
    assert [(c.path, c.score) for c in out] == [("MEMORY.md", 1.0), ("memory/projects.md", 0.75)]
    assert mtime.calls == []


def test_vector_only_merge_newer_note_ranks_first():
    merged = fuse([cand("memory/2025-01-01.md", 0.95), cand("memory/2026-02-10.md", 0.8),
                   cand("memory/2026-02-01.md", 0.15)], [], vector_weight=0.7, text_weight=0.3,
                  cosine_stats=CosineStats(mean=0.15, std=0.8 / 3.5, count=50))
    out = apply_temporal_decay(merged, half_life_days=30, now_ms=NOW_MS, mtime_ms=MtimeLog({}))
    assert [c.path for c in out] == ["memory/2026-02-10.md", "memory/2025-01-01.md", "memory/2026-02-01.md"]
    assert out[0].score == pytest.approx(0.65 / 0.8)  # vector evidence (0.65 of the 0.8 to full), no decay today
    assert out[1].vector_score == 0.95


def test_future_today_and_ancient():
    out = apply_temporal_decay(
        [cand("memory/2099-01-01.md", 0.9), cand("memory/2026-02-10.md", 0.8),
         cand("memory/2000-01-01.md", 1.0)],
        half_life_days=30, now_ms=NOW_MS, mtime_ms=MtimeLog({}))
    scores = {c.path: c.score for c in out}
    assert scores["memory/2099-01-01.md"] == 0.9
    assert scores["memory/2026-02-10.md"] == 0.8
    assert scores["memory/2000-01-01.md"] < 0.001
    assert [c.path for c in out] == ["memory/2099-01-01.md", "memory/2026-02-10.md",
                                     "memory/2000-01-01.md"]


def test_nested_and_suffixed_dates_decay_older_more():
    out = apply_temporal_decay(
        [cand("memory/archive/2026-01-10.md", 1.0), cand("memory/reference/2025-12-01-detail.md", 1.0)],
        half_life_days=30, now_ms=NOW_MS, mtime_ms=MtimeLog({}))
    scores = {c.path: c.score for c in out}
    assert scores["memory/archive/2026-01-10.md"] == pytest.approx(
        math.exp(-math.log(2) / 30 * 31))
    assert [c.path for c in out] == ["memory/archive/2026-01-10.md",
                                     "memory/reference/2025-12-01-detail.md"]
    assert scores["memory/reference/2025-12-01-detail.md"] == pytest.approx(
        math.exp(-math.log(2) / 30 * 71))


def test_undated_under_memory_unchanged():
    old = NOW_MS - 3650 * DAY_MS
    out = apply_temporal_decay([cand("memory/reference/spec.md", 0.9)], half_life_days=30,
                               now_ms=NOW_MS, mtime_ms=MtimeLog({("memory", "memory/reference/spec.md"): old}))
    assert out[0].score == 0.9


def test_sessions_decay_by_mtime_once_per_file():
    mtime = MtimeLog({("sessions", "sessions/thread.jsonl"): NOW_MS - 30 * DAY_MS})
    out = apply_temporal_decay(
        [cand("sessions/thread.jsonl", 1.0, source="sessions", chunk_id="c1"),
         cand("sessions/thread.jsonl", 0.5, source="sessions", chunk_id="c2")],
        half_life_days=30, now_ms=NOW_MS, mtime_ms=mtime)
    assert [c.score for c in out] == pytest.approx([0.5, 0.25])
    assert mtime.calls == [("sessions", "sessions/thread.jsonl")]


def test_unreadable_mtime_means_no_decay():
    out = apply_temporal_decay([cand("sessions/gone.jsonl", 0.7, source="sessions")],
                               half_life_days=30, now_ms=NOW_MS, mtime_ms=MtimeLog({}))
    assert out[0].score == 0.7


def test_decay_does_not_mutate_input():
    original = cand("memory/2000-01-01.md", 1.0)
    apply_temporal_decay([original], half_life_days=30, now_ms=NOW_MS, mtime_ms=MtimeLog({}))
    assert original.score == 1.0
