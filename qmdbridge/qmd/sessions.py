"""Session transcript export: one sanitised, redacted Markdown file per transcript, for qmd (spec 2.11).

Before each ``qmd update`` the agent's ``*.jsonl`` transcripts are rendered (through
``fallback.sources.transcripts``) into ``<export_dir>/<session id>.md``, rewritten only when
their bytes change; passes over one export dir are serialised by ``.export.lock``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from fallback.errors import BackendTimeoutError, BackendUnavailableError, LockTimeoutError
from fallback.fs.atomic import write_atomic
from fallback.fs.lock import PidFileLock
from fallback.sources.stamps import change_time_ns
from fallback.sources.transcripts import TranscriptMessage, parse_transcript, scan_transcripts, session_id_for

__all__ = ["EXPORT_LOCK_TIMEOUT_MS", "EXPORT_WRAP_CHARS", "ExportReport", "ExportState", "export_sessions",
           "render_session_markdown"]

# Content chars per exported line (spec 2.11); longer messages wrap on spaces.
EXPORT_WRAP_CHARS = 800
_DAY_MS = 86_400_000
_LOCK_NAME = ".export.lock"
# How long a pass waits for another pass over the same export dir (ms): longer means it is stuck.
EXPORT_LOCK_TIMEOUT_MS = 120_000


@dataclass(frozen=True)
class _Seen:
    mtime_ns: int
    size: int
    ctime_ns: int | None
    digest: str


@dataclass
class ExportState:
    """What the last passes exported, by transcript path (``mtime_ns, size, ctime_ns``, digest of
    the export), so unchanged transcripts are not parsed again. One per manager."""

    seen: dict[str, _Seen] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportReport:
    """The outcome of one :func:`export_sessions` pass.

    Attributes:
        written: export file names (``<id>.md``) created or rewritten.
        unchanged: export file names already current.
        removed: stale export file names deleted.
        errors: one line per transcript that could not be read or written (its old export kept).
    """

    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in pieces of at most ``width`` code points, broken on spaces (a longer word is cut)."""
    pieces: list[str] = []
    rest = text
    while len(rest) > width:
        cut = rest.rfind(" ", 0, width + 1)
        if cut <= 0:
            pieces.append(rest[:width])
            rest = rest[width:].lstrip(" ")
        else:
            pieces.append(rest[:cut].rstrip(" "))
            rest = rest[cut + 1:].lstrip(" ")
    if rest or not pieces:
        pieces.append(rest)
    return pieces


def render_session_markdown(session_id: str, messages: list[TranscriptMessage], *,
                            wrap_chars: int = EXPORT_WRAP_CHARS) -> str:
    """Sanitised messages as the exported document: ``# Session <id>\\n\\n<body>\\n``, one
    ``User:``/``Assistant:`` line per ``wrap_chars`` of content, ``(empty)`` without messages."""
    lines: list[str] = []
    for message in messages:
        label = "User" if message.role == "user" else "Assistant"
        lines.extend(f"{label}: {piece}" for piece in _wrap(message.text, wrap_chars))
    body = "\n".join(lines) if lines else "(empty)"
    return f"# Session {session_id}\n\n{body}\n"


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def export_sessions(sessions_dir: Path, export_dir: Path, *, retention_days: int | None,
                    now_ms: int, state: ExportState | None = None,
                    lock_timeout_ms: int = EXPORT_LOCK_TIMEOUT_MS) -> ExportReport:
    """Export every transcript in ``sessions_dir`` to ``export_dir/<session id>.md`` (written only
    when its bytes differ; transcripts past ``retention_days`` and cron runs skipped; every other
    ``*.md`` there deleted at the end; with ``state``, updated in place, an unchanged transcript
    is not parsed again). ``export_dir`` is created if missing; ``retention_days`` ``None`` or 0
    keeps all; ``now_ms``: epoch ms; ``lock_timeout_ms``: wait for another pass there, ms.

    Returns:
        :class:`ExportReport` with export file names.

    Raises:
        BackendUnavailableError: the sessions dir could not be listed (nothing deleted), or the
            lock file cannot be opened.
        BackendTimeoutError: another pass held the lock longer than ``lock_timeout_ms``.
    """
    state = ExportState() if state is None else state  # a pass of its own: nothing reused
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    report = ExportReport()
    cutoff_ms = now_ms - retention_days * _DAY_MS if retention_days else None
    lock = PidFileLock(export_dir / _LOCK_NAME, timeout_ms=lock_timeout_ms)
    try:
        lock.acquire_blocking()
    except LockTimeoutError as exc:
        raise BackendTimeoutError("qmd", f"waiting for the session export lock {lock.path}",
                                  lock_timeout_ms) from exc
    except OSError as exc:
        raise BackendUnavailableError(
            "qmd", f"cannot open the session export lock {lock.path}: {exc}") from exc
    try:
        scan = scan_transcripts(Path(sessions_dir))
        produced: set[str] = set()
        present: set[str] = set()
        for path in scan.paths:
            key = str(path)
            present.add(key)
            session_id = session_id_for(path)
            name = f"{session_id}.md"  # a file name's segment: no "/", never "." or ".."
            if "\\" in name:  # qmd skips such a name (status lists the transcript, with a fix)
                report.errors.append(f"{path.name}: not exported: qmd skips a file name with a backslash")
                continue
            target = export_dir / name
            try:
                st = path.stat()
            except OSError as exc:
                report.errors.append(f"{path.name}: stat failed: {exc.strerror or exc}")
                continue
            if cutoff_ms is not None and st.st_mtime_ns // 1_000_000 < cutoff_ms:
                continue
            produced.add(name)
            seen = state.seen.get(key)
            if (seen is not None and (seen.mtime_ns, seen.size, seen.ctime_ns)
                    == (st.st_mtime_ns, st.st_size, change_time_ns(st))):
                current = _read_bytes(target)
                if current is not None and hashlib.sha256(current).hexdigest() == seen.digest:
                    report.unchanged.append(name)
                    continue
            parsed = parse_transcript(path)
            if parsed.read_failed:
                report.errors.append(f"{path.name}: {'; '.join(parsed.errors)}")
                continue
            if parsed.excluded_reason is not None:
                produced.discard(name)
                continue
            data = render_session_markdown(session_id, parsed.messages).encode("utf-8")
            if _read_bytes(target) == data:
                report.unchanged.append(name)
            else:
                try:
                    write_atomic(target, data)
                except OSError as exc:
                    report.errors.append(f"{name}: write failed: {exc.strerror or exc}")
                    continue
                report.written.append(name)
            state.seen[key] = _Seen(st.st_mtime_ns, st.st_size, change_time_ns(st),
                                    hashlib.sha256(data).hexdigest())
        if scan.error is not None:
            raise BackendUnavailableError(
                "qmd", "QMD session export aborted: session enumeration failed")
        for entry in sorted(export_dir.glob("*.md")):
            if entry.name not in produced and entry.is_file():
                entry.unlink(missing_ok=True)
                report.removed.append(entry.name)
        for key in [k for k in state.seen if k not in present]:
            del state.seen[key]
    finally:
        lock.close()
    return report
