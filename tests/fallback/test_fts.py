"""FTS query plans (exact MATCH strings) and CJK routing (fallback/search/fts.py)."""

from __future__ import annotations

import pytest

from fallback.search.fts import FtsPlan, analyze_fts_query, escape_like


def build_fts_query(query: str, *, tokenizer: str = "unicode61", **plan: object) -> FtsPlan | None:
    """The plan of ``query`` with no store counts (:meth:`FtsQuery.plan` with ``plan``)."""
    analyzed = analyze_fts_query(query, tokenizer=tokenizer)
    return None if analyzed is None else analyzed.plan(**plan)  # type: ignore[arg-type]


def test_plain_words_are_ored_with_joined_pair_and_proximity() -> None:
    assert build_fts_query("hello world") == FtsPlan(
        tokens=("hello", "world"),
        match=('"hello" OR "world" OR "helloworld" OR NEAR("hello" "world", 10)'
               ' OR ("hello" AND "world")'),
        trigram_match=None, like_terms=(), terms=("hello", "world"),
        mark_match='"hello" OR "world"', parts=(("hello", '"hello"'), ("world", '"world"')))
    assert build_fts_query("hello world", coverage_pairs=False).match == (
        '"hello" OR "world" OR "helloworld" OR NEAR("hello" "world", 10)')
    # A part found in half of the chunks or more joins no pair and marks no snippet line ...
    common = build_fts_query("Nate turtle tank", coverage_pairs=False, common=frozenset({"nate"}))
    assert common is not None
    assert common.match == ('"nate" OR "turtle" OR "tank" OR "nateturtle" OR "turtletank"'
                            ' OR NEAR("turtle" "tank", 10)')
    assert common.mark_match == '"turtle" OR "tank"'
    # ... and with drop_common leaves the OR (its joined form with a rare neighbour stays) ...
    dropped = build_fts_query("Nate turtle tank", coverage_pairs=False,
                              common=frozenset({"nate"}), drop_common=True)
    assert dropped is not None
    assert dropped.match == ('"turtle" OR "tank" OR "nateturtle" OR "turtletank"'
                             ' OR NEAR("turtle" "tank", 10)')
    assert dropped.mark_match == '"turtle" OR "tank"'
    assert dropped.terms == ("nate", "turtle", "tank")
    # ... unless every part is that common: then they are all searched.
    every = build_fts_query("Nate turtle", coverage_pairs=False,
                            common=frozenset({"nate", "turtle"}), drop_common=True)
    assert every is not None
    assert every.match == '"nate" OR "turtle" OR "nateturtle"'
    assert every.mark_match == '"nate" OR "turtle"'
    assert build_fts_query("cafe\u0301").match == '"café"'


def test_question_keeps_content_words_only() -> None:
    plan = build_fts_query("When did Caroline go to the LGBTQ support group?")
    assert plan is not None
    assert plan.terms == ("caroline", "lgbtq", "support", "group")
    assert plan.match == (
        '"caroline" OR "lgbtq" OR "support" OR "group" OR "lgbtqsupport" OR "supportgroup"'
        ' OR NEAR("caroline" "lgbtq", 10) OR NEAR("lgbtq" "support", 10)'
        ' OR NEAR("support" "group", 10) OR ("caroline" AND "lgbtq") OR ("caroline" AND "support")'
        ' OR ("caroline" AND "group") OR ("lgbtq" AND "support") OR ("lgbtq" AND "group")'
        ' OR ("support" AND "group")')
    assert plan.mark_match == '"caroline" OR "lgbtq" OR "support" OR "group"'
    # Spanish stop words go too; a query of stop words only keeps them all.
    assert build_fts_query("ayer hablamos sobre la estrategia").terms == (
        "hablamos", "estrategia")
    assert build_fts_query("the a an").terms == ("the", "a", "an")


def test_contraction_pieces_are_not_content_parts() -> None:
    # The "s" of a possessive and the pieces of "don't" are in most English chunks and say
    # nothing: they are dropped like stop words, and they break no adjacency (no "natedog").
    plan = build_fts_query("What is Nate's dog called? I don't know")
    assert plan is not None
    assert plan.terms == ("nate", "dog", "called")
    assert plan.match == (
        '"nate" OR "dog" OR "called" OR "dogcalled" OR NEAR("nate" "dog", 10)'
        ' OR NEAR("dog" "called", 10) OR ("nate" AND "dog") OR ("nate" AND "called")'
        ' OR ("dog" AND "called")')
    # A query of nothing else keeps them, as a stop-word-only query does.
    assert build_fts_query("it's").terms == ("it", "s")


def test_hyphen_forms_match_both_ways() -> None:
    assert build_fts_query("Wi-Fi").match == '("wi fi" OR "wifi")'
    assert build_fts_query("wi fi").match == (
        '"wi" OR "fi" OR "wifi" OR NEAR("wi" "fi", 10) OR ("wi" AND "fi")')
    assert build_fts_query("wifi").match == '"wifi"'
    assert build_fts_query("pre-edit").match == '("pre edit" OR "preedit")'
    assert build_fts_query("ice cream").match == (
        '"ice" OR "cream" OR "icecream" OR NEAR("ice" "cream", 10) OR ("ice" AND "cream")')


def test_identifiers_dates_and_quoted_phrases() -> None:
    plan = build_fts_query("ABC-1234 broke on 2023-05-08")
    assert plan is not None
    assert plan.terms == ("abc1234", "broke", "20230508")
    assert plan.match == ('("abc 1234" OR "abc1234") OR "broke" OR "20230508"'
                          ' OR NEAR("abc 1234" "broke", 10)'
                          ' OR (("abc 1234" OR "abc1234") AND "broke")'
                          ' OR (("abc 1234" OR "abc1234") AND "20230508")'
                          ' OR ("broke" AND "20230508")')
    assert build_fts_query("FOO_bar").match == '("foo bar" OR "foobar")'
    for written in ("May 8, 2023", "8 May 2023", "8th of May, 2023", "2023/05/08"):
        assert build_fts_query(f"what happened {written}").match == (
            '"happened" OR "20230508" OR ("happened" AND "20230508")')
    assert build_fts_query("notes from March 2023").match == (
        '"notes" OR "202303" OR ("notes" AND "202303")')
    assert build_fts_query('"support group" meeting').match == (
        '"support" OR "group" OR "meeting" OR "support group" OR "supportgroup"'
        ' OR NEAR("support" "group", 10) OR NEAR("group" "meeting", 10)'
        ' OR ("support" AND "group") OR ("support" AND "meeting") OR ("group" AND "meeting")')


def test_blank_and_symbol_only_queries_give_no_plan() -> None:
    assert build_fts_query("   ") is None
    assert build_fts_query("") is None
    assert build_fts_query("!@#$%^&*()") is None
    assert build_fts_query("🙂🚀").like_terms == ("🙂🚀",)  # type: ignore[union-attr]


@pytest.mark.parametrize(("query", "match"), [
    ("2026-03-31", '"20260331"'),
    ('"quoted"', '"quoted"'),
    ('say "hi', '"hi"'),
    ("(paren", '"paren"'),
    ("a*", '"a"'),
    ("key:value", '"key" OR "value" OR NEAR("key" "value", 10) OR ("key" AND "value")'),
    ("^x", '"x"'),
    ("AND", '"and"'),
    ("OR", '"or"'),
    ("NOT", '"not"'),
    ("NEAR", '"near"'),
    ("NEAR(a b)", '"near" OR "b" OR NEAR("near" "b", 10) OR ("near" AND "b")'),
    ("deploy 🚀 now", '"deploy" OR "now" OR NEAR("deploy" "now", 10) OR ("deploy" AND "now")'),
    ("-leading", '"leading"'),
    ('x" OR "y', '"x"'),
])
def test_hazards_are_quoted_literals(query: str, match: str) -> None:
    plan = build_fts_query(query)
    assert plan is not None
    assert plan.match == match
    assert plan.trigram_match is None and plan.like_terms == ()


def test_cjk_tokens_route_to_trigram_or_like() -> None:
    plan = build_fts_query("価格 2026年 戦略会議 한국어 서버")
    assert plan is not None
    assert plan.match is None
    assert plan.trigram_match == '"2026年" AND "戦略会議" AND "한국어"'
    assert plan.like_terms == ("価格", "서버")
    assert plan.like_patterns == ("%価格%", "%서버%")
    mixed = build_fts_query("deploy 会議")
    assert mixed is not None
    assert (mixed.match, mixed.trigram_match, mixed.like_terms) == ('"deploy"', None, ("会議",))
    # Thai, Lao, Khmer and Myanmar write no spaces between words either: substrings too
    unspaced = build_fts_query("ฐานข้อมูล ເຂົ້າ បាយឆា ထမင်း deploy")
    assert unspaced is not None
    assert (unspaced.match, unspaced.trigram_match, unspaced.like_terms) == (
        '"deploy"', '"ฐานข้อมูล" AND "ເຂົ້າ" AND "បាយឆា" AND "ထမင်း"', ())


def test_trigram_tokenizer_plan_sends_short_tokens_to_like() -> None:
    plan = build_fts_query("ai roadmap 会議 金银价格", tokenizer="trigram")
    assert plan is not None
    assert plan.match == '"roadmap" AND "金银价格"'
    assert plan.trigram_match is None
    assert plan.like_terms == ("ai", "会議")


def test_escape_like_escapes_wildcards() -> None:
    assert escape_like("50%_off\\x") == "%50\\%\\_off\\\\x%"


def test_symbol_only_queries_become_substring_searches() -> None:
    plan = build_fts_query("  🦘  ")
    assert plan is not None and plan.match is None and plan.like_terms == ("🦘",)
    assert build_fts_query("★ →").like_terms == ("★ →",)  # type: ignore[union-attr]
    assert build_fts_query("?!... ,") is None  # punctuation only: nothing to look for


def test_ascii_word_runs_need_no_unicode_tables() -> None:
    # An ASCII query is cut with [A-Za-z0-9_]+ (no `regex` load); it must give the very runs the
    # Unicode pattern gives, on every ASCII character and on mixed text.
    import regex

    from fallback.search.fts import _ASCII_WORD_RE, _WORD_PATTERN, _word_matches

    unicode_words = regex.compile(_WORD_PATTERN)
    assert [chr(c) for c in range(128) if _ASCII_WORD_RE.fullmatch(chr(c))] == [
        chr(c) for c in range(128) if unicode_words.fullmatch(chr(c))]
    for text in ("Wi-Fi 6E router_v2 (ABC-1234) dropped 3x!", "  ", "a\tb\nc", "\x00x\x7fy"):
        assert [(m.start(), m.group()) for m in _word_matches(text)] == [
            (m.start(), m.group()) for m in unicode_words.finditer(text)]
    assert [m.group() for m in _word_matches("café naïve 東京2026")] == ["café", "naïve", "東京2026"]
