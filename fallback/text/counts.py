"""Counts in messages: ``1 file waits``, ``2 files wait`` (one rule for every status line)."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, verb: str = "") -> str:
    """``n`` with ``noun`` (singular form) and an optional present-tense ``verb`` (plural form)
    agreeing with it: ``counted(1, "file", "wait")`` is ``"1 file waits"``,
    ``counted(3, "memory file")`` is ``"3 memory files"``. English ``-s`` forms only."""
    one = n == 1
    phrase = f"{n} {noun if one else noun + 's'}"
    return f"{phrase} {verb + 's' if one else verb}" if verb else phrase
