"""Keyword ranking end to end (real files, real SQLite/FTS5, the BuiltinEngine in keyword-only
mode): questions, hyphen forms, identifiers, note names and dates, snippets on the evidence."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings

pytestmark = pytest.mark.anyio

FILLER = ["The weather was mild and the coffee was fine.", "We talked about nothing much.",
          "Lunch was a sandwich at the desk.", "Emails piled up in the afternoon."]


def _write(ws: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _engine(ws: Path) -> BuiltinEngine:
    settings = EngineSettings.for_workspace(ws, search=MemorySearchSettings(provider="none"))
    return BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"))


async def _paths(ws: Path, query: str, **kwargs: object) -> list[str]:
    engine = _engine(ws)
    try:
        return [h.path for h in (await engine.search(SearchRequest.of(query, min_score=0.0, **kwargs))).results]  # type: ignore[arg-type]
    finally:
        await engine.close()


async def test_chunk_matching_four_question_words_beats_one_repeating_one(tmp_path: Path) -> None:
    _write(tmp_path, {
        "memory/a-one-word.md": "group " * 12 + "\n" + "\n".join(FILLER),
        "memory/b-four-words.md": "Caroline joined the LGBTQ support group last week.\n"
                                  + "\n".join(FILLER),
        "memory/c-two-words.md": "A support call about the printer.\n" + "\n".join(FILLER),
        "memory/d-unrelated.md": "\n".join(FILLER),
    })
    question = "When did Caroline go to the LGBTQ support group?"
    assert await _paths(tmp_path, question) == [
        "memory/b-four-words.md", "memory/a-one-word.md", "memory/c-two-words.md"]


async def test_stemming_finds_other_word_forms(tmp_path: Path) -> None:
    _write(tmp_path, {"memory/art.md": "Melanie painted a sunrise over the lake.",
                      "memory/other.md": "\n".join(FILLER)})
    assert await _paths(tmp_path, "What has Melanie been painting?") == ["memory/art.md"]


@pytest.mark.parametrize("query", ["Wi-Fi password", "wifi password", "wi fi password",
                                   "WIFI password"])
async def test_hyphen_and_joined_forms_find_each_other(tmp_path: Path, query: str) -> None:
    _write(tmp_path, {"memory/hyphen.md": "The guest Wi-Fi password is on the fridge.",
                      "memory/joined.md": "Reset the wifi password monthly.",
                      "memory/other.md": "The password manager needs an update.\n"
                                         + "\n".join(FILLER)})
    found = await _paths(tmp_path, query)
    assert sorted(found[:2]) == ["memory/hyphen.md", "memory/joined.md"]
    assert found[2:] == ["memory/other.md"]


async def test_identifier_matches_as_a_whole(tmp_path: Path) -> None:
    _write(tmp_path, {
        "memory/ticket.md": "Filed ABC-1234 for the broken export.",
        "memory/joined.md": "See abc1234 in the tracker.\n" + "\n".join(FILLER),
        "memory/noise.md": "ABC team export broken again; 1234 rows lost in export.\n"
                           + "\n".join(FILLER),
    })
    # The parts of an id found apart (noise.md) do not match it; written as in the query, the id
    # matches both as a phrase and as its joined form, so it ranks first.
    assert await _paths(tmp_path, "ABC-1234") == ["memory/ticket.md", "memory/joined.md"]
    assert sorted(await _paths(tmp_path, "abc1234")) == ["memory/joined.md", "memory/ticket.md"]


@pytest.mark.parametrize("query", ["2023-05-08", "May 8 2023", "8 May 2023", "8th of May, 2023",
                                   "what did we do on May 8, 2023?"])
async def test_date_query_finds_the_daily_note(tmp_path: Path, query: str) -> None:
    _write(tmp_path, {
        "memory/2023-05-07.md": "# Sunday\n" + "\n".join(FILLER),
        "memory/2023-05-08.md": "# Monday\nWe did the quarterly planning.\n" + "\n".join(FILLER),
        "memory/2023-06-08.md": "# Thursday\n" + "\n".join(FILLER),
        "MEMORY.md": "Quarterly planning happens every May.",
    })
    assert (await _paths(tmp_path, query))[0] == "memory/2023-05-08.md"


async def test_note_name_and_first_heading_are_searchable(tmp_path: Path) -> None:
    _write(tmp_path, {"notes/team-sync.md": "Agenda items for Tuesday.",
                      "notes/recipes.md": "# Grandma's lasagne\nLayer the sheets.",
                      "notes/other.md": "Team lunch on Friday; sync later about the lasagne."})
    paths = ["notes/team-sync.md", "notes/recipes.md", "notes/other.md"]
    engine = BuiltinEngine(
        EngineSettings.for_workspace(tmp_path, search=MemorySearchSettings(
            provider="none", extra_paths=paths)),
        provider_selection=ProviderSelection(None, "none"))
    try:
        assert [h.path for h in (await engine.search(SearchRequest.of("team-sync", min_score=0))).results][0] == paths[0]
        assert [h.path for h in (await engine.search(SearchRequest.of("grandma lasagne", min_score=0))).results][0] == paths[1]
    finally:
        await engine.close()


async def test_snippet_holds_the_matching_line_and_reports_its_lines(tmp_path: Path) -> None:
    lines = [f"Ann: small talk number {i} about the weather and the traffic today." for i in range(18)]
    lines[13] = "Ann: I went to the LGBTQ support group yesterday and it was powerful."
    _write(tmp_path, {"memory/2023-05-08.md": "# Conversation\n\n" + "\n".join(lines) + "\n"})
    engine = _engine(tmp_path)
    try:
        hits = (await engine.search(SearchRequest.of("When did Ann go to the support group?", max_results=1))).results
    finally:
        await engine.close()
    hit = hits[0]
    evidence_line = 3 + 13
    assert hit.start_line <= hit.snippet_start_line <= evidence_line <= hit.snippet_end_line
    assert hit.snippet_end_line <= hit.end_line and len(hit.snippet) <= 700
    assert lines[13] in hit.snippet.split("\n")
    file_lines = (tmp_path / "memory/2023-05-08.md").read_text().split("\n")
    assert hit.snippet.split("\n") == file_lines[hit.snippet_start_line - 1:hit.snippet_end_line]
    assert hit.end_line - hit.start_line > hit.snippet_end_line - hit.snippet_start_line


async def test_stop_word_only_query_still_searches(tmp_path: Path) -> None:
    _write(tmp_path, {"memory/ops.md": "Rust AND Go, OR tools", "memory/other.md": "nothing"})
    assert await _paths(tmp_path, "AND") == ["memory/ops.md"]


async def test_lone_cr_note_cites_only_the_chunk_holding_the_word(tmp_path: Path) -> None:
    lines = [f"Entry {i}: the weekly review of project number {i} went as planned." for i in range(80)]
    lines[60] = "Entry 60: the zeppelin model arrived broken."
    note = tmp_path / "memory" / "mac-export.md"
    note.parent.mkdir()
    note.write_bytes(("# Review log\r" + "\r".join(lines) + "\r").encode())  # old Mac line ends
    engine = _engine(tmp_path)
    try:
        hits = (await engine.search(SearchRequest.of("zeppelin", min_score=0.0))).results
        page = await engine.read_file("memory/mac-export.md", from_line=61, lines=3)
        titled = (await engine.search(SearchRequest.of("review log", min_score=0.0, max_results=20))).results
    finally:
        await engine.close()
    # line 62 is in two chunks (the overlap); no other chunk is cited
    assert [(h.path, h.start_line <= 62 <= h.end_line, "zeppelin" in h.snippet) for h in hits] == [
        ("memory/mac-export.md", True, True)] * 2
    assert page.text.startswith("\r".join(lines[59:62]) + "\r")  # the file's text as it is
    assert (page.from_line, page.lines) == (61, 3)
    assert len(titled) > 1  # the heading is every chunk's title, and only the heading
