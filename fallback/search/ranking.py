"""Ranking of search candidates: the candidate type, temporal decay and MMR re-ranking.

Everything here is pure: plain values in, new values out, no SQLite, no clock (callers pass
``now_ms``), no file system (callers pass an ``mtime_ms`` callback). Inputs are never mutated.

The order of operations in a hybrid search (``fallback/search/pipeline.py``):

1. ``fallback/search/fusion.py`` :func:`~fallback.search.fusion.fuse` — vector and keyword
   candidates merged by chunk id into one calibrated score, then
   :func:`~fallback.search.fusion.apply_floor` (``minScore``);
2. :func:`apply_temporal_decay` — multiply each score by ``0.5 ** (age_days / half_life_days)``
   (after the floor: decay reorders, it never removes);
3. :func:`mmr_rerank` — optional diversity re-ranking of the whole list;
4. :func:`~fallback.search.fusion.select_results` — ``maxResults``, sessions at most half.

A keyword-only search skips fusion and MMR but drops, before the cut, every hit whose lines are
mostly inside a better hit of the same file (:func:`drop_covered`).
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
    "normalize_rel_path",
]

# Milliseconds in one day, for converting ``now_ms - timestamp_ms`` into an age in days.
MS_PER_DAY = 86_400_000

# A dated memory note's file name: ``YYYY-MM-DD.md`` or ``YYYY-MM-DD<non-digit><anything>.md``.
# The look-ahead rejects ``2026-02-101.md``; anchoring at the start rejects ``ticket-92025-06-15.md``.
_DATED_NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:\.md|[^0-9].*\.md)$", re.IGNORECASE)

# Root memory files that never decay (the legacy lower-case name included).
_ROOT_MEMORY_FILES = frozenset({"MEMORY.md", "memory.md"})


@dataclass
class Candidate:
    """One search candidate (a chunk) on its way through ranking.

    Attributes:
        chunk_id: the chunk's primary key in the store.
        path: workspace-relative path with ``/`` separators (sessions: ``sessions/<file>.jsonl``).
        source: ``"memory"`` or ``"sessions"``.
        start_line: first line of the chunk, 1-based inclusive.
        end_line: last line of the chunk, 1-based inclusive.
        snippet: text shown for the hit (also MMR's content).
        score: the ranking score; for raw vector hits the cosine similarity, for raw keyword hits
            the BM25-derived text score in ``[0, 1]``; after hybrid fusion the calibrated score
            in ``[0, 1]`` (``fallback/search/fusion.py``), then multiplied by temporal decay.
        vector_score: cosine similarity of the chunk to the query (for window vectors, of its
            best window), ``0.0`` when not a vector hit.
        text_score: BM25-derived text score in ``[0, 1]``, ``0.0`` when not a keyword hit.
        bm25: the FTS5 ``bm25()`` value of a keyword hit (lower is better), ``None`` otherwise
            (also for substring-only matches, which have no BM25 rank).
        vector_evidence / text_evidence: the chunk's evidence on each side after fusion, in
            ``[0, 1]`` (``fallback/search/fusion.py``; ``0.0`` before fusion or when the side
            did not return it).
    """

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


# ---------------------------------------------------------------------------------------------
# Temporal decay (dates from file names, see apply_temporal_decay)


def decay_multiplier(age_days: float, half_life_days: float) -> float:
    """Exponential decay factor ``exp(-ln 2 / half_life_days · age_days)``.

    Args:
        age_days: age of the note in days; negative (future dates) is clamped to 0.
        half_life_days: days after which the multiplier is 0.5.

    Returns:
        A factor in ``(0, 1]``; exactly 1.0 when the half-life is non-finite or ``<= 0`` or the
        age is not a finite number, 0.5 when ``age_days == half_life_days``.

    Source: exponential decay by half-life, ``N(t) = N0 · 2^(-t / t½)``.
    """
    if not math.isfinite(half_life_days) or half_life_days <= 0 or not math.isfinite(age_days):
        return 1.0
    age = max(0.0, age_days)
    return math.exp(-math.log(2) / half_life_days * age)


def normalize_rel_path(path: str) -> str:
    """Normalise a stored path for matching: ``\\`` -> ``/``, leading ``./`` segments removed."""
    norm = path.replace("\\", "/")
    while norm.startswith("./"):
        norm = norm[2:]
    return norm


def date_from_path(path: str) -> dt.date | None:
    """The date of a dated memory note, taken from its file name.

    A path is dated when it has a ``memory`` directory segment (at any depth, so nested folders
    such as ``memory/archive/2026-01-10.md`` and extra paths like ``../team/memory/...`` count)
    and its file name starts with a real calendar date ``YYYY-MM-DD`` followed by ``.md`` or by a
    non-digit suffix (``2026-02-10-standup.md``). Malformed dates (``2026-02-30.md``) and dates not
    at the start of the name (``ticket-92025-06-15.md``, ``notes-2026-02-10.md``) are not dated.

    Args:
        path: workspace-relative path, ``/`` or ``\\`` separators.

    Returns:
        The date (interpreted as 00:00 UTC by :func:`apply_temporal_decay`), or ``None``.
    """
    segments = normalize_rel_path(path).split("/")
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
    """Whether a file never decays.

    By our rule ("dates come from a file name that starts with YYYY-MM-DD under
    memory/; everything else is evergreen"), every file of source ``"memory"`` that is not
    dated is evergreen: ``MEMORY.md``, ``memory.md``, undated notes under ``memory/`` and extra
    paths alike. Other sources (``"sessions"``) are never evergreen: they decay by mtime.

    Args:
        path: workspace-relative path.
        source: ``"memory"`` or ``"sessions"``.

    Returns:
        True when no decay applies to the file.
    """
    if source != "memory":
        return False
    if normalize_rel_path(path) in _ROOT_MEMORY_FILES:
        return True
    return date_from_path(path) is None


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
    """Multiply each candidate's score by its file's decay multiplier and re-sort.

    The timestamp of a file is, in order: the date in its name (:func:`date_from_path`, at
    00:00 UTC); none (no decay) when :func:`is_evergreen`; else ``mtime_ms(source, path)``,
    where ``None`` (unreadable) means no decay. ``mtime_ms`` is called at most once per
    ``(source, path)`` per call, and never for dated or evergreen files.

    Args:
        cands: candidates, any order.
        half_life_days: half-life in days (non-finite or ``<= 0`` disables decay).
        now_ms: the current time in ms since the epoch.
        mtime_ms: ``(source, path) -> ms since the epoch | None``.

    Returns:
        New candidates with decayed ``score`` (``vector_score``/``text_score`` unchanged),
        sorted by score descending (stable).

    Source: exponential decay by half-life, as OpenClaw's temporal decay.
    """
    stamps: dict[tuple[str, str], int | None] = {}
    out: list[Candidate] = []
    for cand in cands:
        key = (cand.source, cand.path)
        if key not in stamps:
            stamps[key] = decay_timestamp_ms(cand, mtime_ms)
        stamp = stamps[key]
        if stamp is None:
            out.append(replace(cand))
            continue
        age_days = (now_ms - stamp) / MS_PER_DAY
        out.append(replace(cand, score=cand.score * decay_multiplier(age_days, half_life_days)))
    return _by_score_desc(out)


# ---------------------------------------------------------------------------------------------
# Hits covering the same lines

# A hit is dropped when more than this share of its lines lies inside better hits of its file.
MAX_SHARED_LINES = 0.5


def drop_covered(cands: list[Candidate], *,
                 max_shared: float = MAX_SHARED_LINES) -> list[Candidate]:
    """The candidates minus those whose lines the better candidates mostly show already.

    Chunks overlap (80 tokens by default), and the last chunk of a file is often little more
    than the previous chunk's tail: returned side by side, the two show the same lines twice
    and the second takes a slot a new region could have had. Walking ``cands`` in order, a
    candidate is dropped when more than ``max_shared`` of its own lines lie inside the already
    kept candidates of the same source and path; two full chunks that only overlap by the chunk
    overlap are both kept, and so is a long chunk after a short one inside it.

    Args:
        cands: candidates, best first (1-based inclusive line ranges).
        max_shared: the share in ``[0, 1]`` of a candidate's lines above which it repeats what
            is already shown.

    Returns:
        The kept candidates, order unchanged (a new list; the objects are not copied).
    """
    kept: list[Candidate] = []
    shown: dict[tuple[str, str], set[int]] = {}
    for c in cands:
        lines = shown.setdefault((c.source, c.path), set())
        own = range(c.start_line, c.end_line + 1)
        if sum(1 for n in own if n in lines) > max_shared * len(own):
            continue
        lines.update(own)
        kept.append(c)
    return kept


# ---------------------------------------------------------------------------------------------
# MMR (spec §8.8)


def _emit_run(run: str, cjk: bool, tokens: set[str]) -> None:
    """Add one homogeneous run: a word as is, a CJK run as its character bigrams."""
    if not run:
        return
    if not cjk or len(run) == 1:
        tokens.add(run)
        return
    tokens.update(run[i:i + 2] for i in range(len(run) - 1))


def mmr_tokens(text: str) -> set[str]:
    """The token set MMR compares: NFC, lower-cased, word runs, CJK runs as bigrams.

    Word runs are maximal runs of letters, combining marks, digits and ``_``. Inside a run, the
    stretches of CJK characters (Han, kana, Hangul, Bopomofo, Yi, as
    :func:`fallback.text.scripts.word_stretches` cuts them) become their overlapping character
    bigrams (a lone CJK character stays a unigram), because those scripts have no spaces and
    Jaccard over whole sentences would never see an overlap; the other stretches stay whole
    words (``"2026年度"`` -> ``{"2026", "年度"}``).

    Args:
        text: any text (a snippet).

    Returns:
        The set of tokens; empty for text without word characters.
    """
    tokens: set[str] = set()
    for stretch, cjk in word_stretches(unicodedata.normalize("NFC", text).lower()):
        _emit_run(stretch, cjk, tokens)
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
    """Maximal marginal relevance ``λ·relevance − (1−λ)·max_sim``.

    Source: Carbonell & Goldstein, "The use of MMR, diversity-based reranking for reordering
    documents and producing summaries", SIGIR 1998.
    """
    return lambda_ * relevance - (1.0 - lambda_) * max_sim


def mmr_rerank(cands: list[Candidate], *, lambda_: float) -> list[Candidate]:
    """Reorder candidates greedily by maximal marginal relevance (never drops any).

    Relevance is the score min-max normalised over the list (all equal -> 1). At each step the
    remaining candidate maximising :func:`mmr_score` against the already selected ones (Jaccard
    over :func:`mmr_tokens` of the snippets) is taken; ties go to the higher original score, then
    to the earlier position.

    Args:
        cands: candidates, any order.
        lambda_: trade-off in ``[0, 1]`` (clamped; non-finite -> 1): 1 is a plain sort by score,
            0 is pure diversity.

    Returns:
        The same candidate objects in MMR order (a new list; length unchanged).

    Source: Carbonell & Goldstein, SIGIR 1998 (MMR); spec §8.8.
    """
    if len(cands) <= 1:
        return list(cands)
    lam = 1.0 if not math.isfinite(lambda_) else min(1.0, max(0.0, lambda_))
    if lam == 1.0:
        return _by_score_desc(cands)
    ordered = _by_score_desc(cands)
    top, bottom = ordered[0].score, ordered[-1].score
    spread = top - bottom

    def relevance(c: Candidate) -> float:
        return 1.0 if spread == 0 or not math.isfinite(spread) else (c.score - bottom) / spread

    rels = [relevance(c) for c in ordered]
    token_sets = [mmr_tokens(c.snippet) for c in ordered]
    max_sims = [0.0] * len(ordered)
    remaining = list(range(len(ordered)))
    picked: list[Candidate] = []
    while remaining:
        best = remaining[0]
        best_value = mmr_score(rels[best], max_sims[best], lam)
        for idx in remaining[1:]:
            value = mmr_score(rels[idx], max_sims[idx], lam)
            # ``ordered`` is by score desc, so on a tie the earlier index has the higher score.
            if value > best_value:
                best, best_value = idx, value
        remaining.remove(best)
        picked.append(ordered[best])
        for idx in remaining:
            sim = jaccard(token_sets[idx], token_sets[best])
            if sim > max_sims[idx]:
                max_sims[idx] = sim
    return picked
