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

from fallback.skipped import DEFAULT_MAX_FILE_BYTES, SkippedFile
from fallback.sources.memory_files import NOFOLLOW_READ, SYMLINK_ERRNOS, SYMLINK_SKIP, MemoryFile
from fallback.sources.stamps import change_time_ns
from fallback.text.scripts import sha256_hex

__all__ = ["BINARY_FILE", "VANISHED", "FileContent", "is_binary", "is_binary_file", "is_binary_path",
           "list_session_files", "read_memory_text", "read_session_text"]

# Skip reason of a file that disappeared between discovery and reading (not reported).
VANISHED = "vanished before read"
# Skip reason of a binary file (also memory_get's refusal of one: fallback/sources/read_page.py).
BINARY_FILE = "binary file (NUL bytes)"

_UTF8_BOM = b"\xef\xbb\xbf"
# Control characters that mark a file with NUL bytes as binary (C0 and DEL but \t \n \v \f \r).
_BINARY_CONTROLS = re.compile(r"[\x01-\x08\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class FileContent:
    """The text of one memory file as it will be indexed.

    Attributes:
        text: the file decoded as UTF-8 (BOM removed, invalid bytes as U+FFFD, NULs removed).
        content_hash: sha256 hex of the raw bytes on disk.
        invalid_utf8: True when the bytes were not valid UTF-8.
        size: size in bytes.
        mtime_ms: modification time, epoch ms.
        nul_bytes: NUL bytes removed from the text.
        ctime_ns: status-change time, epoch ns, or ``None`` (``fallback/sources/stamps.py``).
    """

    text: str
    content_hash: str
    invalid_utf8: bool
    size: int
    mtime_ms: int
    nul_bytes: int = 0
    ctime_ns: int | None = None


def read_memory_text(f: MemoryFile, *, max_file_bytes: int) -> FileContent | SkippedFile:
    """Read one memory file for indexing (once, through one descriptor, so hash, size and
    text describe the same bytes); never raises for a bad file.

    Args:
        f: the discovered file.
        max_file_bytes: size cap in bytes.

    Returns:
        :class:`FileContent`, or a :class:`~fallback.skipped.SkippedFile` with reason
        :data:`VANISHED`, :data:`SYMLINK_SKIP`, ``unreadable: <OS reason>``, ``not a
        regular file``, ``too large (N bytes > cap M)`` or :data:`BINARY_FILE`.
    """
    def skipped(reason: str) -> SkippedFile:
        return SkippedFile(path=f.rel_path, reason=reason)

    try:
        fd = os.open(f.abs_path, NOFOLLOW_READ)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return skipped(VANISHED)
        if exc.errno in SYMLINK_ERRNOS:
            return skipped(SYMLINK_SKIP)
        return skipped(f"unreadable: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return skipped("not a regular file")
        if st.st_size > max_file_bytes:
            return skipped(f"too large ({st.st_size} bytes > cap {max_file_bytes})")
        with open(fd, "rb", closefd=False) as fh:
            data = fh.read(max_file_bytes + 1)  # a file that grew since fstat is cut here
        if len(data) > max_file_bytes:
            return skipped(f"too large ({len(data)} bytes > cap {max_file_bytes})")
    except OSError as exc:
        return skipped(f"unreadable: {exc.strerror or exc}")
    finally:
        os.close(fd)
    body = data.removeprefix(_UTF8_BOM)
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
    """Whether a file's bytes (blocks in order) make it binary: NUL bytes together with
    another control character or with invalid UTF-8 once the NULs are removed. A note padded
    with NULs is text. ``complete=False``: the blocks are a prefix, so a cut UTF-8 sequence at
    their end is not invalid."""
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
    """:func:`is_binary` of the first ``max_bytes`` bytes of the file behind ``fd`` (read
    with ``pread``: the file offset stays where it is).

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


def is_binary_path(path: Path, *, max_bytes: int) -> bool:
    """:func:`is_binary_file` of the first ``max_bytes`` bytes of the note at ``path`` (opened
    as discovery opens it: no symlink, no blocking); ``False`` when it cannot be opened or read."""
    try:
        fd = os.open(path, NOFOLLOW_READ)
        try:
            return is_binary_file(fd, max_bytes=max_bytes)
        finally:
            os.close(fd)
    except OSError:
        return False


def list_session_files(sessions_dir: Path) -> tuple[list[MemoryFile], str | None]:
    """``(files, error)``: the transcripts of ``sessions_dir`` as :class:`MemoryFile` rows
    (``rel_path`` ``sessions/<name>``, source ``sessions``) and the listing error, or ``None``."""
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
    """Flatten one transcript (spec §5.4) for indexing: one ``message_line`` per kept message
    (an unreadable or fully filtered file: empty text); never raises for a bad file.

    Returns:
        ``(FileContent, line_map)`` (``line_map[i]``: the 1-based JSONL line of text line
        ``i + 1``; ``content_hash``: sha256 hex of the text, ``"\\n"`` and the comma-joined
        line map), or ``(SkippedFile, None)``.
    """
    try:
        fd = os.open(mf.abs_path, os.O_RDONLY)
    except FileNotFoundError:
        return SkippedFile(path=mf.rel_path, reason=VANISHED), None
    except OSError as exc:
        return SkippedFile(path=mf.rel_path, reason=f"unreadable: {exc.strerror or exc}"), None
    from fallback.sources.transcripts import message_line, parse_transcript

    messages = parse_transcript(fd).messages
    text = "\n".join(message_line(m) for m in messages)
    line_map = [m.line_no for m in messages]
    return FileContent(text=text, content_hash=sha256_hex(f"{text}\n{','.join(map(str, line_map))}"),
                       invalid_utf8=False, size=mf.size, mtime_ms=mf.mtime_ms,
                       ctime_ns=mf.ctime_ns), line_map
