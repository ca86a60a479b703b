"""Collections from config, qmd list/show parsing, reconciliation decisions (spec 2.2, 2.6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.sources.memory_files import escape_glob
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.collections import (
    ManagedCollection,
    ReconcileState,
    build_collections,
    reconcile,
    render_index_yml,
    sanitize_name,
)
from qmdbridge.qmd.listing import ListedCollection, parse_collection_list, parse_collection_show
from qmdbridge.qmd.runner import RunResult

LIST_283 = """Collections (3):

memory-root-main (qmd://memory-root-main/)
  Pattern:  MEMORY.md
  Files:    1
  Updated:  0s ago

memory-dir-main (qmd://memory-dir-main/)
  Pattern:  **/*.md
  Files:    1
  Updated:  0s ago

old-one (qmd://old-one/) [excluded]
  Pattern:  *.txt

"""


def _agent(tmp_path: Path, memory: dict, search: dict | None = None, agent_id: str = "main"):
    cfg = parse_config({"memory": memory, "agents": {"defaults": {"memorySearch": search or {}}}})
    return resolve_agent(cfg, agent_id, workspace=tmp_path / "ws",
                         env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})


def test_build_defaults_custom_and_sessions(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "one [draft].md").write_text("x")
    outside = tmp_path / "notes"
    outside.mkdir()
    agent = _agent(tmp_path, {"qmd": {"paths": [{"path": str(outside), "name": "Notes"},
                                                {"path": "docs/one [draft].md"},
                                                {"path": str(outside), "name": "dup"}],
                                      "sessions": {"enabled": True}}},
                   {"extraPaths": ["docs"], "qmd": {"extraCollections": [{"path": "docs", "name": "docs"}]}})
    got = build_collections(agent, sessions_dir=tmp_path / "exp")
    assert [(c.name, c.path, c.pattern, c.kind) for c in got] == [
        ("memory-root-main", ws, "MEMORY.md", "memory"),
        ("memory-dir-main", ws / "memory", "**/*.md", "memory"),
        ("notes", outside, "**/*.md", "custom"),
        ("custom-2-main", ws / "docs", "one \\[draft\\].md", "custom"),
        ("custom-4-main", ws / "docs", "**/*.md", "custom"),
        ("sessions-main", tmp_path / "exp", "**/*.md", "sessions")]


def test_names_sanitised_and_unique(tmp_path: Path) -> None:
    agent = _agent(tmp_path, {"qmd": {"includeDefaultMemory": False, "paths": [
        {"path": "a", "name": "My Notes!"}, {"path": "b", "name": "my notes"}]}}, agent_id="Ops Bot")
    assert [c.name for c in build_collections(agent, sessions_dir=tmp_path)] == [
        "my-notes-ops-bot", "my-notes-ops-bot-2"]
    assert sanitize_name("--") == "collection"
    assert escape_glob("a*b?(c).md") == "a\\*b\\?\\(c\\).md"


def test_parse_list_text_283() -> None:
    assert parse_collection_list(LIST_283) == {
        "memory-root-main": ListedCollection("memory-root-main", None, "MEMORY.md"),
        "memory-dir-main": ListedCollection("memory-dir-main", None, "**/*.md")}


def test_parse_list_json_and_empty() -> None:
    assert parse_collection_list('["a", {"name": "b", "path": "/x", "mask": "*.md"}]') == {
        "a": ListedCollection("a"), "b": ListedCollection("b", "/x", "*.md")}
    assert parse_collection_list("No collections found. Run 'qmd collection add .' to create one.\n") == {}


def test_parse_show() -> None:
    text = ("Collection: memory-root-main\n  Path:     /tmp/ws\n  Pattern:  MEMORY.md\n"
            "  Include:  yes (default)\n")
    assert parse_collection_show(text) == ListedCollection("memory-root-main", "/tmp/ws", "MEMORY.md")
    assert parse_collection_show("Collection not found: x\n") is None


def test_render_index_yml_quotes_values() -> None:
    mc = ManagedCollection("n", Path("/a/Notes #1: blue"), "**/* #tag: [draft].md", "custom")
    assert render_index_yml([mc]) == ('collections:\n  "n":\n    path: "/a/Notes #1: blue"\n'
                                      '    pattern: "**/* #tag: [draft].md"\n')
    assert render_index_yml([]) == "collections: {}\n"


def _ran(ok: bool, stdout: str, stderr: str) -> RunResult:
    """A finished qmd command: exit 0 when ``ok``, else 1."""
    return RunResult(("qmd",), 0 if ok else 1, None, stdout, stderr, 0)


class FakeQmd:
    """Answers collection commands like a qmd build (not our code): records every call; a
    collection added (with the pattern it was given) shows up in later listings."""

    def __init__(self, listing: str, *, reject: tuple[str, ...] = ()) -> None:
        self.listing = listing
        self.reject = reject
        self.calls: list[list[str]] = []
        self.added: dict[str, str] = {}

    async def __call__(self, args: list[str], pos: list[str]) -> RunResult:
        self.calls.append([*args, *pos])
        if args[:2] == ["collection", "list"]:
            extra = "".join(f"{n} (qmd://{n}/)\n  Pattern:  {p}\n\n" for n, p in self.added.items())
            return _ran(True, self.listing + ("\n" + extra if extra else ""), "")
        if args[:2] == ["collection", "add"] and args[4] in self.reject:
            return _ran(False, "", f"error: unknown flag: {args[4]}")
        if args[:2] == ["collection", "add"]:
            self.added[args[3]] = args[5]
        if args[:2] == ["collection", "show"]:
            return _ran(False, "", f"Collection not found: {pos[0]}")
        return _ran(True, "", "")


@pytest.mark.anyio
async def test_names_only_listing_never_rebinds(tmp_path: Path) -> None:
    managed = [ManagedCollection("memory-root-main", tmp_path, "MEMORY.md", "memory")]
    fake = FakeQmd('["memory-root-main"]')
    await reconcile(managed, run=fake, agent_id="main", workspace=tmp_path, state=ReconcileState())
    assert fake.calls == [["collection", "list", "--json"], ["collection", "show", "memory-root-main"]]


@pytest.mark.anyio
async def test_changed_pattern_rebinds_and_mask_then_glob_remembered(tmp_path: Path) -> None:
    managed = [ManagedCollection("memory-root-main", tmp_path, "MEMORY.md", "memory"),
               ManagedCollection("memory-dir-main", tmp_path / "memory", "**/*.md", "memory"),
               ManagedCollection("notes-main", tmp_path / "notes", "**/*.md", "custom")]
    fake = FakeQmd("memory-root-main (qmd://memory-root-main/)\n  Pattern:  *.txt\n\n",
                   reject=("--mask",))
    state = ReconcileState()
    (tmp_path / "notes").mkdir()  # a configured folder is never created (see below)
    await reconcile(managed, run=fake, agent_id="main", workspace=tmp_path, state=state)
    assert ["collection", "remove", "memory-root-main"] in fake.calls
    assert state.flags_tried == ["--mask", "--glob", "--glob", "--glob"]
    assert state.pattern_flag == "--glob"
    assert (tmp_path / "memory").is_dir()  # the workspace's own memory/ is


@pytest.mark.anyio
async def test_custom_collection_of_a_missing_folder_is_not_added_nor_created(tmp_path: Path) -> None:
    managed = [ManagedCollection("memory-dir-main", tmp_path / "memory", "**/*.md", "memory"),
               ManagedCollection("notes", tmp_path / "notse", "**/*.md", "custom")]
    fake = FakeQmd("")
    state = ReconcileState()
    await reconcile(managed, run=fake, agent_id="main", workspace=tmp_path, state=state)
    assert not (tmp_path / "notse").exists()
    assert not any(c[:2] == ["collection", "add"] and "notes" in c for c in fake.calls)
    assert state.missing == {"notes": str(tmp_path / "notse")}
    assert state.warnings == [f"qmd collection notes not added: {tmp_path / 'notse'} does not exist "
                              "(yet); it is added once it does"]


@pytest.mark.anyio
async def test_legacy_unscoped_name_removed_when_matching(tmp_path: Path) -> None:
    managed = [ManagedCollection("memory-dir-main", tmp_path / "memory", "**/*.md", "memory")]
    fake = FakeQmd(f'[{{"name": "memory-dir", "path": "{tmp_path / "memory"}", "pattern": "**/*.md"}},'
                   f' {{"name": "memory-alt", "path": "{tmp_path}", "pattern": "memory.md"}}]')
    await reconcile(managed, run=fake, agent_id="main", workspace=tmp_path, state=ReconcileState())
    assert ["collection", "remove", "memory-dir"] in fake.calls
    assert not any(c[:2] == ["collection", "remove"] and c[2] == "memory-alt" for c in fake.calls)


@pytest.mark.anyio
async def test_owner_that_cannot_be_verified_is_not_rebound(tmp_path: Path) -> None:
    """qmd refuses the add naming another collection that holds the folder, but its listing
    gives no path to check that against: nothing is removed, a warning says what to do."""
    (tmp_path / "notes").mkdir()
    managed = [ManagedCollection("notes", tmp_path / "notes", "**/*.md", "custom")]

    class Refusing(FakeQmd):
        async def __call__(self, args: list[str], pos: list[str]) -> RunResult:
            if args[:2] == ["collection", "add"]:
                self.calls.append([*args, *pos])
                return _ran(False, "", "A collection already exists for this path and "
                                     "pattern:\n  Name: old-notes (qmd://old-notes/)\n")
            return await super().__call__(args, pos)

    fake = Refusing('["old-notes"]')
    state = ReconcileState()
    await reconcile(managed, run=fake, agent_id="main", workspace=tmp_path, state=state)
    assert not any(c[:2] == ["collection", "remove"] for c in fake.calls)
    assert state.warnings == [
        "qmd collection add for notes: qmd reported existing collection old-notes, but list output "
        "did not include verifiable path/pattern metadata; refusing automatic rebind. If old-notes "
        "is stale, remove it manually with 'qmd collection remove old-notes'"]


def test_custom_collection_path_that_is_a_symlink_is_skipped(tmp_path: Path) -> None:
    """Memory files are never reached through symlinks: a custom path that is one is no collection."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    agent = _agent(tmp_path, {"qmd": {"includeDefaultMemory": False, "paths": [
        {"path": str(tmp_path / "link"), "name": "linked"}, {"path": str(tmp_path / "real"), "name": "real"}]}})
    assert [(c.name, c.path) for c in build_collections(agent, sessions_dir=tmp_path / "s")] == [
        ("real", tmp_path / "real")]
