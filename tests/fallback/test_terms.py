"""Derived search terms: compound joins, canonical dates, note titles (fallback/text/terms.py)."""

from __future__ import annotations

import pytest

from fallback.text.terms import (
    Compound,
    DateMention,
    compounds,
    date_mentions,
    derived_terms,
    first_heading,
    title_text,
)


def test_compounds_join_their_parts() -> None:
    assert compounds("guest Wi-Fi and ABC-1234, see snake_case_name or v1.2.3.") == [
        Compound(6, 11, ("wi", "fi"), "wifi"),
        Compound(16, 24, ("abc", "1234"), "abc1234"),
        Compound(30, 45, ("snake", "case", "name"), "snakecasename"),
    ]  # dots (and slashes) are no connectors
    assert compounds("a sentence. Another - and -dash") == []
    assert compounds("non\u2011breaking") == [Compound(0, 12, ("non", "breaking"), "nonbreaking")]
    assert compounds("ฐาน-ข้อมูล")[0].joined == "ฐานข้อมูล"  # marks stay in the part
    assert compounds("x" * 30 + "-" + "y" * 30) == []  # joined form too long to be worth it


@pytest.mark.parametrize(("text", "terms"), [
    ("2023-05-08", ("20230508", "202305")),
    ("2023/5/8", ("20230508", "202305")),
    ("2023.05.08", ("20230508", "202305")),
    ("8 May 2023", ("20230508", "202305")),
    ("8 may, 2023", ("20230508", "202305")),
    ("8th of May, 2023", ("20230508", "202305")),
    ("May 8, 2023", ("20230508", "202305")),
    ("Sept. 28th 2023", ("20230928", "202309")),
    ("May 2023", ("202305",)),
    ("2023-05", ("202305",)),
    ("1:56 pm on 8 May, 2023", ("20230508", "202305")),
])
def test_written_dates_have_one_canonical_form(text: str, terms: tuple[str, ...]) -> None:
    assert [m.terms for m in date_mentions(text)] == [terms]


def test_date_spans_and_impossible_dates() -> None:
    assert date_mentions("due 2023-02-30, moved to March 3 2024 (v2023-01 is a tag)") == [
        DateMention(25, 37, ("20240303", "202403"))]
    assert date_mentions("1999 and 12023 and 2023") == []
    assert date_mentions("from 2023-05-08 to 9 May 2023") == [
        DateMention(5, 15, ("20230508", "202305")), DateMention(19, 29, ("20230509", "202305"))]


def test_derived_terms_of_a_chunk() -> None:
    assert derived_terms("Wi-Fi broke on 8 May 2023; ticket ABC-1234.") == (
        "wifi abc1234 20230508 202305")
    assert derived_terms("no compounds, no dates") == ""


def test_title_of_a_daily_note_carries_its_date() -> None:
    assert first_heading("intro\n## Standup notes ##\n# Later") == "Standup notes"
    assert first_heading("no heading\n#hashtag") == ""
    assert first_heading("intro\r# Mac export\rbody\rmore") == "Mac export"  # lone CR line ends
    assert first_heading("# Windows\r\nbody") == "Windows"
    assert title_text("memory/2023-05-08.md", "Standup") == (
        "memory/2023-05-08.md Standup 20230508 202305")
    assert title_text("memory/2023-05-08-2.md", "") == (
        "memory/2023-05-08-2.md 202305082 20230508 202305")
    assert title_text("notes/team-sync.md", "") == "notes/team-sync.md teamsync"
