"""``qmdbridge models pull [NAME]`` and ``qmdbridge models list``: the local embedding model cache.

``pull`` downloads a model ahead of first use, with a first use's checks
(``fallback/embeddings/model_fetch.py``); ``list`` shows cached models and partial downloads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from fallback.embeddings import model_fetch
from fallback.embeddings.model_fetch import DEFAULT_MODEL, ModelRef, ModelSpec, format_bytes
from fallback.errors import UsageError
from qmdbridge.cli.common import EXIT_OK, emit_json

__all__ = ["models", "pull_target"]


def pull_target(name: str | None, configured: str | None) -> ModelSpec | ModelRef:
    """What ``models pull [NAME]`` downloads: ``NAME`` (a known model or an ``hf:`` URI), else
    ``local.modelPath`` when it is an ``hf:`` URI, else the default model.

    Raises:
        UsageError: ``NAME`` is neither a known model nor an ``hf:`` URI.
    """
    wanted = (name or "").strip() or (configured or "").strip()
    if not wanted or (not name and not wanted.startswith(model_fetch.HF_URI_PREFIX)):
        return DEFAULT_MODEL
    try:
        return model_fetch.find_model(wanted)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@contextmanager
def _download_progress(uri: str, *, quiet: bool) -> Iterator[model_fetch.ProgressFn | None]:
    """A rich download bar on a terminal, plain percentage lines otherwise, nothing when quiet."""
    if quiet:
        yield None
        return
    if not sys.stderr.isatty():
        yield model_fetch.stderr_progress(uri)
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn(uri), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("download", total=None)

        def on_progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield on_progress


def _cache_dir(agent: Any) -> Path:
    return model_fetch.default_cache_dir(agent.memory_search.local.model_cache_dir, os.environ)


async def _pull(agent: Any, args: argparse.Namespace) -> int:
    target = pull_target(args.name, agent.memory_search.local.model_path)
    ref = target.ref if isinstance(target, ModelSpec) else target
    cache = _cache_dir(agent)
    with _download_progress(ref.uri, quiet=args.json) as on_progress:
        fetch: Callable[[], model_fetch.FetchResult] = partial(
            model_fetch.fetch_model, target, cache, base_url=model_fetch.hub_base_url(os.environ),
            on_progress=on_progress)
        result = await anyio.to_thread.run_sync(fetch, abandon_on_cancel=True)
    if args.json:
        emit_json({"ok": True, "model": ref.uri, "path": str(result.path), "sizeBytes": result.size_bytes,
                   "sha256": result.sha256, "downloaded": result.downloaded,
                   "resumedFrom": result.resumed_from, "verifiedBy": result.verified_by})
        return EXIT_OK
    how = {"pinned": "sha256 matches the pinned digest", "hub": "sha256 matches the hub's",
           "sidecar": "sha256 matches the published .sha256", "size": "size matches; no sha256 published",
           "cache": "already cached"}[result.verified_by]
    verb = "downloaded" if result.downloaded else "cached"
    sys.stdout.write(f"{verb} {ref.uri}\n  {result.path} ({format_bytes(result.size_bytes)}, {how})\n")
    if agent.memory_search.provider != "local":
        sys.stdout.write('  to use it: set agents.defaults.memorySearch.provider to "local"'
                         f'{"" if target is DEFAULT_MODEL else " and local.modelPath to " + ref.uri}\n')
    return EXIT_OK


async def _list(agent: Any, args: argparse.Namespace) -> int:
    cache = _cache_dir(agent)
    cached = model_fetch.list_cached(cache)
    if args.json:
        emit_json({"cacheDir": str(cache), "default": DEFAULT_MODEL.ref.uri,
                   "models": [{"model": m.uri, "path": str(m.path), "sizeBytes": m.size_bytes,
                               "sha256": m.sha256, "complete": m.complete, "default": m.default}
                              for m in cached]})
        return EXIT_OK
    sys.stdout.write(f"Model cache: {cache}\n")
    if not cached:
        sys.stdout.write(f"No models cached. `qmdbridge models pull` downloads the default, "
                         f"{DEFAULT_MODEL.name} ({format_bytes(DEFAULT_MODEL.size_bytes or 0)}).\n")
    for m in cached:
        state = "" if m.complete else " (partial download: `qmdbridge models pull` resumes it)"
        mark = " [default]" if m.default else ""
        digest = f", sha256 {m.sha256[:12]}" if m.sha256 else ""
        sys.stdout.write(f"{m.uri}{mark}\n  {m.path} ({format_bytes(m.size_bytes)}{digest}){state}\n")
    return EXIT_OK


async def models(agent: Any, args: argparse.Namespace) -> int:
    """Run ``models pull`` or ``models list``; returns the exit code.

    Raises:
        UsageError: ``list`` with a NAME, or an unknown NAME.
        ModelDownloadError: the download failed (offline, HTTP error, checksum).
    """
    if args.action == "pull":
        return await _pull(agent, args)
    if args.name:
        raise UsageError("models list takes no NAME")
    return await _list(agent, args)
