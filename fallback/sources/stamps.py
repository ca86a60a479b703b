"""A file's status-change time (ctime), where the platform gives one that every rewrite moves.

An index row is trusted without reading its file while the file's ``(mtime, size, ctime)``
equals what was recorded (``fallback/index/indexer.py``, ``fallback/engine/in_sync.py``). The
mtime alone is not enough: ``touch -r``, ``cp -p``, ``rsync -t`` and editors or sync tools that
keep mtimes put it back after a rewrite, and a rewrite of the same size then looks unchanged.
The ctime cannot be set that way: on POSIX systems the kernel stamps it on every write,
``chmod``, ``utime`` and rename onto the path, so a file whose ctime moved is read again and
its content hash decides. Git compares ``st_ctime`` in its index for the same reason (its
``core.trustctime``).

On Windows ``st_ctime_ns`` is the creation time, which a rewrite does not change, so no ctime
is used there (``None``) and the rule is ``(mtime, size)``.
"""

from __future__ import annotations

import os

__all__ = ["change_time_ns"]


def change_time_ns(st: os.stat_result, *, platform: str = os.name) -> int | None:
    """The status-change time of a stat result, epoch ns, or ``None`` when it is not usable.

    Args:
        st: an ``os.stat``/``os.lstat``/``os.fstat`` result.
        platform: ``os.name`` of the system that made ``st`` (``nt`` gives the creation time
            in ``st_ctime_ns``, not a change time).

    Returns:
        ``st.st_ctime_ns``; ``None`` on Windows.
    """
    return None if platform == "nt" else st.st_ctime_ns
