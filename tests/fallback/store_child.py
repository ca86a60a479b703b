"""Child process for the multi-process store tests (test_concurrency.py, test_crash_safety.py).

Run as ``python store_child.py '<json config>'``; the ``role`` key picks what it does:

- ``writer``: edit files and sync (incremental, every ``force_every``-th forced) ``iterations``
  times, then write ``memory/final.md`` holding ``final_token`` and force a rebuild, then
  create ``stop_file``;
- ``reader``: search every planted token and read status until ``stop_file`` exists (at most
  ``max_loops`` rounds; ``ignore_stop`` runs all of them); a hit list without the token's file
  counts as inconsistent; with ``final_token`` it then waits for ``stop_file`` and must find
  the writer's last rebuild (the store it opened long ago was published over);
- ``sync``: one sync (``force`` true/false) that prints ``progress <done> <total>`` after each
  file and then sleeps ``progress_sleep_ms`` (and, with ``embed_sleep_ms``, a provider that
  sleeps per batch and prints ``embedded <n>``), for SIGKILL tests;
- ``hold-lock``: take the store's writer lock, print ``held``, wait for a line on stdin (or
  ``restore`` first: rename the given backup back onto the store, then release);
- ``hold-write``: open a plain ``sqlite3`` connection, ``BEGIN IMMEDIATE``, print ``locked``,
  commit after a line on stdin.

``writer``/``reader`` write ``{"errors": [...], "inconsistent": [...], ...}`` to ``out``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import anyio

from fallback.embeddings import BaseProvider, ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.lock import StoreWriteLock

# Dimensions of the deterministic hashing provider.
HASH_DIMS = 16


class HashProvider(BaseProvider):
    """Deterministic bag-of-words provider: each word adds 1 to dimension sha1(word) % 16.

    ``embed_sleep_ms`` > 0 makes every ``embed_batch`` call sleep and print ``embedded <n>``
    (the running count of batches) so a parent can SIGKILL the process mid-sync.
    """

    provider_id = "test-hash"
    model = "hash-v1"
    dims = HASH_DIMS
    provider_key = "hash-key-1"
    max_input_tokens = 8192
    max_batch_bytes = 8000

    def __init__(self, *, embed_sleep_ms: int = 0) -> None:
        self.embed_sleep_ms = embed_sleep_ms
        self.batches = 0

    @staticmethod
    def vector(text: str) -> list[float]:
        vec = [0.0] * HASH_DIMS
        for word in text.lower().split():
            vec[int(hashlib.sha1(word.encode()).hexdigest(), 16) % HASH_DIMS] += 1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]

    async def embed_query(self, text: str) -> list[float]:
        return self.vector(text)

    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        if self.embed_sleep_ms:
            await anyio.sleep(self.embed_sleep_ms / 1000)
            self.batches += 1
            print(f"embedded {self.batches}", flush=True)
        return [self.vector(t) for t in texts]

    async def aclose(self) -> None:
        return None


def make_engine(cfg: dict[str, Any], **kwargs: Any) -> BuiltinEngine:
    """The engine every process of a test builds the same way (same identity, same store)."""
    provider = HashProvider(embed_sleep_ms=cfg.get("embed_sleep_ms", 0)) if cfg.get(
        "provider") == "hash" else None
    search = MemorySearchSettings(
        provider="openai" if provider else "none",
        store={"path": cfg["db"]},
        sync={"onSearch": cfg.get("on_search", False), "watch": False})
    settings = EngineSettings.for_workspace(cfg["ws"], search=search)
    sel = ProviderSelection(provider, "test-hash" if provider else "none",
                            unavailable_reason=None if provider else "provider set to none")
    return BuiltinEngine(settings, provider_selection=sel, **kwargs)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


async def run_writer(cfg: dict[str, Any]) -> dict[str, Any]:
    ws = Path(cfg["ws"])
    engine = make_engine(cfg)
    errors: list[str] = []
    forced = incremental = 0
    try:
        for i in range(cfg["iterations"]):
            target = ws / "memory" / f"churn-{i % 5}.md"
            _write(target, f"# Churn {i}\n" + "\n".join(
                f"churn line {i}-{n} filler words go here" for n in range(1 + i % 7)))
            force = cfg["force_every"] > 0 and i % cfg["force_every"] == cfg["force_every"] - 1
            try:
                await engine.sync(reason="cli", force=force)
                forced += force
                incremental += not force
            except Exception as exc:  # noqa: BLE001 - the test counts every failure
                errors.append(f"sync {i} force={force}: {type(exc).__name__}: {exc}")
        if cfg.get("final_token"):
            _write(ws / "memory" / "final.md", f"# Final\nThe last word is {cfg['final_token']}.\n")
            try:
                await engine.sync(reason="cli", force=True)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"final sync: {type(exc).__name__}: {exc}")
    finally:
        await engine.close()
        if cfg.get("stop_file"):
            Path(cfg["stop_file"]).touch()
    return {"errors": errors, "forced": forced, "incremental": incremental}


async def run_reader(cfg: dict[str, Any]) -> dict[str, Any]:
    engine = make_engine(cfg)
    errors: list[str] = []
    inconsistent: list[str] = []
    searches = statuses = loops = 0
    stop = Path(cfg["stop_file"])
    try:
        while loops < cfg["max_loops"] and not (
                loops >= 1 and stop.exists() and not cfg.get("ignore_stop")):
            loops += 1
            for token, path in cfg["tokens"].items():
                try:
                    hits = (await engine.search(SearchRequest.of(token, min_score=0.0))).results
                    searches += 1
                    if path not in [h.path for h in hits]:
                        inconsistent.append(f"{token}: {[h.path for h in hits]}")
                except Exception as exc:  # noqa: BLE001 - the test counts every failure
                    errors.append(f"search {token}: {type(exc).__name__}: {exc}")
            try:
                status = await engine.status()
                statuses += 1
                if status.files < len(cfg["tokens"]):
                    inconsistent.append(f"status files={status.files}")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"status: {type(exc).__name__}: {exc}")
        if cfg.get("final_token"):
            # the writer's last forced rebuild must be visible to this long-lived reader
            with anyio.fail_after(cfg.get("final_wait_s", 120)):
                while not stop.exists():
                    await anyio.sleep(0.05)
            hits = (await engine.search(SearchRequest.of(cfg["final_token"], min_score=0.0))).results
            if "memory/final.md" not in [h.path for h in hits]:
                inconsistent.append(f"final: {[h.path for h in hits]}")
    finally:
        await engine.close()
    return {"errors": errors, "inconsistent": inconsistent, "searches": searches,
            "statuses": statuses, "loops": loops}


async def run_sync(cfg: dict[str, Any]) -> dict[str, Any]:
    def progress(done: int, total: int, embedded: int, written: int) -> None:
        print(f"progress {done} {total}", flush=True)
        if cfg.get("progress_sleep_ms"):
            time.sleep(cfg["progress_sleep_ms"] / 1000)  # slow the sync so a kill lands in it

    engine = make_engine(cfg)
    try:
        report = await engine.sync(reason="cli", force=cfg.get("force", False), progress=progress)
    finally:
        await engine.close()
    print("done", flush=True)
    return {"full": report.full, "files_indexed": report.files_indexed}


def hold_lock(cfg: dict[str, Any]) -> None:
    lock = StoreWriteLock(Path(cfg["db"]))
    if not lock.try_acquire():
        print("busy", flush=True)
        return
    print("held", flush=True)
    sys.stdin.readline()
    if cfg.get("restore"):
        os.replace(cfg["restore"], cfg["db"])
        print("restored", flush=True)
        sys.stdin.readline()
    lock.release()


def hold_write(cfg: dict[str, Any]) -> None:
    conn = sqlite3.connect(cfg["db"], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('holder', '1')")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    conn.close()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    role = cfg["role"]
    if role == "hold-lock":
        hold_lock(cfg)
        return
    if role == "hold-write":
        hold_write(cfg)
        return
    runner = {"writer": run_writer, "reader": run_reader, "sync": run_sync}[role]
    try:
        result = anyio.run(runner, cfg)
    except Exception:  # noqa: BLE001 - report the crash to the parent through the out file
        result = {"errors": [traceback.format_exc()], "inconsistent": []}
    if cfg.get("out"):
        Path(cfg["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
