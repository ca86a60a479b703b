"""Tool handlers: schemas, success payloads, and errors as ``disabled`` payloads (never raised)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import MemoryManager
from qmdbridge.tools import (
    MEMORY_GET_SCHEMA,
    MEMORY_SEARCH_SCHEMA,
    SYNC_SCHEMA,
    handle_memory_get,
    handle_memory_search,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def manager(tmp_path: Path) -> MemoryManager:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("Coffee: flat white with oat milk.\n")
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    return MemoryManager(resolve_agent(cfg, workspace=ws, env=env), env=env)


def test_schemas() -> None:
    assert MEMORY_SEARCH_SCHEMA["name"] == "memory_search"
    assert MEMORY_SEARCH_SCHEMA["parameters"]["required"] == ["query"]
    assert MEMORY_GET_SCHEMA["name"] == "memory_get"
    assert set(MEMORY_GET_SCHEMA["parameters"]["properties"]) == {"path", "from", "lines", "fromChar", "corpus"}


def test_the_published_schema_holds_the_tools_parameters() -> None:
    """docs/serve-protocol.schema.json's parameters are the tools' own: a default changed in a
    settings model (which the tools read) and not in the published file fails here."""
    published = json.loads((Path(__file__).resolve().parents[2] / "docs" / "serve-protocol.schema.json")
                           .read_text())["$defs"]
    assert [published[name] for name in ("memorySearchParams", "memoryGetParams", "syncParams")] == [
        schema["parameters"] for schema in (MEMORY_SEARCH_SCHEMA, MEMORY_GET_SCHEMA, SYNC_SCHEMA)]
    # a hit's snippet budget: the builtin engine's constant, qmd's memory.qmd.limits.maxSnippetChars
    from fallback.search.fts_only import SNIPPET_MAX_CHARS
    from qmdbridge.config import QmdLimits

    snippet = published["hit"]["properties"]["snippet"]["description"]
    assert (SNIPPET_MAX_CHARS, snippet.split(" (")[0]) == (
        QmdLimits.model_fields["max_snippet_chars"].default, f"At most {SNIPPET_MAX_CHARS} code points")


def test_the_tools_read_the_defaults_the_settings_models_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A default the settings models (or the read page) own is read from them, never written again
    in the schemas: the tools module run with other defaults in the models says those."""
    import fallback.sources.read_page as read_page
    import qmdbridge.tools
    from fallback.settings import QuerySettings
    from qmdbridge.config import QmdLimits

    monkeypatch.setattr(QuerySettings.model_fields["max_results"], "default", 9)
    monkeypatch.setattr(QuerySettings.model_fields["min_score"], "default", 0.25)
    monkeypatch.setattr(QmdLimits.model_fields["max_results"], "default", 7)
    monkeypatch.setattr(read_page, "DEFAULT_READ_LINES", 80)
    spec = importlib.util.spec_from_file_location("tools_with_other_defaults", qmdbridge.tools.__file__)
    assert spec is not None and spec.loader is not None
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)  # a copy: qmdbridge.tools itself keeps the real defaults
    search = tools.MEMORY_SEARCH_SCHEMA["parameters"]["properties"]
    get = tools.MEMORY_GET_SCHEMA
    assert [search["maxResults"]["description"], search["minScore"]["description"],
            get["parameters"]["properties"]["lines"]["description"], get["description"].split(". ")[1]] == [
        "Hits wanted (default query.maxResults, 9, on the builtin engine; memory.qmd.limits.maxResults, 7,"
        " on the qmd backend).",
        "Score floor (default query.minScore, 0.25, on the builtin engine; none on the qmd backend).",
        "Lines wanted (default 80).",
        "Pages of 80 lines; follow the continuation notice's 'from' (and 'fromChar' for a long line) to read on."]


async def test_search_and_get_payloads(manager: MemoryManager) -> None:
    async with manager:
        out = await handle_memory_search(manager, {"query": "oat milk", "maxResults": 3},
                                         session_key="agent:main:main")
        assert out["backend"] == "builtin" and out["citations"] == "auto"
        assert out["results"][0]["path"] == "MEMORY.md"
        assert out["results"][0]["snippet"].endswith("Source: MEMORY.md#L1")
        page = await handle_memory_get(manager, {"path": "MEMORY.md", "from": 1, "lines": 5})
        assert page["text"] == "Coffee: flat white with oat milk." and page["from"] == 1
        rest = await handle_memory_get(manager, {"path": "MEMORY.md", "from": 1, "fromChar": 9})
        assert rest["text"] == "flat white with oat milk."
        assert (await handle_memory_get(manager, {"path": "MEMORY.md", "fromChar": "9"}))["error"] == (
            "fromChar must be an integer, not '9'")


async def test_corpus_memory_refuses_a_file_of_qmds_sessions_collection(tmp_path: Path) -> None:
    """Under the qmd backend a session hit cites ``qmd/sessions-<agent>/<id>.md``: corpus
    ``memory`` refuses it before qmd is asked, as it refuses the builtin's ``sessions/...``."""
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"sessions": {"enabled": True}}},
                        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    async with MemoryManager(resolve_agent(cfg, workspace=ws, env=env), env=env) as m:
        for path in ("qmd/sessions-main/s1.md", "sessions/s1.jsonl"):
            assert await handle_memory_get(m, {"path": path, "corpus": "memory"}) == {
                "path": path, "text": "", "disabled": True, "refused": True,
                "error": f"path refused: {path!r}: a session transcript, outside corpus 'memory' "
                         "(read it with corpus all)"}


async def test_errors_become_disabled_payloads(manager: MemoryManager) -> None:
    async with manager:
        assert await handle_memory_search(manager, {}) == {
            "results": [], "disabled": True, "error": "query required"}
        # the request's own checks (fallback/request.py), in the words every route uses
        assert await handle_memory_search(manager, {"query": 5}) == {
            "results": [], "disabled": True, "error": "query must be a string, not int"}
        blank = await handle_memory_search(manager, {"query": "  "})
        assert blank["disabled"] is True and blank["error"] == "query must not be empty"
        refused = await handle_memory_get(manager, {"path": "../../etc/passwd"})
        assert refused["refused"] is True and refused["disabled"] is True and refused["text"] == ""
        assert (await handle_memory_get(manager, {}))["error"] == "path required"
        # a blank path is refused by the memory-file rule, as `qmdbridge get ""` refuses it
        assert await handle_memory_get(manager, {"path": " "}) == {
            "path": " ", "text": "", "disabled": True, "refused": True, "error": "path refused: ' ': empty path"}
        assert await handle_memory_get(manager, {"path": 5}) == {
            "path": "", "text": "", "disabled": True, "refused": False, "error": "path must be a string, not int"}
        (manager.agent.workspace_dir / "memory" / "blob.md").write_bytes(b"GIF\x00\x01\x02\n")
        assert await handle_memory_get(manager, {"path": "memory/blob.md"}) == {
            "path": "memory/blob.md", "text": "", "disabled": True, "refused": True,
            "error": "path refused: 'memory/blob.md': binary file (NUL bytes)"}
        denied = await handle_memory_search(manager, {"query": "oat"}, session_key="agent:main:wa:group:g1")
        assert denied["results"] == [] and denied["denied"]["allowed"] is False


async def test_sub_agent_searches_with_the_key_it_inherits(manager: MemoryManager) -> None:
    async with manager:
        alone = await handle_memory_search(manager, {"query": "oat milk"},
                                           session_key="agent:main:subagent:7f3c")
        assert alone["results"] == [] and alone["denied"]["allowed"] is False
        out = await handle_memory_search(manager, {"query": "oat milk"},
                                         session_key="agent:main:subagent:7f3c",
                                         session_keys=["agent:main:main"])
        assert out["denied"] is None and [r["path"] for r in out["results"]] == ["MEMORY.md"]
        bad = await handle_memory_search(manager, {"query": "oat"}, session_keys="agent:main:main")  # type: ignore[arg-type]
        assert bad == {"results": [], "disabled": True,
                       "error": "inherited session keys must be a list of strings"}


BAD_AND_GOOD = [  # (tool, params) pairs around every parameter's type
    ("memory_search", {"query": "oat", "maxResults": "5"}), ("memory_search", {"query": "oat", "maxResults": True}),
    ("memory_search", {"query": "oat", "maxResults": 2.5}), ("memory_search", {"query": "oat", "maxResults": 5.0}),
    ("memory_search", {"query": "oat", "maxResults": 5}), ("memory_search", {"query": "oat", "minScore": "0.1"}),
    ("memory_search", {"query": "oat", "minScore": 0}), ("memory_search", {"query": "oat", "minScore": None}),
    ("memory_search", {"query": "oat", "max_results": 5}), ("memory_get", {"path": "MEMORY.md", "from": "1"}),
    ("memory_get", {"path": "MEMORY.md", "lines": 3}), ("memory_get", {"path": "MEMORY.md", "lines": [3]}),
    ("memory_get", {"path": "MEMORY.md", "offset": 3}),
]


@pytest.mark.parametrize(("tool", "params"), BAD_AND_GOOD)
def test_param_error_refuses_what_the_mcp_schema_validation_refuses(tool: str, params: dict[str, object]) -> None:
    """serve and mcp share the handlers; mcp's SDK validates the schema with jsonschema first, so
    the handlers' own check must refuse exactly the same parameters."""
    jsonschema = pytest.importorskip("jsonschema")
    from qmdbridge.tools import param_error

    schema = MEMORY_SEARCH_SCHEMA if tool == "memory_search" else MEMORY_GET_SCHEMA
    by_sdk = list(jsonschema.Draft202012Validator(schema["parameters"]).iter_errors(params))
    assert (param_error(schema, params) is not None) == bool(by_sdk), by_sdk


async def test_params_of_the_wrong_type_are_refused_not_ignored(manager: MemoryManager) -> None:
    async with manager:
        assert await handle_memory_search(manager, {"query": "oat", "maxResults": "5"}) == {
            "results": [], "disabled": True, "error": "maxResults must be an integer, not '5'"}
        assert (await handle_memory_search(manager, {"query": "oat", "minScore": "0.1"}))["error"] == (
            "minScore must be a number, not '0.1'")
        assert (await handle_memory_search(manager, {"query": "oat", "max_results": 1}))["error"] == (
            "unknown parameter 'max_results' (memory_search takes query, maxResults, minScore, corpus)")
        assert await handle_memory_get(manager, {"path": "MEMORY.md", "from": "2"}) == {
            "path": "MEMORY.md", "text": "", "disabled": True, "refused": False,
            "error": "from must be an integer, not '2'"}
        ok = await handle_memory_search(manager, {"query": "oat milk", "maxResults": 1.0, "minScore": 0})
        assert [r["path"] for r in ok["results"]] == ["MEMORY.md"]


async def test_serve_sync_refuses_a_force_that_is_not_a_boolean(manager: MemoryManager) -> None:
    """serve's sync request is checked as the protocol's schema says (syncParams): "false", a
    string, was truthy and forced a rebuild; an unknown parameter was ignored."""
    from qmdbridge.cli.serve import handle_line

    async with manager:
        assert await handle_line(manager, b'{"id": 1, "tool": "sync", "params": {"force": "false"}}') == {
            "id": 1, "error": "force must be a boolean, not 'false'"}
        assert await handle_line(manager, b'{"id": 2, "tool": "sync", "params": {"full": true}}') == {
            "id": 2, "error": "unknown parameter 'full' (sync takes force)"}
        assert await handle_line(manager, b'{"id": 3, "tool": "sync", "params": {"force": false}}') == {
            "id": 3, "result": {"ok": True}}
        assert await handle_line(manager, b'{"id": 4, "tool": "sync"}') == {"id": 4, "result": {"ok": True}}


async def test_an_absolute_path_inside_the_workspace_is_read_on_every_surface(manager: MemoryManager) -> None:
    """memory_get takes an absolute path inside the workspace as the CLI does (the tools are
    what serve, its daemon socket and MCP call); one outside it is refused with the reason."""
    ws = manager.agent.workspace_dir
    async with manager:
        page = await handle_memory_get(manager, {"path": str(ws / "MEMORY.md"), "lines": 5})
        assert (page["path"], page["text"]) == ("MEMORY.md", "Coffee: flat white with oat milk.")
        outside = ws.parent / "notes" / "x.md"
        refused = await handle_memory_get(manager, {"path": str(outside)})
        assert refused["refused"] is True
        assert refused["error"] == (f"path refused: '{outside}': outside the workspace {ws} and its extra "
                                    "paths (memory is MEMORY.md, memory/**/*.md and memorySearch.extraPaths)")
