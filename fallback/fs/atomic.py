"""Atomic file replacement: readers see a file's old content or its new content, never a mix.

Used by every file the project rewrites in place (session exports, the circuit breaker's shared
state, the qmd probe cache and ``index.yml``, reconcile markers, flush records) and, through
:func:`publish_file`, by downloads too large to hold in memory (GGUF models streamed to a partial
file). It lives in the neutral ``fallback.fs`` package so both ``fallback`` and ``qmdbridge``
can use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["TEMP_PREFIX", "TEMP_SUFFIX", "publish_file", "write_atomic"]

# Temporary files are ``.tmp-<random>.part`` beside the target: hidden, and never ``*.md``, so a
# Markdown watcher or qmd's collection glob never picks up a half-written file.
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

    Permissions are kept unless ``mode`` is given: an existing ``target``'s permission bits
    are copied to the new file; a new file gets ``0o666`` minus the umask, like
    ``open(path, "w")`` (ownership is not copied). The folder must exist.

    Args:
        target: the file to replace or create.
        data: the complete new content.
        durable: False skips both fsyncs, for advisory state rewritten on a hot path (the
            circuit breaker records every search): concurrent readers still see old or new
            content, but after a power loss the file may be old or empty.
        mode: the permission bits of the new file whatever the umask and the old file's
            (``0o600`` for a file only its owner may read or write), or ``None``.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full; ``target`` is
            unchanged and the temporary file is removed.
    """
    target = Path(target)
    keep_mode = mode
    if keep_mode is None:
        try:
            keep_mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            pass
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


def publish_file(source: Path, target: Path, *, durable: bool = True) -> None:
    """Move a completely written file into place: fsync ``source``, rename it over ``target``,
    then fsync the folder, so readers see no file or the whole file, never a part of it.

    For content written elsewhere in pieces (a download streamed to ``<name>.part``);
    :func:`write_atomic` covers content held in memory.

    Args:
        source: the finished file, in the same folder as ``target`` (a rename never copies).
        target: the final path; an existing file there is replaced.
        durable: False skips both fsyncs (see :func:`write_atomic`).

    Raises:
        OSError: ``source`` is missing or the rename fails; ``target`` is then unchanged.
    """
    source, target = Path(source), Path(target)
    if durable:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(source, target)
    if durable:
        _fsync_dir(target.parent)
