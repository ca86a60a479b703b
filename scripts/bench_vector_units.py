"""LoCoMo recall of the vector side by embedding unit, with and without the query's common terms contrasted out.

Every conversation is converted as the data's README fixes it (``qmdbridge.evaluation.locomo``)
and indexed keyword-only into a temporary store: that gives the engine's own chunks and, per
question, its keyword candidates (``fallback.search.keyword``). Each chunk is then embedded as
units of one scheme with the local GGUF model, a chunk scoring the cosine of its best unit (max
pooling, as ``fallback/store/vectors.py`` does with windows), and every question is ranked by
vectors alone and hybrid (the engine's calibrated fusion, ``minScore`` floor and slots, from
``fallback/search/fusion.py``, at the default settings), each with the plain query vector and
with its common terms contrasted out (``fallback/search/contrast.py``, words counted in the real
store). Recall comes from ``qmdbridge.evaluation.metrics`` (R@k: the evidence line inside one of
the first k chunks), per group of conversations: the ones tuned on and the ones checked on.

Schemes: ``windows`` (the engine's 192-token windows, ``fallback/index/windows.py``), ``lines``
(one unit per line, headings left out), ``lines3`` (windows of 3 lines, step 1) and
``sentences`` (the sentences of each line with the line's ``speaker:`` prefix, questions left
out). The ranking is that of ``qmdbridge eval`` up to embedding batch effects (the same
windows embedded by the engine give the same figures within 0.003).

Embeddings are cached by text in ``--cache-dir`` (one SQLite file), so a rerun embeds nothing;
without it they go to a temporary folder. The data is only read.

Usage: ``python3 scripts/bench_vector_units.py [DATA] [--schemes windows,lines,lines3,sentences]
[--groups conv-26,conv-30,conv-41/conv-42,conv-43] [--model PATH] [--cache-dir DIR] [--json]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sqlite3
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fallback.embeddings import ProviderSelection  # noqa: E402
from fallback.embeddings.local_gguf import LocalGgufProvider  # noqa: E402
from fallback.engine.builtin import BuiltinEngine  # noqa: E402
from fallback.index.windows import chunk_windows  # noqa: E402
from fallback.search.contrast import CONTRAST_WEIGHT, background_text, common_words, contrast_vector  # noqa: E402
from fallback.search.fusion import CosineStats, apply_floor, fuse, select_results  # noqa: E402
from fallback.search.keyword import rank_keyword_candidates, search_plan  # noqa: E402
from fallback.search.ranking import Candidate  # noqa: E402
from fallback.settings import EngineSettings, MemorySearchSettings  # noqa: E402
from fallback.store.db import Store  # noqa: E402
from fallback.text.chunking import Chunk  # noqa: E402
from qmdbridge.evaluation.locomo import (  # noqa: E402
    CATEGORY_NAMES,
    LocomoConversation,
    load_locomo,
    locomo_files,
    write_workspace,
)
from qmdbridge.evaluation.metrics import judge, summarize  # noqa: E402

DEFAULT_DATA = Path("/work/shared/bench/locomo-dev")
DEFAULT_MODEL = Path("/work/shared/models/all-MiniLM-L6-v2.Q8_0.gguf")
DEFAULT_GROUPS = "conv-26,conv-30,conv-41/conv-42,conv-43"
SCHEMES = ("windows", "lines", "lines3", "sentences")
# Texts per embedding call (each finished call is written to the cache).
EMBED_BATCH = 64
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SPEAKER = re.compile(r"^([^:]{1,40}):\s+(.*)$")


@dataclass(frozen=True)
class Hit:
    """One ranked chunk (the fields the metrics read)."""

    path: str
    start_line: int
    end_line: int
    snippet: str


def _lines(text: str) -> list[str]:
    return [ln for ln in text.split("\n") if ln.strip() and not ln.startswith("#")]


def units(scheme: str, text: str) -> list[str]:
    """The texts one chunk is embedded as under ``scheme`` (never empty)."""
    if scheme == "windows":
        chunk = Chunk(text=text, start_line=1, end_line=1, content_hash="")
        return [w.text for w in chunk_windows(chunk, max_input_tokens=2048)]
    lines = _lines(text)
    if scheme == "lines":
        out = lines
    elif scheme == "lines3":
        out = ["\n".join(lines[i:i + 3]) for i in range(max(1, len(lines) - 2))]
    else:
        out = []
        for line in lines:
            m = _SPEAKER.match(line)
            speaker, body = (m.group(1), m.group(2)) if m else ("", line)
            out += [f"{speaker}: {s}" if speaker else s for s in _SENTENCE_END.split(body)
                    if s.strip() and not s.rstrip().endswith("?")]
    return out or [text]


class EmbeddingCache:
    """Vectors by (kind, text) in one SQLite file; misses are embedded by the local model."""

    def __init__(self, path: Path, provider: LocalGgufProvider) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE TABLE IF NOT EXISTS v(key TEXT PRIMARY KEY, vector BLOB)")
        self.provider = provider

    async def get(self, texts: list[str], *, query: bool) -> Any:
        """Unit vectors of ``texts`` as a ``(len(texts), dims)`` array (queries: ``embed_query``)."""
        if not texts:
            return np.zeros((0, 0))
        keys = [hashlib.sha256(f"{'q' if query else 'd'}:{t}".encode()).hexdigest() for t in texts]
        found: dict[str, Any] = {}
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            stored = self.db.execute(f"SELECT key, vector FROM v WHERE key IN ({','.join('?' * len(part))})",
                                     part).fetchall()
            found.update((str(k), np.frombuffer(b, dtype=np.float32)) for k, b in stored)
        missing = list(dict.fromkeys((k, t) for k, t in zip(keys, texts, strict=True) if k not in found))
        for i in range(0, len(missing), EMBED_BATCH):
            batch = missing[i:i + EMBED_BATCH]
            if query:
                vectors = [await self.provider.embed_query(t) for _, t in batch]
            else:
                vectors = await self.provider.embed_batch([t for _, t in batch])
            fresh = [(k, np.asarray(v, dtype=np.float32).tobytes()) for (k, _), v in zip(batch, vectors, strict=True)]
            self.db.executemany("INSERT OR REPLACE INTO v VALUES (?, ?)", fresh)
            self.db.commit()
            found.update((k, np.frombuffer(b, dtype=np.float32)) for k, b in fresh)
        out = np.stack([found[k] for k in keys]).astype(np.float64)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


@dataclass
class Prepared:
    """One conversation, indexed: chunk rows, and per question its keyword hits and common words."""

    conversation: LocomoConversation
    chunks: list[tuple[str, str, int, int, str]]
    keyword: list[list[Candidate]]
    common: list[list[str]]


async def prepare(conversation: LocomoConversation, tmp: Path, candidates: int) -> Prepared:
    """Index the conversation keyword-only in ``tmp``; read its chunks and keyword candidates."""
    ws = write_workspace(conversation, tmp / conversation.name / "ws")
    settings = EngineSettings.for_workspace(ws, state_dir=tmp / conversation.name / "state",
                                            search=MemorySearchSettings(provider="none"))
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"))
    try:
        await engine.sync(reason="bench")
    finally:
        await engine.close()
    store = Store(settings.db_path)
    try:
        chunks = [(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in store.query(
            "SELECT id, path, start_line, end_line, text FROM chunks ORDER BY id")]
        keyword = [rank_keyword_candidates(store, q.query, ["memory"], candidates,
                                           plan=search_plan(store, q.query)) for q in conversation.questions]
        common = [common_words(store, q.query) for q in conversation.questions]
    finally:
        store.close()
    return Prepared(conversation, chunks, keyword, common)


def rank(p: Prepared, scores: Any, qi: int, *, hybrid: bool, settings: MemorySearchSettings,
         candidates: int, max_results: int) -> list[Hit]:
    """The engine's fusion, floor and slots over one question's chunk scores (cosines)."""
    h = settings.query.hybrid
    s = scores[qi]
    order = np.argsort(-s, kind="stable")[:candidates]
    vector = [Candidate(chunk_id=p.chunks[i][0], path=p.chunks[i][1], source="memory",
                        start_line=p.chunks[i][2], end_line=p.chunks[i][3], snippet=p.chunks[i][4],
                        score=float(s[i]), vector_score=float(s[i])) for i in order]
    stats = CosineStats(float(s.mean()), float(s.std()), len(s))
    merged = fuse(vector, p.keyword[qi] if hybrid else [], method=h.fusion, cosine_stats=stats,
                  vector_weight=h.vector_weight, text_weight=h.text_weight)
    ranked = sorted(apply_floor(merged, settings.query.min_score), key=lambda c: -c.score)
    return [Hit(c.path, c.start_line, c.end_line, c.snippet)
            for c in select_results(ranked, max_results=max_results)]


async def chunk_scores(p: Prepared, scheme: str, cache: EmbeddingCache, *, contrast: bool) -> tuple[Any, int]:
    """Best-unit cosine of every chunk for every question, and the number of units."""
    per_chunk = [units(scheme, c[4]) for c in p.chunks]
    matrix = await cache.get([u for us in per_chunk for u in us], query=False)
    bounds = np.concatenate(([0], np.cumsum([len(us) for us in per_chunk])[:-1]))
    queries = await cache.get([q.query for q in p.conversation.questions], query=True)
    if contrast:
        for qi, words in enumerate(p.common):
            if words and background_text(words) != p.conversation.questions[qi].query:
                b = (await cache.get([background_text(words)], query=True))[0]
                queries[qi] = np.asarray(contrast_vector(queries[qi].tolist(), b.tolist(),
                                                         weight=CONTRAST_WEIGHT))
    queries /= np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    return np.maximum.reduceat(queries @ matrix.T, bounds, axis=1), len(matrix)


async def run(args: argparse.Namespace, cache_dir: Path, tmp: Path) -> list[dict[str, Any]]:
    """Every scheme x contrast x mode, per group; one row per scheme and contrast."""
    settings = MemorySearchSettings()
    candidates = args.max_results * settings.query.hybrid.candidate_multiplier
    conversations = {c.name: c for f in locomo_files(args.data) for c in load_locomo(f)}
    groups = [[n for n in g.split(",") if n in conversations] for g in args.groups.split("/")]
    prepared = {n: await prepare(conversations[n], tmp, candidates) for g in groups for n in g}
    provider = LocalGgufProvider(model_path=Path(args.model))
    cache = EmbeddingCache(cache_dir / "bench_vector_units.sqlite", provider)
    rows = []
    try:
        for scheme in args.schemes.split(","):
            for contrast in (False, True):
                row: dict[str, Any] = {"scheme": scheme, "contrast": contrast, "groups": []}
                n_units = n_chunks = 0
                for group in groups:
                    outcomes: dict[str, list[Any]] = {"vectors": [], "hybrid": []}
                    for name in group:
                        p = prepared[name]
                        scores, count = await chunk_scores(p, scheme, cache, contrast=contrast)
                        n_units, n_chunks = n_units + count, n_chunks + len(p.chunks)
                        for qi, q in enumerate(p.conversation.questions):
                            for mode in outcomes:
                                hits = rank(p, scores, qi, hybrid=mode == "hybrid", settings=settings,
                                            candidates=candidates, max_results=args.max_results)
                                outcomes[mode].append(judge(q, hits, latency_ms=0.0))
                    cats = list(CATEGORY_NAMES.values())
                    row["groups"].append({"conversations": group, **{
                        mode: summarize(o, categories=cats).model_dump(by_alias=True) for mode, o in outcomes.items()}})
                row["unitsPerChunk"] = n_units / max(1, n_chunks)
                rows.append(row)
    finally:
        await provider.aclose()
        cache.db.close()
    return rows


def _pair(row: dict[str, Any], mode: str, key: str) -> str:
    return " \\| ".join(f"{g[mode][key]:.3f}" for g in row["groups"])


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table: per scheme and contrast, vectors-alone R@5 and hybrid R@1/5/10 and file R@5 per group."""
    out = ["| units | per chunk | contrast | vectors R@5 | hybrid R@1 | hybrid R@5 | hybrid R@10 | hybrid file R@5 |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['scheme']} | {r['unitsPerChunk']:.1f} | {'yes' if r['contrast'] else 'no'} | "
                   f"{_pair(r, 'vectors', 'recallAt5')} | {_pair(r, 'hybrid', 'recallAt1')} | "
                   f"{_pair(r, 'hybrid', 'recallAt5')} | {_pair(r, 'hybrid', 'recallAt10')} | "
                   f"{_pair(r, 'hybrid', 'fileRecallAt5')} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, print the table (or JSON); returns the exit code."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo folder or file")
    p.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma list of {', '.join(SCHEMES)}")
    p.add_argument("--groups", default=DEFAULT_GROUPS, help="conversation names, comma-separated, groups split by /")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="the local GGUF embedding model")
    p.add_argument("--cache-dir", help="keep the embeddings here for the next run (default: throw-away)")
    p.add_argument("--max-results", type=int, default=10)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    unknown = [s for s in args.schemes.split(",") if s not in SCHEMES]
    if unknown:
        p.error(f"unknown scheme {unknown[0]}; choose from {', '.join(SCHEMES)}")
    if not Path(args.model).is_file():
        p.error(f"model not found: {args.model}")
    with tempfile.TemporaryDirectory(prefix="bench-vector-units-") as tmp_name:
        tmp = Path(tmp_name)
        cache_dir = Path(args.cache_dir) if args.cache_dir else tmp
        cache_dir.mkdir(parents=True, exist_ok=True)
        rows = anyio.run(run, args, cache_dir, tmp)
    if args.json:
        sys.stdout.write(json.dumps({"title": "bench_vector_units", "data": args.data, "rows": rows}, indent=2) + "\n")
    else:
        sys.stdout.write(f"LoCoMo {args.data}; groups {args.groups}; maxResults {args.max_results}\n\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
