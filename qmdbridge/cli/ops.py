"""Operator commands for the qmd sidecar: ``qmd update|embed|collections`` and ``warmup``."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from fallback.errors import BackendUnavailableError
from fallback.request import require_workspace
from qmdbridge.cli.common import EXIT_FAILURE, EXIT_OK, emit_json
from qmdbridge.paths import qmd_home
from qmdbridge.problems import CI_REFUSAL
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import probe_qmd
from qmdbridge.qmd.models import DEFAULT_MODELS, model_problem
from qmdbridge.qmd.runner import run_command

__all__ = ["missing_model_hint", "qmd_action", "warmup"]

# Model pre-warm can download ~2 GB on first use; allow 30 minutes per step.
WARMUP_TIMEOUT_MS = 30 * 60 * 1000

_MODEL_RE = re.compile(r"hf:[\w.\-]+/[\w.\-]+/[\w.\-]+\.gguf", re.IGNORECASE)
# node-llama-cpp's line for a download the host answered with an error status
_HTTP_STATUS_RE = re.compile(r"Url: (\S+), Status code: (\d+)")


def missing_model_hint(stderr: str, *, step: str) -> str:
    """One or two lines for a person on a failed model load in qmd's ``step``
    (``embed`` or ``query``, its ``stderr``): which model, and which download it needs."""
    if "disabled in CI" in stderr:
        return f"{CI_REFUSAL}; unset CI to warm up the models"
    models = sorted(set(_MODEL_RE.findall(stderr)))
    if not models:
        models = [DEFAULT_MODELS["embed"]] if step == "embed" else list(DEFAULT_MODELS.values())
    offline = re.search(r"fetch failed|ENOTFOUND|EAI_AGAIN|ECONNREFUSED|getaddrinfo|network", stderr, re.I)
    refused = _HTTP_STATUS_RE.search(stderr)
    why = (f"the download of {refused.group(1)} failed with HTTP {refused.group(2)}" if refused else
           "the download failed (offline?)" if offline else "loading failed")
    return (f"qmd {step}: {why}; it needs the model(s) {', '.join(models)} "
            f"(downloaded from huggingface.co into the agent's xdg-cache/qmd/models on first use; "
            f"or point QMD_EMBED_MODEL / QMD_RERANK_MODEL / QMD_GENERATE_MODEL at local .gguf files)")


async def _backend(agent: Any) -> Any:
    location = await probe_qmd(agent.memory.qmd.command, env=dict(os.environ))
    if not location.usable:
        raise BackendUnavailableError("qmd", location.reason or "qmd not available")
    return QmdBackend(agent, location=location, mode="cli", env=dict(os.environ))


async def qmd_action(agent: Any, args: argparse.Namespace) -> int:
    """``qmdbridge qmd update|embed|collections``: run one sidecar operation for the agent."""
    require_workspace(agent.workspace_dir)  # the qmd start-up would create a mistyped one
    backend = await _backend(agent)
    try:
        await backend.start(boot_update=False)
        doc: dict[str, Any] = {"ok": True, "action": args.action}
        if args.action == "update":
            await backend.sync(reason="manual", force=True)
        elif args.action == "embed":
            await backend.embed()
        else:
            doc["collections"] = await backend.list_collections()
    finally:
        await backend.close()
    if args.json:
        emit_json(doc)
    elif args.action == "collections":
        for c in doc["collections"]:
            sys.stdout.write(f"{c['name']}\t{c.get('path') or '-'}\t{c.get('pattern') or '-'}\n")
    else:
        sys.stdout.write(f"qmd {args.action} done ({agent.agent_id}).\n")
    return EXIT_OK


async def warmup(agent: Any, args: argparse.Namespace) -> int:
    """``qmdbridge warmup``: ``qmd embed`` and one ``qmd query`` in the agent's qmd home, so
    the GGUF models are downloaded and loaded first; fails fast, naming the models, under
    ``CI`` or offline with models missing."""
    home = qmd_home(agent.state_dir, agent.agent_id)
    problem = await model_problem(home.models_dir, dict(os.environ), kinds=("embed", "rerank", "generate"))
    if problem is not None:
        if args.json:
            emit_json({"ok": False, "steps": [{"step": "embed", "ok": False, "durationMs": 0, "error": problem}]})
        else:
            sys.stderr.write(f"qmdbridge warmup: {problem}\n")
        return EXIT_FAILURE

    backend = await _backend(agent)
    try:
        await backend.start(boot_update=False)
        await backend.sync(reason="manual", force=True)
    finally:
        await backend.close()
    # in the qmd home and child environment the backend's start-up made
    steps = [("embed", backend.argv(["embed"])), ("query", backend.argv(["query", "--json", "-n", "1"], ["test"]))]
    report: list[dict[str, Any]] = []
    for i, (step, argv) in enumerate(steps, start=1):
        if not args.json:
            sys.stderr.write(f"[{i}/{len(steps)}] qmd {step} (first run downloads models; this can take minutes)...\n")
        result = await run_command(argv, env=backend.child_env, cwd=agent.workspace_dir,
                                   timeout_ms=WARMUP_TIMEOUT_MS)
        ok = result.ok
        entry: dict[str, Any] = {"step": step, "ok": ok, "durationMs": result.duration_ms}
        if not ok:
            entry["error"] = missing_model_hint(result.stderr, step=step)
        report.append(entry)
        if not args.json:
            sys.stderr.write(f"    {'ok' if ok else 'failed'} in {result.duration_ms} ms"
                             f"{': ' + entry['error'] if not ok else ''}\n")
        if not ok:
            break
    if args.json:
        emit_json({"ok": ok, "steps": report})
    return EXIT_OK if ok else EXIT_FAILURE
