"""MMR re-ranking (spec §8.8, §12 cases 26-31) and CJK tokenisation."""

from __future__ import annotations

import pytest

from fallback.search.ranking import Candidate, jaccard, mmr_rerank, mmr_score, mmr_tokens


def items(*pairs: tuple[float, str]) -> list[Candidate]:
    return [Candidate(chunk_id=str(i + 1), path=f"memory/{i + 1}.md", source="memory",
                      start_line=1, end_line=1, snippet=text, score=score)
            for i, (score, text) in enumerate(pairs)]


def ids(cands: list[Candidate]) -> list[str]:
    return [c.chunk_id for c in cands]


def test_tokens_basic():
    assert mmr_tokens("Hello World 123") == {"hello", "world", "123"}
    assert mmr_tokens("") == set()
    assert mmr_tokens("!@#$%^&*()") == set()
    assert mmr_tokens("snake_case value") == {"snake_case", "value"}
    assert mmr_tokens("test test TEST") == {"test"}


def test_tokens_nfc_and_marks():
    assert mmr_tokens("cafe\u0301") == {"caf\u00e9"}
    assert mmr_tokens("p\u00e4\u00e4t\u00f6s") == {"p\u00e4\u00e4t\u00f6s"}


def test_tokens_cjk_bigrams():
    assert mmr_tokens("金银价格") == {"金银", "银价", "价格"}
    assert mmr_tokens("中") == {"中"}
    assert mmr_tokens("2026年度 API设计") == {"2026", "年度", "api", "设计"}
    assert mmr_tokens("デプロイ戦略") == {"デプ", "プロ", "ロイ", "イ戦", "戦略"}


def test_cjk_overlap_is_visible_to_jaccard():
    a = mmr_tokens("我们讨论了部署方案")
    b = mmr_tokens("部署方案已经确定")
    assert jaccard(a, b) == pytest.approx(3 / 12)


def test_jaccard():
    assert jaccard({"a", "b"}, {"a", "b"}) == 1.0
    assert jaccard({"a"}, {"b"}) == 0.0
    assert jaccard(set(), set()) == 1.0
    assert jaccard({"a"}, set()) == 0.0
    assert jaccard({"a", "b", "c"}, {"b", "c", "d"}) == 0.5
    assert jaccard({"b", "c", "d"}, {"a", "b", "c"}) == 0.5


def test_mmr_score():
    assert mmr_score(0.8, 0.5, 1) == pytest.approx(0.8)
    assert mmr_score(0.8, 0.5, 0) == pytest.approx(-0.5)
    assert mmr_score(0.8, 0.6, 0.5) == pytest.approx(0.1)
    assert mmr_score(1, 0.5, 0.7) == pytest.approx(0.55)


FRUIT = ((1.0, "apple banana cherry"), (0.9, "apple banana date"), (0.8, "elderberry fig grape"))


def test_lambda_one_is_plain_sort():
    assert ids(mmr_rerank(items(*FRUIT), lambda_=1)) == ["1", "2", "3"]
    assert ids(mmr_rerank(items(*FRUIT), lambda_=1.5)) == ["1", "2", "3"]


@pytest.mark.parametrize("lam", [0, -0.5])
def test_lambda_zero_prefers_diversity(lam):
    assert ids(mmr_rerank(items(*FRUIT), lambda_=lam)) == ["1", "3", "2"]


def test_balanced_lambda():
    out = mmr_rerank(items((1.0, "machine learning neural networks"),
                           (0.95, "machine learning deep learning"),
                           (0.9, "database systems sql queries"),
                           (0.85, "machine learning algorithms")), lambda_=0.5)
    assert ids(out)[:2] == ["1", "3"]
    assert sorted(ids(out)) == ["1", "2", "3", "4"]


def test_duplicates_second_pick_is_different():
    out = mmr_rerank(items((1.0, "same text here"), (0.9, "same text here"), (0.8, "other words")),
                     lambda_=0.5)
    assert ids(out) == ["1", "3", "2"]


def test_all_identical_keeps_all():
    out = mmr_rerank(items((1.0, "x y"), (1.0, "x y"), (1.0, "x y")), lambda_=0.7)
    assert ids(out) == ["1", "2", "3"]


def test_negative_scores_higher_first():
    out = mmr_rerank(items((-0.5, "alpha"), (-0.1, "beta"), (-0.9, "gamma")), lambda_=0.7)
    assert ids(out) == ["2", "1", "3"]


def test_trivial_inputs():
    assert mmr_rerank([], lambda_=0.7) == []
    single = items((0.3, "x"))
    assert mmr_rerank(single, lambda_=0.7) == single


def test_cjk_near_duplicates_are_spread():
    out = mmr_rerank(items((1.0, "部署方案已经确定了"), (0.95, "部署方案已经确定"),
                           (0.9, "数据库迁移计划")), lambda_=0.5)
    assert ids(out) == ["1", "3", "2"]


def test_input_not_mutated_and_same_objects():
    cands = items(*FRUIT)
    out = mmr_rerank(cands, lambda_=0.3)
    assert ids(cands) == ["1", "2", "3"]
    assert all(any(o is c for c in cands) for o in out)
    assert [c.score for c in cands] == [1.0, 0.9, 0.8]
