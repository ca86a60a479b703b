"""The postgres store against a real PostgreSQL: migrations, generations and the sync lease,
kill -9 of a syncing process, row-level security with real roles, faults, and redaction."""
# ruff: noqa: E402  (psycopg is imported after require_postgres() decided to skip or fail)

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.pg_fixtures import require_postgres

require_postgres()
pytestmark = pytest.mark.postgres

from fallback.errors import BackendTimeoutError, BackendUnavailableError, ConfigError
from fallback.store.postgres.errors import PostgresTimeoutError, PostgresUnavailableError
from fallback.store.postgres.migrations import MIGRATIONS, applied_versions, migrate
from fallback.store.postgres.store import ChunkRow, PostgresStore
from fallback.store.postgres.target import resolve_target
from tests.pg_fixtures import PgServer, new_data_dir, password_role, round_trips, start_pgserver

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "s3cr3t-Pa55word"


def write(store: PostgresStore, files: dict[str, str]) -> None:
    lease = store.sync_lease(wait_ms=5000)
    assert lease is not None
    for path, text in files.items():
        lease.write_file(path, "memory", content_hash=f"h-{text}", mtime_ms=1, size=len(text),
                         title=path, chunks=[ChunkRow(f"{path}#1", 1, 1, f"c-{text}", "", text, "")])
    lease.publish()


def found(store: PostgresStore, word: str) -> list[str]:
    return [r[0] for r in store.keyword_rows(f'"{word}"', sources=["memory"], limit=10)]


def test_migrations_are_idempotent_and_safe_when_two_hosts_start_at_once(pg_dsn: str) -> None:
    results: list[list[str]] = []

    def run() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            results.append(migrate(conn, "qmdbridge"))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [m.__name__ for m in MIGRATIONS]
    assert sorted(results, key=len) == [[], names]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrate(conn, "qmdbridge") == []
        assert applied_versions(conn, "qmdbridge") == list(enumerate(names, start=1))


def test_a_schema_a_newer_version_migrated_opens_with_an_agents_own_role(pg_server: PgServer,
                                                                      pg_dsn: str) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        conn.execute("DROP ROLE IF EXISTS later_role")
        conn.execute("CREATE ROLE later_role LOGIN NOSUPERUSER")
    owner = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        owner.register_agent("main", role_name="later_role")
        owner.grant_role("later_role")
        write(owner, {"memory/a.md": "otter"})
    finally:
        owner.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the owner ran a later migration
        conn.execute(f"INSERT INTO qmdbridge.schema_migrations (version, name)"
                     f" VALUES ({len(MIGRATIONS) + 1}, 'm{len(MIGRATIONS) + 1:03d}_later')")
    agent = PostgresStore(resolve_target(pg_server.dsn(dbname, user="later_role")),
                          agent_id="main", workspace="/ws")  # may not create: opens as it is
    try:
        assert found(agent, "otter") == ["memory/a.md#1"]
    finally:
        agent.close()


def test_a_role_that_may_not_create_the_schema_is_told_who_migrates(pg_server: PgServer,
                                                                   pg_dsn: str) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        conn.execute("DROP ROLE IF EXISTS no_create")
        conn.execute("CREATE ROLE no_create LOGIN NOSUPERUSER")
        conn.execute(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC')
    with pytest.raises(PostgresUnavailableError) as caught:
        PostgresStore(resolve_target(pg_server.dsn(dbname, user="no_create")), agent_id="main",
                      workspace="/ws")
    assert str(caught.value).startswith("postgres unavailable: permission denied while trying to"
                                        f" migrate the schema: permission denied for database {dbname}")
    assert caught.value.hint == ("the schema owner (a role that may create in this database) migrates"
                                 " the schema before an agent's own role opens it (docs/postgres.md,"
                                 " Row-level security)")


def test_readers_see_the_published_generation_until_the_next_publish(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        write(store, {"memory/a.md": "apple orchard"})
        lease = store.sync_lease()
        assert lease is not None and lease.generation == 2
        lease.write_file("memory/a.md", "memory", content_hash="h2", mtime_ms=2, size=1,
                         title="memory/a.md", chunks=[ChunkRow("memory/a.md#1", 1, 1, "c2", "", "banana grove", "")])
        lease.write_file("memory/b.md", "memory", content_hash="h3", mtime_ms=2, size=1,
                         title="memory/b.md", chunks=[ChunkRow("memory/b.md#1", 1, 1, "c3", "", "banana split", "")])
        # Committed but not published: readers still answer from generation 1.
        assert found(store, "apple") == ["memory/a.md#1"]
        assert found(store, "banana") == []
        # A second sync of the same agent + workspace is refused, naming the holder.
        assert store.sync_lease(wait_ms=0) is None
        assert store.busy_reason is not None
        assert store.busy_reason.startswith("another sync of agent main workspace /ws is running: qmdbridge:main")
        stats = lease.publish()
        assert (stats.generation, stats.chunk_count) == (2, 2)
        assert found(store, "apple") == []
        assert found(store, "banana") == ["memory/a.md#1", "memory/b.md#1"]
        assert store.stats().generation == 2
    finally:
        store.close()


def test_kill_9_of_a_syncing_process_loses_nothing_committed_and_holds_no_lock(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        write(store, {"memory/old.md": "walrus"})
        child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("pg_sync_child.py")), pg_dsn],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "written"
            assert store.sync_lease(wait_ms=0) is None  # the child holds the lease
            child.send_signal(signal.SIGKILL)
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL
        # Nothing was published: readers still see the old generation.
        assert found(store, "walrus") == ["memory/old.md#1"]
        assert found(store, "zebra") == []
        # The lock went with the killed session (waited for on the lock itself, bounded).
        lease = store.sync_lease(wait_ms=10_000)
        assert lease is not None
        # What the killed sync committed is still there for this sync to publish.
        assert lease.file_hash("memory/new.md", "memory") == "new-hash"
        assert lease.generation == 2
        lease.publish()
        assert found(store, "zebra") == ["new-1"]
        assert found(store, "walrus") == ["memory/old.md#1"]
    finally:
        store.close()


def test_a_write_failing_on_the_writer_thread_is_raised_by_the_next_call_and_keeps_the_ones_before(
        pg_dsn: str) -> None:
    """A write's transaction runs on the lease's writer thread: a read of the lease waits for
    it, and its failure (a trigger refuses a chunk) is raised by the next call; the writes
    committed before it stay for the next lease, and nothing is published."""
    from fallback.store.postgres.errors import PostgresStoreError
    from fallback.store.postgres.store import FileRows

    def rows(path: str, text: str) -> list[FileRows]:
        return [FileRows(path, "memory", f"h-{text}", 1, len(text), path,
                         (ChunkRow(f"{path}#1", 1, 1, f"c-{text}", "", text, ""),))]

    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                         " IF NEW.text = 'boom' THEN RAISE EXCEPTION 'chunk refused'; END IF;"
                         " RETURN NEW; END $$")
            conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON qmdbridge.chunks FOR EACH ROW"
                         " EXECUTE FUNCTION public.refuse()")
        lease = store.sync_lease()
        assert lease is not None
        with lease:
            lease.write_files(rows("memory/a.md", "walrus"))
            assert lease.file_hash("memory/a.md", "memory") == "h-walrus"
            lease.write_files(rows("memory/b.md", "boom"))
            with pytest.raises(PostgresStoreError, match="chunk refused"):
                lease.publish()
        assert found(store, "walrus") == []
        lease = store.sync_lease()
        assert lease is not None
        assert lease.file_hash("memory/a.md", "memory") == "h-walrus"
        assert lease.file_hash("memory/b.md", "memory") is None
        assert lease.publish().chunk_count == 1
        assert found(store, "walrus") == ["memory/a.md#1"]
    finally:
        store.close()


def test_row_level_security_own_rows_and_shared_rows_read_only(pg_server: PgServer, pg_dsn: str) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        for role in ("alice_role", "bob_role"):
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
    owner_target = resolve_target(pg_dsn)
    alice = PostgresStore(owner_target, agent_id="alice", workspace="/ws")
    carol = PostgresStore(owner_target, agent_id="carol", workspace="/ws")
    try:
        alice.register_agent("alice", role_name="alice_role", share_with=["bob"])
        alice.register_agent("bob", role_name="bob_role")
        alice.register_agent("carol", role_name=None)
        alice.grant_role("alice_role")
        alice.grant_role("bob_role")
        write(alice, {"memory/a.md": "otter"})
        write(carol, {"memory/c.md": "otter"})
        as_bob = pg_server.dsn(dbname, user="bob_role")
        bob_on_alice = PostgresStore(resolve_target(as_bob), agent_id="alice", workspace="/ws",
                                     run_migrations=False)
        bob_on_carol = PostgresStore(resolve_target(as_bob), agent_id="carol", workspace="/ws",
                                     run_migrations=False)
        alice_self = PostgresStore(resolve_target(pg_server.dsn(dbname, user="alice_role")),
                                   agent_id="alice", workspace="/ws", run_migrations=False)
        try:
            assert found(bob_on_alice, "otter") == ["memory/a.md#1"]   # shared with bob
            assert found(bob_on_carol, "otter") == []                  # not shared
            assert found(alice_self, "otter") == ["memory/a.md#1"]
            with psycopg.connect(pg_server.dsn(dbname, user="alice_role")) as conn:
                paths = conn.execute("SELECT path FROM qmdbridge.chunks ORDER BY path").fetchall()
            assert paths == [("memory/a.md",)]
            # Shared rows are read-only: bob cannot start a sync of alice's workspace.
            with pytest.raises(PostgresUnavailableError) as caught:
                bob_on_alice.sync_lease()
            assert str(caught.value).startswith(
                "postgres unavailable: permission denied while trying to start the sync: new row"
                ' violates row-level security policy for table "workspaces"')
            assert "shared rows are read-only" in str(caught.value)
            assert caught.value.hint.startswith(  # bob's role is registered for agent bob
                "an agent's role writes only the rows of the agent it is registered for"
                " (register_agent(agent, role_name=...): check that the config's agent id is that agent;")
            # Alice writes her own rows through row-level security.
            write(alice_self, {"memory/a2.md": "otter"})
            assert found(bob_on_alice, "otter") == ["memory/a.md#1", "memory/a2.md#1"]
        finally:
            for s in (bob_on_alice, bob_on_carol, alice_self):
                s.close()
    finally:
        alice.close()
        carol.close()


def test_unreachable_server_names_the_target_and_what_to_do(tmp_path: Path) -> None:
    dsn = f"host={tmp_path / 'no-server'} dbname=memdb user=agent password={PASSWORD}"
    with pytest.raises(PostgresUnavailableError) as caught:
        PostgresStore(resolve_target(dsn), agent_id="main", workspace="/ws", connect_timeout_ms=2000)
    message = str(caught.value)
    assert isinstance(caught.value, BackendUnavailableError)
    # refused at once (no socket): no deadline ran out, so none is named
    assert message.startswith("postgres unavailable: cannot reach PostgreSQL to connect: connection is bad: connection to server on socket")
    assert f'(database "memdb" on host {tmp_path / "no-server"} port 5432 as user agent)' in message
    assert message.endswith("start the server, or fix the host and port in memorySearch.store.dsn / PGHOST, PGPORT")
    assert PASSWORD not in message and PASSWORD not in repr(caught.value.args)


def test_login_refused_names_the_user_and_hides_the_password(pg_server: PgServer) -> None:
    with password_role(pg_server, "pw_user"):
        url = f"postgresql://pw_user:{PASSWORD}@/postgres?host={pg_server.data_dir}"
        with pytest.raises(PostgresUnavailableError) as caught:
            PostgresStore(resolve_target(url), agent_id="main", workspace="/ws")
        message = str(caught.value)
        assert "PostgreSQL refused the login" in message
        assert 'password authentication failed for user "pw_user"' in message
        assert "check the user and password (memorySearch.store.dsn or PGUSER/PGPASSWORD)" in message
        assert PASSWORD not in message


def test_a_connection_the_server_refuses_is_told_by_its_reason_not_as_unreachable(
        pg_server: PgServer, pg_dsn: str) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin() as conn:
        conn.execute("DROP ROLE IF EXISTS no_slots")
        conn.execute("CREATE ROLE no_slots LOGIN CONNECTION LIMIT 0")
        conn.execute("DROP DATABASE IF EXISTS closed_db")
        conn.execute("CREATE DATABASE closed_db ALLOW_CONNECTIONS false")

    def refusal(dsn: str) -> PostgresUnavailableError:
        with pytest.raises(PostgresUnavailableError) as caught:
            PostgresStore(resolve_target(dsn), agent_id="main", workspace="/ws", connect_timeout_ms=2000)
        assert "cannot reach" not in str(caught.value) and "within" not in str(caught.value)
        return caught.value

    try:
        missing = refusal(pg_server.dsn("no_such_db"))
        assert 'the database does not exist: connection failed: ' in str(missing)
        assert 'FATAL: database "no_such_db" does not exist' in str(missing)
        assert missing.hint == "create it (createdb) or fix the database name in memorySearch.store.dsn / PGDATABASE"
        nobody = refusal(pg_server.dsn(dbname, user="no_such_role"))
        assert str(nobody).startswith("postgres unavailable: PostgreSQL refused the login: ")
        assert 'FATAL: role "no_such_role" does not exist' in str(nobody)
        full = refusal(pg_server.dsn(dbname, user="no_slots"))
        assert str(full).startswith("postgres unavailable: PostgreSQL has no connection left for this login: ")
        assert full.hint.startswith("raise the server's max_connections")
        with password_role(pg_server, "pw_user"):  # libpq's own: the server asked for a password
            assert str(refusal(pg_server.dsn(dbname, user="pw_user"))).startswith(
                "postgres unavailable: PostgreSQL refused the login: connection failed: ")
        closed = refusal(pg_server.dsn("closed_db"))
        assert str(closed).startswith("postgres unavailable: PostgreSQL refused the connection: ")
        assert 'FATAL: database "closed_db" is not currently accepting connections' in str(closed)
        assert closed.hint == "the server answered with the error above: see the server's log"
    finally:
        with pg_server.admin() as conn:
            conn.execute("DROP ROLE no_slots")
            conn.execute("DROP DATABASE closed_db")


def test_a_sync_whose_session_the_server_ends_is_told_so_and_the_next_sync_runs(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        write(store, {"memory/a.md": "heron"})
        lease = store.sync_lease()
        assert lease is not None
        with psycopg.connect(pg_dsn, autocommit=True) as admin:  # the lease's lock holder
            ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_locks"
                                  " WHERE locktype = 'advisory' AND granted").fetchall()
        assert ended == [(True,)]
        with pytest.raises(PostgresUnavailableError) as caught:
            lease.publish()
        lease.close()
        assert str(caught.value).startswith(
            "postgres unavailable: PostgreSQL ended the connection while trying to ")
        assert "terminating connection due to administrator command" in str(caught.value)
        assert "within" not in str(caught.value)
        assert caught.value.hint.endswith("the next call connects again")
        write(store, {"memory/a.md": "heron", "memory/b.md": "egret"})
        assert found(store, "egret") == ["memory/b.md#1"]
    finally:
        store.close()


def test_sslmode_require_against_a_server_without_tls_says_so() -> None:
    import socket

    # A stand-in for a server without TLS: it answers the SSLRequest with "N", as PostgreSQL
    # with ssl = off does (the session's server listens on a Unix socket only, where libpq
    # uses no TLS).
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn = listener.accept()[0]
        with conn:
            while conn.recv(8):  # each SSLRequest (or GSSENCRequest) until libpq hangs up
                conn.sendall(b"N")

    server = threading.Thread(target=answer, daemon=True)
    server.start()
    try:
        with pytest.raises(PostgresUnavailableError) as caught:
            PostgresStore(resolve_target(f"postgresql://agent@127.0.0.1:{port}/memdb?sslmode=require"),
                          agent_id="main", workspace="/ws", connect_timeout_ms=2000)
        assert str(caught.value).startswith("postgres unavailable: the TLS set-up with PostgreSQL failed: ")
        assert "server does not support SSL, but SSL was required" in str(caught.value)
        assert caught.value.hint.startswith("make sslmode (and sslrootcert) in memorySearch.store.dsn")
        server.join(60)
    finally:
        listener.close()


def test_a_connection_service_is_what_messages_name_and_its_password_is_hidden(
        pg_server: PgServer, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    services = tmp_path / "pg_service.conf"
    services.write_text(f"# the fleet's database\n[memdb]\nhost={pg_server.data_dir}\n"
                        f"dbname={dbname}\nuser=pw_user\npassword={PASSWORD}\n")
    where = f'database "{dbname}" on host {pg_server.data_dir} port 5432 as user pw_user'
    with password_role(pg_server, "pw_user"), monkeypatch.context() as env:
        env.setenv("PGSERVICEFILE", str(services))
        env.setenv("PGSERVICE", "memdb")
        with pytest.raises(PostgresUnavailableError) as caught:
            PostgresStore(resolve_target(None), agent_id="main", workspace="/ws")
        assert "PostgreSQL refused the login" in str(caught.value)
        assert f"({where});" in str(caught.value) and PASSWORD not in str(caught.value)
        services.write_text(services.read_text().replace(PASSWORD, "the-right-one"))
        store = PostgresStore(resolve_target(None), agent_id="main", workspace="/ws",
                              run_migrations=False)  # logged in: the service's user and password
        try:
            assert store.target.describe() == where
            assert store.target.redact("x the-right-one y") == "x [REDACTED:password] y"
        finally:
            store.close()
        # the DSN's keys come first, and a service no file defines is told before connecting
        assert resolve_target("user=other").describe() == (
            f'database "{dbname}" on host {pg_server.data_dir} port 5432 as user other')
        env.setenv("PGSERVICE", "nosuch")
        with pytest.raises(ConfigError, match=r"memorySearch.store.dsn: the connection service 'nosuch' is not "):
            resolve_target(None)


def test_statement_timeout_is_a_backend_timeout(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws",
                          statement_timeout_ms=200)
    try:
        with psycopg.connect(pg_dsn) as locker:
            locker.execute("LOCK TABLE qmdbridge.workspaces IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(PostgresTimeoutError) as caught:
                store.stats()
            # a snapshot's first statement, sent with its BEGIN in one pipeline
            with pytest.raises(PostgresTimeoutError) as in_snapshot:
                store.keyword_rows('"apple"', sources=["memory"], limit=10)
            locker.rollback()
        assert isinstance(caught.value, BackendTimeoutError)
        assert caught.value.timeout_ms == 200
        assert str(caught.value).startswith("postgres unavailable: read the index statistics on database")
        assert str(in_snapshot.value).startswith("postgres unavailable: keyword search on database")
        assert store.stats().generation == 0  # the pool's connection still works
        assert found(store, "apple") == []  # its transaction was rolled back
    finally:
        store.close()


def test_a_search_takes_four_round_trips_and_the_statistics_two(pg_dsn: str, tmp_path: Path) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws", pool_size=1)
    try:
        write(store, {"memory/a.md": "apple orchard", "memory/b.md": "apple pie"})
        trace = tmp_path / "libpq.trace"
        # check; BEGIN + statistics; ranking; texts + ROLLBACK
        assert round_trips(store, trace, lambda: found(store, "apple")) == 4
        assert round_trips(store, trace, store.stats) == 2  # check; the statistics (one statement)
        assert found(store, "apple") == ["memory/a.md#1", "memory/b.md#1"]
    finally:
        store.close()


def test_the_candidates_a_search_ranks_are_read_in_its_one_ranking_statement(
        pg_dsn: str, tmp_path: Path) -> None:
    """200 notes hold both words too far apart for their ``NEAR`` group: each one's bound
    counts the group, its exact score does not, so every one of them is ranked before the
    answer stands. Their lower bounds (the words' own shares) tell the ranking statement to
    read all their postings: one ranking statement, not one more per further step."""
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws", pool_size=1)
    try:
        far = " ".join(["filler"] * 12)
        write(store, {**{f"memory/n{i:03d}.md": f"zebra {far} apple" for i in range(200)},
                      **{f"memory/o{i:03d}.md": f"other {far} words" for i in range(200)}})
        expr = '"zebra" OR "apple" OR NEAR("zebra" "apple", 10)'
        rows: list[list[object]] = []

        def search() -> None:
            rows.append(list(store.keyword_rows(expr, sources=["memory"], limit=40)))

        # check; BEGIN + statistics; ranking; texts + ROLLBACK
        assert round_trips(store, tmp_path / "libpq.trace", search) == 4
        assert [r[0] for r in rows[0]] == [f"memory/n{i:03d}.md#1" for i in range(40)]
        assert len({r[6] for r in rows[0]}) == 1 and rows[0][0][6] < 0
    finally:
        store.close()


def test_the_pool_survives_a_server_restart_and_a_stopped_server_fails_at_once() -> None:
    """With the server stopped its socket is gone: each call fails with the reason right away
    (the pool's worker and the waiting caller both see the refusal), not after the 30 s
    connect deadline; the first call after the restart answers."""
    server = start_pgserver(new_data_dir())
    try:
        store = PostgresStore(resolve_target(server.dsn()), agent_id="main", workspace="/ws",
                              connect_timeout_ms=30_000)
        try:
            write(store, {"memory/a.md": "heron"})
            server.stop()
            for _ in range(2):  # the pooled connection found dead; then no connection at all
                with pytest.raises(PostgresUnavailableError) as caught:
                    store.stats()
                assert str(caught.value).startswith(
                    "postgres unavailable: cannot reach PostgreSQL to read the index statistics: ")
                assert "No such file or directory" in str(caught.value)
            server.start()
            assert found(store, "heron") == ["memory/a.md#1"]
        finally:
            store.close()
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


# Forwards TCP connections on (argv[2], 5432) to the server's Unix socket argv[1]; "ready" once
# it listens. Run inside a network namespace: the test cuts its link without closing a socket.
FORWARDER = """
import socket, sys, threading
listener = socket.create_server((sys.argv[2], 5432))
print("ready", flush=True)
def pump(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
while True:
    client = listener.accept()[0]
    server = socket.socket(socket.AF_UNIX)
    server.connect(sys.argv[1])
    for a, b in ((client, server), (server, client)):
        threading.Thread(target=pump, args=(a, b), daemon=True).start()
"""


def test_a_server_that_stops_answering_on_an_open_connection_fails_the_call_with_the_reason(
        pg_server: PgServer, pg_dsn: str) -> None:
    """A network partition (packets dropped, no socket closed): the pooled TCP connection's
    next call fails within the connection and statement deadlines instead of waiting for the
    kernel's retransmissions (about 15 minutes), and answers again once the link is back."""
    import secrets

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    n = secrets.randbelow(16384)
    ns, veth, ip = f"qbh{n}", f"qbh{n}", f"10.213.{n // 64}.{n % 64 * 4 + 2}"
    setup = [["ip", "netns", "add", ns], ["ip", "link", "add", f"{veth}a", "type", "veth", "peer",
                                           "name", f"{veth}b", "netns", ns],
             ["ip", "addr", "add", f"10.213.{n // 64}.{n % 64 * 4 + 1}/30", "dev", f"{veth}a"],
             ["ip", "link", "set", f"{veth}a", "up"],
             ["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", f"{veth}b"],
             ["ip", "-n", ns, "link", "set", f"{veth}b", "up"]]
    forwarder = None
    try:
        for cmd in setup:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:  # e.g. a container without CAP_NET_ADMIN
                pytest.skip(f"no network namespace here: {' '.join(cmd)}: {done.stderr.strip()}")
        forwarder = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", FORWARDER,
                                      str(pg_server.data_dir / ".s.PGSQL.5432"), ip],
                                     stdout=subprocess.PIPE, text=True)
        assert forwarder.stdout is not None and forwarder.stdout.readline() == "ready\n"
        dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
        store = PostgresStore(resolve_target(f"host={ip} port=5432 dbname={dbname} user=postgres"),
                              agent_id="main", workspace="/ws", connect_timeout_ms=2000,
                              statement_timeout_ms=5000)
        try:
            write(store, {"memory/a.md": "heron"})
            subprocess.run(["ip", "-n", ns, "link", "set", f"{veth}b", "down"], check=True)
            outcome: list[BaseException] = []

            def call() -> None:
                try:
                    store.stats()
                except BaseException as exc:  # noqa: BLE001 (handed to the test's thread)
                    outcome.append(exc)

            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(120)  # a hang guard: the call ends on its own deadline first
            assert not caller.is_alive(), "the call still waits for a server that does not answer"
            assert isinstance(outcome[0], PostgresUnavailableError), outcome
            assert str(outcome[0]).startswith(
                "postgres unavailable: cannot reach PostgreSQL to read the index statistics within ")
            subprocess.run(["ip", "-n", ns, "link", "set", f"{veth}b", "up"], check=True)
            # No restart: it answers again once the pool holds a connection (an attempt begun
            # during the partition may still take a call's wait first).
            for _ in range(30):
                with contextlib.suppress(PostgresUnavailableError):
                    assert found(store, "heron") == ["memory/a.md#1"]
                    break
            else:
                pytest.fail("no answer after the link came back")
        finally:
            store.close()
    finally:
        if forwarder is not None:
            forwarder.kill()
            forwarder.wait()
        # the pair now (the namespace outlives its deletion while its sockets time out)
        subprocess.run(["ip", "link", "del", f"{veth}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_redaction_of_the_password_everywhere() -> None:
    url = resolve_target(f"postgresql://agent:{PASSWORD}@db.example:6432/mem?sslmode=require")
    assert (url.host, url.port, url.dbname, url.user) == ("db.example", "6432", "mem", "agent")
    assert PASSWORD not in repr(url) and PASSWORD not in url.describe()
    assert url.redact(f"failed: {url.conninfo} and {PASSWORD}") == (
        "failed: postgresql://agent:[REDACTED:password]@db.example:6432/mem?sslmode=require"
        " and [REDACTED:password]")
    kv = resolve_target(f"host=h dbname=d password='{PASSWORD}'")
    assert kv.redact(kv.conninfo) == "host=h dbname=d password=[REDACTED:password]"
    env = resolve_target(None, env={"PGHOST": "pg.internal", "PGUSER": "u", "PGPASSWORD": PASSWORD,
                                    "PGDATABASE": "mem"})
    assert env.describe() == 'database "mem" on host pg.internal port 5432 as user u'
    assert env.redact(f"x {PASSWORD} y") == "x [REDACTED:password] y"
    with pytest.raises(ConfigError) as caught:
        resolve_target(f"host=h password={PASSWORD} = =")
    assert PASSWORD not in str(caught.value)
    assert str(caught.value).startswith("<config>: memorySearch.store.dsn: cannot parse the DSN")


def test_pgvector_not_installable_by_the_migrating_role(pg_server: PgServer, pg_dsn: str) -> None:
    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    with pg_server.admin(dbname) as conn:
        conn.execute("DROP ROLE IF EXISTS plain_owner")
        conn.execute("CREATE ROLE plain_owner LOGIN NOSUPERUSER")
        conn.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO plain_owner')
    with pytest.raises(PostgresUnavailableError) as caught:
        PostgresStore(resolve_target(pg_server.dsn(dbname, user="plain_owner")), agent_id="main",
                      workspace="/ws")
    message = str(caught.value)
    assert message.startswith('postgres unavailable: the pgvector extension is not available:'
                              ' permission denied to create extension "vector"')
    assert f'(database "{dbname}" on host {pg_server.data_dir} port 5432 as user plain_owner)' in message
    assert message.endswith("install pgvector on the server (e.g. the postgresql-16-pgvector package)"
                            " and run CREATE EXTENSION vector as a superuser")
    with psycopg.connect(pg_dsn) as conn:  # the failed migration left nothing behind
        assert conn.execute("SELECT to_regnamespace('qmdbridge')").fetchone() == (None,)


def test_a_missing_extension_control_file_is_told_as_missing_pgvector(pg_dsn: str) -> None:
    from fallback.store.postgres.errors import translate

    with psycopg.connect(pg_dsn, autocommit=True) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute("CREATE EXTENSION vector_not_installed")
    assert raised.value.sqlstate == "0A000"  # PostgreSQL 16: feature_not_supported
    err = translate(raised.value, resolve_target(pg_dsn), doing="migrate the schema", timeout_ms=1000)
    assert isinstance(err, PostgresUnavailableError)
    assert str(err).startswith("postgres unavailable: the pgvector extension is not available: extension"
                               ' "vector_not_installed" is not available')


def test_vector_rows_nearest_first_and_the_shared_embedding_cache(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    other = PostgresStore(resolve_target(pg_dsn), agent_id="other", workspace="/ws")
    try:
        for s, vectors in ((store, [[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0]]),
                           (other, [[1.0, 0.0, 0.0]] * 3)):
            lease = s.sync_lease()
            assert lease is not None
            lease.write_file("memory/v.md", "memory", content_hash="v", mtime_ms=1, size=1, title="v",
                             chunks=[ChunkRow(f"{s.agent_id}-{i}", i + 1, i + 1, f"h{i}", "m", f"text {i}", "", v)
                                     for i, v in enumerate(vectors)])
            lease.publish()
        rows = store.vector_rows([1.0, 0.0, 0.0], sources=["memory"], limit=2)
        assert [r[0] for r in rows] == ["main-0", "main-1"]
        assert [r[6] for r in rows] == pytest.approx([0.0, 0.4])
        assert store.vector_rows([1.0, 0.0, 0.0], sources=["sessions"], limit=2) == []
        with psycopg.connect(pg_dsn) as conn:  # no vector index (m010): vectors are compared exactly
            assert conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 'chunk_vectors'"
                                " AND indexdef LIKE '%USING hnsw%'").fetchone() == (0,)
        store.cache_embeddings({"hash-a": [0.5, 0.5], "hash-b": [1.0, 0.0]}, "fp-1")
        assert other.cached_embeddings(["hash-a", "hash-c"], "fp-1") == {"hash-a": [0.5, 0.5]}
        assert other.cached_embeddings(["hash-a"], "fp-2") == {}
    finally:
        store.close()
        other.close()


def test_m010_drops_the_vector_indexes_the_syncs_before_created(pg_dsn: str) -> None:
    """A schema whose syncs created an HNSW index per dimension count (before ``m010``) loses
    them at the next migration; the vectors stay and are searched exactly."""
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        lease = store.sync_lease()
        assert lease is not None
        lease.write_file("memory/v.md", "memory", content_hash="v", mtime_ms=1, size=1, title="v",
                         chunks=[ChunkRow("v-0", 1, 1, "h0", "m", "t", "", [0.6, 0.8, 0.0])])
        lease.publish()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for d in (3, 384):  # as the syncs before m010 created them
                conn.execute(f"CREATE INDEX chunk_vectors_hnsw_{d} ON qmdbridge.chunk_vectors USING hnsw"
                             f" ((embedding::vector({d})) vector_cosine_ops) WHERE dims = {d}")
            conn.execute("DELETE FROM qmdbridge.schema_migrations WHERE version = 10")
            assert migrate(conn, "qmdbridge") == ["m010_no_vector_index"]
            assert conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'chunk_vectors'"
                                " ORDER BY 1").fetchall() == [("chunk_vectors_pkey",), ("chunk_vectors_scope",)]
        assert [(r[0], round(r[6], 6)) for r in store.vector_rows([1.0, 0.0, 0.0], sources=["memory"],
                                                                   limit=2)] == [("v-0", 0.4)]
    finally:
        store.close()


def test_rows_of_a_few_kb_are_stored_whole_and_uncompressed(pg_dsn: str) -> None:
    """A chunk row and a posting block of 3 to 4 kB (a long text, a word repeated in it) are
    written uncompressed in their pages (``m011``: PostgreSQL compressed such rows with pglz,
    a large share of a write's server work)."""
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        text = " ".join(["otter"] * 400 + [f"w{i}" for i in range(200)])
        lease = store.sync_lease()
        assert lease is not None
        lease.write_file("memory/o.md", "memory", content_hash="o", mtime_ms=1, size=len(text), title="o",
                         chunks=[ChunkRow("o-0", 1, 1, "h0", "", text, "")])
        lease.publish()
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT octet_length(text), pg_column_compression(text),"
                                " pg_column_size(text) FROM qmdbridge.chunks").fetchone() == (3289, None, 3293)
            assert conn.execute("SELECT pg_column_compression(positions), pg_column_size(positions)"
                                " FROM qmdbridge.posting_blocks WHERE term = 'otter'").fetchone() == (None, 1624)
        assert found(store, "otter") == ["o-0"]
    finally:
        store.close()


def test_a_second_sync_waits_for_the_first_and_then_runs(pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        first = store.sync_lease()
        assert first is not None and first.generation == 1
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(store.sync_lease(wait_ms=60_000)))
        waiter.start()
        # Publish once the second sync is waiting on the lock (seen in pg_locks, not slept for).
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while not conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                   " AND NOT granted").fetchone()[0]:
                assert waiter.is_alive()
        first.write_file("memory/a.md", "memory", content_hash="a", mtime_ms=1, size=1, title="a",
                         chunks=[ChunkRow("a-1", 1, 1, "a1", "", "puffin", "")])
        first.publish()
        waiter.join()
        second = got[0]
        assert second is not None and second.generation == 2  # it started after the publish
        # the statement deadline, lifted for the wait, is back on the lease's connection
        assert second._conn.execute("SHOW statement_timeout").fetchone() == ("10s",)
        second.close()
        assert found(store, "puffin") == ["a-1"]
    finally:
        store.close()


def test_a_sync_waits_for_another_past_the_statement_deadline_and_names_it(pg_dsn: str) -> None:
    """The wait for another host's sync is bounded by ``wait_ms`` (the engine's 30 s), not by
    ``statementTimeoutMs``: past it the holder is named."""
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws",
                          statement_timeout_ms=1000)
    try:
        first = store.sync_lease()
        assert first is not None
        try:
            assert store.sync_lease(wait_ms=2500) is None
            assert store.busy_reason is not None and store.busy_reason.startswith(
                "another sync of agent main workspace /ws is running: qmdbridge:main from local socket")
        finally:
            first.close()
    finally:
        store.close()


def test_write_files_writes_many_files_in_one_call_with_any_text(pg_dsn: str) -> None:
    from fallback.store.postgres.store import FileRows

    odd = 'say "hi" \\ back\\slash {brace}, comma NULL \'quote\''
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        write(store, {"memory/old.md": "stale pear", "memory/keep.md": "kept plum"})
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files([
            FileRows("memory/old.md", "memory", "h-new", 2, 3, 'title "x"',
                     (ChunkRow("old#1", 1, 2, "c1", "", "fresh pear", ""),
                      ChunkRow("old#2", 3, 4, "c2", "", odd, "brace"))),
            FileRows("memory/new, {1}.md", "sessions", "h-n", 2, 3, "n",
                     (ChunkRow("new#1", 1, 1, "c3", "", "pear tree", ""),)),
            FileRows("memory/empty.md", "memory", "h-e", 2, 0, "e"),
        ])
        assert lease.file_hash("memory/old.md", "memory") == "h-new"
        assert lease.file_hash("memory/new, {1}.md", "sessions") == "h-n"
        assert lease.file_hash("memory/empty.md", "memory") == "h-e"
        assert lease.publish().chunk_count == 4
        rows = store.chunk_rows(["old#1", "old#2", "new#1", "memory/keep.md#1", "memory/old.md#1"])
        assert [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
            ("old#1", "memory/old.md", "memory", 1, 2, "fresh pear"),
            ("old#2", "memory/old.md", "memory", 3, 4, odd),
            ("new#1", "memory/new, {1}.md", "sessions", 1, 1, "pear tree"),
            ("memory/keep.md#1", "memory/keep.md", "memory", 1, 1, "kept plum")]
        assert found(store, "pear") == ["old#1"]
        assert [r[0] for r in store.keyword_rows('"pear"', sources=["memory", "sessions"],
                                                 limit=10)] == ["new#1", "old#1"]
        assert found(store, "backslash") == [] and found(store, "brace") == ["old#2"]
    finally:
        store.close()


def test_postings_keep_a_scope_and_terms_holding_tabs_backslashes_and_newlines(pg_dsn: str) -> None:
    """The schema owner's postings go by COPY (text format): an agent id, a workspace and
    trigram terms holding a backslash, a tab or a newline are stored as they are."""
    agent, ws = "team\\bot", "/srv/ws\ttab\\x {1}\nline"
    store = PostgresStore(resolve_target(pg_dsn), agent_id=agent, workspace=ws)
    try:
        write(store, {"memory/a.md": "otter 日本\\語\t文字"})
        assert found(store, "otter") == ["memory/a.md#1"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            scopes = conn.execute("SELECT DISTINCT agent_id, workspace, gen_from FROM qmdbridge.posting_blocks"
                                  " WHERE term = 'otter'").fetchall()
            trigrams = [r[0] for r in conn.execute(
                "SELECT term FROM qmdbridge.trigram_postings WHERE agent_id = %s AND workspace = %s"
                " ORDER BY term", (agent, ws))]
        assert scopes == [(agent, ws, 1)]
        assert "本\\語" in trigrams and "語\t文" in trigrams and "\\語\t" in trigrams
    finally:
        store.close()


def test_a_large_write_batch_is_written_by_statements_of_bounded_size(pg_dsn: str) -> None:
    from fallback.store.postgres.store import POSTINGS_PER_STATEMENT, WRITE_POSTINGS_PER_STATEMENT, FileRows

    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        # Each statement writing postings (COPY or INSERT) records how many postings it wrote.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.insert_sizes (n int NOT NULL)")
            conn.execute("CREATE FUNCTION public.record_insert() RETURNS trigger LANGUAGE plpgsql AS"
                         " $$ BEGIN INSERT INTO public.insert_sizes SELECT sum(cardinality(rowids))"
                         " FROM new_rows; RETURN NULL; END $$")
            conn.execute("CREATE TRIGGER record_insert AFTER INSERT ON qmdbridge.posting_blocks"
                         " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT"
                         " EXECUTE FUNCTION public.record_insert()")
        # 60 files of 3 chunks, each chunk 250 distinct words: 45,000 postings in one call.
        files = [FileRows(f"memory/{f}.md", "memory", f"h{f}", 1, 1, "",
                          tuple(ChunkRow(f"{f}#{c}", c, c, f"c{f}-{c}", "",
                                         " ".join(f"w{f}x{c}x{w}" for w in range(250)), "")
                                for c in range(3))) for f in range(60)]
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files(files)
        assert lease.publish().chunk_count == 180
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            sizes = [r[0] for r in conn.execute("SELECT n FROM public.insert_sizes")]
        assert sum(sizes) == 45_000 and len(sizes) == 3
        assert max(sizes) <= WRITE_POSTINGS_PER_STATEMENT
        assert found(store, "w59x2x99") == ["59#2"]
        # Publishing their removal takes their postings out of the blocks by bounded
        # statements too: each DELETE records the postings of the blocks it took.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.delete_sizes (n int NOT NULL)")
            conn.execute("CREATE FUNCTION public.record_delete() RETURNS trigger LANGUAGE plpgsql AS"
                         " $$ BEGIN INSERT INTO public.delete_sizes SELECT sum(cardinality(rowids))"
                         " FROM old_rows; RETURN NULL; END $$")
            conn.execute("CREATE TRIGGER record_delete AFTER DELETE ON qmdbridge.posting_blocks"
                         " REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT"
                         " EXECUTE FUNCTION public.record_delete()")
        lease = store.sync_lease()
        assert lease is not None
        for f in files[1:]:
            lease.delete_file(f.path, "memory")
        assert lease.publish().chunk_count == 3
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            sizes = [r[0] for r in conn.execute("SELECT n FROM public.delete_sizes")]
            left = conn.execute("SELECT sum(cardinality(rowids)) FROM qmdbridge.posting_blocks").fetchone()
        assert sum(sizes) == 44_250 and len(sizes) == 9 and max(sizes) <= POSTINGS_PER_STATEMENT
        assert left == (750,)
        assert found(store, "w59x2x99") == [] and found(store, "w0x2x99") == ["0#2"]
    finally:
        store.close()


def test_term_stats_follow_the_published_postings_through_rewrites_deletes_and_a_dropped_sync(
        pg_dsn: str) -> None:
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    truth = ("SELECT b.term, count(*), ARRAY[max(u.h0), max(u.h1), max(u.h2)], min(u.dl)"
             " FROM qmdbridge.posting_blocks b"
             " JOIN qmdbridge.workspaces w USING (agent_id, workspace) CROSS JOIN LATERAL"
             " unnest(b.lens, b.tf_text, b.tf_title, b.tf_terms) AS u(dl, h0, h1, h2)"
             " WHERE b.gen_from <= w.published_generation GROUP BY b.term ORDER BY b.term")
    try:
        write(store, {"memory/a.md": "apple apple pear", "memory/b.md": "pear plum", "memory/c.md": "fig"})
        # A sync that writes and leaves without publishing: the next one publishes its rows.
        lease = store.sync_lease()
        assert lease is not None
        lease.write_file("memory/d.md", "memory", content_hash="hd", mtime_ms=1, size=1, title="d",
                         chunks=[ChunkRow("d#1", 1, 1, "cd", "", "kiwi pear pear pear", "")])
        lease.close()
        lease = store.sync_lease()
        assert lease is not None
        lease.write_file("memory/a.md", "memory", content_hash="ha2", mtime_ms=2, size=1, title="a",
                         chunks=[ChunkRow("a#2", 1, 1, "ca2", "", "plum", "")])
        lease.write_file("memory/a.md", "memory", content_hash="ha3", mtime_ms=3, size=1, title="a",
                         chunks=[ChunkRow("a#3", 1, 1, "ca3", "", "plum lime", "")])
        lease.delete_file("memory/c.md", "memory")
        lease.publish()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            want = conn.execute(truth).fetchall()
            got = conn.execute("SELECT term, df, max_tf, min_dl FROM qmdbridge.term_stats"
                               " ORDER BY term").fetchall()
        assert [(t, n) for t, n, _, _ in got] == [(t, n) for t, n, _, _ in want] == [
            ("a", 1), ("b", 1), ("d", 1), ("kiwi", 1), ("lime", 1), ("md", 1), ("memori", 1),
            ("pear", 2), ("plum", 2)]
        # The hit and length bounds never fall below the postings' own (they only widen).
        for (_, _, hits, dl), (_, _, top, shortest) in zip(got, want, strict=True):
            assert all(h >= t for h, t in zip(hits, top, strict=True)) and dl <= shortest
        assert found(store, "pear") == ["d#1", "memory/b.md#1"]
    finally:
        store.close()


def test_m005_copies_each_postings_chunk_values_and_drops_retired_postings(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fallback.store.postgres import migrations

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:4])
        migrate(conn, "qmdbridge")
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:7])  # up to m007
        s = "qmdbridge"
        conn.execute(f"INSERT INTO {s}.workspaces (agent_id, workspace, published_generation,"
                     " chunk_count, token_count) VALUES ('main', '/ws', 2, 1, 9)")
        # (id, source, doc_len, gen_from, gen_to): live, retired by the published generation,
        # written by an unpublished sync.
        for cid, source, n, gen_from, gen_to in (("live", "sessions", 9, 1, None),
                                                 ("retired", "memory", 4, 1, 2),
                                                 ("next", "memory", 6, 3, None)):
            rowid = conn.execute(
                f"INSERT INTO {s}.chunks (agent_id, workspace, id, path, source, start_line,"
                " end_line, hash, model, text, doc_len, gen_from, gen_to) VALUES ('main', '/ws',"
                " %s, 'p.md', %s, 1, 1, 'h', '', 'x', %s, %s, %s) RETURNING chunk_rowid",
                (cid, source, n, gen_from, gen_to)).fetchone()[0]
            # Text offsets 0 and 5, a title offset (column 1), a terms offset (column 2).
            conn.execute(f"INSERT INTO {s}.postings (agent_id, workspace, term, chunk_rowid,"
                         " positions) VALUES ('main', '/ws', 'walrus', %s, %s)",
                         (rowid, [0, 5, 1 << 20 | 1, 2 << 20 | 3]))
        assert migrate(conn, s) == ["m005_posting_impacts", "m006_vector_windows", "m007_term_stats"]
        rows = conn.execute(f"SELECT c.id, p.tf, p.doc_len, p.source, p.gen_from FROM {s}.postings p"
                            f" JOIN {s}.chunks c USING (chunk_rowid) ORDER BY c.id").fetchall()
        # m007: the published generation's statistics (the unpublished sync's posting is not).
        stats = conn.execute(f"SELECT term, df, max_tf, min_dl FROM {s}.term_stats").fetchall()
    assert rows == [("live", [2, 1, 1], 9, "sessions", 1), ("next", [2, 1, 1], 6, "memory", 3)]
    assert stats == [("walrus", 1, [2, 1, 1], 9)]


def test_a_file_rewritten_leaves_the_blocks_it_shared_with_other_files(pg_dsn: str) -> None:
    """Files written in one call share a term's posting block; rewriting one of them (and
    deleting another) takes their chunks' postings out of the shared blocks at publish: the
    ranks, row by row, and the term statistics are those of a store that wrote the end state
    from scratch."""
    from fallback.store.postgres.store import FileRows

    def files(texts: dict[str, str]) -> list[FileRows]:
        return [FileRows(p, "memory", f"h-{t}", 1, len(t), p,
                         tuple(ChunkRow(f"{p}#{i}", i, i, f"c-{p}-{i}-{t}", "", line, "")
                               for i, line in enumerate(t.split("|"), start=1)))
                for p, t in texts.items()]

    first = {"memory/a.md": "walrus tusk ice|walrus swim", "memory/b.md": "walrus tusk|seal ice",
             "memory/c.md": "ice floe walrus walrus", "memory/d.md": "tusk seal"}
    end = {"memory/a.md": "walrus tusk ice|walrus swim", "memory/b.md": "walrus krill|seal",
           "memory/c.md": "ice floe walrus walrus"}
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    fresh = PostgresStore(resolve_target(pg_dsn), agent_id="fresh", workspace="/ws")
    try:
        for target, batches in ((store, [first]), (fresh, [end])):
            lease = target.sync_lease()
            assert lease is not None
            for texts in batches:
                lease.write_files(files(texts))
            lease.publish()
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files(files({"memory/b.md": end["memory/b.md"]}))
        lease.delete_file("memory/d.md", "memory")
        # Not published yet: readers still rank the first state.
        assert found(store, "tusk") == ["memory/b.md#1", "memory/d.md#1", "memory/a.md#1"]
        lease.publish()
        for query in ('"walrus"', '"tusk"', '"seal" OR "ice"', '"walrus" OR "krill" OR "swim"',
                      'NEAR("walrus" "tusk", 2)'):
            assert store.keyword_rows(query, sources=["memory"], limit=10) == \
                fresh.keyword_rows(query, sources=["memory"], limit=10), query
        assert [r[0] for r in store.keyword_rows('"tusk" OR "krill"', sources=["memory"], limit=10)] \
            == ["memory/b.md#1", "memory/a.md#1"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            stats = {agent: conn.execute("SELECT term, df, min_dl FROM qmdbridge.term_stats"
                                         " WHERE agent_id = %s ORDER BY term", (agent,)).fetchall()
                     for agent in ("main", "fresh")}
            postings = {agent: conn.execute(
                "SELECT b.term, sum(cardinality(b.rowids)) FROM qmdbridge.posting_blocks b"
                " WHERE agent_id = %s GROUP BY b.term ORDER BY b.term", (agent,)).fetchall()
                for agent in ("main", "fresh")}
        assert [(t, n) for t, n, _ in stats["main"]] == [(t, n) for t, n, _ in stats["fresh"]]
        assert postings["main"] == postings["fresh"]
        assert dict(postings["main"])["walru"] == 4 and dict(postings["main"])["tusk"] == 1
    finally:
        store.close()
        fresh.close()


def test_a_write_of_both_sources_keeps_each_terms_blocks_apart(pg_dsn: str) -> None:
    """Files of both sources in one write, in interleaved order: a chunk rewritten later
    leaves its own source's block (found by key), so the postings and statistics are those of
    a store that wrote the end state from scratch."""
    from fallback.store.postgres.store import FileRows

    def rows(texts: dict[tuple[str, str], str]) -> list[FileRows]:
        return [FileRows(p, src, f"h-{t}", 1, len(t), p, (ChunkRow(f"{p}#1", 1, 1, f"c-{p}-{t}", "", t, ""),))
                for (p, src), t in texts.items()]

    first = {("memory/a.md", "memory"): "walrus ice", ("s/b.jsonl", "sessions"): "walrus seal",
             ("memory/c.md", "memory"): "walrus tusk", ("s/d.jsonl", "sessions"): "walrus krill"}
    end = {**first, ("memory/c.md", "memory"): "narwhal tusk"}
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    fresh = PostgresStore(resolve_target(pg_dsn), agent_id="fresh", workspace="/ws")
    try:
        for target, texts in ((store, first), (fresh, end)):
            lease = target.sync_lease()
            assert lease is not None
            lease.write_files(rows(texts))
            lease.publish()
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files(rows({("memory/c.md", "memory"): end[("memory/c.md", "memory")]}))
        lease.publish()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            postings = {agent: conn.execute(
                "SELECT term, source, sum(cardinality(rowids)) FROM qmdbridge.posting_blocks"
                " WHERE agent_id = %s GROUP BY term, source ORDER BY term, source", (agent,)).fetchall()
                for agent in ("main", "fresh")}
            stats = {agent: conn.execute("SELECT term, df FROM qmdbridge.term_stats WHERE agent_id = %s"
                                         " ORDER BY term", (agent,)).fetchall() for agent in ("main", "fresh")}
        assert postings["main"] == postings["fresh"]
        assert ("walru", "memory", 1) in postings["main"] and ("walru", "sessions", 2) in postings["main"]
        assert stats["main"] == stats["fresh"]
        both = ["memory", "sessions"]
        for query in ('"walrus"', '"walrus" OR "tusk"', '"narwhal" OR "seal"'):
            assert store.keyword_rows(query, sources=both, limit=10) == \
                fresh.keyword_rows(query, sources=both, limit=10), query
    finally:
        store.close()
        fresh.close()


def test_m009_turns_each_posting_into_a_block_and_keeps_the_grants(
        pg_server: PgServer, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database of the schema before posting blocks (m001-m008, rows as its store wrote
    them) is converted: one block per posting, each chunk's terms, the agent role's grants on
    the postings carried over; searches rank as before and the next sync retires old rows."""
    from fallback.store.postgres import migrations

    dbname = str(psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"])
    s = "qmdbridge"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:8])
        migrate(conn, s)
        conn.execute("DROP ROLE IF EXISTS m9_role")
        conn.execute("CREATE ROLE m9_role LOGIN NOSUPERUSER")
        conn.execute(f"GRANT USAGE ON SCHEMA {s} TO m9_role")
        conn.execute(f"GRANT SELECT ON {s}.agents, {s}.shares, {s}.schema_migrations TO m9_role")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.workspaces, {s}.files, {s}.chunks,"
                     f" {s}.postings, {s}.trigram_postings, {s}.term_stats, {s}.chunk_vectors TO m9_role")
        conn.execute(f"INSERT INTO {s}.agents VALUES ('main', 'm9_role')")
        conn.execute(f"INSERT INTO {s}.workspaces (agent_id, workspace, published_generation,"
                     " chunk_count, token_count) VALUES ('main', '/ws', 1, 2, 7)")
        # (id, path, doc_len, {term: positions}) as the store wrote them before m009.
        for cid, path, n, terms in (("a#1", "memory/a.md", 3, {"otter": [0, 2], "river": [1]}),
                                    ("b#1", "memory/b.md", 4, {"otter": [0], "sea": [1, 2, 1 << 20]})):
            rowid = conn.execute(
                f"INSERT INTO {s}.chunks (agent_id, workspace, id, path, source, start_line,"
                " end_line, hash, model, text, doc_len, gen_from) VALUES ('main', '/ws', %s, %s,"
                " 'memory', 1, 1, 'h', '', 'x', %s, 1) RETURNING chunk_rowid", (cid, path, n)).fetchone()[0]
            conn.execute(f"INSERT INTO {s}.files (agent_id, workspace, path, source, hash, mtime, size,"
                         " gen_from) VALUES ('main', '/ws', %s, 'memory', 'h', 1, 1, 1)", (path,))
            for term, positions in terms.items():
                hits = [sum(1 for p in positions if p >> 20 == c) for c in range(3)]
                conn.execute(f"INSERT INTO {s}.postings (agent_id, workspace, term, chunk_rowid,"
                             " positions, tf, doc_len, source, gen_from) VALUES ('main', '/ws', %s, %s,"
                             " %s, %s, %s, 'memory', 1)", (term, rowid, positions, hits, n))
                conn.execute(f"INSERT INTO {s}.term_stats VALUES ('main', '/ws', %s, 1, %s, %s)"
                             " ON CONFLICT (agent_id, workspace, term) DO UPDATE SET df = 2,"
                             " min_dl = 3", (term, hits, n))
        monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
        assert migrate(conn, s) == ["m009_posting_blocks", "m010_no_vector_index", "m011_rows_uncompressed"]
        assert migrate(conn, s) == []
        assert conn.execute("SELECT to_regclass('qmdbridge.postings')").fetchone() == (None,)
        blocks = conn.execute(f"SELECT c.id, b.term, b.rowids = ARRAY[c.chunk_rowid], b.lens,"
                              " ARRAY[b.tf_text, b.tf_title, b.tf_terms],"
                              f" b.ends, b.positions FROM {s}.posting_blocks b JOIN {s}.chunks c"
                              " ON c.chunk_rowid = b.chunk_rowid ORDER BY c.id, b.term").fetchall()
        assert blocks == [("a#1", "otter", True, [3], [[2], [0], [0]], [2], [0, 2]),
                          ("a#1", "river", True, [3], [[1], [0], [0]], [1], [1]),
                          ("b#1", "otter", True, [4], [[1], [0], [0]], [1], [0]),
                          ("b#1", "sea", True, [4], [[2], [1], [0]], [3], [1, 2, 1 << 20])]
        assert conn.execute(f"SELECT id, terms FROM {s}.chunks ORDER BY id").fetchall() == [
            ("a#1", "otter river"), ("b#1", "otter sea")]
        assert conn.execute("SELECT has_table_privilege('m9_role', 'qmdbridge.posting_blocks', 'SELECT')"
                            " AND has_table_privilege('m9_role', 'qmdbridge.posting_blocks', 'INSERT')"
                            " AND has_table_privilege('m9_role', 'qmdbridge.posting_blocks', 'DELETE')"
                            ).fetchone() == (True,)
    # The agent's own role (row-level security: INSERTs, not COPY) searches and syncs.
    agent = PostgresStore(resolve_target(pg_server.dsn(dbname, user="m9_role")), agent_id="main",
                          workspace="/ws", run_migrations=False)
    try:
        assert found(agent, "otter") == ["a#1", "b#1"]
        assert found(agent, "sea") == ["b#1"]
        write(agent, {"memory/b.md": "river delta"})
        assert found(agent, "otter") == ["a#1"]
        assert found(agent, "river") == ["a#1", "memory/b.md#1"]
        assert found(agent, "sea") == []
    finally:
        agent.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT term, df FROM {s}.term_stats ORDER BY term").fetchall() == [
            ("b", 1), ("delta", 1), ("md", 1), ("memori", 1), ("otter", 1), ("river", 2)]


def test_a_write_commits_while_the_one_before_it_waits_and_each_draws_its_own_row_ids(pg_dsn: str) -> None:
    """Two writes of a lease in flight at once, on connections of their own: with the first
    (its files hold WRITE_CHUNKS chunks, so write_files sends them) held by a lock on
    ``trigram_postings`` (its CJK chunk), the second commits (its files' notifications
    arrive) before the first does; each write's chunk row ids form a range the other's does
    not enter, and the published index ranks as a store that wrote the same files one write
    after the other."""
    from fallback.store.postgres.store import WRITE_CHUNKS, FileRows

    def rows(texts: dict[str, str]) -> list[FileRows]:
        return [FileRows(p, "memory", f"h-{t}", 1, len(t), p,
                         tuple(ChunkRow(f"{p}#{i}", i, i, f"c-{p}-{i}", "", line, "")
                               for i, line in enumerate(t.split("|"), start=1)))
                for p, t in texts.items()]

    held = {"memory/a.md": "walrus tusk 海象|walrus ice",
            "memory/b.md": "|".join(f"seal ice n{i}" for i in range(WRITE_CHUNKS - 2))}
    free = {"memory/c.md": "walrus krill|tusk seal", "memory/d.md": "ice floe walrus"}
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    fresh = PostgresStore(resolve_target(pg_dsn), agent_id="fresh", workspace="/ws")
    listener = psycopg.connect(pg_dsn, autocommit=True)
    blocker = psycopg.connect(pg_dsn)
    try:
        lease = fresh.sync_lease()
        assert lease is not None
        lease.write_files(rows(held))
        lease.flush()
        lease.write_files(rows(free))
        lease.publish()
        listener.execute("CREATE FUNCTION public.told() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                         " PERFORM pg_notify('written', NEW.agent_id || ' ' || NEW.path); RETURN NEW; END $$")
        listener.execute("CREATE TRIGGER told AFTER INSERT ON qmdbridge.files FOR EACH ROW"
                         " EXECUTE FUNCTION public.told()")
        listener.execute("LISTEN written")
        blocker.execute("LOCK TABLE qmdbridge.trigram_postings IN SHARE MODE")  # COPY waits
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files(rows(held))
        # The first write waits on the lock (seen in pg_locks, not slept for; bounded).
        deadline = time.monotonic() + 120
        while not listener.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'relation'"
                                   " AND NOT granted").fetchone()[0]:
            assert time.monotonic() < deadline
        second = threading.Thread(target=lambda: (lease.write_files(rows(free)), lease.flush()))
        second.start()
        told = [n.payload for n in listener.notifies(timeout=120, stop_after=2)]
        blocker.rollback()
        second.join()
        assert told == ["main memory/c.md", "main memory/d.md"]
        lease.publish()
        ranges = listener.execute("SELECT path IN ('memory/a.md', 'memory/b.md'), min(chunk_rowid),"
                                  " max(chunk_rowid) FROM qmdbridge.chunks WHERE agent_id = 'main'"
                                  " GROUP BY 1").fetchall()
        assert len(ranges) == 2
        (_, low_a, high_a), (_, low_b, high_b) = sorted(ranges, key=lambda r: r[1])
        assert high_a < low_b
        for query in ('"walrus"', '"tusk" OR "seal"', '"ice" OR "krill"', '"海象"', 'NEAR("walrus" "tusk", 2)'):
            assert store.keyword_rows(query, sources=["memory"], limit=10) == \
                fresh.keyword_rows(query, sources=["memory"], limit=10), query
        postings = {agent: listener.execute(
            "SELECT term, sum(cardinality(rowids)) FROM qmdbridge.posting_blocks WHERE agent_id = %s"
            " GROUP BY term ORDER BY term", (agent,)).fetchall() for agent in ("main", "fresh")}
        assert postings["main"] == postings["fresh"]
        assert (dict(postings["main"])["walru"], dict(postings["main"])["seal"]) == (4, WRITE_CHUNKS - 1)
    finally:
        blocker.close()
        listener.close()
        store.close()
        fresh.close()


def test_a_publish_after_writes_on_both_connections_analyses_every_table(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync whose writes ran on both writer connections analyses the posting blocks on the
    second one while the first analyses the other tables: the planner's row counts of both
    are the written ones after the publish."""
    from fallback.store.postgres import store as store_module
    from fallback.store.postgres.store import FileRows

    monkeypatch.setattr(store_module, "WRITE_CHUNKS", 1)  # a write per file
    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        lease = store.sync_lease()
        assert lease is not None
        for i in range(4):
            lease.write_files([FileRows(f"memory/{i}.md", "memory", f"h{i}", 1, 1, "t",
                                        (ChunkRow(f"{i}#1", 1, 1, f"c{i}", "", f"walrus w{i}", ""),))])
        assert len(lease._conns) == 2
        lease.publish()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT relname, reltuples FROM pg_class WHERE relnamespace ="
                                " 'qmdbridge'::regnamespace AND relname IN ('chunks', 'posting_blocks')"
                                " ORDER BY 1").fetchall() == [("chunks", 4), ("posting_blocks", 12)]
        assert found(store, "walrus") == ["0#1", "1#1", "2#1", "3#1"]
    finally:
        store.close()


def test_files_of_several_calls_are_written_as_one_write_and_close_writes_the_ones_gathered(
        pg_dsn: str) -> None:
    """write_files gathers files across calls until they hold WRITE_CHUNKS chunks: two calls of
    one file each make one block per term; files gathered when the lease closes unpublished
    are written for the next lease; the publish of a sync that wrote much analyses ``files``
    too (unanalysed, the planner took the scope's files for one row and compared each with
    every path a write replaces)."""
    from fallback.store.postgres.store import FileRows

    def rows(path: str, text: str) -> list[FileRows]:
        return [FileRows(path, "memory", f"h-{text}", 1, len(text), path,
                         (ChunkRow(f"{path}#1", 1, 1, f"c-{text}", "", text, ""),))]

    store = PostgresStore(resolve_target(pg_dsn), agent_id="main", workspace="/ws")
    try:
        lease = store.sync_lease()
        assert lease is not None
        lease.write_files(rows("memory/a.md", "walrus tusk"))
        lease.write_files(rows("memory/b.md", "walrus ice"))
        lease.close()
        lease = store.sync_lease()
        assert lease is not None
        assert lease.file_hash("memory/b.md", "memory") == "h-walrus ice"
        lease.write_files(rows("memory/c.md", "seal"))
        lease.publish()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the publish analysed the files
            assert conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'qmdbridge.files'::regclass"
                                ).fetchone()[0] == 3
        assert found(store, "walrus") == ["memory/a.md#1", "memory/b.md#1"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT term, cardinality(rowids) FROM qmdbridge.posting_blocks"
                                " WHERE term IN ('walru', 'seal') ORDER BY term").fetchall() == [
                ("seal", 1), ("walru", 2)]
    finally:
        store.close()
