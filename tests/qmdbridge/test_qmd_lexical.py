"""Questions through qmd's lexical search (``qmdbridge/qmd/lexical.py``): the content words
sent to ``qmd search``, and the relaxed pass, against the real qmd 2.8.3 behind an argv logger."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from fallback.request import SearchRequest
from fallback.text.chunking import chunk_markdown
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation
from qmdbridge.qmd.passages import MAX_FOCUS_CHARS
from qmdbridge.qmd.query_text import MAX_RELAXED_TERMS, cjk_terms, lexical_terms, without_stray_quote

QUESTION = "When did Caroline go to the LGBTQ support group?"


@pytest.mark.parametrize(("query", "terms"), [
    (QUESTION, ("Caroline", "LGBTQ", "support", "group")),
    # possessive and contraction pieces dropped; a hyphenated token kept whole (qmd: a phrase)
    ("What's Nate's Wi-Fi password?", ("Nate", "Wi-Fi", "password")),
    ("qmd 2.8.3 release notes", ("qmd", "2.8.3", "release", "notes")),
    ("ABC-1234 status?!", ("ABC-1234", "status")),
    ("CAROLINE caroline Caroline", ("CAROLINE",)),  # once, as first written
    ("¿Dónde vive Juan?", ("vive", "Juan")),  # Spanish stop words too
    ("mid-size -- dash", ("mid-size", "dash")),  # a lone "--" is no negation
    # every apostrophe a keyboard or an autocorrect writes ends a possessive the same way
    *((f"Nate{a}s dog", ("Nate", "dog")) for a in "'\u2019\u2018\u02bc`\u00b4\uff07"),
    ("we don\u00b4t mind rain", ("mind", "rain")),
    # a word keeps its combining marks (FTS5 reads letters, marks and digits as one token)
    ("कैरोलिन चाय", ("कैरोलिन", "चाय")),
    ("สวัสดี", ("สวัสดี",)),
    # hyphens and dots in one token: qmd matches neither form whole, so it is cut at the
    # hyphens, and the dotted parts stay whole
    ("1.2.3-rc1 router", ("1.2.3", "rc1", "router")),
    ("node-v18.2 crash", ("node", "v18.2", "crash")),
    # full-width words (an input method in full-width mode): the ASCII form, then as typed;
    # a full-width stop word is a stop word
    ("ｔｈｅ ｒｏｕｔｅｒ ＷＡＮ", ("router", "ｒｏｕｔｅｒ", "WAN", "ＷＡＮ")),
    # sent as written: qmd syntax, CJK text, nothing but stop words, nothing at all
    ('"support group" Caroline', ()),
    ("Caroline -draft", ()),
    ("-leading dash", ("leading", "dash")),  # a leading dash is no negation (encode_query)
    ("部署 the server", ()),
    ("what is it", ()),
    ("  ", ()),
])
def test_lexical_terms(query: str, terms: tuple[str, ...]) -> None:
    assert lexical_terms(query) == terms


@pytest.mark.parametrize(("query", "terms"), [
    # ideograph bigrams; one taking a character of a stop word (我们, 什么, 了) is no word
    ("我们什么时候去了支持小组？", ("时候", "候去", "支持", "持小", "小组")),
    # an ideograph in no stop word and no word kept comes last (a one-character noun)
    ("用户喜欢喝什么茶", ("用户", "户喜", "喜欢", "欢喝", "茶")),
    ("東京の会議はいつですか", ("東京", "会議")),
    ("회의는 언제 시작하나요", ("회의", "시작하나요")),
    # a word holding a kept word (a Korean word and its stem) finds only notes that one finds
    # (qmd: the phrase of its characters), so it takes no slot: 음식 stays within the six
    ("지난주에 부산에서 먹은 음식은 뭐였어?", ("지난주", "부산", "먹은", "음식", "뭐였어")),
    ("When did Caroline go to 支持小组?", ("caroline", "支持", "持小", "小组")),
    # Traditional Chinese stop words too: 茶 stays within the six words searched
    ("使用者喜歡喝什麼茶", ("使用", "用者", "者喜", "喜歡", "歡喝", "茶")),
    ("我們上次去台北開會是甚麼時候", ("去台", "台北", "北開", "開會", "時候")),
    # a Japanese question: Japanese stop words, not the Chinese function characters (都 and 与
    # are parts of 京都 and 給与), and no grammar (particles, endings: はいつですか) as a word
    ("京都旅行はいつでしたか", ("京都", "都旅", "旅行")),
    ("給与の振込日はいつですか", ("給与", "振込", "込日")),
    ("和食で何が好き？", ("和食", "好")),
    ("プレゼンの資料はどこに保存しましたか", ("プレゼン", "資料", "保存")),
    # no CJK text, or qmd syntax: nothing to relax
    ("router", ()),
    ('"支持小组" 时间', ()),
    ("支持 -小组", ()),
    ("  ", ()),
])
def test_cjk_terms(query: str, terms: tuple[str, ...]) -> None:
    assert cjk_terms(query) == terms


NOTES = {
    "2026-03-01.md": "# Tuesday\n\nCaroline went to the LGBTQ support group on Tuesday.\n",
    "2026-03-02.md": "# Wednesday\n\nThe support group meets weekly in the library.\n",
    "2026-03-03.md": "# Thursday\n\nCaroline paints landscapes by the lake.\n",
    "2026-03-04.md": "# Friday\n\nRepotted the basil and watered the garden.\n",
}


def _backend(tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str,
             more_notes: dict[str, str] | None = None, *, daily: dict[str, str] = NOTES,
             memory: str = "# Memory\n\nCaroline likes green tea.\n",
             **env_extra: str) -> tuple[QmdBackend, Path]:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text(memory)
    notes = {**daily, **(more_notes or {})}
    for name, text in notes.items():
        (ws / "memory" / name).write_text(text)
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"limits": {"timeoutMs": 20000}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    exe = standins_dir / "fail_one_query.py"
    loc = QmdLocation(path=str(exe), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    log = tmp_path / "argv.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(HOME=str(tmp_path / "home"), REAL_QMD=str(qmd_bin), ARGV_LOG=str(log), **env_extra)
    return QmdBackend(agent, location=loc, mode="cli", env=env), log


@asynccontextmanager
async def _started(tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str,
                   more_notes: dict[str, str] | None = None,
                   **kwargs: Any) -> AsyncIterator[tuple[QmdBackend, Path]]:
    """The started backend of :func:`_backend` and its argv log; closed on exit."""
    b, log = _backend(tmp_path, qmd_bin, standins_dir, base_path_env, more_notes, **kwargs)
    try:
        await b.start()
        yield b, log
    finally:
        await b.close()


def _queries(log: Path) -> list[str]:
    """The query of every search call, in the order they were logged (side-by-side calls of
    one step in any order); a ``lex`` call's queries one by one."""
    return [q for sent in _sent(log) for q in ((sent,) if isinstance(sent, str) else sent)]


def _sent(log: Path) -> list[str | tuple[str, ...]]:
    """What each search call sent, in the order they were logged: a ``qmd search`` its query,
    a question's ``qmd query`` its typed ``lex`` queries (a tuple)."""
    out: list[str | tuple[str, ...]] = []
    for args in map(orjson.loads, log.read_text().splitlines()):
        doc = args[-1]
        if args[0] == "query" and doc.startswith("lex: "):
            out.append(tuple(line.removeprefix("lex: ") for line in doc.split("\n")))
        else:
            out.append(doc)
    return out


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_question_finds_the_note_with_every_word_first_then_notes_with_some(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env) as (b, log):
        hits = (await b.search(SearchRequest.of(QUESTION, min_score=0))).results
        # the note holding every content word first; then the notes holding some of them
        assert hits[0].path == "memory/2026-03-01.md"
        assert sorted(h.path for h in hits[1:]) == ["MEMORY.md", "memory/2026-03-02.md",
                                                    "memory/2026-03-03.md"]
        assert hits[0].snippet.endswith("Caroline went to the LGBTQ support group on Tuesday.")
        # one call per collection: the content words ANDed, then each word alone, as qmd's
        # typed lex searches (fused by qmd)
        assert _sent(log) == [("Caroline LGBTQ support group", "Caroline", "LGBTQ", "support",
                               "group")] * 2


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_cjk_question_is_searched_as_written_then_word_by_word(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """qmd matches a CJK term as the phrase of its characters: a question sent whole finds only
    a note that holds it verbatim (qmd answered nothing here). Then each of its words is
    searched alone, and the passages of the notes found are ranked for the question."""
    more = {"2026-03-05.md": "# 周五\n\n今天讨论了记忆系统升级。\n周五晚上去了支持小组，大家分享了故事。\n",
            "2026-03-06.md": "# 周六\n\n用户喜欢喝乌龙茶。\n"}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        hits = (await b.search(SearchRequest.of("我们什么时候去了支持小组？", min_score=0))).results
        assert hits[0].path == "memory/2026-03-05.md"
        assert hits[0].snippet_start_line <= 4 <= hits[0].snippet_end_line
        [sent, again] = _sent(log)  # one call per collection: as written, then word by word
        assert sent == again and sent[0] == "我们什么时候去了支持小组？"
        assert sorted(sent[1:]) == ["候去", "小组", "持小", "支持", "时候"]
        tea = (await b.search(SearchRequest.of("用户喜欢喝什么茶", min_score=0))).results
        assert [h.path for h in tea][:1] == ["memory/2026-03-06.md"]
        phrase = (await b.search(SearchRequest.of('"支持小组"', min_score=0))).results  # qmd syntax: as written, qmd's lines
        assert [h.path for h in phrase] == ["memory/2026-03-05.md"]
        assert _queries(log)[-2:] == ['"支持小组"'] * 2


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_cjk_question_with_one_word_searches_that_word(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """A CJK question with a single word ("护照" of "我的护照呢？") is not that word: sent as
    written it matches only a note holding it verbatim, so the word is searched alone too."""
    more = {"2026-03-05.md": "# 周五\n\n护照放在书房的抽屉里。\n"}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        assert cjk_terms("我的护照呢？") == ("护照",)
        hits = (await b.search(SearchRequest.of("我的护照呢？", min_score=0))).results
        assert [h.path for h in hits] == ["memory/2026-03-05.md"]
        assert hits[0].snippet_start_line <= 3 <= hits[0].snippet_end_line
        assert _sent(log) == [("我的护照呢？", "护照")] * 2
        log.unlink()
        # a question that is its one word is searched once (per collection)
        assert [h.path for h in (await b.search(SearchRequest.of("护照", min_score=0))).results] == ["memory/2026-03-05.md"]
        assert _sent(log) == ["护照"] * 2  # one word: a plain qmd search


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_traditional_chinese_question_searches_its_words_not_its_stop_words(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """什麼 is 什么 in Traditional script: a stop word, not two words (喝什, 麼茶) taking the
    slots of the question's last noun."""
    more = {"2026-03-05.md": "# 週五\n\n每天下午都喝凍頂烏龍茶。\n"}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        hits = (await b.search(SearchRequest.of("使用者喜歡喝什麼茶", min_score=0))).results
        assert [h.path for h in hits] == ["memory/2026-03-05.md"]
        assert "茶" in _queries(log) and "喝什" not in _queries(log)


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_japanese_question_searches_its_kanji_words_whole(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """都 is a Chinese function character but part of the Japanese word 京都: searched as 京
    alone, the question found every 東京 note before the one about Kyoto."""
    more = {f"2026-03-1{i}.md": f"# 出張\n\n東京で打ち合わせ{i}。\n" for i in range(6)}
    more["2026-03-20.md"] = "# 旅行\n\n週末は京都に行った。お寺を回って、抹茶のお菓子を買った。\n"
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        hits = (await b.search(SearchRequest.of("京都はどうだった？", max_results=1, min_score=0))).results
        assert [h.path for h in hits] == ["memory/2026-03-20.md"]
        assert "京都" in _queries(log)


@pytest.mark.anyio
@pytest.mark.qmd
async def test_one_call_per_collection_and_qmd_syntax_sent_as_written(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env) as (b, log):
        [hit] = (await b.search(SearchRequest.of(QUESTION, max_results=1, min_score=0))).results
        assert hit.path == "memory/2026-03-01.md"
        assert len(_sent(log)) == 2  # one call per collection
        log.unlink()
        # a quoted phrase is qmd syntax: sent as written, ANDed by qmd, never relaxed
        [hit] = (await b.search(SearchRequest.of('"support group" weekly', min_score=0))).results
        assert hit.path == "memory/2026-03-02.md"
        assert _queries(log) == ['"support group" weekly'] * 2
        log.unlink()
        assert (await b.search(SearchRequest.of("Caroline -paints lake", min_score=0))).results == []
        assert _queries(log) == ["Caroline -paints lake"] * 2


def _calls(log: Path) -> list[tuple[str, str | tuple[str, ...]]]:
    """``(collection, what was sent)`` of every search call logged (:func:`_sent`)."""
    colls = [args[args.index("-c") + 1] for args in map(orjson.loads, log.read_text().splitlines())]
    return list(zip(colls, _sent(log), strict=True))


class _Unknown:
    """Index counts that are never known (``IndexCounts.read`` of an unreadable index)."""

    async def read(self) -> tuple[dict[str, int], str | None]:
        return {}, "unable to open database file"


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_question_is_one_call_per_collection_whatever_the_index_counts_say(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """The AND and each word alone go in one call per collection (qmd's typed lex searches),
    so a question costs as many qmd processes as collections, and the answer is the same when
    qmd's index cannot be counted."""
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env) as (b, log):
        hits = (await b.search(SearchRequest.of("Caroline tea", min_score=0))).results
        assert [h.path for h in hits][:1] == ["MEMORY.md"]
        assert sorted(h.path for h in hits[1:]) == ["memory/2026-03-01.md", "memory/2026-03-03.md"]
        assert sorted(_calls(log)) == [("memory-dir-main", ("Caroline tea", "Caroline", "tea")),
                                       ("memory-root-main", ("Caroline tea", "Caroline", "tea"))]
        log.unlink()
        b.index_counts = _Unknown()  # type: ignore[assignment]  # every collection is searched
        assert (await b.search(SearchRequest.of("Caroline tea", min_score=0))).results == hits
        assert len(_calls(log)) == 2


@pytest.mark.anyio
@pytest.mark.qmd
async def test_no_word_is_searched_alone_when_the_and_found_every_note(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """A workspace of one note: one qmd call in all (the collection of memory/ holds nothing),
    the AND and each word alone in it."""
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, daily={},
                        memory="# Notes\nrouter dropped the WAN link on tuesday\n") as (b, log):
        [hit] = (await b.search(SearchRequest.of("did the router drop the WAN?", min_score=0))).results
        assert (hit.path, hit.start_line, hit.end_line) == ("MEMORY.md", 1, 2)
        assert _calls(log) == [("memory-root-main", ("router drop WAN", "router", "drop", "WAN"))]
        log.unlink()
        # no note holds "lost": the AND finds nothing, each word alone finds the note
        assert [h.path for h in (await b.search(SearchRequest.of("router WAN lost", min_score=0))).results] == ["MEMORY.md"]
        assert _calls(log) == [("memory-root-main", ("router WAN lost", "router", "WAN", "lost"))]


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_qmd_rejecting_the_lex_call_gets_the_and_and_the_relaxed_pass(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """A qmd build whose ``query`` rejects a flag of the lex call: the content words ANDed,
    then each word alone (``lexical.relax``); a relaxed call that fails leaves its hits out
    and the answer stands."""
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, FAIL_QUERY="support",
                        REJECT_LEX="1") as (b, log):
        hits = (await b.search(SearchRequest.of(QUESTION, min_score=0))).results
        # "support" alone failed; "group" still finds Wednesday's note, "Caroline" the others
        assert hits[0].path == "memory/2026-03-01.md"
        assert sorted(h.path for h in hits[1:]) == ["MEMORY.md", "memory/2026-03-02.md",
                                                    "memory/2026-03-03.md"]
        sent = _sent(log)
        assert sent[:2] == [("Caroline LGBTQ support group", "Caroline", "LGBTQ", "support", "group")] * 2
        assert sent[2:4] == ["Caroline LGBTQ support group"] * 2
        assert sorted(sent[4:]) == sorted(["Caroline", "LGBTQ", "support", "group"] * 2)
        assert b.last_search_error is None


@pytest.mark.anyio
@pytest.mark.qmd
async def test_the_relaxed_pass_searches_the_first_words_only(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    words = ["lake", "library", "basil", "tea", "Tuesday", "weekly", "garden", "Caroline"]
    assert MAX_RELAXED_TERMS == 6
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env) as (b, log):
        hits = (await b.search(SearchRequest.of(" ".join(words), min_score=0))).results  # no note holds all eight
        assert _sent(log) == [(" ".join(words), *words[:MAX_RELAXED_TERMS])] * 2
        # each note holds one of the first six words (lake: Thursday, library: Wednesday,
        # basil: Friday, tea: MEMORY.md, Tuesday: Tuesday's note)
        assert sorted(h.path for h in hits) == ["MEMORY.md", "memory/2026-03-01.md",
                                                "memory/2026-03-02.md", "memory/2026-03-03.md",
                                                "memory/2026-03-04.md"]


@pytest.mark.anyio
@pytest.mark.qmd
async def test_words_reach_qmd_whole_as_its_index_holds_them(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more_notes={
        "2026-03-05.md": "# Saturday\n\nInstalled 1.2.3-rc1 on the router.\n",
        "2026-03-06.md": "# Sunday\n\nRouter log: the router rebooted, router cable replaced.\n",
        "2026-03-07.md": "# Monday\n\nNate's dog barks at the mailman.\n",
        "2026-03-08.md": "# Holi\n\nकैरोलिन को हरी चाय पसंद है।\n",
        # a word starting with each consonant of the note above, none of its words
        "2026-03-09.md": "# Diwali\n\nकल रात लड़का नया चश्मा यहाँ लाया।\n",
    }) as (b, log):
        # a version with a suffix: the dotted part and the suffix, which the note holds
        hits = (await b.search(SearchRequest.of("1.2.3-rc1 router", min_score=0))).results
        assert [h.path for h in hits] == ["memory/2026-03-05.md", "memory/2026-03-06.md"]
        assert [sent[0] for sent in _sent(log)] == ["1.2.3 rc1 router"] * 2
        log.unlink()
        # an acute accent typed as the apostrophe: no lone "s", which would match any note
        # with a word starting with s ("support")
        [hit] = (await b.search(SearchRequest.of("Nate\u00b4s dog", min_score=0))).results
        assert hit.path == "memory/2026-03-07.md"
        assert sorted(_queries(log)) == sorted(["Nate dog", "Nate", "dog"] * 2)
        log.unlink()
        # Devanagari words go whole, never as their consonants (each of which begins some word
        # of the Diwali note); qmd 2.8.3 drops the vowel signs from a query term, so its search
        # finds no such word at all (the builtin engine does)
        assert (await b.search(SearchRequest.of("कैरोलिन चाय", min_score=0))).results == []
        assert sorted(_queries(log)) == sorted(["कैरोलिन चाय", "कैरोलिन", "चाय"] * 2)


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_one_letter_word_narrows_the_and_but_is_not_searched_alone(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more_notes={
            "2026-03-10.md": "# Roadmap\n\nThe launch plan is ready for review.\n"}) as (b, log):
        hits = (await b.search(SearchRequest.of("Plan B launch", min_score=0))).results
        # "b" alone would be a prefix of "basil" and "by" (Friday's and Thursday's notes)
        assert [h.path for h in hits] == ["memory/2026-03-10.md"]
        assert _sent(log) == [("Plan B launch", "Plan", "launch")] * 2


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_long_note_is_cited_at_the_lines_holding_the_question_words(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """A 60-line chat found by the relaxed pass: qmd's own snippet for ``Caroline`` alone sits at
    the first line naming her; the bridge ranks the note's chunks (``passages.py``): the first
    hit is the builtin index's chunk holding the line with both words, its snippet the lines
    around it, and the snippet's lines are what the citation names."""
    chat = ["# Conversation on 5 March", ""] + [
        f"Melanie: that sounds lovely, tell me more about the week ({i})." for i in range(3, 61)]
    chat[3 - 1] = "Caroline: hi Melanie, long time no see!"
    chat[45 - 1] = "Caroline: the pottery workshop on Saturday was wonderful."
    more = {"2026-03-05.md": "\n".join(chat) + "\n"}
    chunks = {(c.start_line, c.end_line)
              for c in chunk_markdown("\n".join(chat) + "\n", tokens=400, overlap=80, sections=True)}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        hits = (await b.search(SearchRequest.of("Caroline pottery kiln", min_score=0))).results
        assert [sent[0] for sent in _sent(log)] == ["Caroline pottery kiln"] * 2  # no note holds "kiln"
        hit = hits[0]  # the only note holding "pottery"
        assert hit.path == "memory/2026-03-05.md" and hit.score == 1.0
        assert hit.start_line <= hit.snippet_start_line <= 45 <= hit.snippet_end_line <= hit.end_line
        assert (hit.start_line, hit.end_line) in chunks  # within the chunk budget (1,600 chars)
        assert hit.snippet == "\n".join(chat[hit.snippet_start_line - 1:hit.snippet_end_line])
        assert len(hit.snippet) <= 700
        # the chunk naming Caroline on line 3 follows, lower
        assert any(h.path == hit.path and h.start_line <= 3 <= h.end_line and h.score < 1.0
                   for h in hits[1:])
        span = "\n".join(chat[hit.start_line - 1:hit.end_line])
        page = await b.read_file(hit.path, from_line=hit.start_line,
                                 lines=hit.end_line - hit.start_line + 1)
        more_note = f"\n\n[More content available. Use from={hit.end_line + 1} to continue.]"
        assert page.text == (span if hit.end_line == len(chat) else f"{span}{more_note}")


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_note_shortened_after_qmd_indexed_it_is_cited_where_the_words_now_are(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """qmd's index still holds the 60-line chat and its snippet at line 45; the note on disk is
    now three lines. The passage is chosen in the note as it is now, so the hit is cited at
    its lines; a note that lost the words too has no line to cite and is left out."""
    chat = ["# Conversation on 5 March", ""] + [
        f"Melanie: that sounds lovely, tell me more about the week ({i})." for i in range(3, 61)]
    chat[45 - 1] = "Caroline: the pottery workshop on Saturday was wonderful."
    more = {"2026-03-05.md": "\n".join(chat) + "\n",
            "2026-03-06.md": "\n".join(["# Conversation on 6 March", *chat[1:]]) + "\n"}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, _):
        hits = (await b.search(SearchRequest.of("pottery workshop", min_score=0))).results
        firsts = {h.path: h for h in reversed(hits)}  # each note's best hit
        assert sorted((p, h.snippet_start_line <= 45 <= h.snippet_end_line)
                      for p, h in firsts.items()) == [
            ("memory/2026-03-05.md", True), ("memory/2026-03-06.md", True)]
        memory = b.agent.workspace_dir / "memory"
        (memory / "2026-03-05.md").write_text("# Conversation on 5 March\n\n"
                                              "Caroline: the pottery workshop moved to Sunday.\n")
        (memory / "2026-03-06.md").write_text("# Conversation on 6 March\n\nNothing new.\n")
        [hit] = (await b.search(SearchRequest.of("pottery workshop", min_score=0))).results
    assert (hit.path, hit.start_line, hit.end_line, hit.snippet_start_line, hit.snippet_end_line,
            hit.snippet) == ("memory/2026-03-05.md", 1, 3, 1, 3, "# Conversation on 5 March\n\n"
                             "Caroline: the pottery workshop moved to Sunday.")


@pytest.mark.anyio
@pytest.mark.qmd
async def test_notes_too_long_to_rank_keep_qmds_order_with_scores_that_never_rise(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """Two notes over ``MAX_FOCUS_CHARS`` keep qmd's lines, in qmd's order: the one holding both
    words (the AND search, weighted twice in qmd's fusion) before the one only ``pottery``
    found; hits are best first, so the second is shown no higher than the first."""
    filler = "\n".join(f"Line {i}: ordinary words about the weather and the garden today."
                       for i in range(3500))
    assert len(filler) > MAX_FOCUS_CHARS
    more = {"2026-03-05.md": f"# Big one\n{filler}\nCaroline mentioned pottery and the kiln once.\n",
            "2026-03-06.md": "# Pottery\n" + "pottery pottery pottery\n" * 20 + filler + "\n"}
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env, more) as (b, log):
        hits = (await b.search(SearchRequest.of("pottery kiln", min_score=0))).results
        assert _sent(log) == [("pottery kiln", "pottery", "kiln")] * 2
        assert [(h.path, h.start_line, h.end_line) for h in hits] == [
            ("memory/2026-03-05.md", 3501, 3502), ("memory/2026-03-06.md", 1, 3)]
        assert hits[1].score <= hits[0].score


@pytest.mark.anyio
@pytest.mark.qmd
async def test_a_note_that_lost_the_words_shows_its_lines_as_they_are_now(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """qmd's index still holds the chat with "pottery workshop" on line 45; the note on disk
    has as many lines, none of them with the words. The passage ranking finds nothing in it,
    so it keeps qmd's lines, and its snippet is what those lines say now, not qmd's copy."""
    chat = ["# Conversation on 5 March", ""] + [
        f"Melanie: that sounds lovely, tell me more about the week ({i})." for i in range(3, 61)]
    chat[45 - 1] = "Caroline: the pottery workshop on Saturday was wonderful."
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env,
                        {"2026-03-05.md": "\n".join(chat) + "\n"}) as (b, _):
        hit = ((await b.search(SearchRequest.of("pottery workshop", min_score=0))).results)[0]
        assert hit.snippet_start_line <= 45 <= hit.snippet_end_line
        now = [*chat[:44], "Caroline: we skipped the class on Saturday.", *chat[45:]]
        (b.agent.workspace_dir / "memory" / "2026-03-05.md").write_text("\n".join(now) + "\n")
        [hit] = (await b.search(SearchRequest.of("pottery workshop", min_score=0))).results
        assert (hit.path, hit.start_line, hit.end_line) == ("memory/2026-03-05.md", 44, 47)
        assert hit.snippet == "\n".join(now[hit.snippet_start_line - 1:hit.snippet_end_line])


@pytest.mark.parametrize(("query", "balanced"), [
    ('"pottery workshop', "pottery workshop"),  # a quote opened and never closed: a typo
    ('pottery workshop"', "pottery workshop"),
    ('"support group" "weekly', '"support group" weekly'),  # the phrase kept, the stray dropped
    ('"support group" weekly', '"support group" weekly'),  # balanced: qmd syntax, untouched
    ("Nate's dog", "Nate's dog"),
    ('"', '"'),  # nothing else: left as it is (qmd answers no match)
])
def test_without_stray_quote(query: str, balanced: str) -> None:
    assert without_stray_quote(query) == balanced


@pytest.mark.anyio
@pytest.mark.qmd
async def test_an_unclosed_quote_is_searched_as_a_question_not_as_qmd_syntax(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """qmd finds the note for ``"pottery`` but shows its first lines, which do not hold the
    word (its snippet looks for the quote); a quote never closed is a typo, so the question
    is searched as its words and cited where they are, as without the quote."""
    chat = ["# Conversation on 5 March", ""] + [
        f"Melanie: that sounds lovely, tell me more about the week ({i})." for i in range(3, 61)]
    chat[45 - 1] = "Caroline: the pottery workshop on Saturday was wonderful."
    async with _started(tmp_path, qmd_bin, standins_dir, base_path_env,
                        {"2026-03-05.md": "\n".join(chat) + "\n"}) as (b, log):
        hit = ((await b.search(SearchRequest.of('"pottery', min_score=0))).results)[0]
        assert _queries(log)[:2] == ["pottery"] * 2
        assert hit.path == "memory/2026-03-05.md" and hit.score == 1.0
        assert hit.snippet_start_line <= 45 <= hit.snippet_end_line
        assert "Caroline: the pottery workshop on Saturday was wonderful." in hit.snippet
