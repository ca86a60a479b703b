"""Reading one discovered memory file's bytes for indexing: one descriptor, no symlinks, a
size cap, and the text, hash and size of the same bytes."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass

from fallback.models import SkippedFile
from fallback.sources.memory_files import MemoryFile
from fallback.text.scripts import sha256_hex

__all__ = ["FileContent", "read_memory_text"]

_UTF8_BOM = b"\xef\xbb\xbf"
# Control characters that mark a file with NUL bytes as binary (all C0 controls and DEL but
# tab, line feed, vertical tab, form feed and carriage return).
_BINARY_CONTROLS = re.compile(r"[\x01-\x08\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class FileContent:
    """The text of one memory file as it will be indexed.

    Attributes:
        text: the file decoded as UTF-8 (a leading BOM removed; invalid bytes replaced by
            U+FFFD when ``invalid_utf8``; NUL bytes removed when ``nul_bytes``).
        content_hash: sha256 hex of the raw bytes on disk.
        invalid_utf8: True when the bytes were not valid UTF-8.
        size: size in bytes.
        mtime_ms: modification time, epoch ms.
        nul_bytes: NUL bytes removed from the text (a note padded with NULs); 0 for most files.
    """

    text: str
    content_hash: str
    invalid_utf8: bool
    size: int
    mtime_ms: int
    nul_bytes: int = 0


def read_memory_text(f: MemoryFile, *, max_file_bytes: int) -> FileContent | SkippedFile:
    """Read one memory file for indexing; never raises for a bad file.

    The bytes are read once (through one descriptor, symlinks not followed), so the hash,
    size and text describe the same content.

    Args:
        f: the discovered file.
        max_file_bytes: size cap in bytes.

    Returns:
        :class:`FileContent`, or :class:`~fallback.models.SkippedFile` with ``path =
        f.rel_path`` and reason ``vanished before read``, ``symlink (not followed)``,
        ``unreadable: <OS reason>``, ``not a regular file``,
        ``too large (N bytes > cap M)`` or ``binary file (NUL bytes)`` (NUL bytes and other
        control bytes or invalid UTF-8; a text padded with NULs is read without them, see
        ``FileContent.nul_bytes``).
    """
    def skipped(reason: str) -> SkippedFile:
        return SkippedFile(path=f.rel_path, reason=reason)

    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(f.abs_path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return skipped("vanished before read")
        if exc.errno == errno.ELOOP:
            return skipped("symlink (not followed)")
        return skipped(f"unreadable: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return skipped("not a regular file")
        if st.st_size > max_file_bytes:
            return skipped(f"too large ({st.st_size} bytes > cap {max_file_bytes})")
        parts: list[bytes] = []
        total = 0
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            total += len(block)
            if total > max_file_bytes:
                return skipped(f"too large ({total} bytes > cap {max_file_bytes})")
            parts.append(block)
    except OSError as exc:
        return skipped(f"unreadable: {exc.strerror or exc}")
    finally:
        os.close(fd)
    data = b"".join(parts)
    body = data[len(_UTF8_BOM):] if data.startswith(_UTF8_BOM) else data
    nul_bytes = body.count(b"\x00")
    if nul_bytes:
        text = _text_without_nuls(body)
        if text is None:
            return skipped("binary file (NUL bytes)")
        return FileContent(text=text, content_hash=sha256_hex(data), invalid_utf8=False,
                           size=len(data), mtime_ms=int(st.st_mtime_ns // 1_000_000),
                           nul_bytes=nul_bytes)
    try:
        text = body.decode("utf-8")
        invalid = False
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="replace")
        invalid = True
    return FileContent(text=text, content_hash=sha256_hex(data), invalid_utf8=invalid,
                       size=len(data), mtime_ms=int(st.st_mtime_ns // 1_000_000))


def _text_without_nuls(body: bytes) -> str | None:
    """The text of a file that holds NUL bytes, or ``None`` when it is binary.

    A note padded with NUL bytes (preallocated or fixed-size files, the zero-filled tail or
    blocks a crash leaves behind) is text once the NULs are removed: valid UTF-8 without other
    control characters than tab, line feed, vertical tab, form feed and carriage return. Any
    other control byte or an invalid UTF-8 sequence means a binary file (images, archives,
    UTF-16 text), which is not indexed. Removing NUL bytes never changes line numbers, so the
    chunks' line ranges still match what ``memory_get`` pages.
    """
    try:
        text = body.replace(b"\x00", b"").decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _BINARY_CONTROLS.search(text) else text
