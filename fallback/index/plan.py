"""The one rule of what an incremental sync does with each discovered file, blocking and free of anyio.

The sync asks :func:`read_reason` for every file; the one-shot in-sync check asks
:func:`scan_change`, the same rule over a whole scan (docs/architecture.md "Files a sync reads").
"""

from __future__ import annotations

from typing import NamedTuple

from fallback.index.racy import racily_clean
from fallback.sources.memory_files import Discovery, MemoryFile
from fallback.store.readonly import MetaReads

__all__ = ["RecordedFiles", "Stamp", "file_stamp", "read_reason", "recorded_files", "scan_change"]

Stamp = tuple[int, int, int | None]
"""``(mtime_ms, size_bytes, ctime_ns)`` of a file; ``ctime_ns`` is ``None`` where the platform
gives none (``fallback/sources/stamps.py``)."""


def file_stamp(mf: MemoryFile) -> Stamp:
    """The stamps of ``mf`` as discovery saw them."""
    return (mf.mtime_ms, mf.size, mf.ctime_ns)


class RecordedFiles(NamedTuple):
    """What the store recorded of one source's files: ``rows`` (``files`` rows by path:
    ``(content hash, stamp)``), ``skip_stamps`` (stamps of files read and skipped, by path) and
    ``skips`` (every ``skipped_files`` row as ``(path, reason, stamp or None)``)."""

    rows: dict[str, tuple[str, Stamp]]
    skip_stamps: dict[str, Stamp]
    skips: list[tuple[str, str, Stamp | None]]


def recorded_files(store: MetaReads, source: str) -> RecordedFiles:
    """Read :class:`RecordedFiles` of ``source`` from ``store`` (blocking). Raises
    ``IndexStoreError``."""
    rows = {p: (h, (m, n, c)) for p, h, m, n, c in store.file_rows(source)}
    skips: list[tuple[str, str, Stamp | None]] = [
        (p, r, None if m is None or n is None else (m, n, c)) for p, r, m, n, c in store.skip_rows(source)]
    skip_stamps = {p: s for p, _, s in skips if s is not None}
    return RecordedFiles(rows, skip_stamps, skips)


def read_reason(mf: MemoryFile, recorded: RecordedFiles, *, last_started: int | None) -> str | None:
    """Why an incremental sync reads ``mf`` (``new``, ``changed`` or ``racily clean``), or
    ``None`` when a row of ``recorded`` holds its stamps; ``last_started``: the previous scan's
    start, epoch ms, ``None`` when none is recorded."""
    row = recorded.rows.get(mf.rel_path)
    stamp = row[1] if row is not None else recorded.skip_stamps.get(mf.rel_path)
    if stamp is None:
        return "new"
    if stamp != file_stamp(mf):
        return "changed"
    if racily_clean(mf.mtime_ms * 1_000_000, last_started):
        return "racily clean"
    return None


def scan_change(found: Discovery, recorded: RecordedFiles, *, last_started: int | None,
                stored_issues: object) -> str | None:
    """Why an incremental sync of the ``memory`` source would write more than its timestamps,
    or ``None`` when the index holds ``found`` as the sync would write it.

    Args:
        found: discovery of the memory files.
        recorded: the store's rows of the ``memory`` source.
        last_started: as :func:`read_reason`.
        stored_issues: the ``scan_issues`` meta value.

    Returns:
        ``None``, or one line: ``no scan start recorded``, ``<read_reason>: <path>`` (the first
        file the sync reads), ``gone: <path>``, ``skipped files changed``, ``scan issues changed``.
    """
    if last_started is None:
        return "no scan start recorded"
    for mf in found.files:
        why = read_reason(mf, recorded, last_started=last_started)
        if why is not None:
            return f"{why}: {mf.rel_path}"
    discovered = {mf.rel_path for mf in found.files}
    gone = sorted((set(recorded.rows) | set(recorded.skip_stamps)) - discovered)  # indexed or read
    if gone:
        return f"gone: {gone[0]}"
    # rows without stamps of undiscovered files are discovery's skips (a sync keeps the caveats
    # of indexed files and the read skips while their files are unchanged)
    stored = {(p, r) for p, r, stamp in recorded.skips if stamp is None and p not in discovered}
    if stored != {(s.path, s.reason) for s in found.skipped}:
        return "skipped files changed"
    if (stored_issues or []) != found.issues:
        return "scan issues changed"
    return None
