"""A file's status-change time (ctime), where the platform gives one that every rewrite moves.

An index row is trusted without reading its file while its ``(mtime, size, ctime)`` equals
what was recorded: ``touch -r``, ``cp -p`` and ``rsync -t`` put an mtime back after a rewrite,
but the kernel stamps the ctime on every write (git's ``core.trustctime``). On Windows
``st_ctime_ns`` is the creation time, so no ctime is used there.
"""

from __future__ import annotations

import os

__all__ = ["change_time_ns"]


def change_time_ns(st: os.stat_result, *, platform: str = os.name) -> int | None:
    """``st.st_ctime_ns``, epoch ns, or ``None`` when ``platform`` (``os.name`` of the system
    that made ``st``) is ``nt``."""
    return None if platform == "nt" else st.st_ctime_ns
