"""Session transcripts in the builtin engine (spec §5.4, §12 cases 21 and 66): real JSONL
files, real SQLite, FTS-only."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import orjson
import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import PathRefusedError
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings

pytestmark = pytest.mark.anyio

NOW_MS = 1_770_681_600_000


def _record(role: str, text: str) -> bytes:
    return orjson.dumps({"type": "message", "message": {"role": role, "content": text}})


def write_transcript(path: Path, lines: list[bytes | str]) -> None:
    """Write JSONL lines (bytes are records, str are raw lines such as blanks or noise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("Project Nebula stale codename: ORBIT-9.\n")
    return w


def _engine(ws: Path, *, sessions: bool = True, **search: object) -> BuiltinEngine:
    cfg = MemorySearchSettings(
        provider="none", sources=["memory", "sessions"] if sessions else ["memory"],
        experimental={"sessionMemory": sessions}, **search)
    settings = EngineSettings.for_workspace(ws, search=cfg)
    sel = ProviderSelection(None, "none", unavailable_reason="provider set to none")
    return BuiltinEngine(settings, provider_selection=sel, now_ms=lambda: NOW_MS)


def _sessions_dir(engine: BuiltinEngine) -> Path:
    return engine.settings.sessions_dir


def _kestrel_head() -> list[bytes | str]:
    """The first four JSONL lines of the transcripts below: a record that is not a message, a
    user question, a blank line and a line that is not JSON."""
    return [orjson.dumps({"type": "session", "id": "abc"}),
            _record("user", "What is the launch window for Kestrel?"), "", "{not json"]


async def test_transcript_hits_point_at_jsonl_lines(ws: Path) -> None:
    engine = _engine(ws)
    try:
        write_transcript(_sessions_dir(engine) / "abc.jsonl", [
            *_kestrel_head(),  # lines 1-4: not a message, a question, blank, invalid
            _record("assistant", "The Kestrel launch window opens on March 3."),  # line 5
        ])
        report = await engine.sync(reason="test")
        assert report.session_sizes == {
            str(_sessions_dir(engine) / "abc.jsonl"):
                (_sessions_dir(engine) / "abc.jsonl").stat().st_size}
        hits = (await engine.search(SearchRequest.of("Kestrel launch window"))).results
        assert [(h.path, h.source, h.start_line, h.end_line) for h in hits] == [
            ("sessions/abc.jsonl", "sessions", 2, 5)]
        assert hits[0].snippet == ("User: What is the launch window for Kestrel?\n"
                                   "Assistant: The Kestrel launch window opens on March 3.")
        status = await engine.status()
        counts = {c.source: (c.files, c.chunks) for c in status.source_counts}
        assert counts == {"memory": (1, 1), "sessions": (1, 1)}
        assert status.sources == ["memory", "sessions"]
    finally:
        await engine.close()


async def test_long_transcript_chunks_are_remapped(ws: Path) -> None:
    """Spec §12 case 21 through the engine: several chunks, first start and last end are the
    JSONL lines of the first and last kept messages, each start <= end."""
    engine = _engine(ws, chunking={"tokens": 10, "overlap": 0})
    try:
        lines: list[bytes | str] = []
        for i in range(10):
            lines.append(orjson.dumps({"type": "custom", "n": i}))    # odd lines: not messages
            lines.append(_record("user" if i % 2 == 0 else "assistant", f"message number {i}"))
        write_transcript(_sessions_dir(engine) / "long.jsonl", lines)
        await engine.sync(reason="test")
        with sqlite3.connect(engine.settings.db_path) as conn:
            rows = conn.execute("SELECT start_line, end_line FROM chunks WHERE source = 'sessions'"
                                " ORDER BY start_line, end_line").fetchall()
        assert len(rows) == 10
        assert rows[0][0] == 2 and rows[-1][1] == 20
        assert all(start <= end and start % 2 == 0 for start, end in rows)
    finally:
        await engine.close()


async def test_deleting_a_transcript_removes_its_rows(ws: Path) -> None:
    engine = _engine(ws)
    try:
        sdir = _sessions_dir(engine)
        write_transcript(sdir / "one.jsonl", [_record("user", "Pelican migration notes")])
        write_transcript(sdir / "two.jsonl", [_record("user", "Heron nesting notes")])
        await engine.sync(reason="test")
        assert [h.path for h in (await engine.search(SearchRequest.of("Pelican"))).results] == ["sessions/one.jsonl"]
        (sdir / "one.jsonl").unlink()
        report = await engine.sync(reason="test")
        assert report.files_deleted == 1
        assert (await engine.search(SearchRequest.of("Pelican"))).results == []
        assert [h.path for h in (await engine.search(SearchRequest.of("Heron"))).results] == ["sessions/two.jsonl"]
        status = await engine.status()
        assert {c.source: c.files for c in status.source_counts} == {"memory": 1, "sessions": 1}
    finally:
        await engine.close()


async def test_unchanged_transcript_is_not_reread_and_archives_count(ws: Path) -> None:
    engine = _engine(ws)
    try:
        sdir = _sessions_dir(engine)
        write_transcript(sdir / "cur.jsonl", [_record("user", "Albatross sighting")])
        write_transcript(sdir / "old.jsonl.reset.2026-01-02T03-04-05Z",
                         [_record("user", "Cormorant sighting")])
        write_transcript(sdir / "cur.checkpoint.0f0e0d0c-1111-2222-3333-444455556666.jsonl",
                         [_record("user", "Checkpoint Cormorant copy")])
        cur = sdir / "cur.jsonl"
        # stamped well before the sync: not racily clean (fallback/index/racy.py), so trusted
        for i, f in enumerate([ws / "MEMORY.md", *sorted(sdir.iterdir())]):
            past = 1_600_000_000_000_000_000 + i * 1_000_000_000
            os.utime(f, ns=(past, past))
        first = await engine.sync(reason="test")
        assert first.files_indexed == 3  # MEMORY.md, cur.jsonl, the reset archive
        assert [h.path for h in (await engine.search(SearchRequest.of("Cormorant"))).results] == [
            "sessions/old.jsonl.reset.2026-01-02T03-04-05Z"]
        unchanged = await engine.sync(reason="test")
        assert (unchanged.files_read, unchanged.files_indexed) == (0, 0)  # none read again
        # Same (mtime, size), different bytes: the rewrite moved the ctime, so it is read.
        st = cur.stat()
        write_transcript(cur, [_record("user", "Albatrosz sighting")])
        os.utime(cur, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (cur.stat().st_size, cur.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        second = await engine.sync(reason="test")
        assert (second.files_read, second.files_indexed) == (1, 1)
        assert (await engine.search(SearchRequest.of("Albatross"))).results == []
        assert [h.path for h in (await engine.search(SearchRequest.of("Albatrosz"))).results] == ["sessions/cur.jsonl"]
        # New stamps, the same bytes: read and hashed, its chunks left as they are.
        os.utime(cur, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        third = await engine.sync(reason="test")
        assert (third.files_read, third.files_indexed, third.chunks_written) == (1, 0, 0)
        assert [h.path for h in (await engine.search(SearchRequest.of("Albatrosz"))).results] == ["sessions/cur.jsonl"]
    finally:
        await engine.close()


@pytest.mark.parametrize("prior_sync", [True, False])
async def test_case_66_fresh_transcript_beats_stale_memory(ws: Path, prior_sync: bool) -> None:
    engine = _engine(ws)
    try:
        write_transcript(_sessions_dir(engine) / "nebula.jsonl", [
            _record("user", "What is the Project Nebula codename now?"),
            _record("assistant", "The current Project Nebula codename is ORBIT-10."),
        ])
        if prior_sync:
            await engine.sync(reason="test")
        hits = (await engine.search(SearchRequest.of("current Project Nebula codename ORBIT-10"))).results
        assert hits[0].source == "sessions"
        assert hits[0].path == "sessions/nebula.jsonl"
        assert (hits[0].start_line, hits[0].end_line) == (1, 2)
        assert "ORBIT-10" in hits[0].snippet
    finally:
        await engine.close()


async def test_sources_filter_and_disabled_sessions(ws: Path) -> None:
    engine = _engine(ws)
    try:
        write_transcript(_sessions_dir(engine) / "s.jsonl",
                         [_record("assistant", "Project Nebula codename is ORBIT-10.")])
        await engine.sync(reason="test")
        only_mem = (await engine.search(SearchRequest.of("Project Nebula codename", sources=["memory"]))).results
        assert [(h.source, h.path) for h in only_mem] == [("memory", "MEMORY.md")]
        only_ses = (await engine.search(SearchRequest.of("Project Nebula codename", sources=["sessions"]))).results
        assert [(h.source, h.path) for h in only_ses] == [("sessions", "sessions/s.jsonl")]
    finally:
        await engine.close()
    # Without experimental.sessionMemory the sessions source is off: transcripts are ignored.
    plain = _engine(ws, sessions=False)
    try:
        await plain.sync(reason="test")
        assert (await plain.search(SearchRequest.of("ORBIT-10", sources=["sessions"]))).results == []
        status = await plain.status()
        assert [(c.source, c.files) for c in status.source_counts] == [("memory", 1)]
    finally:
        await plain.close()


async def test_unreadable_transcript_is_skipped_with_reason() -> None:
    import shutil
    import tempfile

    # Root reads any file, and the tests run as root here and in CI: run the engine as uid
    # nobody in a folder every uid may use.
    top = Path(tempfile.mkdtemp(prefix="qmdbridge-perm-"))
    try:
        ws = top / "ws"
        (ws / "memory").mkdir(parents=True)
        (ws / "MEMORY.md").write_text("root fact\n")
        engine = _engine(ws)
        sdir = _sessions_dir(engine)
        sdir.mkdir(parents=True, exist_ok=True)
        for d in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]:
            d.chmod(0o777)
        (ws / "MEMORY.md").chmod(0o644)
        path = sdir / "locked.jsonl"
        write_transcript(path, [_record("user", "Secret heron")])
        path.chmod(0)
        dropped = os.geteuid() == 0
        if dropped:
            os.seteuid(65534)
        try:
            await engine.sync(reason="test")
            status = await engine.status()
        finally:
            await engine.close()
            if dropped:
                os.seteuid(0)
        assert [(s.path, s.reason) for s in status.skipped] == [
            ("sessions/locked.jsonl", "unreadable: Permission denied")]
    finally:
        shutil.rmtree(top, ignore_errors=True)


async def test_case_38_sessions_decay_by_transcript_mtime(ws: Path) -> None:
    """Spec §8.7/§12 case 38: a transcript 30 days old scores half of a fresh one (half-life 30)."""
    engine = _engine(ws, query={"hybrid": {"temporalDecay": {"enabled": True,
                                                             "halfLifeDays": 30}}})
    try:
        sdir = _sessions_dir(engine)
        for name in ("fresh.jsonl", "old.jsonl"):
            write_transcript(sdir / name, [_record("user", "Lapwing census totals")])
        day_ns = 86_400 * 10**9
        os.utime(sdir / "fresh.jsonl", ns=(NOW_MS * 10**6, NOW_MS * 10**6))
        old_ns = NOW_MS * 10**6 - 30 * day_ns
        os.utime(sdir / "old.jsonl", ns=(old_ns, old_ns))
        await engine.sync(reason="test")
        hits = (await engine.search(SearchRequest.of("Lapwing census totals", min_score=0.0))).results
        assert [h.path for h in hits] == ["sessions/fresh.jsonl", "sessions/old.jsonl"]
        assert hits[1].score == pytest.approx(hits[0].score * 0.5, rel=1e-6)
    finally:
        await engine.close()


async def test_transcripts_take_at_most_half_of_the_result_slots(ws: Path) -> None:
    # Four transcripts and two notes mention the heron; the transcripts match best (the word
    # twice each), yet with maxResults 4 they fill only two slots while notes remain.
    (ws / "memory" / "2026-02-01.md").write_text("A heron stood by the pond.\n")
    (ws / "memory" / "2026-02-02.md").write_text("Saw the heron again near the reeds.\n")
    engine = _engine(ws)
    try:
        for n in range(4):
            write_transcript(_sessions_dir(engine) / f"s{n}.jsonl",
                             [_record("user", f"heron heron sighting {n}")])
        await engine.sync(reason="test")
        hits = (await engine.search(SearchRequest.of("heron", max_results=4, min_score=0))).results
        assert sorted(h.source for h in hits) == ["memory", "memory", "sessions", "sessions"]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        # with six slots the notes run out first, and transcripts fill the rest
        six = (await engine.search(SearchRequest.of("heron", max_results=6, min_score=0))).results
        assert sorted(h.source for h in six) == ["memory", "memory", *["sessions"] * 4]
    finally:
        await engine.close()


def _verbose_transcript(topic: str, repeats: int) -> list[bytes | str]:
    """A transcript that comes back to one topic ``repeats`` times in nearly the same words,
    each exchange long enough to be a chunk of its own."""
    out: list[bytes | str] = []
    for i in range(repeats):
        out.append(_record("user", f"Tell me again about the {topic}, attempt {i}. "
                                   + f"We keep talking about the {topic} and nothing else. " * 6))
        out.append(_record("assistant", f"The {topic} question again: it is in your notes. " * 5))
    return out


@pytest.mark.parametrize("max_results", [6, 20])
async def test_a_verbose_transcript_cannot_take_every_slot(ws: Path, max_results: int) -> None:
    (ws / "MEMORY.md").write_text("# Home\nThe garage door code is 4417.\n")
    engine = _engine(ws)
    try:
        write_transcript(_sessions_dir(engine) / "chatty.jsonl",
                         _verbose_transcript("garage door code", 120))
        await engine.sync(reason="test")
        hits = (await engine.search(SearchRequest.of("garage door code", max_results=max_results))).results
    finally:
        await engine.close()
    # its 61 chunks say the same thing (the last, one message, less of it): the transcript is
    # cited for the first chunk (and with room, the last), and the note is found
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [
        ("sessions/chatty.jsonl", 1, 4),
        *([("sessions/chatty.jsonl", 240, 240)] if max_results > 6 else []), ("MEMORY.md", 1, 2)]


async def test_a_transcript_hit_reads_back_at_its_cited_lines(ws: Path) -> None:
    """``memory_get`` of a session hit's path returns the hit's lines: the transcript's JSONL
    lines, each message as the index holds it (``User:``/``Assistant:``, redacted), every
    other line blank, so the cited line numbers are the lines read."""
    engine = _engine(ws)
    try:
        write_transcript(_sessions_dir(engine) / "abc.jsonl", [
            *_kestrel_head(),  # lines 1-4: not a message, a question, blank, invalid
            _record("assistant", "Kestrel opens March 3; key sk-proj-abcdefghijklmnopqrstuvwx1234"),
            orjson.dumps({"type": "custom", "n": 1}),                  # line 6: not a message
        ])
        [hit] = (await engine.search(SearchRequest.of("Kestrel launch window"))).results
        assert (hit.path, hit.snippet_start_line, hit.snippet_end_line) == ("sessions/abc.jsonl", 2, 5)
        first, last = hit.snippet_start_line, hit.snippet_end_line
        page = await engine.read_file(hit.path, from_line=first, lines=last - first + 1)
        assert (page.path, page.from_line, page.lines, page.truncated, page.next_from) == (
            "sessions/abc.jsonl", 2, 4, True, 6)
        assert page.text == ("User: What is the launch window for Kestrel?\n\n\n"
                             "Assistant: Kestrel opens March 3; key [REDACTED:openai_key]"
                             "\n\n[More content available. Use from=6 to continue.]")
        # the snippet's lines are the messages among them
        lines = page.text.split("\n")
        assert hit.snippet == f"{lines[0]}\n{lines[3]}"
        whole = await engine.read_file("sessions/abc.jsonl")
        assert (whole.lines, whole.truncated, whole.text.count("\n")) == (6, False, 5)
        gone = await engine.read_file("sessions/gone.jsonl")
        assert (gone.missing, gone.text) == (True, "")
        (_sessions_dir(engine) / "link.jsonl").symlink_to(_sessions_dir(engine) / "abc.jsonl")
        for path, reason in [("sessions/link.jsonl", "symlink"),
                             ("sessions/x.md", "not a memory path"),
                             ("sessions/../sessions/abc.jsonl", "parent segment"),
                             ("sessions/abc.jsonl.bak", "not a memory path")]:
            with pytest.raises(PathRefusedError) as ei:
                await engine.read_file(path)
            assert ei.value.reason == reason, path
    finally:
        await engine.close()
    plain = _engine(ws, sessions=False)  # no sessions source: its hits never cite transcripts
    try:
        with pytest.raises(PathRefusedError) as ei:
            await plain.read_file("sessions/abc.jsonl")
        assert ei.value.reason == "not a memory path"
    finally:
        await plain.close()


async def test_pasted_environment_variables_and_flags_are_redacted_before_indexing(ws: Path) -> None:
    """The usual way a secret reaches a chat is a pasted ``.env`` file or command line: each
    value is redacted before it is indexed, so neither a hit, ``memory_get`` nor the store
    holds it."""
    engine = _engine(ws)
    secrets = ["hunter2pg", "gh0-abc123def456", "zz-sig-998877", "x0x0-bot-55", "k9-lab-4242"]
    try:
        write_transcript(_sessions_dir(engine) / "env.jsonl", [
            _record("user", "Here is the gannet .env: DB_PASSWORD=hunter2pg "
                            "GITHUB_TOKEN=gh0-abc123def456 STRIPE_SIGNING_SECRET=zz-sig-998877"),
            _record("user", "and the gannet bot: SLACK_BOT_TOKEN=x0x0-bot-55 "
                            "curl --api-key=k9-lab-4242 https://gannet.example"),
        ])
        hits = (await engine.search(SearchRequest.of("gannet", min_score=0))).results
        assert [(h.path, h.start_line, h.end_line) for h in hits] == [("sessions/env.jsonl", 1, 2)]
        page = await engine.read_file("sessions/env.jsonl")
        assert page.text == (
            "User: Here is the gannet .env: DB_PASSWORD=[REDACTED:password] "
            "GITHUB_TOKEN=[REDACTED:token] STRIPE_SIGNING_SECRET=[REDACTED:secret]\n"
            "User: and the gannet bot: SLACK_BOT_TOKEN=[REDACTED:token] "
            "curl --api-key=[REDACTED:api_key] https://gannet.example")
        assert hits[0].snippet == page.text
        db = engine.settings.db_path
        store = b"".join(f.read_bytes() for f in (db, db.with_name(db.name + "-wal")) if f.exists())
        assert [s for s in secrets if s.encode() in store] == []
    finally:
        await engine.close()
