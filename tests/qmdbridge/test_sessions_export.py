"""Tests for qmdbridge.qmd.sessions: Markdown export of transcripts for qmd (spec 2.11, cases 23-25)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from fallback.errors import BackendTimeoutError, BackendUnavailableError
from fallback.fs.lock import PidFileLock
from fallback.sources.transcripts import TranscriptMessage
from qmdbridge.qmd.sessions import ExportReport, ExportState, export_sessions, render_session_markdown
from tests.fallback.same_stamps import rewrite_keeping_size_and_mtime

NOW_MS = 1_770_000_000_000
DAY_S = 86_400


def msg(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "message": {"role": role, "content": content}}


def write_jsonl(path: Path, records: list[dict[str, Any]], *, age_days: float = 0) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    when = NOW_MS / 1000 - age_days * DAY_S
    os.utime(path, (when, when))
    return path


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    sessions = tmp_path / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    return sessions, tmp_path / "ws" / "qmd" / "sessions-main"


def test_render_wraps_on_spaces_and_repeats_label() -> None:
    text = " ".join(["abcd"] * 5)  # 24 chars
    doc = render_session_markdown("s1", [TranscriptMessage("user", text, 2),
                                         TranscriptMessage("assistant", "x" * 12, 3)], wrap_chars=10)
    assert doc == ("# Session s1\n\nUser: abcd abcd\nUser: abcd abcd\nUser: abcd\n"
                   "Assistant: xxxxxxxxxx\nAssistant: xx\n")
    assert render_session_markdown("s2", []) == "# Session s2\n\n(empty)\n"


def test_render_default_wrap_is_800_chars() -> None:
    words = ["w" * 9] * 100  # 999 chars with spaces
    doc = render_session_markdown("s", [TranscriptMessage("user", " ".join(words), 1)])
    lines = doc.splitlines()[2:]
    assert [len(line) - len("User: ") for line in lines] == [799, 199]
    assert all(line.startswith("User: ") for line in lines)


def test_export_writes_sanitised_markdown(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "abc.jsonl", [
        {"type": "session", "id": "abc"},
        msg("user", "Conversation info (untrusted metadata):\n```json\n{\"message_id\": \"1\"}\n```\n\n"
                    "What is the  wifi\npassword?"),
        msg("assistant", "password=Tr0ub4dor&3 (I saved it)"),
        msg("user", "Read HEARTBEAT.md if it exists."),
        msg("assistant", "HEARTBEAT_OK"),
    ])
    write_jsonl(sessions / "quiet.jsonl", [msg("assistant", "NO_REPLY")])
    write_jsonl(sessions / "abc.checkpoint.0f8fad5b-d9cb-469f-a165-70867728950e.jsonl",
                [msg("user", "checkpoint copy")])
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS)
    assert report == ExportReport(written=["abc.md", "quiet.md"], unchanged=[], removed=[], errors=[])
    assert (export / "abc.md").read_text() == (
        "# Session abc\n\nUser: What is the wifi password?\n"
        "Assistant: password=[REDACTED:password] (I saved it)\n")
    assert (export / "quiet.md").read_text() == "# Session quiet\n\n(empty)\n"
    assert sorted(p.name for p in export.iterdir()) == [".export.lock", "abc.md", "quiet.md"]


def test_reexport_unchanged_is_byte_identical_and_untouched(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "s1.jsonl", [msg("user", "hello"), msg("assistant", "hi there")])
    export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS)
    target = export / "s1.md"
    before = target.read_bytes()
    os.utime(target, (1_000_000, 1_000_000))
    for state in (None, ExportState()):
        report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, state=state)
        assert report == ExportReport(written=[], unchanged=["s1.md"], removed=[], errors=[])
    assert target.read_bytes() == before
    assert target.stat().st_mtime == 1_000_000


def test_state_skips_parsing_and_detects_changes(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    src = write_jsonl(sessions / "s1.jsonl", [msg("user", "first")])
    state = ExportState()
    assert export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS,
                           state=state).written == ["s1.md"]
    assert list(state.seen) == [str(src)]
    assert export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS,
                           state=state).unchanged == ["s1.md"]
    write_jsonl(src, [msg("user", "first"), msg("assistant", "second")], age_days=-0.001)
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, state=state)
    assert report.written == ["s1.md"]
    assert (export / "s1.md").read_text() == "# Session s1\n\nUser: first\nAssistant: second\n"
    # an export edited behind our back is rewritten even though the transcript is unchanged
    (export / "s1.md").write_text("tampered")
    assert export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS,
                           state=state).written == ["s1.md"]
    src.unlink()
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, state=state)
    assert report.removed == ["s1.md"]
    assert state.seen == {}


def test_state_sees_a_transcript_rewritten_with_its_size_and_mtime_put_back(
        dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    src = write_jsonl(sessions / "s1.jsonl", [msg("user", "first heron")])
    state = ExportState()
    export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, state=state)
    rewrite_keeping_size_and_mtime(src, b"heron", b"egret")  # only its ctime moves
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, state=state)
    assert report == ExportReport(written=["s1.md"], unchanged=[], removed=[], errors=[])
    assert (export / "s1.md").read_text() == "# Session s1\n\nUser: first egret\n"
    src.chmod(0o600)  # a new ctime, the same bytes: parsed again, the export left as it is
    assert export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS,
                           state=state).unchanged == ["s1.md"]


def test_retention_and_stale_exports_removed(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "new.jsonl", [msg("user", "recent")], age_days=1)
    write_jsonl(sessions / "old.jsonl", [msg("user", "ancient")], age_days=31)
    write_jsonl(sessions / "old.jsonl.reset.2026-01-01T00-00-00Z", [msg("user", "archived")],
                age_days=2)
    export.mkdir(parents=True)
    (export / "old.md").write_text("# Session old\n\nUser: ancient\n")
    (export / "gone.md").write_text("# Session gone\n")
    (export / "keep.txt").write_text("not markdown")
    report = export_sessions(sessions, export, retention_days=30, now_ms=NOW_MS)
    assert report == ExportReport(written=["new.md", "old.reset.2026-01-01T00-00-00Z.md"],
                                  unchanged=[], removed=["gone.md", "old.md"], errors=[])
    assert sorted(p.name for p in export.glob("*.md")) == [
        "new.md", "old.reset.2026-01-01T00-00-00Z.md"]
    assert (export / "keep.txt").exists()
    kept = export_sessions(sessions, export, retention_days=0, now_ms=NOW_MS)
    assert kept.written == ["old.md"]


def test_cron_run_not_exported(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "cron1.jsonl", [msg("user", "[cron:job1 digest] run"),
                                           msg("assistant", "digest text")])
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS)
    assert report == ExportReport()
    assert list(export.glob("*.md")) == []


def test_enumeration_failure_aborts_before_deleting(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "previous.md").write_text("# Session previous\n")
    sessions_file = tmp_path / "sessions"
    sessions_file.write_text("not a directory")
    with pytest.raises(BackendUnavailableError) as info:
        export_sessions(sessions_file, export, retention_days=None, now_ms=NOW_MS)
    assert info.value.backend == "qmd"
    assert info.value.reason == "QMD session export aborted: session enumeration failed"
    assert str(info.value) == "qmd unavailable: QMD session export aborted: session enumeration failed"
    assert (export / "previous.md").read_text() == "# Session previous\n"


def test_missing_sessions_dir_removes_exports(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "old.md").write_text("x")
    report = export_sessions(tmp_path / "absent", export, retention_days=None, now_ms=NOW_MS)
    assert report == ExportReport(removed=["old.md"])


def test_non_regular_entries_ignored(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    export.mkdir(parents=True)
    (export / "folder.md").write_text("# Session folder\n\nUser: earlier\n")
    (sessions / "folder.jsonl").mkdir()
    write_jsonl(sessions / "s2.jsonl", [msg("user", "fine")])
    (sessions / "link.jsonl").symlink_to(sessions / "s2.jsonl")
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS)
    assert report == ExportReport(written=["s2.md"], removed=["folder.md"])


def test_concurrent_exports_are_serialised(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    for i in range(20):
        write_jsonl(sessions / f"s{i:02d}.jsonl", [msg("user", f"message {i}")])
    reports: list[ExportReport] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            reports.append(export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    written = sorted(name for r in reports for name in r.written)
    assert written == [f"s{i:02d}.md" for i in range(20)]
    assert sum(len(r.unchanged) for r in reports) == 60
    assert sorted(p.name for p in export.glob("*.md")) == written
    assert not list(export.glob(".tmp-*"))


def test_export_lock_held_elsewhere_times_out_and_writes_nothing(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "s1.jsonl", [msg("user", "hello")])
    export.mkdir(parents=True)
    other = PidFileLock(export / ".export.lock", timeout_ms=0)  # another manager's pass
    other.acquire_blocking()
    try:
        with pytest.raises(BackendTimeoutError) as info:
            export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, lock_timeout_ms=40)
        assert str(info.value) == ("qmd unavailable: waiting for the session export lock"
                                   f" {export / '.export.lock'} timed out after 40ms")
        assert sorted(p.name for p in export.iterdir()) == [".export.lock"]
    finally:
        other.release()
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS, lock_timeout_ms=40)
    assert report.written == ["s1.md"]
    assert (export / ".export.lock").read_text() == ""  # the pass released and cleared its record


def test_a_transcript_name_with_a_backslash_is_not_exported(dirs: tuple[Path, Path]) -> None:
    sessions, export = dirs
    write_jsonl(sessions / "a\\b.jsonl", [msg("user", "kestrel")])
    write_jsonl(sessions / "good.jsonl", [msg("user", "giraffe")])
    report = export_sessions(sessions, export, retention_days=None, now_ms=NOW_MS)
    assert report.errors == ["a\\b.jsonl: not exported: qmd skips a file name with a backslash"]
    assert (report.written, sorted(p.name for p in export.iterdir() if p.suffix == ".md")) == (["good.md"], ["good.md"])
