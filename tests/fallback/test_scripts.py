"""fallback.text.scripts: the one script classifier behind chunk weights, CJK tests, keywords and MMR."""

from __future__ import annotations

import pytest
import regex

from fallback.text.scripts import (
    _CJK_PROPERTIES,
    CJK_FLOOR,
    UNSPACED_SCRIPTS,
    _properties,
    contains_cjk,
    contains_unspaced,
    script_of,
    text_weight,
    word_stretches,
)


@pytest.mark.parametrize("ch,script", [
    ("漢", "han"), ("々", "han"), ("〇", "han"), ("\U00020000", "han"), ("\U00030000", "han"),
    ("か", "hiragana"), ("ゟ", "hiragana"),
    ("カ", "katakana"), ("ｶ", "katakana"), ("ー", "katakana"), ("ｰ", "katakana"), ("ﾞ", "katakana"),
    ("한", "hangul"), ("ㄱ", "hangul"), ("ᄀ", "hangul"),
    ("ㄅ", "cjk"), ("ꀀ", "cjk"), ("、", "cjk"), ("。", "cjk"), ("「", "cjk"), ("・", "cjk"),
    ("a", "other"), ("é", "other"), ("·", "other"), ("\u0323", "other"), ("\u3000", "other"),
    ("㎡", "other"), ("ꓐ", "other"), ("，", "other"), ("😀", "other"), ("Я", "other"),
])
def test_script_of(ch: str, script: str) -> None:
    assert script_of(ch) == script


def test_text_weight_follows_the_classifier() -> None:
    assert text_weight("") == 0
    assert text_weight("東京チームのデータ。") == 40  # ideographs, kana, ー and 。 weigh 4 each
    assert text_weight("l·l café Vie\u0323\u0302t") == 15  # Latin text with shared marks: 1 each
    assert text_weight("한국어 메모") == 21  # five syllables and a space
    assert text_weight("한") == 12  # conjoining jamo weigh like syllables
    assert text_weight("ｶﾀｶﾅ") == 16
    assert text_weight("㎡ ꓐ") == 3  # squared Latin and Lisu are not CJK
    assert text_weight("a\U00030000b") == 6  # Extension G


def test_contains_cjk() -> None:
    assert [contains_cjk(t) for t in ("plain", "café l·l", "", "東京", "ｶﾀｶﾅ", "ㄅ", "x、y", "㎡")] == [
        False, False, False, True, True, True, True, False]



def test_contains_unspaced_takes_cjk_and_the_other_scripts_without_spaces() -> None:
    assert [contains_unspaced(t) for t in ("plain", "", "東京", "ｶﾀｶﾅ", "x、y", "㎡")] == [
        False, False, True, True, True, False]
    # Thai, Lao, Khmer and Myanmar take the substring path too, but are not CJK: they weigh 1
    unspaced = ("ข้าวผัด", "๒๐๒๖", "ເຂົ້າ", "បាយឆា", "ထမင်း")
    assert [contains_unspaced(t) for t in unspaced] == [True] * 5
    assert [contains_cjk(t) for t in unspaced] == [False] * 5
    assert [text_weight(t) for t in unspaced] == [len(t) for t in unspaced]
    assert [contains_unspaced(t) for t in ("Привет", "مرحبا", "नमस्ते", "ᚠ")] == [False] * 4


def test_word_stretches_cut_words_where_cjk_starts_or_stops() -> None:
    assert list(word_stretches("2026年度 plan, データ化x")) == [
        ("2026", False), ("年度", True), ("plan", False), ("データ化", True), ("x", False)]
    # combining marks stay with the stretch they follow; a leading one goes by its own script
    assert list(word_stretches("e\u0301漢\u0301 \u3099か")) == [
        ("e\u0301", False), ("漢\u0301", True), ("\u3099か", True)]
    assert list(word_stretches("、。 ...")) == []


def test_no_cjk_character_lies_below_the_floor() -> None:
    properties = regex.compile(_CJK_PROPERTIES, regex.V1)
    below = [hex(cp) for cp in range(ord(CJK_FLOOR)) if properties.match(chr(cp))]
    assert below == [] and properties.match(CJK_FLOOR)
    unspaced = regex.compile(_properties(UNSPACED_SCRIPTS), regex.V1)
    assert [hex(cp) for cp in range(ord(CJK_FLOOR)) if unspaced.match(chr(cp))] == []
