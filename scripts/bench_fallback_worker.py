"""Child-process side of ``scripts/bench_fallback.py``: one measurement task, JSON on stdout.

Each task runs in its own process so that its peak RSS is its own. Usage (internal):
``python3 scripts/bench_fallback_worker.py TASK SPEC_JSON``; tasks: ``index``, ``embed``,
``hybrid``, ``watch``, ``sync-loop``, ``search-probe``. Times are in ms.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from benchlib import percentile
from corpus import change_file, note_path, planted_token

from fallback.embeddings import BaseProvider
from fallback.request import SearchRequest

__all__ = ["PreEmbeddedProvider", "SyntheticProvider", "TASKS", "agent_for"]


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def agent_for(spec: dict[str, Any]) -> Any:
    """Resolve agent ``main`` for ``spec["ws"]`` with ``spec["memorySearch"]`` and state dir
    ``spec["state"]`` (the same store the ``qmdbridge`` CLI uses with that state dir)."""
    from qmdbridge.config import parse_config, resolve_agent

    cfg = parse_config({"agents": {"defaults": {"memorySearch": spec.get("memorySearch", {})}}})
    return resolve_agent(cfg, "main", workspace=spec["ws"],
                         env={"OPENCLAW_STATE_DIR": spec["state"]})


class SyntheticProvider(BaseProvider):
    """Deterministic 384-d unit vectors from a text's sha256 (no model).

    Used to fill a 10,000-chunk vector index in seconds: the cost of a vector search does not
    depend on the vector values, and the query embedding is excluded from the timing anyway.
    """

    provider_id = "bench-synthetic"

    def __init__(self) -> None:
        super().__init__(model="sha256-normal-384", dims=384, max_input_tokens=8192,
                         provider_key=hashlib.sha256(b"bench-synthetic").hexdigest())

    def _vec(self, text: str) -> list[float]:
        import numpy as np

        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        v = np.random.default_rng(seed).normal(size=384)
        return (v / np.linalg.norm(v)).tolist()

    async def embed_query(self, text: str) -> list[float]:
        """Vector of ``text`` (384 floats, unit length)."""
        return self._vec(text)

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """Vectors of ``texts``, in order."""
        return [self._vec(t) for t in texts]

    async def aclose(self) -> None:
        """Nothing to release."""


class PreEmbeddedProvider(BaseProvider):
    """Wraps a provider; ``embed_query`` answers from vectors computed before the timing starts.

    Args:
        inner: the real provider (everything else is delegated to it).
        queries: query text -> vector, filled by :meth:`prepare`.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queries: dict[str, list[float]] = {}
        for attr in ("provider_id", "model", "dims", "provider_key", "max_input_tokens",
                     "max_batch_bytes"):
            setattr(self, attr, getattr(inner, attr))

    async def prepare(self, texts: list[str]) -> float:
        """Embed ``texts`` as queries now; returns the mean query embedding time in ms."""
        start = time.perf_counter()
        for t in texts:
            self.queries[t] = await self.inner.embed_query(t)
        return _ms(start) / max(1, len(texts))

    async def embed_query(self, text: str) -> list[float]:
        """The prepared vector of ``text`` (the inner provider for an unprepared one)."""
        vec = self.queries.get(text)
        return vec if vec is not None else await self.inner.embed_query(text)

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        """Delegated to the inner provider."""
        return await self.inner.embed_batch(texts)

    async def aclose(self) -> None:
        """No-op: engines come and go over one wrapper; the owner calls :meth:`close_inner`."""

    async def close_inner(self) -> None:
        """Release the inner provider (the loaded model)."""
        await self.inner.aclose()


def _engine(spec: dict[str, Any], *, provider: Any = None) -> Any:
    from fallback.embeddings import ProviderSelection, select_provider
    from fallback.engine.builtin import BuiltinEngine

    agent = agent_for(spec)
    settings = agent.engine
    selection = (ProviderSelection(provider, "local") if provider is not None
                 else select_provider(agent.memory_search, env={}))
    return BuiltinEngine(settings, provider_selection=selection)


async def _time_searches(engine: Any, queries: list[str], repeats: int) -> list[float]:
    for q in queries:  # warm-up: connection, statement cache, page cache
        await engine.search(SearchRequest.of(q))
    times = []
    for _ in range(repeats):
        for q in queries:
            start = time.perf_counter()
            await engine.search(SearchRequest.of(q))
            times.append(_ms(start))
    return times


async def task_index(spec: dict[str, Any]) -> dict[str, Any]:
    """Full FTS index, no-op re-sync, re-sync after one changed file, keyword search p50/p95."""
    engine = _engine(spec)
    try:
        start = time.perf_counter()
        report = await engine.sync(reason="bench")
        full_ms = _ms(start)
        noop = []
        for _ in range(5):
            start = time.perf_counter()
            await engine.sync(reason="bench")
            noop.append(_ms(start))
        changed = []
        files = int(spec["files"])
        for k in range(3):
            change_file(spec["ws"], (k * 7919) % files, f"zqchange{k}")
            start = time.perf_counter()
            await engine.sync(reason="bench")
            changed.append(_ms(start))
        found = (await engine.search(SearchRequest.of(planted_token(files // 2), max_results=1))).results
        times = await _time_searches(engine, list(spec["queries"]), int(spec["repeats"]))
        cjk = await _time_searches(engine, list(spec["cjk_queries"]), int(spec["repeats"]))
        rare = await _time_searches(engine, [planted_token(i * 37 % files) for i in range(10)],
                                    int(spec["repeats"]))
        st = await engine.status()
    finally:
        await engine.close()
    return {"full_ms": full_ms, "files": report.files_total, "chunks": st.chunks,
            "noop_ms": percentile(noop, 50), "changed_ms": percentile(changed, 50),
            "search_p50": percentile(times, 50), "search_p95": percentile(times, 95),
            "cjk_p50": percentile(cjk, 50), "cjk_p95": percentile(cjk, 95),
            "rare_p50": percentile(rare, 50), "rare_p95": percentile(rare, 95),
            "searches": len(times), "planted_found": bool(found) and
            found[0].path == note_path(files // 2)}


async def task_embed(spec: dict[str, Any]) -> dict[str, Any]:
    """Index with the local GGUF model (chunks/s), then embedding alone over the same chunks."""
    import sqlite3

    engine = _engine(spec)
    try:
        start = time.perf_counter()
        report = await engine.sync(reason="bench")
        sync_ms = _ms(start)
        st = await engine.status()
        db = st.db_path
    finally:
        await engine.close()
    with sqlite3.connect(db) as conn:
        texts = [r[0] for r in conn.execute("SELECT text FROM chunks ORDER BY id")]
    from fallback.embeddings import select_provider

    provider = select_provider(agent_for(spec).memory_search, env={}).provider
    try:
        start = time.perf_counter()
        await provider.embed_batch(texts)
        embed_ms = _ms(start)
    finally:
        await provider.aclose()
    return {"sync_ms": sync_ms, "chunks": st.chunks, "chunks_embedded": report.windows_embedded,
            "embed_ms": embed_ms, "embedded_texts": len(texts),
            "mean_chars": sum(len(t) for t in texts) / max(1, len(texts))}


async def task_hybrid(spec: dict[str, Any]) -> dict[str, Any]:
    """Hybrid search p50/p95 (query embedding excluded) over the window vectors."""
    from fallback.embeddings import select_provider

    if spec["vectors"] == "synthetic":
        inner: Any = SyntheticProvider()
    else:
        inner = select_provider(agent_for(spec).memory_search, env={}).provider
    provider = PreEmbeddedProvider(inner)
    queries = list(spec["queries"])
    out: dict[str, Any] = {}
    engine = _engine(spec, provider=provider)
    try:
        start = time.perf_counter()
        await engine.sync(reason="bench")
        out["sync_ms"] = _ms(start)
        out["query_embed_ms"] = await provider.prepare(queries)
        out["chunks"] = (await engine.status()).chunks
        times = await _time_searches(engine, queries, int(spec["repeats"]))
        st = await engine.status()
        out["vec"] = {"p50": percentile(times, 50), "p95": percentile(times, 95),
                      "mode": st.vector.get("lastQueryMode")}
    finally:
        await engine.close()
        await provider.close_inner()
    return out


async def _poll(check: Callable[[], Awaitable[bool]], *, timeout_s: float,
                interval_s: float = 0.01) -> bool:
    with anyio.move_on_after(timeout_s):
        while not await check():
            await anyio.sleep(interval_s)
        return True
    return False


async def task_watch(spec: dict[str, Any]) -> dict[str, Any]:
    """Save-to-searchable latency through the live watcher (``MemoryManager`` full mode)."""
    from fallback.engine.builtin import BuiltinEngine
    from qmdbridge.manager import MemoryManager

    if not callable(getattr(BuiltinEngine, "start", None)):
        return {"skipped": "live mode not available (BuiltinEngine.start missing)"}
    agent = agent_for(spec)
    latencies: list[float] = []
    async with MemoryManager(agent, mode="full", env={}) as manager:
        await manager.start()

        async def hit(token: str, path: str) -> bool:
            res = await manager.search(token, max_results=3, min_score=0)
            return any(r.path == path for r in res.results)

        first = planted_token(0)
        if not await _poll(lambda: hit(first, note_path(0)), timeout_s=120):
            return {"skipped": "initial index never became searchable"}
        for k in range(int(spec["changes"])):
            index = (k * 101 + 3) % int(spec["files"])
            token = "zqlive" + planted_token(k)[2:]
            await anyio.sleep(0.3)
            start = time.perf_counter()
            change_file(spec["ws"], index, token)
            if not await _poll(lambda t=token, i=index: hit(t, note_path(i)), timeout_s=30):
                return {"skipped": f"change {k} not searchable after 30 s"}
            latencies.append(_ms(start))
    return {"latencies_ms": latencies, "p50": percentile(latencies, 50),
            "max": max(latencies)}


async def task_sync_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """Forced full re-syncs (rebuild + atomic swap) back to back for ``seconds``."""
    engine = _engine(spec)
    runs = 0
    deadline = time.perf_counter() + float(spec["seconds"])
    try:
        while time.perf_counter() < deadline:
            await engine.sync(reason="bench", force=True)
            runs += 1
    finally:
        await engine.close()
    return {"runs": runs}


async def task_search_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Keyword searches back to back for ``seconds`` (``sync.onSearch`` off: read-only)."""
    from fallback.errors import MemorySearchError

    engine = _engine(spec)
    times: list[float] = []
    errors: list[str] = []
    queries = list(spec["queries"])
    deadline = time.perf_counter() + float(spec["seconds"])
    try:
        await engine.search(SearchRequest.of(queries[0]))
        i = 0
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            try:
                await engine.search(SearchRequest.of(queries[i % len(queries)]))
                times.append(_ms(start))
            except MemorySearchError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            i += 1
    finally:
        await engine.close()
    return {"p50": percentile(times, 50), "p95": percentile(times, 95), "searches": len(times),
            "errors": len(errors), "first_error": errors[0] if errors else None}


TASKS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "index": task_index, "embed": task_embed, "hybrid": task_hybrid, "watch": task_watch,
    "sync-loop": task_sync_loop, "search-probe": task_search_probe,
}


def main() -> None:
    """Run one task and print its JSON result on stdout."""
    task, spec = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    result = anyio.run(TASKS[task], spec)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
