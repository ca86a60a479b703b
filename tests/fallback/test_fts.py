"""FTS query plans, CJK routing and the BM25 rank mapping (fallback/search/fts.py)."""

from __future__ import annotations

import pytest

from fallback.search.fts import (
    FtsPlan,
    bm25_rank_to_score,
    build_fts_query,
    escape_like,
    fts_only_score,
    fts_tokens,
)


def test_spec_examples_unicode61() -> None:
    assert build_fts_query("hello world") == FtsPlan(
        tokens=("hello", "world"), match='"hello" AND "world"', trigram_match=None, like_terms=())
    assert build_fts_query("FOO_bar baz-1").match == '"FOO_bar" AND "baz" AND "1"'
    assert build_fts_query("cafe\u0301").match == '"café"'
    assert build_fts_query("päätös äänestys").match == '"päätös" AND "äänestys"'
    assert build_fts_query("ฐานข้อมูล ข้อผิดพลาด").match == '"ฐานข้อมูล" AND "ข้อผิดพลาด"'


def test_blank_and_symbol_only_queries_give_no_plan() -> None:
    assert build_fts_query("   ") is None
    assert build_fts_query("") is None
    assert build_fts_query("!@#$%^&*()") is None
    assert build_fts_query("🙂🚀").like_terms == ("🙂🚀",)  # type: ignore[union-attr]


@pytest.mark.parametrize(("query", "match"), [
    ("2026-03-31", '"2026" AND "03" AND "31"'),
    ("pre-edit", '"pre" AND "edit"'),
    ('"quoted"', '"quoted"'),
    ('say "hi', '"say" AND "hi"'),
    ("(paren", '"paren"'),
    ("a*", '"a"'),
    ("key:value", '"key" AND "value"'),
    ("^x", '"x"'),
    ("AND", '"AND"'),
    ("OR", '"OR"'),
    ("NOT", '"NOT"'),
    ("NEAR", '"NEAR"'),
    ("NEAR(a b)", '"NEAR" AND "a" AND "b"'),
    ("deploy 🚀 now", '"deploy" AND "now"'),
    ("-leading", '"leading"'),
    ("x AND y AND x", '"x" AND "AND" AND "y"'),
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


def test_trigram_tokenizer_plan_sends_short_tokens_to_like() -> None:
    plan = build_fts_query("ai roadmap 会議 金银价格", tokenizer="trigram")
    assert plan is not None
    assert plan.match == '"roadmap" AND "金银价格"'
    assert plan.trigram_match is None
    assert plan.like_terms == ("ai", "会議")


def test_escape_like_escapes_wildcards() -> None:
    assert escape_like("50%_off\\x") == "%50\\%\\_off\\\\x%"


def test_fts_tokens_keep_marks_and_underscore() -> None:
    assert fts_tokens("snake_case, e\u0301t\u00e9! 123") == ["snake_case", "été", "123"]


def test_bm25_rank_to_score_spec_case_23() -> None:
    assert bm25_rank_to_score(0) == 1.0
    assert bm25_rank_to_score(1) == 0.5
    assert bm25_rank_to_score(10) < bm25_rank_to_score(1)
    assert abs(bm25_rank_to_score(-100) - 1) <= 0.05
    assert bm25_rank_to_score(-4.2) > bm25_rank_to_score(-2.1) > bm25_rank_to_score(-0.5)
    assert bm25_rank_to_score(float("nan")) == 0.001
    assert bm25_rank_to_score(float("-inf")) == 0.001


def test_fts_only_score_boosts() -> None:
    # 2/2 query tokens matched, chunk has 4 distinct tokens, path has none, 21 chars of text.
    score = fts_only_score(0.1, query="alpha beta", text="alpha beta gamma delta", path="a.md")
    expected = 0.1 + 0.45 * 1.0 + 0.2 * 2 / 4 + 0.0 + min(22 / 160, 0.18)
    assert score == pytest.approx(expected)
    assert fts_only_score(0.9, query="alpha", text="alpha " * 100, path="alpha.md") == 1.0
    # A CJK query token counts as matched when it is a substring of the chunk.
    cjk = fts_only_score(0.0, query="価格", text="金银価格表", path="m.md")
    assert cjk == pytest.approx(0.45 + 0.2 * 1 / 1 + min(5 / 160, 0.18))


def test_symbol_only_queries_become_substring_searches() -> None:
    plan = build_fts_query("  🦘  ")
    assert plan is not None and plan.match is None and plan.like_terms == ("🦘",)
    assert build_fts_query("★ →").like_terms == ("★ →",)  # type: ignore[union-attr]
    assert build_fts_query("?!... ,") is None  # punctuation only: nothing to look for
