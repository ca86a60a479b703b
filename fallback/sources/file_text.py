"""Reading one discovered memory file (or session transcript) for indexing: one descriptor, no
symlinks, a size cap, and the text, hash and size of the same bytes."""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fallback.skipped import SkippedFile
from fallback.sources.memory_files import DEFAULT_MAX_FILE_BYTES, MemoryFile
from fallback.sources.stamps import change_time_ns
from fallback.text.scripts import sha256_hex

__all__ = ["BINARY_FILE", "VANISHED", "FileContent", "is_binary", "is_binary_file", "list_session_files",
           "read_memory_text", "read_session_text"]

# Skip reason of a file that disappeared between discovery and reading (not reported).
VANISHED = "vanished before read"
# Skip reason of a binary file (also memory_get's refusal of one: fallback/sources/read_page.py).
BINARY_FILE = "binary file (NUL bytes)"

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
        ctime_ns: status-change time, epoch ns; ``None`` where the platform gives none that
            rewrites move (``fallback/sources/stamps.py``).
    """

    text: str
    content_hash: str
    invalid_utf8: bool
    size: int
    mtime_ms: int
    nul_bytes: int = 0
    ctime_ns: int | None = None


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
            return skipped(VANISHED)
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
    invalid = False
    if nul_bytes:
        if is_binary([body]):
            return skipped(BINARY_FILE)
        text = body.replace(b"\x00", b"").decode("utf-8")
    else:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = body.decode("utf-8", errors="replace")
            invalid = True
    return FileContent(text=text, content_hash=sha256_hex(data), invalid_utf8=invalid,
                       size=len(data), mtime_ms=int(st.st_mtime_ns // 1_000_000),
                       nul_bytes=nul_bytes, ctime_ns=change_time_ns(st))


def is_binary(blocks: Iterable[bytes], *, complete: bool = True) -> bool:
    """Whether a file's bytes, given in order as blocks of any size, make it binary by the rule
    :func:`read_memory_text` indexes by: NUL bytes together with another control character
    than tab, line feed, vertical tab, form feed and carriage return, or with invalid UTF-8 once
    the NULs are removed (images, archives, UTF-16 text). A file without NUL bytes is never
    binary, and a note padded with NULs (preallocated or fixed-size files, the zero-filled
    tail or blocks a crash leaves behind) is text once they are removed, which never changes
    its line numbers. Reads the blocks once, holding one at a time.

    ``complete=False``: the blocks are a prefix of the file, so a UTF-8 sequence cut at their
    end is not invalid (the rest of it was not read).
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    nul = odd = False
    for block in blocks:
        nul = nul or b"\x00" in block
        if not odd:
            try:
                odd = bool(_BINARY_CONTROLS.search(decoder.decode(block.replace(b"\x00", b""))))
            except UnicodeDecodeError:
                odd = True
        if nul and odd:
            return True
    if nul and not odd and complete:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return True
    return False


def is_binary_file(fd: int, *, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bool:
    """:func:`is_binary` of the first ``max_bytes`` bytes of the file behind ``fd`` (all of it
    when it is not larger), read with ``pread`` in 1 MiB blocks (the file offset stays where
    it is).

    With ``max_bytes`` the index's size cap (``maxFileBytes``, 10 MiB by default), every file
    the index reads is judged whole, as :func:`read_memory_text` judges it; a larger file,
    which the index skips as too large, is judged by that prefix alone (a NUL byte after it is
    never read). A first pass only looks for a NUL byte, so a text file costs one read of at
    most ``max_bytes`` bytes and no decoding; one with a NUL byte two.

    Raises:
        OSError: as ``os.fstat`` / ``os.pread``.
    """
    def blocks() -> Iterator[bytes]:
        offset = 0
        while offset < max_bytes and (block := os.pread(fd, min(1 << 20, max_bytes - offset), offset)):
            offset += len(block)
            yield block

    complete = os.fstat(fd).st_size <= max_bytes
    return any(b"\x00" in block for block in blocks()) and is_binary(blocks(), complete=complete)


def list_session_files(sessions_dir: Path) -> tuple[list[MemoryFile], str | None]:
    """Transcripts of ``sessions_dir`` as :class:`MemoryFile` rows, and the enumeration error.

    Args:
        sessions_dir: the agent's transcript folder.

    Returns:
        ``(files, error)``: each transcript (``*.jsonl`` and retained archives, see
        :func:`fallback.sources.transcripts.scan_transcripts`) with ``rel_path``
        ``sessions/<basename>`` (a name that is not UTF-8 in its printable form) and source
        ``sessions``; files that vanish while being listed are left out. ``error`` is the
        listing problem, or ``None``.
    """
    from fallback.sources.transcripts import scan_transcripts, transcript_path  # sessions source only

    scan = scan_transcripts(sessions_dir)
    out: list[MemoryFile] = []
    for path in scan.paths:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        out.append(MemoryFile.from_stat(path, transcript_path(path.name), st, source="sessions"))
    return out, scan.error


def read_session_text(mf: MemoryFile) -> tuple[FileContent | SkippedFile, list[int] | None]:
    """Flatten one transcript (spec §5.4) for indexing; never raises for a bad file.

    Returns:
        ``(FileContent, line_map)`` where ``line_map[i]`` is the JSONL line of text line
        ``i + 1``, or ``(SkippedFile, None)`` with reason ``vanished before read`` or
        ``unreadable: <OS reason>``. A cron-run or fully filtered transcript gives empty
        content (a files row, no chunks).
    """
    try:
        with open(mf.abs_path, "rb"):
            pass
    except FileNotFoundError:
        return SkippedFile(path=mf.rel_path, reason=VANISHED), None
    except OSError as exc:
        return SkippedFile(path=mf.rel_path, reason=f"unreadable: {exc.strerror or exc}"), None
    from fallback.sources.transcripts import session_document

    doc = session_document(mf.abs_path)
    return FileContent(text=doc.content, content_hash=doc.content_hash, invalid_utf8=False,
                       size=mf.size, mtime_ms=mf.mtime_ms, ctime_ns=mf.ctime_ns), doc.line_map
