"""Tests for fallback.sources.transcripts: listing, parsing, sanitising, session documents, delta tracking."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from fallback.sources.file_text import FileContent, read_session_text
from fallback.sources.memory_files import MemoryFile
from fallback.sources.transcripts import (
    SessionDeltaTracker,
    TranscriptMessage,
    TranscriptScan,
    parse_transcript,
    sanitize_message_text,
    scan_transcripts,
    session_id_for,
)


def msg(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "message": {"role": role, "content": content, **extra}}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_bytes(b"".join(
        (r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records))
    return path


ENVELOPE = (
    "Conversation info (untrusted metadata):\n```json\n{\n  \"message_id\": \"4542\",\n"
    "  \"sender\": \"D W\"\n}\n```\n\nSender (untrusted metadata):\n```json\n{\n  \"id\": \"5\"\n}\n"
    "```\n\nYes please   check\nthe cap"
)


def test_parse_keeps_user_and_assistant_text(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s1.jsonl", [
        {"type": "session", "id": "s1"},
        msg("user", "Where is the  meeting?"),
        msg("assistant", [{"type": "text", "text": "In room"}, {"type": "tool_use", "id": "t"},
                          {"type": "text", "text": "4B."}]),
        msg("system", "you are helpful"),
        msg("tool", "result"),
        {"type": "custom", "message": {"role": "user", "content": "not a message record"}},
        msg("user", {"unexpected": "shape"}),
    ])
    parsed = parse_transcript(path)
    assert parsed.messages == [
        TranscriptMessage(role="user", text="Where is the meeting?", line_no=2),
        TranscriptMessage(role="assistant", text="In room 4B.", line_no=3),
    ]
    assert parsed.errors == []
    assert parsed.read_failed is False


def test_parse_skips_invalid_lines_and_replaces_bad_utf8(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s2.jsonl", [
        b"{not json",
        msg("user", "caf\u00e9"),
        b"",
        b"[1, 2]",
        b'{"type":"message","message":{"role":"user","content":"bad \xff byte"}}',
    ])
    parsed = parse_transcript(path)
    assert parsed.messages == [
        TranscriptMessage(role="user", text="caf\u00e9", line_no=2),
        TranscriptMessage(role="user", text="bad \ufffd byte", line_no=5),
    ]
    assert parsed.errors == ["line 1: invalid JSON", "line 4: not a JSON object"]


def test_parse_missing_file_reports_read_failure(tmp_path: Path) -> None:
    parsed = parse_transcript(tmp_path / "gone.jsonl")
    assert parsed.read_failed is True
    assert parsed.messages == []
    assert parsed.errors == ["read failed: No such file or directory"]


@pytest.mark.parametrize(("role", "text", "expected"), [
    ("user", ENVELOPE, "Yes please check the cap"),
    ("user", "[message_id: om_x100b]\nou_0e01: hello there", "ou_0e01: hello there"),
    ("user", '{"chat_id": "telegram:1", "message_id": "12"}\nReboot it', "Reboot it"),
    ("user", "```json\n{\"chat_id\": 1}\n```\nCan you\nrestart?", "Can you restart?"),
    ("user", "[Sat 2026-02-14 18:49 GMT-3] what now", "what now"),
    ("assistant", "[[reply_to_current]] Salut Denis", "Salut Denis"),
    ("assistant", "Done.\n\n\tAll   good", "Done. All good"),
    ("user", "my key is sk-abcdefghijklmnopqrstuvwxyz0123", "my key is [REDACTED:openai_key]"),
    ("user", "System: [2026-03-01 10:00] Exec completed (abc, code 0)", None),
    ("user", "System (untrusted): [2026-03-01] Discord message edited", None),
    ("user", "[cron:1234 nightly] Summarise the day", None),
    ("user", "Read HEARTBEAT.md if it exists (workspace context). Follow it strictly.", None),
    ("assistant", "HEARTBEAT_OK", None),
    ("assistant", "All quiet. HEARTBEAT_OK", None),
    ("assistant", "NO_REPLY", None),
    ("assistant", "  NO_REPLY.  ", None),
    ("user", "[Inter-session message] sourceSession=agent:main:x\nhi", None),
    ("user", "   \n\t ", None),
    ("user", "Conversation info (untrusted metadata):\n```json\n{}\n```\n", None),
    ("assistant", "I replied NO_REPLY to them yesterday", "I replied NO_REPLY to them yesterday"),
    ("user", "Please read HEARTBEAT.md later", "Please read HEARTBEAT.md later"),
])
def test_sanitize_message_text(role: str, text: str, expected: str | None) -> None:
    assert sanitize_message_text(role, text) == expected  # type: ignore[arg-type]


def test_long_heartbeat_message_keeps_text_without_token() -> None:
    body = "word " * 70
    assert sanitize_message_text("assistant", body + "HEARTBEAT_OK") == body.strip()


def test_inter_session_provenance_and_silent_replies_are_dropped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "s3.jsonl", [
        msg("user", "forwarded result", provenance={"kind": "inter_session"}),
        msg("user", "real question"),
        msg("assistant", "NO_REPLY"),
    ])
    parsed = parse_transcript(path)
    assert parsed.messages == [TranscriptMessage(role="user", text="real question", line_no=2)]


def test_cron_run_transcript_is_excluded(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cron.jsonl", [
        msg("user", "[cron:abc daily-digest] Write the digest"),
        msg("assistant", "Digest: all systems nominal"),
    ])
    parsed = parse_transcript(path)
    assert parsed.excluded_reason == "cron run"
    assert parsed.messages == []


def test_scan_transcripts_selection(tmp_path: Path) -> None:
    names = [
        "a.jsonl", "b.jsonl.reset.2026-02-01T10-00-00.000Z", "c.jsonl.deleted.2026-02-02T00:00:00Z",
        "d.checkpoint.0f8fad5b-d9cb-469f-a165-70867728950e.jsonl", "checkpoint-notes.jsonl",
        "e.checkpoint.jsonl", "f.jsonl.bak", "g.bak.jsonl", "notes.md", "h.json", ".hidden.jsonl",
    ]
    for name in names:
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "nested.jsonl").write_text("{}\n")
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "a.jsonl")
    scan = scan_transcripts(tmp_path)
    assert scan.error is None
    assert [p.name for p in scan.paths] == [
        "a.jsonl", "b.jsonl.reset.2026-02-01T10-00-00.000Z", "c.jsonl.deleted.2026-02-02T00:00:00Z",
        "checkpoint-notes.jsonl", "e.checkpoint.jsonl",
    ]


def test_scan_transcripts_missing_dir_and_failure(tmp_path: Path) -> None:
    assert scan_transcripts(tmp_path / "absent") == TranscriptScan(paths=[])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    scan = scan_transcripts(not_a_dir)
    assert scan.paths == []
    assert scan.error == f"session enumeration failed: {not_a_dir}: Not a directory"


def test_session_id_for() -> None:
    assert session_id_for(Path("/x/abc.jsonl")) == "abc"
    assert session_id_for(Path("/x/abc.jsonl.reset.2026-01-02T03-04-05Z")) == "abc.reset.2026-01-02T03-04-05Z"


def _session_text(path: Path) -> tuple[FileContent, list[int] | None]:
    """The transcript at ``path`` as the sessions source indexes it."""
    doc, line_map = read_session_text(MemoryFile.from_stat(path, f"sessions/{path.name}", path.stat(),
                                                           source="sessions"))
    assert isinstance(doc, FileContent)
    return doc, line_map


def test_session_document_line_map_and_hash(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "thread.jsonl", [
        {"type": "session"},
        msg("user", "Project Nebula codename?"),
        b"garbage",
        msg("assistant", "HEARTBEAT_OK"),
        msg("assistant", "The codename is ORBIT-10."),
    ])
    doc, line_map = _session_text(path)
    assert doc.text == "User: Project Nebula codename?\nAssistant: The codename is ORBIT-10."
    assert line_map == [2, 5]
    expected = hashlib.sha256((doc.text + "\n2,5").encode()).hexdigest()
    assert doc.content_hash == expected


def test_session_document_empty(tmp_path: Path) -> None:
    doc, line_map = _session_text(write_jsonl(tmp_path / "e.jsonl", [msg("assistant", "NO_REPLY")]))
    assert (doc.text, line_map) == ("", [])
    assert doc.content_hash == hashlib.sha256(b"\n").hexdigest()


def test_delta_tracker_bytes_threshold(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"x" * 40)
    tracker = SessionDeltaTracker(delta_bytes=100, delta_messages=0)
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (40, 40, 0)
    with path.open("ab") as fh:
        fh.write(b"y" * 59)
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (99, 99, 0)
    with path.open("ab") as fh:
        fh.write(b"z" * 31)
    assert tracker.observe(path) is True
    assert tracker.pending(path) == (130, 30, 0)
    assert tracker.observe(path) is False  # unchanged size


def test_delta_tracker_messages_and_shrink(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"a\nb\n")
    tracker = SessionDeltaTracker(delta_bytes=10_000, delta_messages=3)
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (4, 4, 2)
    with path.open("ab") as fh:
        fh.write(b"c\n")
    assert tracker.observe(path) is True
    assert tracker.pending(path) == (6, 0, 0)  # both counters drop by their threshold, floor 0
    tracker.reset(path, 6)
    assert tracker.pending(path) == (6, 0, 0)
    path.write_bytes(b"new\n")  # rotated: smaller than before, the whole file is new
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (4, 4, 1)
    path.unlink()
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (0, 0, 0)


def test_delta_tracker_non_positive_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"")
    tracker = SessionDeltaTracker(delta_bytes=0, delta_messages=0)
    assert tracker.observe(path) is False
    path.write_bytes(b"{}\n")
    assert tracker.observe(path) is True
    assert tracker.pending(path) == (3, 0, 0)


def test_delta_tracker_counts_newlines_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"0123456789\n" * 10_000)  # 110,000 bytes, > one 64 KiB block
    tracker = SessionDeltaTracker(delta_bytes=1_000_000, delta_messages=20_000)
    assert tracker.observe(path) is False
    assert tracker.pending(path) == (110_000, 110_000, 10_000)
