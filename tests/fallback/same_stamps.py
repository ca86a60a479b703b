"""Rewriting a file so that its size and mtime stay what they were (``touch -r``, ``cp -p``,
``rsync -t`` and editors that keep mtimes leave a rewrite this way): only its ctime moves."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["rewrite_keeping_size_and_mtime"]


def rewrite_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in ``path`` in place and put its atime and mtime
    back.

    The file-system clock moves in ticks of a few ms, and a rewrite in the tick of the file's
    last change would keep its ctime too: the file's own stamps are set again (a change the
    indexer would read anyway) until its ctime has moved, which waits on the clock's next tick,
    not on a fixed time. Asserts that size and mtime are unchanged and the ctime moved.
    """
    assert len(old) == len(new) and old != new
    before = path.stat()
    while path.stat().st_ctime_ns == before.st_ctime_ns:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    data = path.read_bytes()
    assert old in data
    with open(path, "r+b") as f:  # the same inode, as an in-place save
        f.write(data.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns
