"""Racily clean stamps (fallback/index/racy.py): which stamps are too close to a scan's start."""

from __future__ import annotations

from fallback.index.racy import FINE_WINDOW_MS, WHOLE_SECOND_WINDOW_MS, racily_clean, racy_window_ms

START_MS = 1_764_590_400_000  # a scan's start, epoch ms (a whole second)


def test_the_window_is_two_seconds_for_whole_second_stamps_else_fifty_ms() -> None:
    assert (FINE_WINDOW_MS, WHOLE_SECOND_WINDOW_MS) == (50, 2000)
    assert racy_window_ms(1_764_590_399_000_000_000) == 2000
    assert racy_window_ms(1_764_590_399_123_456_789) == 50
    assert racy_window_ms(1_764_590_399_123_000_000) == 50  # known to the ms, not a whole second


def test_a_stamp_counts_until_a_window_before_the_scan_start() -> None:
    ns = 1_000_000
    assert racily_clean((START_MS - 49) * ns + 1, START_MS)
    assert not racily_clean((START_MS - 50) * ns + 1, START_MS)  # 50 ms (and a ns) before: clean
    assert racily_clean((START_MS - 1000) * ns, START_MS)  # a whole second: FAT, HFS+, ext3
    assert not racily_clean((START_MS - 2000) * ns, START_MS)
    assert racily_clean((START_MS + 3_600_000) * ns + 7, START_MS)  # from the future
    assert racily_clean((START_MS - 86_400_000) * ns + 7, None)  # no scan start recorded
