"""Config -> qmd collections, and reconciling them with what qmd already has (spec 2.2, 2.6).

``reconcile`` and ``rebuild`` run qmd's collection commands through a caller-supplied
function, so this module spawns nothing itself.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson

from fallback.errors import BackendUnavailableError
from fallback.fs.atomic import write_atomic
from fallback.settings import EngineSettings, ExtraPath
from fallback.sources.memory_files import (
    DEFAULT_PATTERN,
    LEGACY_ROOT_MEMORY_FILE,
    MEMORY_DIR_NAME,
    ROOT_MEMORY_FILE,
    MemoryRoot,
    extra_roots,
    memory_roots,
    root_memory_file,
)
from qmdbridge.config import ResolvedAgent
from qmdbridge.qmd.errors import one_line
from qmdbridge.qmd.listing import ListedCollection, parse_collection_list, parse_collection_show
from qmdbridge.qmd.runner import RunResult, is_flag_rejection, is_missing_collection

__all__ = ["CollectionKind", "ManagedCollection", "ReconcileState", "build_collections",
           "describe_collections", "fallback_engine_settings", "rule_extra_paths",
           "rebuild", "reconcile", "render_index_yml", "sanitize_name"]

log = logging.getLogger("qmdbridge.qmd.collections")

CollectionKind = Literal["memory", "custom", "sessions"]

_NAME_IN_STDERR_RE = re.compile(r"Name:\s*(\S+)\s*\(qmd://", re.IGNORECASE)
# qmd could not read its collection list (a hand edit broke the YAML): every command fails so.
_YML_UNREADABLE_RE = re.compile(r"failed to parse \S*index\.yml|yamlparseerror", re.IGNORECASE)


@dataclass(frozen=True)
class ManagedCollection:
    """One qmd collection this bridge owns for an agent.

    Attributes:
        name: sanitised, agent-scoped, unique collection name (``memory-root-main``).
        path: absolute directory qmd indexes.
        pattern: qmd glob relative to ``path`` (``MEMORY.md``, ``**/*.md``).
        kind: ``memory``, ``custom`` (extra paths) or ``sessions``.
        single_file: a custom collection made from one configured file.
    """

    name: str
    path: Path
    pattern: str
    kind: CollectionKind
    single_file: bool = False

    @property
    def source(self) -> Literal["memory", "sessions"]:
        """The search-result source of this collection's hits."""
        return "sessions" if self.kind == "sessions" else "memory"

    @property
    def is_root_file(self) -> bool:
        """Whether this is the root-file collection (``memory-root-<agent>``)."""
        return self.kind == "memory" and self.pattern in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE)

    def rule_root(self) -> MemoryRoot:
        """This collection as a root of the memory-file rule."""
        if self.is_root_file:
            return MemoryRoot(self.path, self.pattern, "root", self.path / self.pattern)
        return MemoryRoot(self.path, self.pattern, "memory" if self.kind == "memory" else "extra",
                          self.path)

    def root_moved(self) -> bool:
        """Whether this is the root-file collection and the root file of its workspace now has
        another name (``MEMORY.md`` created beside a legacy ``memory.md``, or removed)."""
        return self.is_root_file and self.pattern != _root_pattern(self.path)

    def admits(self, rel: str) -> bool:
        """Whether a file qmd returned (``rel`` to :attr:`path`, ``/``-separated) is one this collection
        indexes by the memory-file rule (for the root-file collection: the current root file)."""
        if not self.rule_root().admits(rel):
            return False
        if self.is_root_file:
            current = root_memory_file(self.path).name
            return current is None or rel == current
        return True


def _root_pattern(workspace: Path) -> str:
    """The pattern of the root-file collection: the memory-file rule's root file of the moment
    (``MEMORY.md`` when there is none yet)."""
    return memory_roots(workspace, [])[0].pattern


def sanitize_name(raw: str, *, empty: str = "collection") -> str:
    """Lower-case, runs outside ``[a-z0-9-]`` as ``-``, ``-`` trimmed; ``empty`` if blank."""
    s = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return s or empty


def _resolve_user_path(raw: str, workspace: Path) -> Path | None:
    try:
        return Path(_norm_path(raw.strip(), workspace)) if raw.strip() else None
    except (OSError, RuntimeError, ValueError):
        return None


def rule_extra_paths(agent: ResolvedAgent) -> list[str | ExtraPath]:
    """The memory-file rule's extra paths in qmd mode: ``memorySearch.extraPaths`` then the custom
    collections (``memory.qmd.paths[]``, ``memorySearch.qmd.extraCollections[]``), without repeats."""
    custom = [*agent.memory.qmd.paths, *agent.memory_search.qmd.extra_collections]
    out: list[str | ExtraPath] = []
    for entry in [*agent.memory_search.extra_paths, *(ExtraPath(path=c.path, pattern=c.pattern) for c in custom)]:
        if entry not in out:
            out.append(entry)
    return out


def fallback_engine_settings(agent: ResolvedAgent) -> EngineSettings:
    """The builtin engine's settings when it stands in for qmd: every custom collection among the
    extra paths, so it indexes and reads the files qmd does."""
    search = agent.engine.search.model_copy(update={"extra_paths": rule_extra_paths(agent)})
    return agent.engine.model_copy(update={"search": search})


def _realpath(p: Path) -> Path:
    try:
        return Path(os.path.realpath(p))
    except (OSError, RuntimeError, ValueError):  # ValueError: a NUL byte (a hand-edited index.yml)
        return p


def build_collections(agent: ResolvedAgent, *, sessions_dir: Path) -> list[ManagedCollection]:
    """The agent's managed collections in config order (spec 2.2), without repeated (path, pattern):
    ``memory-root-<agent>`` and ``memory-dir-<agent>`` (``includeDefaultMemory``), the custom ones
    (``memory.qmd.paths``, ``memorySearch.extraPaths``, ``extraCollections``; a file becomes its
    folder and escaped name, a symlink is skipped), ``sessions-<agent>`` (in ``sessions_dir``
    unless ``sessions.exportDir``). Names are sanitised and made unique."""
    ws = agent.workspace_dir
    qmd = agent.memory.qmd
    agent_seg = sanitize_name(agent.agent_id, empty="agent")
    taken: set[str] = set()
    out: list[ManagedCollection] = []

    def unique(base: str) -> str:
        name = sanitize_name(base)
        candidate, n = name, 2
        while candidate in taken:
            candidate, n = f"{name}-{n}", n + 1
        taken.add(candidate)
        return candidate

    if qmd.include_default_memory:
        out.append(ManagedCollection(unique(f"memory-root-{agent_seg}"), ws, _root_pattern(ws), "memory"))
        out.append(ManagedCollection(unique(f"memory-dir-{agent_seg}"), ws / MEMORY_DIR_NAME,
                                     DEFAULT_PATTERN, "memory"))

    entries: list[tuple[str, str | None, str | None]] = [
        (p.path, p.name, p.pattern) for p in qmd.paths]
    entries += [(p, None, None) if isinstance(p, str) else (p.path, None, p.pattern)
                for p in agent.memory_search.extra_paths]
    entries += [(c.path, c.name, c.pattern) for c in agent.memory_search.qmd.extra_collections]
    seen: set[tuple[str, str]] = set()
    for i, (raw_path, raw_name, raw_pattern) in enumerate(entries, start=1):
        if _resolve_user_path(raw_path, ws) is None:
            continue
        (root,) = extra_roots(ws, [ExtraPath(path=raw_path, pattern=raw_pattern)]) or (None,)
        if root is None:
            continue
        if root.entry.is_symlink():
            log.warning("qmd custom collection path %s is a symlink; skipped (memory files are "
                        "never reached through symlinks)", root.entry)
            continue
        path, pattern = root.path, root.pattern
        key = (str(path), pattern)
        if key in seen:
            continue
        seen.add(key)
        explicit = (raw_name or "").strip()
        inside = path.is_relative_to(ws) or _realpath(path).is_relative_to(_realpath(ws))
        base = explicit if explicit and not inside else (
            f"{sanitize_name(explicit or f'custom-{i}')}-{agent_seg}")
        out.append(ManagedCollection(unique(base), path, pattern, "custom",
                                     single_file=root.entry != root.path))

    if qmd.sessions.enabled:
        export = _resolve_user_path(qmd.sessions.export_dir, ws) if qmd.sessions.export_dir else None
        out.append(ManagedCollection(unique(f"sessions-{agent_seg}"), export or sessions_dir,
                                     DEFAULT_PATTERN, "sessions"))
    return out


# run(args, positionals) -> RunResult; raises BackendUnavailableError (timeout, spawn).
RunCollectionCommand = Callable[[list[str], list[str]], Awaitable[RunResult]]


@dataclass
class ReconcileState:
    """What reconciliation remembers across calls (one per backend).

    Attributes:
        pattern_flag / flags_tried: the ``collection add`` pattern flag that last worked, and every one tried.
        warnings: warnings of the last run.
        refused: collections not searched through qmd (it ignored the pattern flags), with the reason.
        missing: custom collections whose path does not exist yet, with that path.
        unreadable_yml: qmd's error when it could not parse ``index.yml`` in the last run.
        timed_out: the reason of the command that timed out in the last run (the commands after
            it were not run: a qmd that hangs on one hangs on the next), else ``None``.
    """

    pattern_flag: str = "--mask"
    flags_tried: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    unreadable_yml: str | None = None
    timed_out: str | None = None

    def no_usable_collection(self, colls: Sequence[ManagedCollection]) -> str | None:
        """``qmd has no usable collection: <the first refusal>`` when every one of ``colls`` is
        refused, else ``None``."""
        if not colls or any(c.name not in self.refused for c in colls):
            return None
        return f"qmd has no usable collection: {self.refused[colls[0].name]}"


def _norm_path(raw: str | Path, workspace: Path) -> str:
    p = Path(raw).expanduser()
    return os.path.normpath(p if p.is_absolute() else workspace / p)


def _failed(reason: str) -> RunResult:
    """A command that did not run, ``reason`` as its stderr."""
    return RunResult((), 1, None, "", reason, 0)


async def _safe(run: RunCollectionCommand, args: list[str], pos: list[str]) -> RunResult:
    try:
        return await run(args, pos)
    except BackendUnavailableError as exc:
        return _failed(str(exc))


async def reconcile(managed: list[ManagedCollection], *, run: RunCollectionCommand,
                    agent_id: str, workspace: Path, state: ReconcileState) -> None:
    """Make qmd's collections match ``managed`` (spec 2.6), running each command through ``run``;
    never raises for qmd errors: list, remove unscoped legacy names of ``agent_id``, then skip,
    rebind or add (``--mask``, then ``--glob``) each. ``state`` is reset here."""
    state.warnings = []
    state.refused = {}
    state.missing = {}
    state.unreadable_yml = None
    listing = await _safe(run, ["collection", "list", "--json"], [])
    if not listing.ok and _YML_UNREADABLE_RE.search(listing.message):
        state.unreadable_yml = one_line(listing.message)  # the caller writes it again
        return
    listed = parse_collection_list(listing.stdout) if listing.ok else {}
    await _enrich(listed, [mc.name for mc in managed], run)
    await _migrate_legacy(managed, listed, run=run, agent_id=agent_id, workspace=workspace)
    for mc in managed:
        got = listed.get(mc.name)
        if got is not None and not _needs_rebind(mc, got, workspace):
            continue
        if mc.kind == "custom" and not mc.path.is_dir():  # a typo, or a folder made later
            state.missing[mc.name] = str(mc.path)
            _warn(state, f"qmd collection {mc.name} not added: {mc.path} does not exist (yet); "
                  "it is added once it does")
            continue
        if got is not None:
            log.info("qmd collection %s is bound to %s (%s); rebinding to %s (%s)", mc.name,
                     got.path, got.pattern, mc.path, mc.pattern)
            await _remove(run, mc.name)
        await _add_with_conflicts(mc, run=run, listed=listed, state=state, workspace=workspace)


async def _enrich(listed: dict[str, ListedCollection], names: list[str],
                  run: RunCollectionCommand) -> None:
    """Fill in the path of each listed collection of ``names`` from ``collection show``."""
    for name in names:
        got = listed.get(name)
        if got is not None and got.path is None:
            shown = await _safe(run, ["collection", "show"], [name])
            info = parse_collection_show(shown.stdout) if shown.ok else None
            if info is not None:
                listed[name] = ListedCollection(name, info.path, got.pattern or info.pattern)


async def describe_collections(list_output: str, *, run: RunCollectionCommand,
                               roots: dict[str, ManagedCollection]) -> list[dict[str, object]]:
    """``qmd collection list`` output as ``[{name, path, pattern, managed, kind}]``, paths from
    ``collection show``."""
    listed = parse_collection_list(list_output)
    await _enrich(listed, list(listed), run)
    return [{"name": name, "path": got.path, "pattern": got.pattern, "managed": name in roots,
             "kind": roots[name].kind if name in roots else None} for name, got in listed.items()]


def _needs_rebind(mc: ManagedCollection, got: ListedCollection, workspace: Path) -> bool:
    if got.path is None and got.pattern is None:
        return False  # names-only listing: a failed re-add would lose the collection
    if got.path is not None and not _same_path(got.path, mc.path, workspace):
        return True
    return got.pattern is not None and got.pattern != mc.pattern


async def _migrate_legacy(managed: list[ManagedCollection], listed: dict[str, ListedCollection], *,
                          run: RunCollectionCommand, agent_id: str, workspace: Path) -> None:
    suffix = "-" + sanitize_name(agent_id, empty="agent")
    for mc in managed:
        if mc.name in listed or not mc.name.endswith(suffix):
            continue
        legacy = mc.name[: -len(suffix)]
        got = listed.get(legacy)
        if not legacy or got is None:
            continue
        path_ok = got.path is None or _norm_path(got.path, workspace) == _norm_path(mc.path, workspace)
        if path_ok and (got.pattern is None or got.pattern == mc.pattern):
            await _remove(run, legacy)
            listed.pop(legacy, None)
        else:
            log.debug("qmd legacy collection migration skipped for %s (path/pattern mismatch)",
                      legacy)


async def _remove(run: RunCollectionCommand, name: str) -> None:
    res = await _safe(run, ["collection", "remove"], [name])
    if not res.ok and not is_missing_collection(res.message):
        log.warning("qmd collection remove failed for %s: %s", name, res.message)


def _same_path(a: str | Path, b: str | Path, workspace: Path) -> bool:
    na, nb = _norm_path(a, workspace), _norm_path(b, workspace)
    if os.name == "nt":
        na, nb = na.casefold(), nb.casefold()
    return na == nb or _realpath(Path(na)) == _realpath(Path(nb))


async def _read_back(mc: ManagedCollection, run: RunCollectionCommand) -> ListedCollection | None:
    """What qmd recorded for ``mc`` (``collection show``, else the list), or ``None``."""
    shown = await _safe(run, ["collection", "show"], [mc.name])
    if shown.ok:
        return parse_collection_show(shown.stdout)
    listing = await _safe(run, ["collection", "list", "--json"], [])
    return parse_collection_list(listing.stdout).get(mc.name) if listing.ok else None


async def _add(mc: ManagedCollection, *, run: RunCollectionCommand,
               state: ReconcileState) -> RunResult:
    """``collection add`` with the remembered pattern flag, then the other one; a success is kept
    only when qmd recorded this path and pattern (read back), else removed, and when no flag is
    honoured the collection goes to ``state.refused``."""
    if mc.kind != "custom" and any(ch in mc.pattern for ch in "*?["):
        try:  # the workspace's own memory/ (never a configured path: a typo would be created)
            mc.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _failed(f"cannot create collection dir {mc.path}: {exc}")
    order = [state.pattern_flag] + [f for f in ("--mask", "--glob") if f != state.pattern_flag]
    ignored: list[str] = []
    moved = False  # a read-back named another folder (not only another pattern)
    for i, flag in enumerate(order):
        state.flags_tried.append(flag)
        res = await _safe(run, ["collection", "add", "--name", mc.name, flag, mc.pattern],
                          [str(mc.path)])
        if res.ok:
            got = await _read_back(mc, run)
            same_path = got is None or got.path is None or _same_path(got.path, mc.path, mc.path)
            if got is None or (same_path and (got.pattern is None or got.pattern == mc.pattern)):
                state.pattern_flag = flag
                state.refused.pop(mc.name, None)
                return res
            moved = moved or not same_path
            ignored.append(f"{flag} {mc.pattern!r} gave path {got.path} pattern {got.pattern!r}")
            log.warning("qmd collection add %s %s %r recorded path %s pattern %r; removing it",
                        mc.name, flag, mc.pattern, got.path, got.pattern)
            await _remove(run, mc.name)
            continue
        if i + 1 < len(order) and is_flag_rejection(res.stderr):
            log.info("qmd collection add rejected %s; retrying with legacy compatibility flag", flag)
            continue
        if not ignored:
            return res
    if ignored:
        cause = ("records another folder than the one added" if moved else
                 "does not honour the pattern flag")
        reason = (f"qmd collection {mc.name} not searched through qmd: this qmd {cause} "
                  f"({'; '.join(ignored)}; wanted {mc.path} {mc.pattern!r}); "
                  "upgrade qmd (2.8.3 honours --mask and --glob)")
        state.refused[mc.name] = reason
        _warn(state, reason)
        return _failed(reason)
    return res


async def _add_with_conflicts(mc: ManagedCollection, *, run: RunCollectionCommand,
                              listed: dict[str, ListedCollection], state: ReconcileState,
                              workspace: Path) -> None:
    res = await _add(mc, run=run, state=state)
    if res.ok or mc.name in state.refused:
        return
    msg = res.message
    if "exists" not in msg.lower():
        _warn(state, f"qmd collection add failed for {mc.name}: {one_line(msg)}")
        return
    low = msg.lower()
    if f"collection '{mc.name}' already exists" in low or f'collection "{mc.name}" already exists' in low:
        log.info("qmd collection add conflict for %s: collection name already exists; "
                 "recreating managed collection", mc.name)
        await _replace(mc, mc.name, run=run, state=state)
        return
    owner = _find_owner(mc, listed, workspace)
    if owner is None:
        relist = await _safe(run, ["collection", "list", "--json"], [])
        if relist.ok:
            listed.update(parse_collection_list(relist.stdout))
            await _enrich(listed, list(listed), run)
            owner = _find_owner(mc, listed, workspace)
    if owner == mc.name:
        return
    if owner is not None:
        log.info("qmd collection %s: path+pattern already bound by %s; rebinding", mc.name, owner)
        await _replace(mc, owner, run=run, state=state)
        return
    named = _NAME_IN_STDERR_RE.search(msg)
    if named:
        other = named.group(1)
        _warn(state, f"qmd collection add for {mc.name}: qmd reported existing collection {other}, "
              "but list output did not include verifiable path/pattern metadata; refusing "
              f"automatic rebind. If {other} is stale, remove it manually with "
              f"'qmd collection remove {other}'")
        return
    _warn(state, f"qmd collection add skipped for {mc.name}: {msg}")


async def _replace(mc: ManagedCollection, old: str, *, run: RunCollectionCommand,
                   state: ReconcileState) -> None:
    """Remove collection ``old`` and add ``mc`` (a warning when the add fails)."""
    await _remove(run, old)
    res = await _add(mc, run=run, state=state)
    if not res.ok:
        _warn(state, f"qmd collection add skipped for {mc.name}: {res.message}")


def _find_owner(mc: ManagedCollection, listed: dict[str, ListedCollection],
                workspace: Path) -> str | None:
    return next((name for name, got in listed.items() if got.path is not None
                 and got.pattern == mc.pattern and _same_path(got.path, mc.path, workspace)), None)


def _warn(state: ReconcileState, message: str) -> None:
    log.warning("%s", message)
    state.warnings.append(message)


def render_index_yml(managed: list[ManagedCollection]) -> str:
    """``index.yml`` holding exactly ``managed``, keys and values JSON-quoted."""
    if not managed:
        return "collections: {}\n"
    lines = ["collections:"]
    for mc in managed:
        lines.append(f"  {orjson.dumps(mc.name).decode()}:")
        lines.append(f"    path: {orjson.dumps(str(mc.path)).decode()}")
        lines.append(f"    pattern: {orjson.dumps(mc.pattern).decode()}")
    return "\n".join(lines) + "\n"


async def rebuild(managed: list[ManagedCollection], *, run: RunCollectionCommand,
                  index_yml: Path, state: ReconcileState) -> None:
    """Update repair (spec 2.7.2): rewrite ``index_yml`` with the managed collections, then remove
    and add each one. Never raises for qmd errors.

    Raises:
        OSError: ``index_yml`` cannot be written.
    """
    index_yml.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(index_yml, render_index_yml(managed).encode("utf-8"))
    for mc in managed:
        await _remove(run, mc.name)
        res = await _add(mc, run=run, state=state)
        if not res.ok and "exists" not in res.message.lower():
            _warn(state, f"qmd collection re-add failed for {mc.name}: {res.message}")
    log.warning("qmd managed collections rebuilt for update repair (%d collections)", len(managed))
