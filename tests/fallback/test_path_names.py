"""The printable path form of names that are not UTF-8 (fallback/text/path_names.py): exact
round trips, ``memory_get`` by that form, refusals, and transcripts with such names."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import PathRefusedError, UsageError
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.sources.memory_files import MemoryRoot, list_memory_files
from fallback.sources.read_page import read_memory_page, read_page_in_root
from fallback.text.path_names import parse_printable_path, printable_path


@pytest.mark.parametrize(("raw", "shown"), [
    (b"memory/2026-01-12.md", "memory/2026-01-12.md"),
    ("memory/東京.md".encode(), "memory/東京.md"),
    (b"memory/caf\xe9.md", "memory/caf\\xe9.md"),
    (b"memory/\xff\xfe.md", "memory/\\xff\\xfe.md"),
    (b"memory/a\\b.md", "memory/a\\x5cb.md"),
    (b"memory/tab\there.md", "memory/tab\\x09here.md"),
    (b"memory/c1\xc2\x85.md", "memory/c1\\xc2\\x85.md"),  # U+0085, a C1 control
    (b"memory/caf\\xe9.md", "memory/caf\\x5cxe9.md"),    # a literal backslash-x name
])
def test_printable_form_round_trips_to_the_same_bytes(raw: bytes, shown: str) -> None:
    assert printable_path(os.fsdecode(raw)) == shown
    assert os.fsencode(parse_printable_path(shown)) == raw
    orjson.dumps(shown)  # printable: JSON-encodable


def test_upper_case_hex_is_accepted_and_bad_backslashes_are_refused() -> None:
    assert os.fsencode(parse_printable_path("caf\\xE9.md")) == b"caf\xe9.md"
    for bad in ("a\\b.md", "a\\x4.md", "trailing\\", "a\\\\x41.md"):
        with pytest.raises(UsageError, match="backslash without a"):
            parse_printable_path(bad)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("root\n")
    with open(os.path.join(os.fsencode(w / "memory"), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"latin one\n")
    with open(os.path.join(os.fsencode(w / "memory"), b"a\\b.md"), "wb") as fh:
        fh.write(b"back slash\n")
    return w


def test_discovery_and_memory_get_use_the_printable_form(ws: Path) -> None:
    found = list_memory_files(ws, [])
    assert sorted(f.rel_path for f in found.files) == [
        "MEMORY.md", "memory/a\\x5cb.md", "memory/caf\\xe9.md"]
    page = read_memory_page(ws, [], "memory/caf\\xe9.md")
    assert (page.path, page.text) == ("memory/caf\\xe9.md", "latin one")
    page = read_memory_page(ws, [], "memory/a\\x5cb.md")
    assert (page.path, page.text) == ("memory/a\\x5cb.md", "back slash")


@pytest.mark.parametrize("request_path", [
    "memory/a\\b.md",          # a bare backslash: not the printable form
    "memory/x\\x00.md",        # an escaped NUL can name no file
    "memory/caf\udce9.md",     # a raw surrogate is not a printable path
])
def test_memory_get_refuses_malformed_escapes(ws: Path, request_path: str) -> None:
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], request_path)
    assert info.value.reason == "invalid characters"


def test_a_raw_name_is_refused_with_the_printable_form_to_send(ws: Path) -> None:
    """A file name's own bytes (a shell passes them as they are) get the form to send instead."""
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], "memory/caf\udce9.md")
    assert (info.value.reason, info.value.hint) == (
        "invalid characters",
        "a file name that is not UTF-8 is written with \\xHH escapes, as search cites it: memory/caf\\xe9.md")
    assert read_memory_page(ws, [], "memory/caf\\xe9.md").text == "latin one"


def test_a_windows_separator_is_refused_with_the_path_to_send(ws: Path) -> None:
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], "memory\\caf\\xe9.md")
    assert (info.value.reason, info.value.hint) == (
        "invalid characters", "folders are separated by '/' (a backslash in a file name is written "
        "\\x5c): memory/caf\\xe9.md")
    assert read_memory_page(ws, [], "memory/caf\\xe9.md").text == "latin one"
    with pytest.raises(PathRefusedError) as info:  # no way around the parent-segment rule
        read_memory_page(ws, [], "memory\\..\\MEMORY.md")
    assert str(info.value) == ("path refused: 'memory\\\\..\\\\MEMORY.md': invalid characters (folders "
                               "are separated by '/' (a backslash in a file name is written \\x5c): "
                               "memory/../MEMORY.md)")


def test_escapes_cannot_smuggle_a_parent_segment(ws: Path) -> None:
    with pytest.raises(PathRefusedError) as info:
        read_memory_page(ws, [], "memory/\\x2e\\x2e/\\x2e\\x2e/etc.md")
    assert info.value.reason == "parent segment"


def test_a_name_in_its_other_unicode_form_reads_the_note(tmp_path: Path) -> None:
    """NFC "résumé" reads the note macOS named in NFD, and NFD reads an NFC name: an agent
    that composes a cited path does not find the note missing (folders too, every backend)."""
    nfc, nfd = "r\u00e9sum\u00e9", "re\u0301sume\u0301"
    (tmp_path / "memory" / nfd).mkdir(parents=True)
    (tmp_path / "memory" / nfd / f"{nfd}.md").write_text("decomposed\n")
    (tmp_path / "memory" / f"{nfc}.md").write_text("composed\n")
    page = read_memory_page(tmp_path, [], f"memory/{nfc}/{nfc}.md")
    assert (page.path, page.text, page.missing) == (f"memory/{nfc}/{nfc}.md", "decomposed", False)
    assert read_memory_page(tmp_path, [], f"memory/{nfd}.md").text == "composed"
    assert read_memory_page(tmp_path, [], f"memory/{nfd}.md.md").missing is True
    coll = MemoryRoot(tmp_path / "memory", "**/*.md", "extra", tmp_path / "memory")  # a qmd collection
    assert read_page_in_root(coll, f"{nfc}/{nfc}.md", shown="qmd/c/x.md", follow_base=False).text == "decomposed"


@pytest.mark.anyio
async def test_a_transcript_with_a_latin1_name_is_indexed(ws: Path) -> None:
    cfg = MemorySearchSettings(provider="none", sources=["memory", "sessions"],
                               experimental={"sessionMemory": True})
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, search=cfg),
                           provider_selection=ProviderSelection(None, "none"))
    sessions = engine.settings.sessions_dir
    sessions.mkdir(parents=True)
    record = orjson.dumps({"type": "message", "message": {"role": "user",
                                                          "content": "Where is the kayak stored?"}})
    with open(os.path.join(os.fsencode(sessions), b"r\xe9union.jsonl"), "wb") as fh:
        fh.write(record + b"\n")
    try:
        hits = (await engine.search(SearchRequest.of("kayak"))).results
        assert [(h.path, h.source, h.start_line) for h in hits] == [
            ("sessions/r\\xe9union.jsonl", "sessions", 1)]
        status = await engine.status()
        assert {c.source: c.files for c in status.source_counts} == {"memory": 3, "sessions": 1}
    finally:
        await engine.close()


def test_the_quick_check_agrees_with_the_character_rule_on_every_code_point() -> None:
    # printable_path returns a name unchanged when one regex search finds nothing to escape; the
    # rule itself is per character (a backslash, Unicode category Cc or Cs).
    import unicodedata

    from fallback.text.path_names import _NEEDS_ESCAPE_RE

    flagged = [c for c in range(0x110000) if _NEEDS_ESCAPE_RE.search(chr(c)) is not None]
    wanted = [c for c in range(0x110000)
              if chr(c) == "\\" or unicodedata.category(chr(c)) in ("Cc", "Cs")]
    assert flagged == wanted
    assert printable_path("memory/東京 notes.md") == "memory/東京 notes.md"
    assert printable_path("memory/a\tb.md") == "memory/a\\x09b.md"
