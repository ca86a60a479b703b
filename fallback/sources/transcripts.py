"""Session transcripts: list, parse and sanitise ``*.jsonl`` transcripts into searchable text.

Shared by the builtin engine's ``sessions`` source and the qmd export, so both see the same
messages. A kept record is ``{"type": "message", "message": {"role": "user"|"assistant",
"content": str | [{"type": "text", "text": str}, ...]}}``.

Sanitising (``qmd-bridge-spec.md`` 2.11, ``builtin-engine-spec.md`` 5.4): inbound metadata
envelopes, ``[message_id: ...]`` lines, a leading timestamp and directive tags are stripped;
system wrappers, cron and heartbeat prompts, heartbeat acks, ``NO_REPLY`` and inter-session
user messages are dropped; whitespace collapses and secrets are redacted. A transcript whose
first user message is a cron prompt is excluded whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from fallback.text.path_names import printable_path
from fallback.text.redact import redact_secrets

__all__ = ["SESSIONS_DIR_NAME", "SessionDeltaTracker", "TranscriptMessage", "TranscriptParse",
           "TranscriptScan", "message_line", "parse_transcript", "sanitize_message_text",
           "scan_transcripts", "session_id_for", "transcript_path"]

Role = Literal["user", "assistant"]

# The folder of the builtin engine's session citations: hits of a transcript cite ``sessions/<name>``.
SESSIONS_DIR_NAME = "sessions"

# Newline counting and hashing read files in blocks of this many bytes (spec 5.4: 64 KiB).
READ_BLOCK_BYTES = 64 * 1024
# An assistant reply that is HEARTBEAT_OK plus at most this many chars is an ack (dropped).
HEARTBEAT_ACK_MAX_CHARS = 300

_CHECKPOINT = re.compile(
    r"\.checkpoint\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.jsonl$", re.I)
_ARCHIVE = re.compile(r"\.jsonl\.(?:reset|deleted)\.[^/\\]+$")
_BACKUP = re.compile(r"\.bak(?:\.|$)|~$", re.I)

_SYSTEM_WRAPPER = re.compile(r"^System(?: \(untrusted\))?:\s*\[")
_CRON_PROMPT = re.compile(r"^\[cron:", re.I)
_HEARTBEAT_PROMPT = re.compile(r"^Read HEARTBEAT\.md\b")
_INTER_SESSION = re.compile(r"^\[Inter-session message\]")
_SILENT = re.compile(r"^\W*NO_REPLY\W*$")
_HEARTBEAT_TOKEN = "HEARTBEAT_OK"
_METADATA_BLOCK = re.compile(
    r"\A\s*[A-Za-z][A-Za-z ]{0,60}\((?:untrusted|metadata)[^)\n]*\):[ \t]*\n"
    r"\s*```[A-Za-z0-9]*[ \t]*\n[\s\S]*?\n[ \t]*```[ \t]*(?:\n|\Z)")
_FENCED_JSON = re.compile(r"\A\s*```json[ \t]*\n[\s\S]*?\n[ \t]*```[ \t]*(?:\n|\Z)", re.I)
_MESSAGE_ID_LINE = re.compile(r"^[ \t]*\[message_id:[^\]\n]*\][ \t]*$\n?", re.M)
_TIMESTAMP_PREFIX = re.compile(
    r"\A\s*\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{1,2}:\d{2}[^\]\n]{0,24}\][ \t]*")
_DIRECTIVE_TAG = re.compile(r"\[\[\s*(?:reply_to_current|reply_to\s*:[^\]]*|audio_as_voice)\s*\]\]")


@dataclass(frozen=True)
class TranscriptMessage:
    """One kept message: its ``role``, sanitised single-line ``text`` and the 1-based JSONL
    ``line_no`` of its record."""

    role: Role
    text: str
    line_no: int


@dataclass(frozen=True)
class TranscriptParse:
    """The result of :func:`parse_transcript`.

    Attributes:
        messages: kept messages in file order.
        errors: one line per problem (``line 3: invalid JSON``, ``read failed: ...``).
        read_failed: True when the file could not be read (messages then empty).
        excluded_reason: set when the whole transcript is excluded (``cron run``).
        line_count: lines read.
    """

    messages: list[TranscriptMessage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    read_failed: bool = False
    excluded_reason: str | None = None
    line_count: int = 0


@dataclass(frozen=True)
class TranscriptScan:
    """The result of :func:`scan_transcripts`: transcript ``paths`` sorted by name, and the
    ``error`` that stopped the listing part-way, if any."""

    paths: list[Path]
    error: str | None = None


def is_transcript_name(name: str) -> bool:
    """Whether a file name is a transcript: ``<id>.jsonl`` or an archive
    ``<id>.jsonl.{reset,deleted}.<iso>``, not a checkpoint ``<id>.checkpoint.<uuid>.jsonl``
    nor a backup (``.bak``, ``~``)."""
    if name.startswith(".") or _BACKUP.search(name):
        return False
    if name.endswith(".jsonl"):
        return not _CHECKPOINT.search(name)
    return bool(_ARCHIVE.search(name))


def transcript_path(name: str) -> str:
    """The path a transcript's hits cite: ``sessions/<printable name>``."""
    return f"{SESSIONS_DIR_NAME}/{printable_path(name)}"


def session_id_for(path: Path) -> str:
    """The session id of a transcript file: ``abc.jsonl`` -> ``abc``,
    ``abc.jsonl.reset.<iso>`` -> ``abc.reset.<iso>``."""
    name = path.name
    return name.removesuffix(".jsonl") if name.endswith(".jsonl") else name.replace(".jsonl.", ".", 1)


def scan_transcripts(sessions_dir: Path) -> TranscriptScan:
    """List the transcripts (regular files) directly inside ``sessions_dir``, never raising;
    a missing folder is an empty list without error."""
    paths: list[Path] = []
    error = None
    try:
        with os.scandir(sessions_dir) as entries:
            for entry in entries:
                if is_transcript_name(entry.name) and entry.is_file(follow_symlinks=False):
                    paths.append(Path(entry.path))
    except FileNotFoundError:
        return TranscriptScan(paths=[])
    except OSError as exc:
        error = f"session enumeration failed: {sessions_dir}: {exc.strerror or type(exc).__name__}"
    return TranscriptScan(paths=sorted(paths, key=lambda p: p.name), error=error)


def _strip_envelopes(text: str) -> str:
    """Remove inbound metadata envelopes from the start of a user message."""
    previous = None
    while previous != text:
        previous = text
        text = _METADATA_BLOCK.sub("", text, count=1)
        text = _FENCED_JSON.sub("", text, count=1)
        text = _MESSAGE_ID_LINE.sub("", text)
        stripped = text.lstrip()
        if stripped.startswith("{"):  # a leading JSON object
            with contextlib.suppress(ValueError):
                value, end = json.JSONDecoder().raw_decode(stripped)
                text = stripped[end:] if isinstance(value, dict) else text
        text = _TIMESTAMP_PREFIX.sub("", text, count=1)
    return text


def sanitize_message_text(role: Role, text: str) -> str | None:
    """Sanitise one message's raw text (rules in the module docstring); ``None`` when the
    message is dropped or empty."""
    if role == "user":
        text = _strip_envelopes(text)
    text = _DIRECTIVE_TAG.sub(" ", text).strip()
    if not text or _SYSTEM_WRAPPER.match(text) or _CRON_PROMPT.match(text) or _SILENT.match(text) or (
            role == "user" and (_HEARTBEAT_PROMPT.match(text) or _INTER_SESSION.match(text))):
        return None
    if role == "assistant" and _HEARTBEAT_TOKEN in text:
        rest = text.removeprefix(_HEARTBEAT_TOKEN).removesuffix(_HEARTBEAT_TOKEN)
        if rest != text:
            if len(rest.strip()) <= HEARTBEAT_ACK_MAX_CHARS:
                return None
            text = rest
    return redact_secrets(" ".join(text.split())) or None


def _message_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [b["text"] for b in content
                 if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]
        return "\n".join(parts)
    return None


def _is_inter_session(record: dict[str, Any], message: dict[str, Any]) -> bool:
    return any(isinstance(prov := holder.get(key), dict) and prov.get("kind") == "inter_session"
               for holder in (message, record) for key in ("provenance", "inputProvenance"))


def message_line(message: TranscriptMessage) -> str:
    """The line a kept message is indexed and read as: ``User: <text>`` or ``Assistant: <text>``."""
    return f"{'User' if message.role == 'user' else 'Assistant'}: {message.text}"


def parse_transcript(path: Path | int) -> TranscriptParse:
    """Read a ``*.jsonl`` transcript (a path, or a descriptor it closes) into sanitised
    messages, never raising: lines that are not JSON objects are named in ``errors``, an
    unreadable file gives ``read_failed=True``."""
    messages: list[TranscriptMessage] = []
    errors: list[str] = []
    line_no = 0
    first_user_raw: str | None = None
    try:
        with open(path, "rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                line = raw.decode("utf-8", errors="replace").strip()
                if not line:
                    continue
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    errors.append(f"line {line_no}: invalid JSON")
                    continue
                if not isinstance(record, dict):
                    errors.append(f"line {line_no}: not a JSON object")
                    continue
                message = record.get("message")
                if record.get("type") != "message" or not isinstance(message, dict):
                    continue
                role, text = message.get("role"), _message_text(message.get("content"))
                if role not in ("user", "assistant") or text is None:
                    continue
                if role == "user" and first_user_raw is None:
                    first_user_raw = _strip_envelopes(text).strip()
                clean = (None if role == "user" and _is_inter_session(record, message)
                         else sanitize_message_text(role, text))
                if clean is not None:
                    messages.append(TranscriptMessage(role=role, text=clean, line_no=line_no))
    except OSError as exc:
        return TranscriptParse(errors=[f"read failed: {exc.strerror or type(exc).__name__}"],
                               read_failed=True)
    if first_user_raw is not None and _CRON_PROMPT.match(first_user_raw):
        return TranscriptParse(errors=errors, excluded_reason="cron run", line_count=line_no)
    return TranscriptParse(messages=messages, errors=errors, line_count=line_no)


@dataclass
class _DeltaState:
    last_size: int = 0
    pending_bytes: int = 0
    pending_messages: int = 0


def _count_newlines(path: Path, start: int, end: int) -> int:
    """Count ``\\n`` bytes in ``[start, end)`` of a file."""
    count = 0
    with open(path, "rb") as fh:
        fh.seek(start)
        remaining = end - start
        while remaining > 0:
            block = fh.read(min(READ_BLOCK_BYTES, remaining))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count


class SessionDeltaTracker:
    """Decide when a growing transcript has changed enough to re-index (spec 5.4).

    Per file it counts appended bytes and lines since the last re-index (a shrink counts
    the whole file); a threshold is hit at ``>= delta`` (``> 0`` for a delta ``<= 0``), and a
    hit subtracts the thresholds (floor 0).

    Args:
        delta_bytes: bytes of growth that trigger a re-index (``sync.sessions.deltaBytes``).
        delta_messages: appended lines that trigger a re-index (``deltaMessages``).
    """

    def __init__(self, delta_bytes: int, delta_messages: int) -> None:
        self.delta_bytes = delta_bytes
        self.delta_messages = delta_messages
        self._states: dict[str, _DeltaState] = {}

    def observe(self, path: Path) -> bool:
        """Account for the file's current size; True when a threshold is hit (False, and
        forgotten, for a missing file)."""
        key = str(path)
        try:
            size = os.stat(path).st_size
        except OSError:
            self._states.pop(key, None)
            return False
        state = self._states.setdefault(key, _DeltaState())
        if size == state.last_size:
            return self._hit(state)
        start = state.last_size if size > state.last_size else 0
        state.pending_bytes += size - start
        if self.delta_messages > 0 and (self.delta_bytes <= 0
                                        or state.pending_bytes < self.delta_bytes):
            with contextlib.suppress(OSError):
                state.pending_messages += _count_newlines(path, start, size)
        state.last_size = size
        return self._hit(state)

    def _hit(self, state: _DeltaState) -> bool:
        bytes_hit = (state.pending_bytes >= self.delta_bytes if self.delta_bytes > 0
                     else state.pending_bytes > 0)
        messages_hit = (state.pending_messages >= self.delta_messages if self.delta_messages > 0
                        else state.pending_messages > 0)
        if not (bytes_hit or messages_hit):
            return False
        state.pending_bytes = (max(0, state.pending_bytes - self.delta_bytes)
                               if self.delta_bytes > 0 else 0)
        state.pending_messages = (max(0, state.pending_messages - self.delta_messages)
                                  if self.delta_messages > 0 else 0)
        return True

    def reset(self, path: Path, size: int) -> None:
        """Record that ``path`` was indexed at ``size`` bytes: ``{size, 0, 0}``."""
        self._states[str(path)] = _DeltaState(last_size=size)

    def below_threshold(self) -> int:
        """How many files grew since their last re-index without hitting a threshold yet (their
        new lines are not indexed)."""
        return sum(1 for st in self._states.values() if st.pending_bytes or st.pending_messages)

    def pending(self, path: Path) -> tuple[int, int, int]:
        """``(last_size, pending_bytes, pending_messages)`` for ``path`` (zeros if unknown)."""
        return astuple(self._states.get(str(path), _DeltaState()))
