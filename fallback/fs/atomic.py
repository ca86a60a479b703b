"""Atomic file replacement: readers see a file's old content or its new content, never a mix.

Used by every file the project rewrites in place and, through :func:`publish_file`, by
downloads streamed to a partial file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["TEMP_PREFIX", "TEMP_SUFFIX", "publish_file", "write_atomic"]

# Temporary files are ``.tmp-<random>.part`` beside the target: hidden and never ``*.md``, so no
# watcher or collection glob picks up a half-written file.
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".part"
# Permission bits of a new file before the umask, as ``open(path, "w")`` would use.
_NEW_FILE_MODE = 0o666


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(target: Path, data: bytes, *, durable: bool = True, mode: int | None = None) -> None:
    """Replace ``target`` with ``data``: write a temporary file in the same folder, fsync it,
    rename it over ``target``, then fsync the folder.

    Args:
        target: the file to replace or create (its folder must exist).
        data: the complete new content.
        durable: False skips both fsyncs (advisory state on a hot path: after a power loss
            the file may be old or empty).
        mode: the permission bits of the new file, or ``None``: an existing file's bits, else
            ``0o666`` minus the umask.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full; ``target`` is
            unchanged and the temporary file is removed.
    """
    keep_mode = mode
    if keep_mode is None:
        with contextlib.suppress(FileNotFoundError):
            keep_mode = stat.S_IMODE(os.stat(target).st_mode)
    tmp = target.with_name(f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, _NEW_FILE_MODE if keep_mode is None else keep_mode)
    try:
        with open(fd, "wb", closefd=True) as fh:
            if keep_mode is not None:
                os.chmod(tmp, keep_mode)  # the umask may have dropped bits of the old mode
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(target.parent)


def publish_file(source: Path, target: Path) -> None:
    """Move a completely written ``source`` (in ``target``'s folder) into place: fsync it,
    rename it over ``target``, fsync the folder; readers see no file or the whole file.

    Raises:
        OSError: ``source`` is missing or the rename fails; ``target`` is then unchanged.
    """
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(source, target)
    _fsync_dir(target.parent)
