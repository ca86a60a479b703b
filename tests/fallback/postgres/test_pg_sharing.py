"""Cross-agent memory on the postgres store (docs/postgres.md "Sharing"): agents of one JSON5
config in one database each find only their own notes, until an owner's ``store.shareWith``
names a reader; the reader's own ``memory_search`` then finds the owner's memory files,
labelled ``shared/<owner>/<path>``, and ``memory_get`` reads their exact lines from the text the
owner's sync stored. The owner sees nothing of the reader, a third agent nothing of either, and
with per-agent roles (row-level security) the reader cannot write the owner's rows."""
# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.pg_fixtures import require_postgres

require_postgres()
pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

from fallback.errors import PathRefusedError
from qmdbridge.config import load_config, resolve_agent
from qmdbridge.manager import MemoryManager

# main's trip note: CRLF line ends, a line of blanks and a line longer than a chunk, so its
# lines cannot be rebuilt from the chunks' texts (memory_get reads the text the sync stored)
TRIP = ("# Garden\r\n\r\nTomatoes want more sun this year.\r\n   \r\n# Trip\r\n\r\n"
        "The heron nests by the north pier.\r\nWe saw it at dawn.\r\n\r\n"
        + " ".join(["gull"] * 500) + "\r\nEnd of the trip.\r\n")


def workspaces(root: Path) -> dict[str, Path]:
    notes = {"main": {"memory/2026-11-02.md": TRIP, "MEMORY.md": "# Main\n\nThe kettle is blue.\n"},
             "reviewer": {"memory/2026-11-03.md": "# Review\n\nThe otter sleeps under the cedar bridge.\n"
                                                  "The heron was not seen.\n"},
             "carol": {"MEMORY.md": "# Carol\n\nThe lamp is green.\n"}}
    out = {}
    for agent, files in notes.items():
        ws = out[agent] = root / f"ws-{agent}"
        for rel, text in files.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_bytes(text.encode())
    return out


def write_config(root: Path, dsns: dict[str, str], *, share: tuple[str, ...], memory: str = "",
                 unshare: tuple[str, ...] = ()) -> Path:
    """A JSON5 config of the agents, each on the postgres store with its own DSN; those of
    ``share`` share their memory with ``reviewer``, those of ``unshare`` say ``shareWith: []``;
    ``memory``: the ``memory`` object's keys."""
    ws = workspaces(root) if not (root / "ws-main").exists() else {a: root / f"ws-{a}" for a in dsns}
    entries = ",\n".join(
        f'{{ id: "{a}", workspace: {json.dumps(str(ws[a]))}, memorySearch: {{ store: {{'
        f' dsn: {json.dumps(dsns[a])}'
        + (', shareWith: ["reviewer"]' if a in share else ", shareWith: []" if a in unshare else "")
        + " } } }"
        for a in dsns)
    path = root / "openclaw.json5"
    path.write_text(f"""// three agents in one database
{{
  memory: {{ {memory} }},
  agents: {{
    defaults: {{ memorySearch: {{ provider: "none", store: {{ driver: "postgres" }} }} }},
    list: [
{entries},
    ],
  }},
}}
""")
    return path


def env_of(root: Path) -> dict[str, str]:
    return {"OPENCLAW_STATE_DIR": str(root / "state"), "HOME": str(root), "PATH": "/usr/bin:/bin"}


def manager(config: Path, agent: str) -> MemoryManager:
    env = env_of(config.parent)
    return MemoryManager(resolve_agent(load_config(config, env=env), agent, env=env), env=env)


def db_name(dsn: str) -> str:
    """The database a conninfo names."""
    import psycopg

    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def agent_roles(pg_server: Any, pg_dsn: str) -> dict[str, str]:
    """Login roles ``main_role``, ``reviewer_role`` and ``carol_role`` registered and granted by
    the schema owner (main and carol share with reviewer); ``{agent: its DSN}``."""
    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target

    agents = ("main", "reviewer", "carol")
    with pg_server.admin(db_name(pg_dsn)) as conn:
        for agent in agents:
            conn.execute(f"DROP ROLE IF EXISTS {agent}_role")
            conn.execute(f"CREATE ROLE {agent}_role LOGIN NOSUPERUSER")
    owner = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/setup")
    try:
        for agent in agents:
            owner.register_agent(agent, role_name=f"{agent}_role",
                                 share_with=[] if agent == "reviewer" else ["reviewer"])
            owner.grant_role(f"{agent}_role")
    finally:
        owner.close()
    return {a: pg_server.dsn(db_name(pg_dsn), user=f"{a}_role") for a in agents}


async def search(config: Path, agent: str, query: str) -> list[dict[str, Any]]:
    async with manager(config, agent) as m:
        found = await m.search(query)
    return [{k: r[k] for k in ("path", "startLine", "endLine", "citation", "source", "score")}
            for r in found.model_dump(by_alias=True)["results"]]


async def read(config: Path, agent: str, path: str, **kwargs: Any) -> dict[str, Any]:
    async with manager(config, agent) as m:
        return (await m.read_file(path, **kwargs)).model_dump(by_alias=True)


async def test_shared_notes_are_found_labelled_and_read_by_the_reader_only(tmp_path: Path,
                                                                          pg_dsn: str) -> None:
    dsns = dict.fromkeys(("main", "reviewer", "carol"), pg_dsn)
    config = write_config(tmp_path, dsns, share=())
    for agent in dsns:  # each agent's first search indexes its workspace
        await search(config, agent, "kettle")
    # by default each finds only its own notes
    assert [h["path"] for h in await search(config, "reviewer", "heron pier")] == ["memory/2026-11-03.md"]
    assert await search(config, "main", "otter") == []
    config = write_config(tmp_path, dsns, share=("main",))
    assert [h["path"] for h in await search(config, "main", "heron pier")] == ["memory/2026-11-02.md"]
    shared = "shared/main/memory/2026-11-02.md"
    # the reader finds the owner's note, labelled, with the lines and score the owner's own
    # hit has (each scope ranked over its own statistics: its best keyword hit scores 1, and
    # on equal scores the reader's own hit comes first); its own note keeps its plain path
    found = await search(config, "reviewer", "heron north pier")
    assert found == [
        {"path": "memory/2026-11-03.md", "startLine": 1, "endLine": 4,
         "citation": "memory/2026-11-03.md#L1-L4", "source": "memory", "score": 1.0},
        {"path": shared, "startLine": 5, "endLine": 9, "citation": f"{shared}#L5-L9",
         "source": "memory", "score": 1.0}]
    owner_hit = (await search(config, "main", "heron north pier"))[0]
    assert found[1] == {**owner_hit, "path": shared, "citation": f"{shared}#L5-L9"}
    async with manager(config, "reviewer") as m:  # status names the scopes it reads
        assert (await m.status()).custom["store"]["sharedScopes"] == [
            {"agent": "main", "workspace": str(tmp_path / "ws-main")}]
    # the reader's own keyword answer is ranked as before (its statistics alone)
    assert [h["path"] for h in await search(config, "reviewer", "otter")] == ["memory/2026-11-03.md"]
    assert [h["path"] for h in await search(config, "reviewer", "kettle")] == ["shared/main/MEMORY.md"]
    # memory_get of the citation's lines gives the owner's exact lines, CRLF ends included,
    # and every page reads as the owner's own memory_get of its file
    page = await read(config, "reviewer", shared, from_line=5, lines=5)
    assert (page["text"], page["from"], page["lines"], page["nextFrom"]) == (
        "# Trip\r\n\r\nThe heron nests by the north pier.\r\nWe saw it at dawn.\r\n\r"
        "\n\n[More content available. Use from=10 to continue.]", 5, 5, 10)
    for kwargs in ({}, {"from_line": 3, "lines": 2}, {"from_line": 10}, {"from_line": 11, "lines": 9}):
        mine = await read(config, "main", "memory/2026-11-02.md", **kwargs)
        assert await read(config, "reviewer", shared, **kwargs) == {**mine, "path": shared}
    # no such file of the owner: a missing page, as a missing local note
    gone = await read(config, "reviewer", "shared/main/memory/2030-01-01.md")
    assert (gone["missing"], gone["text"], gone["lines"]) == (True, "", 0)
    # the owner's path is refused as a local one is: a parent segment, whatever it lands on
    for agent, path in (("main", "memory/../MEMORY.md"), ("reviewer", "shared/main/memory/../MEMORY.md"),
                        ("reviewer", "shared/main/memory/../memory/2026-11-02.md")):
        with pytest.raises(PathRefusedError) as refused:
            await read(config, agent, path)
        assert (refused.value.path, refused.value.reason) == (path, "parent segment")
    assert await read(config, "reviewer", "shared/main/./memory//2026-11-02.md") == await read(
        config, "reviewer", shared)
    # the owner does not see the reader's notes; a third agent sees neither
    assert await search(config, "main", "otter cedar") == []
    assert await search(config, "carol", "heron pier") == []
    with pytest.raises(PathRefusedError) as refused:
        await read(config, "carol", shared)
    assert (refused.value.path, refused.value.reason) == (shared, "not a memory path")
    # two owners: each scope's best hit scores 1, the owners' in id order
    config = write_config(tmp_path, dsns, share=("main", "carol"))
    await search(config, "carol", "lamp")  # carol's store records its share
    assert [(h["path"], h["score"]) for h in await search(config, "reviewer", "kettle lamp")] == [
        ("shared/carol/MEMORY.md", 1.0), ("shared/main/MEMORY.md", 1.0)]


async def test_every_route_gives_the_reader_the_shared_hits_alike(tmp_path: Path, pg_dsn: str) -> None:
    """The library, the CLI (without and through a running ``serve``) and MCP answer the
    reader's search and ``memory_get`` of a shared note alike."""
    import os
    import signal
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "qmdbridge"))
    from server_procs import CLI, start, stop

    config = write_config(tmp_path, dict.fromkeys(("main", "reviewer"), pg_dsn), share=("main",))
    await search(config, "main", "kettle")  # the owner's first sync
    query, shared = "heron north pier", "shared/main/memory/2026-11-02.md"
    async with manager(config, "reviewer") as m:
        want = [r.model_dump(by_alias=True) for r in (await m.search(query)).results]
        page = (await m.read_file(shared, from_line=6, lines=3)).model_dump(by_alias=True)
    assert [r["path"] for r in want] == ["memory/2026-11-03.md", shared]
    assert page["text"] == "\r\nThe heron nests by the north pier.\r\nWe saw it at dawn.\r\n\n" \
        "[More content available. Use from=9 to continue.]"
    env = {**os.environ, **env_of(tmp_path), "QMDBRIDGE_DAEMON": "off"}
    agent = ["--config", str(config), "--agent", "reviewer"]

    def cli(*args: str, daemon: bool = False) -> dict[str, Any]:
        run = subprocess.run([*CLI, *args, "--json", *agent], capture_output=True, timeout=120,
                             env={k: v for k, v in env.items() if not daemon or k != "QMDBRIDGE_DAEMON"})
        assert run.returncode == 0, run.stderr.decode()
        return json.loads(run.stdout)  # type: ignore[no-any-return]

    assert cli("search", query)["results"] == want
    status = subprocess.run([*CLI, "status", *agent], capture_output=True, timeout=120, env=env)
    assert f"\nShared scopes: main ({tmp_path / 'ws-main'})\n" in status.stdout.decode()
    assert cli("get", shared, "--from", "6", "--lines", "3") == {**page, "servedBy": "process"}
    params = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp", *agent], env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read_stream, write_stream), \
                ClientSession(read_stream, write_stream) as session:
            await session.initialize()
            found = await session.call_tool("memory_search", {"query": query})
            assert (found.structuredContent or {})["results"] == want
            got = await session.call_tool("memory_get", {"path": shared, "from": 6, "lines": 3})
            assert got.structuredContent == page
    proc, _ = start(["serve", "--no-stdin", *agent], {**env, "QMDBRIDGE_DAEMON": "on"},
                    ready="daemon socket")
    try:
        served = cli("search", query, daemon=True)
        assert (served["servedBy"], served["results"]) == ("daemon", want)
    finally:
        stop(proc, signal.SIGTERM)


async def test_with_the_qmd_backend_a_shared_path_is_read_by_the_builtin_engine(
        tmp_path: Path, pg_dsn: str, qmd_bin: Path) -> None:
    """qmd answers the agent's own collections; a ``shared/<owner>/...`` path is the builtin
    engine's (qmd would refuse it as no memory path of the workspace)."""
    config = write_config(tmp_path, dict.fromkeys(("main", "reviewer"), pg_dsn), share=("main",),
                          memory=f'backend: "qmd", qmd: {{ command: {json.dumps(str(qmd_bin))} }}')
    await search(config, "main", "kettle")  # qmd or its builtin fallback; the builtin index syncs
    async with manager(config, "main") as m:
        await m.sync(reason="test")
    page = await read(config, "reviewer", "shared/main/MEMORY.md")
    assert (page["path"], page["text"]) == ("shared/main/MEMORY.md", "# Main\n\nThe kettle is blue.")


async def test_a_note_indexed_before_texts_were_kept_is_readable_after_the_owners_next_sync(
        tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    config = write_config(tmp_path, dict.fromkeys(("main", "reviewer"), pg_dsn), share=("main",))
    await search(config, "main", "kettle")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as a store before m008 wrote it
        conn.execute("UPDATE qmdbridge.files SET text = NULL WHERE path = 'MEMORY.md'")
    assert (await read(config, "reviewer", "shared/main/MEMORY.md"))["missing"] is True
    assert [h["path"] for h in await search(config, "reviewer", "kettle")] == ["shared/main/MEMORY.md"]
    async with manager(config, "main") as m:
        await m.sync(reason="test")  # writes the note again, its text with it
    page = await read(config, "reviewer", "shared/main/MEMORY.md")
    assert (page["text"], page["missing"]) == ("# Main\n\nThe kettle is blue.", False)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the other note was left as it was
        assert conn.execute("SELECT path, gen_from FROM qmdbridge.files WHERE agent_id = 'main'"
                            " AND gen_to IS NULL ORDER BY path").fetchall() == [
            ("MEMORY.md", 2), ("memory/2026-11-02.md", 1)]


async def test_with_per_agent_roles_the_reader_reads_the_owner_rows_but_cannot_write_them(
        tmp_path: Path, pg_server: Any, pg_dsn: str) -> None:
    import psycopg

    from fallback.errors import UsageError
    from fallback.store.postgres.errors import PostgresUnavailableError
    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target

    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        for role in ("main_role", "reviewer_role"):
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
    owner = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/setup")
    try:  # the schema owner's setup (docs/postgres.md "Row-level security")
        owner.register_agent("main", role_name="main_role", share_with=["reviewer"])
        owner.register_agent("reviewer", role_name="reviewer_role")
        owner.grant_role("main_role")
        owner.grant_role("reviewer_role")
    finally:
        owner.close()
    dsns = {a: pg_server.dsn(dbname, user=f"{a}_role") for a in ("main", "reviewer")}
    config = write_config(tmp_path, dsns, share=("main",))
    assert [h["path"] for h in await search(config, "main", "heron pier")] == ["memory/2026-11-02.md"]

    def main_rows() -> list[tuple[Any, ...]]:
        with pg_server.admin(dbname) as conn:
            return conn.execute("SELECT path, hash, gen_from, gen_to, text FROM qmdbridge.files"
                                " WHERE agent_id = 'main' ORDER BY path").fetchall()

    before = main_rows()
    found = await search(config, "reviewer", "heron north pier")
    assert [h["path"] for h in found] == ["memory/2026-11-03.md", "shared/main/memory/2026-11-02.md"]
    page = await read(config, "reviewer", "shared/main/memory/2026-11-02.md", from_line=7, lines=1)
    assert page["text"] == "The heron nests by the north pier.\r\n\n[More content available. Use from=8 to continue.]"
    assert main_rows() == before  # the reader's syncs and searches wrote none of the owner's rows
    as_reviewer = resolve_target(dsns["reviewer"])
    reviewer = PostgresStore(as_reviewer, agent_id="reviewer", workspace=str(tmp_path / "ws-reviewer"),
                             run_migrations=False)
    try:
        scopes = reviewer.shared_scopes()
        assert scopes == [("main", str(tmp_path / "ws-main"))]
        with pytest.raises(UsageError, match="the shared scope of agent main is read-only"):
            reviewer.view(*scopes[0]).sync_lease()
        on_main = PostgresStore(as_reviewer, agent_id="main", workspace=scopes[0][1], run_migrations=False)
        try:
            with pytest.raises(PostgresUnavailableError, match="shared rows are read-only"):
                on_main.sync_lease()
        finally:
            on_main.close()
    finally:
        reviewer.close()
    with psycopg.connect(dsns["reviewer"], autocommit=True) as conn:
        assert conn.execute("DELETE FROM qmdbridge.chunks WHERE agent_id = 'main'").rowcount == 0
        assert conn.execute("UPDATE qmdbridge.files SET text = '' WHERE agent_id = 'main'").rowcount == 0
    assert main_rows() == before
    # main's role may not change who reads its rows: a shareWith other than the recorded one
    # is refused with what to do, and the share stays
    config = write_config(tmp_path, dsns, share=(), unshare=("main",))
    async with manager(config, "main") as m:
        with pytest.raises(PostgresUnavailableError) as refused:
            await m.sync(reason="test")
    assert str(refused.value) == (
        "postgres unavailable: the role of agent main may not change who reads its rows:"
        f" store.shareWith [] differs from the recorded ['reviewer'] ({refused.value.target});"
        " leave store.shareWith out (the recorded readers stay) or set it to ['reviewer'], or"
        " have the schema owner record it: register_agent('main', share_with=[])"
        " (docs/postgres.md, Row-level security)")
    assert refused.value.target.endswith("as user main_role")
    assert [h["path"] for h in await search(config, "reviewer", "kettle")] == ["shared/main/MEMORY.md"]


def test_share_with_on_a_sqlite_store_is_a_config_warning(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json5"
    path.write_text('{ agents: { defaults: { memorySearch: { store: { shareWith: ["bob"] } } },'
                    ' list: [{ id: "main" }, { id: "bob" }, { id: "pg", memorySearch: { store: { driver: "postgres",'
                    ' shareWith: ["bob"] } } }] } }')
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    cfg = load_config(path, env=env)
    assert cfg.warnings == ['agents.defaults.memorySearch.store.shareWith: ignored: only the postgres'
                            ' store (store.driver "postgres") shares an agent\'s memory; this store is sqlite']
    assert resolve_agent(cfg, "pg", env=env).config_warnings == cfg.warnings


async def test_a_hybrid_search_ranks_each_scope_as_its_owner_does_and_merges_them(
        tmp_path: Path, pg_dsn: str) -> None:
    from fallback.request import SearchRequest
    from tests.fallback.postgres.test_pg_hybrid import WordProvider, engine

    notes = {"main": {"memory/2026-11-01.md": "# Dinner\n\nI love the pasta and you love the wine.\n",
                      "memory/2026-11-02.md": "# Trip\n\nThe heron nests by the north pier and it was"
                                              " my favourite.\n",
                      "MEMORY.md": "# Main\n\nThe kettle is blue and I love it.\n"},
             "reviewer": {"memory/2026-11-03.md": "# Review\n\nThe otter sleeps and I love it.\n",
                          "MEMORY.md": "# Reviewer\n\nYou and I review the heron report.\n"}}
    for agent, files in notes.items():
        for rel, text in files.items():
            (tmp_path / agent / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / agent / rel).write_text(text)
    store = {"driver": "postgres", "dsn": pg_dsn}

    async def hits(eng: Any, query: str) -> list[dict[str, Any]]:
        found = await eng.search(SearchRequest.of(query, max_results=6))
        assert found.mode == "hybrid"
        return [r.model_dump(by_alias=True) for r in found.results]

    reviewer = engine(tmp_path / "reviewer", tmp_path / "state-reviewer", WordProvider(), store,
                      agent_id="reviewer")
    main = engine(tmp_path / "main", tmp_path / "state-main", WordProvider(),
                  {**store, "shareWith": ["reviewer"]}, agent_id="main")
    try:
        query = "the heron and i love it"
        alone = await hits(reviewer, query)
        owner = await hits(main, query)
        merged = await hits(reviewer, query)
    finally:
        await reviewer.close()
        await main.close()
    assert (len(alone), len(owner)) == (2, 2)
    shared = [h for h in merged if h["path"].startswith("shared/main/")]
    # each scope keeps the hits, order and scores its own search gives (MMR and decay included)
    assert [{**h, "path": h["path"].removeprefix("shared/main/")} for h in shared] == owner[:len(shared)]
    assert [h for h in merged if h not in shared] == alone[:len(merged) - len(shared)]
    # merged by score: the reader's best hit, then the owner's (0.65 each: its own first)
    assert [h["path"] for h in merged] == ["memory/2026-11-03.md", "MEMORY.md",
                                           "shared/main/memory/2026-11-02.md", "shared/main/MEMORY.md"]


def test_an_owner_with_several_workspaces_shares_the_one_it_published_last(pg_dsn: str) -> None:
    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target
    from tests.fallback.postgres.test_pg_store import found, write

    target = resolve_target(pg_dsn)
    old, new, reader, other = (PostgresStore(target, agent_id=a, workspace=w) for a, w in (
        ("main", "/old"), ("main", "/new"), ("reviewer", "/r"), ("carol", "/c")))
    try:
        old.register_agent("main", share_with=["reviewer"])
        old.register_agent("carol", share_with=["someone"])
        assert reader.shared_scopes() == []  # nothing published yet
        write(old, {"memory/a.md": "otter"})
        write(other, {"memory/c.md": "otter"})
        assert reader.shared_scopes() == [("main", "/old")]
        write(new, {"memory/b.md": "otter"})
        assert reader.shared_scopes() == [("main", "/new")]
        view = reader.view(*reader.shared_scopes()[0])
        assert found(view, "otter") == ["memory/b.md#1"]
        write(old, {"memory/a.md": "otter seal"})
        assert reader.shared_scopes() == [("main", "/old")]
        view.close()  # a view closes nothing of the store it reads through
        assert found(reader.view("main", "/old"), "otter") == ["memory/a.md#1"]
        assert found(reader, "otter") == []  # the reader's own scope holds nothing
    finally:
        for s in (old, new, reader, other):
            s.close()


async def test_share_with_set_empty_unshares_and_left_out_keeps_the_recorded_share(
        tmp_path: Path, pg_dsn: str) -> None:
    dsns = dict.fromkeys(("main", "reviewer"), pg_dsn)
    config = write_config(tmp_path, dsns, share=("main",))
    await search(config, "main", "kettle")
    assert [h["path"] for h in await search(config, "reviewer", "kettle")] == ["shared/main/MEMORY.md"]
    # left out: what the schema owner recorded stays (the reader keeps reading)
    config = write_config(tmp_path, dsns, share=())
    await search(config, "main", "kettle")
    assert [h["path"] for h in await search(config, "reviewer", "kettle")] == ["shared/main/MEMORY.md"]
    # set to []: the owner's next open records it, and the reader's next search reads nothing
    config = write_config(tmp_path, dsns, share=(), unshare=("main",))
    assert [h["path"] for h in await search(config, "main", "kettle")] == ["MEMORY.md"]
    assert await search(config, "reviewer", "kettle") == []
    async with manager(config, "reviewer") as m:
        assert (await m.status()).custom["store"]["sharedScopes"] == []
    # an agent named in its own shareWith (e.g. inherited from agents.defaults) is not recorded
    import psycopg

    config = write_config(tmp_path, dsns, share=("main", "reviewer"))
    await search(config, "main", "kettle")
    await search(config, "reviewer", "kettle")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT owner_agent, reader_agent FROM qmdbridge.shares").fetchall() == [
            ("main", "reviewer")]


async def test_a_shared_scope_whose_rows_cannot_be_read_is_left_out_with_a_warning(
        tmp_path: Path, pg_server: Any, pg_dsn: str) -> None:
    """With per-agent roles, a policy refusing the reader main's posting blocks (as a revoked grant
    would): the reader's search, keyword-only and hybrid, answers its own hits and carol's,
    with a warning naming main and the reason, instead of failing."""
    from fallback.request import SearchRequest
    from tests.fallback.postgres.test_pg_hybrid import WordProvider, engine

    dsns = agent_roles(pg_server, pg_dsn)
    config = write_config(tmp_path, dsns, share=("main", "carol"))
    for agent in dsns:  # each agent's first search indexes its workspace
        await search(config, agent, "kettle")
    query = "kettle lamp otter"
    assert [h["path"] for h in await search(config, "reviewer", query)] == [
        "memory/2026-11-03.md", "shared/carol/MEMORY.md", "shared/main/MEMORY.md"]
    with pg_server.admin(db_name(pg_dsn)) as conn:
        conn.execute("CREATE FUNCTION qmdbridge.withheld(agent text) RETURNS boolean LANGUAGE plpgsql"
                     " AS $$ BEGIN RAISE EXCEPTION 'the rows of agent % are withheld', agent"
                     " USING ERRCODE = '42501'; END $$")
        conn.execute("CREATE POLICY withheld ON qmdbridge.posting_blocks AS RESTRICTIVE FOR SELECT USING"
                     " (CASE WHEN agent_id = 'main' THEN qmdbridge.withheld(agent_id) ELSE true END)")
    left_out = ("the memory agent main shares is left out of this answer: postgres unavailable:"
                " permission denied while trying to keyword search: the rows of agent main are withheld")
    async with manager(config, "reviewer") as m:
        found = (await m.search(query)).model_dump(by_alias=True)
    assert [h["path"] for h in found["results"]] == ["memory/2026-11-03.md", "shared/carol/MEMORY.md"]
    assert [w[:len(left_out)] for w in found["warnings"]] == [left_out]
    assert "as user reviewer_role)" in found["warnings"][0]
    hybrid = engine(tmp_path / "ws-reviewer", tmp_path / "state-hybrid", WordProvider(),
                    {"driver": "postgres", "dsn": dsns["reviewer"]}, agent_id="reviewer")
    try:
        await hybrid.sync(reason="test")  # its own vectors, so the search is hybrid
        outcome = await hybrid.search(SearchRequest.of(f"the {query}"))  # "the": a vector
    finally:
        await hybrid.close()
    assert outcome.mode == "hybrid"
    assert [r.path for r in outcome.results] == ["shared/carol/MEMORY.md", "memory/2026-11-03.md"]
    assert [w[:len(left_out)] for w in outcome.warnings] == [left_out]


async def test_a_hybrid_search_ranks_the_shared_scopes_side_by_side(
        tmp_path: Path, pg_server: Any, pg_dsn: str) -> None:
    """A policy lets carol's posting blocks be read only once main's are being read (an advisory
    lock main's reads take): the reader's hybrid search ranks the scopes shared with it at the
    same time, so both are in its answer. Ranked one after the other, carol's statement (the
    first scope) would wait out its deadline and carol would be left out with a warning."""
    from fallback.request import SearchRequest
    from tests.fallback.postgres.test_pg_hybrid import WordProvider, engine

    dsns = agent_roles(pg_server, pg_dsn)
    config = write_config(tmp_path, dsns, share=("main", "carol"))
    for agent in ("main", "carol"):  # each owner's first search indexes its workspace
        await search(config, agent, "kettle")
    with pg_server.admin(db_name(pg_dsn)) as conn:
        conn.execute("CREATE FUNCTION qmdbridge.gate(agent text) RETURNS boolean LANGUAGE plpgsql AS $$"
                     " BEGIN IF agent = 'main' THEN PERFORM pg_advisory_lock_shared(7);"
                     " ELSIF agent = 'carol' THEN FOR i IN 1..6000 LOOP"  # 60 s: past the deadline
                     " EXIT WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                     " AND objid = 7 AND granted); PERFORM pg_sleep(0.01); END LOOP; END IF;"
                     " RETURN true; END $$")
        conn.execute("CREATE POLICY gate ON qmdbridge.posting_blocks AS RESTRICTIVE FOR SELECT"
                     " USING (qmdbridge.gate(agent_id))")
    hybrid = engine(tmp_path / "ws-reviewer", tmp_path / "state-hybrid", WordProvider(),
                    {"driver": "postgres", "dsn": dsns["reviewer"]}, agent_id="reviewer")
    try:
        await hybrid.sync(reason="test")  # its own vectors, so the search is hybrid
        outcome = await hybrid.search(SearchRequest.of("the kettle lamp otter"))
    finally:
        await hybrid.close()
    assert outcome.mode == "hybrid"
    assert outcome.warnings == []
    assert sorted(r.path for r in outcome.results) == [
        "memory/2026-11-03.md", "shared/carol/MEMORY.md", "shared/main/MEMORY.md"]
