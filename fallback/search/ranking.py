"""Ranking of search candidates: the candidate type, temporal decay, covered hits and MMR.

Pure: plain values in, new values out, no SQLite, no clock (callers pass ``now_ms``), no file
system (callers pass an ``mtime_ms`` callback); the order of the steps is the pipeline's
(``fallback/search/pipeline.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace

from fallback.text.scripts import word_stretches

__all__ = [
    "Candidate",
    "apply_temporal_decay",
    "date_from_path",
    "decay_multiplier",
    "decay_timestamp_ms",
    "drop_covered",
    "is_evergreen",
    "jaccard",
    "mmr_rerank",
    "mmr_score",
    "mmr_tokens",
]

# Milliseconds in one day, for converting ``now_ms - timestamp_ms`` into an age in days.
MS_PER_DAY = 86_400_000

# A dated memory note's file name: ``YYYY-MM-DD.md`` or ``YYYY-MM-DD<non-digit><anything>.md``.
# The look-ahead rejects ``2026-02-101.md``; anchoring at the start rejects ``ticket-92025-06-15.md``.
_DATED_NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:\.md|[^0-9].*\.md)$", re.IGNORECASE)


@dataclass
class Candidate:
    """One search candidate (a chunk) on its way through ranking: its id, workspace-relative
    path, source, 1-based inclusive lines and text (``snippet``); ``score`` is a vector hit's
    cosine or a keyword hit's text score, the calibrated score in ``[0, 1]`` after fusion,
    then times temporal decay; ``vector_score`` the best window's cosine, ``text_score`` the
    BM25-derived score in ``[0, 1]`` (``0.0``: none), ``bm25`` FTS5's ``bm25()`` (lower is
    better) of a keyword hit, and each side's evidence after fusion."""

    chunk_id: str
    path: str
    source: str
    start_line: int
    end_line: int
    snippet: str
    score: float
    vector_score: float = 0.0
    text_score: float = 0.0
    bm25: float | None = None
    vector_evidence: float = 0.0
    text_evidence: float = 0.0


def _by_score_desc(cands: list[Candidate]) -> list[Candidate]:
    """Stable sort by score, best first (ties keep their input order)."""
    return sorted(cands, key=lambda c: -c.score)


def decay_multiplier(age_days: float, half_life_days: float) -> float:
    """Exponential decay factor ``exp(-ln 2 / half_life_days · age_days)`` in ``(0, 1]``: a
    negative age (a future date) counts as 0; 1.0 when the half-life is non-finite or ``<= 0``
    or the age not finite."""
    if not math.isfinite(half_life_days) or half_life_days <= 0 or not math.isfinite(age_days):
        return 1.0
    return math.exp(-math.log(2) / half_life_days * max(0.0, age_days))


def date_from_path(path: str) -> dt.date | None:
    """The date of a dated memory note from its file name, or ``None``: the path has a
    ``memory`` directory segment (at any depth) and the name starts with a real date
    ``YYYY-MM-DD`` followed by ``.md`` or a non-digit suffix (``2026-02-10-standup.md``; not
    ``2026-02-30.md``, ``notes-2026-02-10.md``). ``path``: ``/`` or ``\\`` separators."""
    segments = path.replace("\\", "/").split("/")  # a leading "./" changes no answer
    if len(segments) < 2 or "memory" not in segments[:-1]:
        return None
    match = _DATED_NAME.match(segments[-1])
    if match is None:
        return None
    try:
        return dt.date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        return None


def is_evergreen(path: str, source: str) -> bool:
    """Whether a file never decays: every file of source ``"memory"`` that is not dated
    (:func:`date_from_path`); ``"sessions"`` files are never evergreen (they decay by mtime)."""
    return source == "memory" and date_from_path(path) is None


def decay_timestamp_ms(cand: Candidate, mtime_ms: Callable[[str, str], int | None]) -> int | None:
    """The time a candidate's file is dated at, in ms since the epoch, or None for no decay:
    the date in its name at 00:00 UTC, none when evergreen, else ``mtime_ms(source, path)``."""
    dated = date_from_path(cand.path)
    if dated is not None:
        midnight = dt.datetime(dated.year, dated.month, dated.day, tzinfo=dt.timezone.utc)
        return int(midnight.timestamp() * 1000)
    if is_evergreen(cand.path, cand.source):
        return None
    return mtime_ms(cand.source, cand.path)


def apply_temporal_decay(cands: list[Candidate], *, half_life_days: float, now_ms: int,
                         mtime_ms: Callable[[str, str], int | None]) -> list[Candidate]:
    """New candidates, best first (stable), each score times its file's decay multiplier at
    ``now_ms`` (epoch ms) by ``half_life_days`` (non-finite or ``<= 0``: no decay), dated by
    :func:`decay_timestamp_ms` (``mtime_ms(source, path)``, epoch ms or ``None``, asked at
    most once per file)."""
    files = {(c.source, c.path): c for c in reversed(cands)}
    stamps = {key: decay_timestamp_ms(c, mtime_ms) for key, c in files.items()}

    def factor(stamp: int | None) -> float:
        return 1.0 if stamp is None else decay_multiplier((now_ms - stamp) / MS_PER_DAY, half_life_days)

    return _by_score_desc([replace(c, score=c.score * factor(stamps[(c.source, c.path)])) for c in cands])


# A hit is dropped when more than this share of its lines lies inside better hits of its file.
MAX_SHARED_LINES = 0.5


def drop_covered(cands: list[Candidate]) -> list[Candidate]:
    """The candidates minus those whose lines the better candidates mostly show already:
    walking ``cands`` in order, one is dropped when more than :data:`MAX_SHARED_LINES` of its
    lines lie inside the kept candidates of its source and path (chunks overlap, and a file's
    last chunk is often little more than the previous one's tail). Order kept, a new list."""
    kept: list[Candidate] = []
    shown: dict[tuple[str, str], set[int]] = {}
    for c in cands:
        lines = shown.setdefault((c.source, c.path), set())
        own = range(c.start_line, c.end_line + 1)
        if sum(1 for n in own if n in lines) > MAX_SHARED_LINES * len(own):
            continue
        lines.update(own)
        kept.append(c)
    return kept


def mmr_tokens(text: str) -> set[str]:
    """The token set MMR compares: the NFC, lower-cased word runs of ``text``, each CJK
    stretch (:func:`fallback.text.scripts.word_stretches`) as its character bigrams (a lone CJK
    character stays one; ``"2026年度"`` -> ``{"2026", "年度"}``); empty without word
    characters."""
    tokens: set[str] = set()
    for stretch, cjk in word_stretches(unicodedata.normalize("NFC", text).lower()):
        if cjk and len(stretch) > 1:
            tokens.update(stretch[i:i + 2] for i in range(len(stretch) - 1))
        elif stretch:
            tokens.add(stretch)
    return tokens


def jaccard(a: set[str], b: set[str]) -> float:
    """Jaccard similarity ``|a ∩ b| / |a ∪ b|`` in ``[0, 1]``; both empty -> 1, one empty -> 0."""
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def mmr_score(relevance: float, max_sim: float, lambda_: float) -> float:
    """Maximal marginal relevance ``λ·relevance − (1−λ)·max_sim`` (Carbonell & Goldstein,
    SIGIR 1998)."""
    return lambda_ * relevance - (1.0 - lambda_) * max_sim


def mmr_rerank(cands: list[Candidate], *, lambda_: float) -> list[Candidate]:
    """Reorder candidates greedily by maximal marginal relevance (never drops any): relevance
    is the score min-max normalised over the list (all equal -> 1); each step takes the
    candidate maximising :func:`mmr_score` against the selected ones (Jaccard over
    :func:`mmr_tokens` of the snippets), ties to the higher score, then the earlier position.

    ``lambda_`` in ``[0, 1]`` (clamped; non-finite -> 1): 1 is a plain sort by score, 0 pure
    diversity (spec §8.8). Returns the same candidate objects in MMR order (a new list).
    """
    if len(cands) <= 1:
        return list(cands)
    lam = 1.0 if not math.isfinite(lambda_) else min(1.0, max(0.0, lambda_))
    if lam == 1.0:
        return _by_score_desc(cands)
    ordered = _by_score_desc(cands)
    bottom = ordered[-1].score
    spread = ordered[0].score - bottom
    flat = spread == 0 or not math.isfinite(spread)
    rels = [1.0 if flat else (c.score - bottom) / spread for c in ordered]
    token_sets = [mmr_tokens(c.snippet) for c in ordered]
    max_sims = [0.0] * len(ordered)
    remaining = list(range(len(ordered)))
    picked: list[Candidate] = []
    while remaining:
        # max() keeps the first of equal values: the earlier index, the higher score
        best = max(remaining, key=lambda i: mmr_score(rels[i], max_sims[i], lam))
        remaining.remove(best)
        picked.append(ordered[best])
        for idx in remaining:
            max_sims[idx] = max(max_sims[idx], jaccard(token_sets[idx], token_sets[best]))
    return picked
