"""Tests for fallback.text.keywords (spec §8.9, §12 cases 39-45)."""

from __future__ import annotations

import pytest

from fallback.text.keywords import cjk_words, contraction_fragments, extract_keywords
from fallback.text.scripts import word_runs


def test_case39_english_conversational() -> None:
    assert extract_keywords("that thing we discussed about the API") == ["discussed", "api"]


def test_case40_chinese_unigrams_bigrams() -> None:
    kws = extract_keywords("之前讨论的那个方案")
    assert "讨论" in kws and "方案" in kws
    for stop in ("之前", "的", "那个"):
        assert stop not in kws


def test_traditional_chinese_stop_words() -> None:
    kws = extract_keywords("我們之前討論的那個方案是什麼")
    assert "討論" in kws and "方案" in kws
    for stop in ("我們", "那個", "什麼"):
        assert stop not in kws


def test_case41_mixed_chinese_english() -> None:
    kws = extract_keywords("昨天讨论的 API design")
    assert "讨论" in kws and kws[-2:] == ["api", "design"]
    assert "昨天" not in kws


def test_case42_technical_terms() -> None:
    assert extract_keywords("what was the solution for the CFR bug") == ["solution", "cfr", "bug"]


@pytest.mark.parametrize(("query", "expected"), [
    ("어제 논의한 배포 전략", ["논의한", "배포", "전략"]),
    ("서버에서 발생한 에러를 확인", ["서버에서", "서버", "발생한", "에러를", "에러", "확인"]),
    ("논의", ["논의"]),
    ("기능으로 설명", ["기능으로", "기능", "설명"]),
    ("API를 배포했다", ["api를", "api", "배포했다"]),
    ("API 배포에 대한 논의", ["api", "배포에", "배포", "논의"]),
    ("나는 그리고 그래서", []),
    ("그녀는 우리는", []),
])
def test_case43_korean(query: str, expected: list[str]) -> None:
    assert extract_keywords(query) == expected


def test_case44_japanese() -> None:
    kws = extract_keywords("昨日話したデプロイ戦略")
    assert "デプロイ" in kws and "戦略" in kws and "昨日" not in kws
    kws = extract_keywords("昨日話したAPIのバグ")
    assert "api" in kws and "バグ" in kws and "した" not in kws and "の" not in kws
    assert extract_keywords("これ それ そして どう") == []


@pytest.mark.parametrize(("query", "expected"), [
    ("ayer hablamos sobre la estrategia de despliegue", ["hablamos", "estrategia", "despliegue"]),
    ("ontem falamos sobre a estratégia de implantação", ["falamos", "estratégia", "implantação"]),
    ("cómo cuando donde porquê quando onde", []),
    ("بالأمس ناقشنا استراتيجية النشر", ["ناقشنا", "استراتيجية", "النشر"]),
    ("كيف متى أين ماذا", []),
    ("hvordan var mødet om budgettet", ["mødet", "budgettet"]),
    ("hvorfor ble avtalen forsinket", ["ble", "avtalen", "forsinket"]),
    ("varför blev leveransen försenad", ["blev", "leveransen", "försenad"]),
    ("", []),
    ("   ", []),
    ("the a an is are", []),
    ("test test testing", ["test", "testing"]),
    ("deploy 2026 ... !!! v2 ok", ["deploy", "v2"]),
    ("snake_case, hyphen-ated", ["snake_case", "hyphen", "ated"]),
])
def test_case45_other_languages_and_filters(query: str, expected: list[str]) -> None:
    assert extract_keywords(query) == expected


def test_nfc_normalisation() -> None:
    decomposed = "e\u0301te\u0301 planning"  # "été" in NFD
    assert extract_keywords(decomposed) == ["\u00e9t\u00e9", "planning"]


def test_word_runs() -> None:
    assert word_runs("Hello World 123") == ["Hello", "World", "123"]
    assert word_runs("") == []
    assert word_runs("!@#$%^&*()") == []
    assert word_runs("snake_case x-y") == ["snake_case", "x", "y"]
    assert word_runs("Café 東京 hello hello") == ["Café", "東京", "hello", "hello"]
    assert word_runs("e\u0301") == ["\u00e9"]


@pytest.mark.parametrize(("text", "fragments"), [
    ("Nate's dog", ["s"]),
    ("we\u2019ll see, they've gone, I'm in, she'd go, you're right", ["ll", "ve", "m", "d", "re"]),
    ("I don't know and it won't", ["don", "t", "won", "t"]),
    ("CAN'T STOP", ["CAN", "T"]),
    ("O'Brien's bike", ["s"]),
    ("rock 'n' roll", []),
    ("James' car", []),
    ("the 's' key, a 'quoted' word", []),
    ("l'homme d'affaires", []),
])
def test_contraction_fragments(text: str, fragments: list[str]) -> None:
    assert [text[a:b] for a, b in contraction_fragments(text)] == fragments


def test_no_character_below_the_cjk_floor_belongs_to_a_cjk_script() -> None:
    # script_of answers "other" below CJK_FLOOR without compiling its pattern; the pattern agrees.
    from fallback.text.scripts import CJK_FLOOR, _pattern, script_of

    below = [chr(c) for c in range(ord(CJK_FLOOR))]
    assert [ch for ch in below if _pattern("script").match(ch)] == []
    assert {script_of(ch) for ch in below} == {"other"}
    assert [script_of(ch) for ch in "\u02ea東ひカ한、a"] == [
        "cjk", "han", "hiragana", "katakana", "hangul", "cjk", "other"]


def test_ascii_contractions_are_found_as_the_unicode_patterns_find_them() -> None:
    # ASCII text is read with stdlib patterns (no `regex` load); on every such text they must
    # give the spans of the Unicode ones.
    import random

    import regex

    from fallback.text.keywords import _CLITIC, _NEGATED

    clitic, negated = regex.compile(_CLITIC, regex.IGNORECASE), regex.compile(_NEGATED, regex.IGNORECASE)
    alphabet = "aDnNsStTlLrReEvVmMO9_ '.-"
    rng = random.Random(7)
    texts = ["Nate's dog", "I DON'T know", "won't, can't; isn't", "rock 'n' roll", "x'S y'LL"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(4000)]
    for text in texts:
        want = sorted([m.span(1) for m in clitic.finditer(text)] + [m.span(1) for m in negated.finditer(text)])
        assert contraction_fragments(text) == want, text


@pytest.mark.parametrize(("query", "words"), [
    # bigrams taking a stop word's character go (们什, 么时); lone ideographs come last
    ("我们什么时候去了支持小组？", ("时候", "候去", "支持", "持小", "小组")),
    ("用户喜欢喝什么茶", ("用户", "户喜", "喜欢", "欢喝", "茶")),
    # Japanese: its own stop words (not the Chinese ones, which would cut 京都 and 和食)
    ("東京の会議はいつですか", ("東京", "会議")),
    ("京都旅行はいつ", ("京都", "都旅", "旅行")),
    # Korean: the stem only, the word holding it would take a slot for nothing
    ("부산에서 먹은 음식은", ("부산", "먹은", "음식")),
    # Latin words of a mixed query are kept
    ("团队用什么 chat 工具", ("团队", "队用", "chat", "工具")),
    ("no cjk here", ()),
    ("", ()),
])
def test_cjk_words(query: str, words: tuple[str, ...]) -> None:
    assert cjk_words(query) == words
