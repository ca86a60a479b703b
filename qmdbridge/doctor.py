"""``doctor``: checks of the workspace, qmd, SQLite features, the embedding provider, the file
watcher limits and the index, each with a fix hint; ``--fix`` repairs the legacy root file split
(:func:`repair_root_memory`: the legacy file archived, its text merged into ``MEMORY.md``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from fallback.embeddings import select_provider
from fallback.embeddings.base import probe
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import IndexStoreError, MemorySearchError, UsageError
from fallback.request import require_workspace
from fallback.sources import memory_files as files
from fallback.sources.memory_files import LEGACY_ROOT_MEMORY_FILE, ROOT_MEMORY_FILE, root_memory_file
from fallback.store.readonly import ReadOnlyStore
from fallback.store.vectors import probe_sqlite_vec
from qmdbridge.config import ResolvedAgent
from qmdbridge.problems import model_missing_problem, status_problems
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.index_health import is_corrupt
from qmdbridge.qmd.locate import probe_qmd

__all__ = ["Check", "DoctorReport", "LEGACY_MARKER", "repair_root_memory", "root_memory_state", "run_doctor"]

LEGACY_MARKER = "<!-- openclaw:imported-legacy-root-memory -->"
LEGACY_HEADING = "## Imported From Legacy Root memory.md"


@dataclass
class Check:
    """One doctor check: ``level`` is ``ok`` | ``warn`` | ``error``; ``hint`` says how to fix."""

    name: str
    level: Literal["ok", "warn", "error"]
    detail: str
    hint: str | None = None
    fixed: bool = False


@dataclass
class DoctorReport:
    """All checks; ``ok`` is False when any check is an error."""

    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no check failed with ``error``."""
        return all(c.level != "error" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        """JSON form: ``{ok, checks: [{name, level, detail, hint, fixed}]}``, every key present."""
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def root_memory_state(ws: Path) -> Literal["canonical", "legacy-only", "split", "none"]:
    """The workspace root by the memory-file rule: ``canonical`` (``MEMORY.md``),
    ``legacy-only`` (``memory.md``), ``split`` (both, distinct files) or ``none``."""
    root = root_memory_file(ws)
    if root.legacy_shadowed:
        return "split"
    if root.name == ROOT_MEMORY_FILE:
        return "canonical"
    return "legacy-only" if root.name == LEGACY_ROOT_MEMORY_FILE else "none"


def _archive_dir(ws: Path, now: float) -> Path:
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}Z"
    base = ws / ".openclaw-repair" / "root-memory"
    candidate = base / stamp
    n = 2
    while candidate.exists():
        candidate = base / f"{stamp}-{n}"
        n += 1
    return candidate


def repair_root_memory(ws: Path, *, now: float | None = None) -> str:
    """Fix the root memory file layout; returns what was done (one line). ``split``:
    archive ``memory.md`` and append its text to ``MEMORY.md`` under a marked heading;
    ``legacy-only``: archive a copy and rename it to ``MEMORY.md``; otherwise nothing.

    Raises:
        OSError: the workspace is not writable (the original is left untouched).
    """
    state = root_memory_state(ws)
    if state not in ("split", "legacy-only"):
        return "nothing to repair"
    if state == "legacy-only" and (ws / ROOT_MEMORY_FILE).is_symlink():
        return "MEMORY.md is a symlink (never followed): replace it with a regular file first"
    legacy = ws / LEGACY_ROOT_MEMORY_FILE
    archive = _archive_dir(ws, time.time() if now is None else now)
    archive.mkdir(parents=True)
    target = archive / LEGACY_ROOT_MEMORY_FILE
    text = legacy.read_bytes().decode("utf-8", errors="replace")
    if state == "legacy-only":
        shutil.copy2(legacy, target)
        tmp = ws / f".memory-rename-{os.getpid()}.md"
        os.rename(legacy, tmp)  # via a temp name so case-insensitive file systems rename too
        os.rename(tmp, ws / ROOT_MEMORY_FILE)
        return f"renamed memory.md to MEMORY.md (copy archived at {target.relative_to(ws)})"
    root = ws / ROOT_MEMORY_FILE
    current = root.read_bytes().decode("utf-8", errors="replace")
    section = f"{LEGACY_HEADING}\n\n{LEGACY_MARKER}\n\n{text.strip()}\n" if text.strip() else ""
    sep = "" if not current or current.endswith("\n\n") else "\n" if current.endswith("\n") else "\n\n"
    shutil.move(legacy, target)  # a copy and an unlink across file systems
    if section:
        with root.open("a", encoding="utf-8") as fh:
            fh.write(sep + section)
    return f"merged memory.md into MEMORY.md (archived at {target.relative_to(ws)})"


def _index_hint(ws: Path) -> str:
    """How to build the first index of ``ws``: ``qmdbridge index``, after creating a missing ``ws``
    (after moving a file there out of the way)."""
    if ws.is_dir():
        return "run `qmdbridge index`"
    return f"{f'move the file {ws} away, ' if ws.exists() else ''}create the workspace {ws}, then run `qmdbridge index`"


def _check_root(ws: Path, fix: bool) -> Check:
    try:
        require_workspace(ws)  # in the words of every command that needs one
    except UsageError as exc:
        return Check("workspace", "error", str(exc), f"{_index_hint(ws)}; or pass --workspace / set agents.defaults.workspace")
    state = root_memory_state(ws)
    linked = root_memory_file(ws).symlinked
    # the problem status lists once a sync read the root: a symlinked root file, the legacy split
    told = status_problems({"backend": "builtin", "issues": [files.LEGACY_SPLIT] if state == "split" else [],
                            "skipped": [{"path": n, "reason": files.SYMLINK_SKIP} for n in linked[:1]]})
    if linked and state in ("canonical", "none"):
        return Check("root memory file", "error", told[0]["message"], told[0]["hint"])
    if state == "canonical":
        return Check("root memory file", "ok", "MEMORY.md")
    if state == "none":
        return Check("root memory file", "warn", "no MEMORY.md in the workspace",
                     "create MEMORY.md for curated long-term facts")
    detail, hint = (told[-1]["message"], told[-1]["hint"]) if state == "split" else (
        "only the legacy memory.md exists (indexed as fallback)",
        "run `qmdbridge doctor --fix` to archive memory.md and merge it into MEMORY.md")
    if not fix:
        return Check("root memory file", "warn" if state == "legacy-only" else "error", detail, hint)
    try:
        done = repair_root_memory(ws)
    except OSError as exc:
        return Check("root memory file", "error", f"{detail}; repair failed: {exc}", hint)
    return Check("root memory file", "ok", done, fixed=True)


async def _check_qmd(agent: ResolvedAgent, env: Mapping[str, str]) -> Check:
    """qmd found and answering ``--version``; as the backend (and with a workspace) a test search
    and the collections reconciled too: failing searches or every collection refused are errors."""
    loc = await probe_qmd(agent.memory.qmd.command, env=env)
    configured = agent.memory.backend == "qmd"
    level: Literal["warn", "error"] = "error" if configured else "warn"
    found = f"{loc.version or 'qmd'} at {loc.path}"
    if loc.usable and configured and agent.workspace_dir.is_dir():
        backend = QmdBackend(agent, location=loc, mode="cli", env=env)
        unusable = None
        try:
            problem = await backend.search_probe()
            if problem is None:  # the collections a search would reconcile, read back
                await backend.start(boot_update=False)
                unusable = backend.reconcile_state.no_usable_collection(backend.collections)
        except MemorySearchError as exc:
            problem = str(exc)
        finally:
            await backend.close()
        if unusable is not None:
            return Check("qmd", level, f"{found} answers, but {unusable}",
                         "install a qmd that honours `collection add --mask` (scripts/install-qmd.sh "
                         "installs 2.8.3); the builtin engine answers meanwhile")
        if problem is None:
            return Check("qmd", "ok", f"{found}; a test search answered")
        hint = ("qmd's index is corrupt: the next qmdbridge command (a search, status, `qmdbridge "
                "qmd update`) moves it aside and re-indexes" if is_corrupt(problem) else
                "run that command by hand to see qmd's error; reinstall qmd "
                "(scripts/install-qmd.sh) or fix memory.qmd.command")
        return Check("qmd", level, f"{found} answers --version but its searches fail: {problem}",
                     f"{hint}; the builtin engine answers meanwhile")
    if loc.usable:  # not tried: qmd is not the backend, or there is no workspace to run it in
        return Check("qmd", "ok", found)
    return Check("qmd", level,
                 f"{loc.reason}{'' if configured else ' (not needed: memory.backend is ' + agent.memory.backend + ')'}",
                 "run scripts/install-qmd.sh, install qmd with `bun install -g @tobilu/qmd`, or set "
                 "memory.qmd.command; the builtin engine answers meanwhile")


def _check_sqlite(agent: ResolvedAgent) -> list[Check]:
    checks = []
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for name, tok in (("FTS5", "unicode61"), ("FTS5 trigram", "trigram")):
            try:
                conn.execute(f"CREATE VIRTUAL TABLE t_{tok} USING fts5(x, tokenize='{tok}')")
                checks.append(Check(name, "ok", f"SQLite {sqlite3.sqlite_version}"))
            except sqlite3.Error as exc:
                checks.append(Check(name, "error" if tok == "unicode61" else "warn", str(exc),
                                    "use a Python whose SQLite has FTS5 (3.34+ for trigram)"))
    # The same probe the engine runs: sqlite-vec is only ever loaded into the store's own sqlite3.
    configured = agent.memory_search.store.vector.extension_path
    path, reason = probe_sqlite_vec(configured)
    if path is not None:
        checks.append(Check("sqlite-vec", "ok", f"sqlite-vec loads into the store's sqlite3 ({path})"))
    elif configured:
        checks.append(Check("sqlite-vec", "warn", f"store.vector.extensionPath not loadable: {reason}",
                            "fix store.vector.extensionPath, or remove it"))
    else:  # exact search either way; only where the cosine is computed differs
        checks.append(Check("sqlite-vec", "ok", f"vectors by exact numpy cosine: {reason}"))
    return checks


async def _check_provider(agent: ResolvedAgent, env: Mapping[str, str]) -> Check:
    sel = select_provider(agent.memory_search, env=env)
    if sel.error:
        return Check("embedding provider", "error", sel.error, "fix the provider config or set provider: none")
    if sel.provider is None:
        return Check("embedding provider", "warn", f"keyword-only: {sel.unavailable_reason}",
                     'set memorySearch.provider to "local" (a small model is downloaded on first use) '
                     'or an API key for semantic search; see README "Semantic search"')
    missing = sel.provider.model_problem() if hasattr(sel.provider, "model_problem") else None
    if missing is not None:  # probing would download the model; status lists it as a problem
        await sel.provider.aclose()
        problem = model_missing_problem(missing)
        return Check("embedding provider", "error", problem["message"], problem["hint"])
    try:
        ok, err = await probe(sel.provider)
    finally:
        await sel.provider.aclose()
    if ok:
        return Check("embedding provider", "ok", f"{sel.provider.provider_id} {sel.provider.model}")
    return Check("embedding provider", "error", str(err),  # the message names the provider
                 "check the key, the endpoint and the network")


def _check_watch_limits() -> Check:
    path = Path("/proc/sys/fs/inotify/max_user_watches")
    if not path.exists():
        return Check("watcher", "ok", "native file events (no inotify limit on this platform)")
    try:
        limit = int(path.read_text().strip())
    except (OSError, ValueError):
        return Check("watcher", "warn", "cannot read the inotify watch limit")
    if limit < 8192:
        return Check("watcher", "warn", f"inotify max_user_watches = {limit}",
                     "raise it: sysctl fs.inotify.max_user_watches=524288 (the watcher falls back to polling)")
    return Check("watcher", "ok", f"inotify max_user_watches = {limit}")


def _check_postgres(agent: ResolvedAgent) -> Check:
    """The ``index`` check of an agent on the postgres store: the store opens (server reached,
    login accepted, pgvector there, schema migrated) and its published index is counted."""
    from fallback.engine.status import untrigrammed_issue
    from fallback.engine.store_open import open_postgres

    try:
        shared = open_postgres(agent.engine)
        try:
            d = shared.describe()
        finally:
            shared.close()
    except ImportError as exc:
        return Check("index", "error", f"postgres store: {exc}",
                     "install the postgres extra: pip install 'qmdbridge[postgres]'")
    except MemorySearchError as exc:
        return Check("index", "error", f"postgres store: {exc}", getattr(exc, "hint", None))
    files = sum(c.get("files", 0) for c in d["counts"].values())
    chunks = sum(c.get("chunks", 0) for c in d["counts"].values())
    detail = (f"postgres {d['target']}, schema {d['schema']} version {d['schemaVersion']}:"
              f" {files} files, {chunks} chunks")
    if not chunks:
        return Check("index", "warn", f"{detail} (no index yet)", _index_hint(agent.workspace_dir))
    if untrigrammed := untrigrammed_issue(d["unspacedWithoutTrigrams"]):
        return Check("index", "warn", f"{detail}; {untrigrammed[0]}", "run `qmdbridge index --force`")
    return Check("index", "ok", detail)


async def _check_index(agent: ResolvedAgent, fix: bool, env: Mapping[str, str]) -> Check:
    if agent.memory_search.store.driver == "postgres":
        return await anyio.to_thread.run_sync(_check_postgres, agent)
    check = _inspect_index(agent)
    if check.level != "error" or not fix:
        return check
    engine = BuiltinEngine(agent.engine, provider_selection=select_provider(agent.memory_search, env=env))
    try:
        await engine.sync(reason="doctor", force=True)
    except MemorySearchError as exc:
        return Check("index", "error", f"{check.detail}; rebuild failed: {exc}", check.hint)
    finally:
        await engine.close()
    after = _inspect_index(agent)
    if after.level == "ok":
        return Check("index", "ok", f"rebuilt ({check.detail})", fixed=True)
    return after


def _inspect_index(agent: ResolvedAgent) -> Check:
    db = agent.engine.db_path
    try:
        reader = ReadOnlyStore.open(db)
        if reader is None:
            return Check("index", "warn", f"no index yet at {db}", _index_hint(agent.workspace_dir))
        with reader:
            result = f"quick_check: {reader.quick_check()}"
    except IndexStoreError as exc:  # in SQLite's own words
        result = str(exc.__cause__ or exc)
    if result != "quick_check: ok":
        return Check("index", "error", f"{db}: {result}",
                     "run `qmdbridge doctor --fix` or `qmdbridge index --force` to rebuild it")
    return Check("index", "ok", f"{db}: quick_check ok")


async def run_doctor(agent: ResolvedAgent, *, fix: bool = False,
                     env: Mapping[str, str] | None = None) -> DoctorReport:
    """Run every check (and the legacy-split repair when ``fix``); each config warning of the
    agent is a ``warn`` check named ``config``."""
    e = dict(os.environ if env is None else env)
    return DoctorReport([
        _check_root(agent.workspace_dir, fix), await _check_qmd(agent, e), *_check_sqlite(agent),
        await _check_provider(agent, e), _check_watch_limits(), await _check_index(agent, fix, e),
        # what the config loader noticed (status lists the same as "Config warning:")
        *(Check("config", "warn", w) for w in agent.config_warnings)])
