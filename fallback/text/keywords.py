"""Keyword extraction for keyword-only (FTS-only) search.

:func:`extract_keywords` turns a conversational query into search terms (stop words of eleven
languages dropped, CJK runs cut into unigrams and bigrams, Korean particles stripped);
:func:`cjk_words` keeps the words a substring search can use one by one.

Source: OpenClaw ``extractKeywords`` (``query-expansion.ts``, E2); the stop-word lists are ours.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from typing import TYPE_CHECKING

from fallback.text.scripts import contains_cjk, occurrences, script_of

if TYPE_CHECKING:
    import regex

__all__ = ["STOP_WORDS", "cjk_words", "contraction_fragments", "extract_keywords"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_STOP_EN = _words("""
a an the this that these those there here
i me my mine myself we us our ours you your yours he him his she her hers it its they them
their theirs who whom whose which what when where why how
is am are was were be been being do does did done doing have has had having
will would shall should can could may might must
to of in on at by for from with without about into onto over under than then so such
and or but nor not no yes if else also just only very really too
any some all each every other more most much many few lot lots
thing things stuff something anything everything someone anyone
yesterday today tomorrow recently earlier before after ago last previous week month year
please find search look show tell give get got let remember recall know think want need
said say says mentioned talk talked
own same both again further once while until during through against between above below up
down out off go goes went gone going kind like likely ever one ones
""")
_STOP_ES = _words("""
el la los las un una unos unas lo le les de del al a en y e o u que qué por para con sin
sobre entre hasta desde ayer hoy mañana anoche cómo como cuando cuándo donde dónde quién
quien cuál cual cuáles porque porqué es son fue fueron era eran ser estar está están estaba
yo tú tu él ella ellos ellas nosotros nosotras usted ustedes mi mis su sus nuestro nuestra
ese esa eso este esta esto aquel aquella muy más menos pero también ya cosa cosas algo
favor buscar encuentra encontrar
""")
_STOP_PT = _words("""
o a os as um uma uns umas de do da dos das em no na nos nas ao aos e ou que quê por pela
pelo para com sem sobre entre até desde ontem hoje amanhã como quando onde porque porquê
quem qual quais é são foi foram era eram ser estar está estão estava eu você vocês ele ela
eles elas nós meu minha seu sua nosso nossa isso isto esse essa este esta aquilo muito
mais menos mas também já coisa coisas algo favor
""")
_STOP_AR = _words("""
في من إلى الى على عن مع هذا هذه ذلك تلك التي الذي الذين هو هي هم هن نحن أنا انا أنت انت
كيف متى أين اين ماذا لماذا ما هل و أو او ثم لكن كان كانت يكون قد لقد أمس امس بالأمس
بالامس اليوم غدا غداً كل بعض أي اي إن ان أن شيء الشيء عندما لدي لدينا
""")
_STOP_ZH = _words("""
的 了 和 是 在 我 你 他 她 它 我们 你们 他们 她们 这 那 这个 那个 这些 那些 这里 那里
之前 以前 之后 以后 昨天 今天 明天 刚才 最近 上次 什么 怎么 怎样 为什么 哪 哪里 哪个 谁
吗 呢 吧 啊 也 都 就 还 又 把 被 对 从 到 给 跟 与 或 或者 但 但是 而 一个 有 没有 请 帮 帮我
找 一下 东西 事情 关于 讨论过 说过 提到
""")
# The same words in Traditional script, where it differs, with common variants.
_STOP_ZH_HANT = _words("""
我們 你們 他們 她們 這 這個 那個 這些 那些 這裡 這裏 那裡 那裏 之後 以後 剛才 什麼 甚麼 怎麼
怎樣 為什麼 爲什麼 為甚麼 哪裡 哪裏 哪個 誰 嗎 還 對 從 給 與 沒有 請 幫 幫我 東西 關於 討論過
說過 一個
""")
_STOP_KO = _words("""
나 너 저 우리 저희 그 그녀 그들 너희 당신 이것 그것 저것 이거 그거 저거 것 수 등 및
그리고 그래서 그러나 하지만 그런데 또는 또 혹은 어제 오늘 내일 지금 아까 요즘 최근
무엇 뭐 어디 언제 어떻게 왜 누구 어떤 좀 잘 더 매우 아주 정말 있다 없다 하다 되다
대한 대해 관한 관련 같은 이런 그런 저런
""")
_STOP_JA = _words("""
これ それ あれ どれ この その あの どの ここ そこ あそこ どこ そして しかし でも また だから
どう なに 何 いつ だれ 誰 です ます でした ました した する して される ある いる なる
こと もの ため よう 昨日 今日 明日 先日 前回 私 僕 俺 あなた 彼 彼女 について という
など から まで より ので けど ください
""")
_STOP_DA = _words("""
og i at det den de en et er var til på med for af som om fra har havde jeg du han hun vi
jer dem min din sin vores ikke men eller hvad hvor hvornår hvordan hvorfor hvem igår denne
dette disse ting noget også kan skal vil
""")
_STOP_NB = _words("""
og i å det den de en et ei er var til på med for av som om fra har hadde jeg du han hun vi
dere dem min din sin vår ikke men eller hva hvor når hvordan hvorfor hvem igår denne dette
disse ting noe også kan skal vil
""")
_STOP_SV = _words("""
och i att det den de en ett är var till på med för av som om från har hade jag du han hon
vi ni dem min din sin vår inte men eller vad när hur varför vem igår denna detta dessa sak
något också kan ska vill
""")

# Every stop word of every supported language, lower-case NFC; matched on whole tokens.
STOP_WORDS: frozenset[str] = frozenset().union(
    _STOP_EN, _STOP_ES, _STOP_PT, _STOP_AR, _STOP_ZH, _STOP_ZH_HANT, _STOP_KO, _STOP_JA, _STOP_DA,
    _STOP_NB, _STOP_SV,
)

# The Chinese (both scripts) and the Japanese stop words, for callers that know the language.
CHINESE_STOP_WORDS: frozenset[str] = _STOP_ZH | _STOP_ZH_HANT
JAPANESE_STOP_WORDS: frozenset[str] = _STOP_JA

# Korean particles stripped from word ends, longest first so "으로" wins over "로".
KOREAN_PARTICLES: tuple[str, ...] = tuple(sorted(
    ("에서", "으로", "에게", "한테", "처럼", "같이", "보다", "까지", "부터", "마다", "밖에", "대로",
     "은", "는", "이", "가", "을", "를", "의", "에", "로", "와", "과", "도", "만"),
    key=len, reverse=True))


# English contractions and possessives: the clitic after an apostrophe (``s`` of ``Nate's``) and
# the auxiliary before ``n't`` (``don``) carry nothing a search can use.
_APOSTROPHES = "'\u2019\u02bc"
_CLITIC = r"(?<=\p{L})['\u2019\u02bc](s|t|d|ll|re|ve|m)(?![\p{L}\p{M}\p{N}_])"
_NEGATED = r"(?<![\p{L}\p{M}\p{N}_])(\p{L}+n)['\u2019\u02bc]t(?![\p{L}\p{M}\p{N}_])"
# The same two for ASCII text, without the ``regex`` package.
_ASCII_CLITIC_RE = re.compile(r"(?<=[A-Za-z])'(s|t|d|ll|re|ve|m)(?![A-Za-z0-9_])", re.IGNORECASE)
_ASCII_NEGATED_RE = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z]+n)'t(?![A-Za-z0-9_])", re.IGNORECASE)


@functools.cache
def _contraction_patterns() -> tuple[regex.Pattern[str], regex.Pattern[str]]:
    """The clitic and ``n't`` patterns for any text, compiled on first use."""
    import regex

    return regex.compile(_CLITIC, regex.IGNORECASE), regex.compile(_NEGATED, regex.IGNORECASE)


def contraction_fragments(text: str) -> list[tuple[int, int]]:
    """Code-point spans ``(start, end)``, in order, of the pieces of English contractions and
    possessives in ``text``: ``s`` of ``Nate's``, ``ll`` of ``we'll``, ``don`` and ``t`` of
    ``don't`` (``O'Brien`` has none)."""
    if not any(a in text for a in _APOSTROPHES):
        return []
    patterns = (_ASCII_CLITIC_RE, _ASCII_NEGATED_RE) if text.isascii() else _contraction_patterns()
    return sorted(m.span(1) for pattern in patterns for m in pattern.finditer(text))


def _segments(query: str) -> list[str]:
    """Lower-case NFC segments split on whitespace and Unicode punctuation (``_`` kept)."""
    def is_break(ch: str) -> bool:
        return ch != "_" and (ch.isspace() or unicodedata.category(ch).startswith("P"))

    norm = unicodedata.normalize("NFC", query).lower().strip()
    return ["".join(run) for brk, run in itertools.groupby(norm, key=is_break) if not brk]


def _script(ch: str) -> str:
    """``ascii`` (letters, digits, ``_``), ``katakana``, ``hiragana``, ``han`` or ``other``."""
    if ch.isascii() and (ch.isalnum() or ch == "_"):
        return "ascii"
    script = script_of(ch)
    return script if script in ("katakana", "hiragana", "han") else "other"


def _script_runs(segment: str) -> list[tuple[str, str]]:
    return [(kind, "".join(run)) for kind, run in itertools.groupby(segment, key=_script)]


def _japanese_terms(segment: str) -> list[str]:
    terms: list[str] = []
    for kind, run in _script_runs(segment):
        if kind != "other" and (kind != "hiragana" or len(run) >= 2):
            terms.append(run)
        if kind == "han":
            terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return terms


def _chinese_terms(segment: str) -> list[str]:
    terms: list[str] = []
    for kind, run in _script_runs(segment):
        if kind == "han":
            terms.extend([*run, *(run[i:i + 2] for i in range(len(run) - 1))])  # unigrams, bigrams
        else:
            terms.append(run)
    return terms


def _korean_terms(segment: str) -> list[str]:
    stem = next((segment.removesuffix(p) for p in KOREAN_PARTICLES  # the particle stripped
                 if segment.endswith(p) and len(segment) > len(p)), None)
    if segment in STOP_WORDS or (stem is not None and stem in STOP_WORDS):
        return []
    terms = [segment]
    if stem is not None:
        all_hangul = all(script_of(ch) == "hangul" for ch in stem)
        if (all_hangul and len(stem) >= 2) or (stem.isascii() and stem.isalnum()):
            terms.append(stem)
    return terms


def _is_noise(term: str) -> bool:
    return (not term or term in STOP_WORDS or term.isdigit()
            or (term.isascii() and term.isalpha() and len(term) < 3)
            or all(unicodedata.category(ch)[0] in "PS" for ch in term))


def extract_keywords(query: str) -> list[str]:
    """Extract search keywords from a conversational query (lower-case NFC segments; kana
    text cut at script changes, ideographs as unigrams and bigrams, Hangul words with their
    stems; stop words, short ASCII words, digits and punctuation dropped).

    Args:
        query: the user's query, any language.

    Returns:
        Keywords in first-seen order without duplicates.

    Source: OpenClaw ``extractKeywords`` (E2 ``query-expansion.ts``), unicode61 variant.
    """
    seen: set[str] = set()
    out: list[str] = []
    for segment in _segments(query):
        scripts = set() if segment.isascii() else {script_of(ch) for ch in segment}
        if "hiragana" in scripts or "katakana" in scripts:
            terms = _japanese_terms(segment)
        elif "han" in scripts:
            terms = _chinese_terms(segment)
        elif "hangul" in scripts:
            terms = _korean_terms(segment)
        else:
            terms = [segment]
        for term in terms:
            if term not in seen and not _is_noise(term):
                seen.add(term)
                out.append(term)
    return out


@functools.cache
def _cjk_stop_words(japanese: bool) -> tuple[str, ...]:
    """The stop words of a Japanese or else a Chinese query, longest first (not both: Chinese
    function characters are parts of Japanese words, 都 of 京都)."""
    words = JAPANESE_STOP_WORDS if japanese else CHINESE_STOP_WORDS
    return tuple(sorted(words, key=len, reverse=True))


def cjk_words(query: str) -> tuple[str, ...]:
    """The words of a query holding CJK text, to be searched one by one as substrings (pure).

    The words of :func:`extract_keywords` of two characters or more, less an ideograph bigram
    or hiragana run that takes a character of a stop word of the query's language, less a CJK
    word that holds another word kept; then each ideograph in no stop word and no word kept.

    Args:
        query: the user's query (any text).

    Returns:
        The words in query order; ``()`` without CJK text.

    Examples:
        ``我们什么时候去了支持小组？`` -> ``("时候", "候去", "支持", "持小", "小组")``;
        ``用户喜欢喝什么茶`` -> ``("用户", "户喜", "喜欢", "欢喝", "茶")``;
        ``東京の会議はいつですか`` -> ``("東京", "会議")``.
    """
    text = unicodedata.normalize("NFC", query).strip().lower()
    if not text or not contains_cjk(text):
        return ()
    japanese = any(script_of(ch) in ("hiragana", "katakana") for ch in text)
    covered = [False] * len(text)
    for word in _cjk_stop_words(japanese):
        for at in occurrences(text, (word,)):
            covered[at:at + len(word)] = [True] * len(word)

    def is_word(term: str) -> bool:
        scripts = {script_of(ch) for ch in term}
        if not (scripts == {"hiragana"} or (len(term) == 2 and scripts == {"han"})):
            return True
        # a word if one of its places takes no stop word's character
        return any(not any(covered[at:at + len(term)]) for at in occurrences(text, (term,)))

    words = [t for t in extract_keywords(text) if len(t) >= 2 and is_word(t)]
    # a CJK word holding another word is found only where that one is: 부산에서 of 부산,
    # 京都旅行 of 京都; it would only take a slot
    words = [t for t in words
             if not (contains_cjk(t) and any(u != t and contains_cjk(u) and u in t for u in words))]
    alone = [ch for i, ch in enumerate(text) if script_of(ch) == "han" and not covered[i]
             and not any(ch in w for w in words)]
    return tuple(dict.fromkeys([*words, *alone]))
