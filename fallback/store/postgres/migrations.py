"""Numbered schema migrations of the postgres store, safe when several hosts start at once.

:func:`migrate` runs every pending ``mNNN_name(cur, schema)`` in one transaction that first takes
a transaction-level advisory lock on the schema (``pg_advisory_xact_lock``): a second host
starting at the same moment waits for the first to commit, then finds nothing left to do.
Each applied migration is recorded in ``<schema>.schema_migrations(version, name)`` in the same
transaction; running :func:`migrate` again changes nothing. A shipped migration is never edited.

Schema (every data row carries ``agent_id`` and ``workspace``):

- ``agents(agent_id, role_name)``: which database role acts for which agent (row-level security);
  ``shares(owner_agent, reader_agent)``: ``reader_agent`` may read ``owner_agent``'s rows.
- ``workspaces(agent_id, workspace, published_generation, chunk_count, token_count,
  last_sync_at, meta)``: the pointer readers follow (see below) and the BM25 statistics of the
  published generation (chunks, and tokens over all indexed columns).
- ``files(agent_id, workspace, path, source, hash, mtime, size, gen_from, gen_to, text)``;
  ``text`` is a memory file's text (``m008``), read by the agents it is shared with.
- ``chunks(chunk_rowid, agent_id, workspace, id, path, source, start_line, end_line, hash, model,
  text, doc_len, terms, gen_from, gen_to)``; ``doc_len`` is the chunk's token count over its three
  indexed columns (text, title, derived terms), as FTS5 counts it for ``bm25()``; ``terms`` its
  distinct terms, space-separated (``m009``). Its rows and ``posting_blocks``' stay uncompressed
  up to 8,160 bytes (``m011``).
- ``posting_blocks(agent_id, workspace, term, chunk_rowid, rowids, lens, tf_text, tf_title,
  tf_terms, ends, positions, source, gen_from)`` (``m009``, replacing ``postings``): per term,
  the postings of up to 64 chunks of one write and source, keyed by the first chunk: ``rowids``
  ascending, ``lens`` their ``doc_len``, ``tf_*`` their hits in each column, ``positions`` (FTS5 token offsets,
  ``column << 20 | offset``; column 0 text, 1 title, 2 terms) one chunk after another, chunk
  ``i``'s ending at ``ends[i]``; so a search's bm25 bound reads the blocks alone. A block is
  visible in generation ``G`` when ``gen_from <= G``: the postings a sync retires leave their
  blocks in the transaction that publishes it. Rows keyed by ``chunk_rowid`` (posting blocks,
  trigram postings, vectors) carry no foreign key: a per-row check on every posting took a
  third of the write time; the store deletes them with their chunk (``store._delete_chunks``).
- ``trigram_postings(agent_id, workspace, term, chunk_rowid, positions)``: one row per FTS5
  ``trigram`` token of a chunk with CJK text
  (``m004``), with ``chunks.trigram_len`` and the workspace's trigram statistics.
- ``term_stats(agent_id, workspace, term, df, max_tf, min_dl)``: per term of the published
  index, its chunk count and bounds of its postings' hits and chunk lengths (``m007``).
- ``embedding_cache(content_hash, fingerprint, dims, embedding)``: shared by every agent.
- ``chunk_vectors(chunk_rowid, window_no, agent_id, workspace, dims, embedding)``: pgvector, one
  row per embedding window of a chunk (``m006``; a chunk embedded whole is window 0), each a
  unit vector; no vector index (``m010``): every search compares the scope's windows exactly.

Generations: a row is part of generation ``G`` when ``gen_from <= G`` and (``gen_to`` is NULL or
``gen_to > G``). A sync writes generation ``P + 1`` beside the published ``P`` and publishes it by
updating ``workspaces.published_generation`` in one transaction; readers never wait for it.

Row-level security on every table holding agent rows: a role listed in ``agents.role_name``
reads and writes its agent's rows, and reads (only) the rows of agents that share with it. The
schema owner (who runs the migrations) is not restricted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MIGRATIONS", "POSITION_COLUMN_SHIFT", "TF_COLUMNS", "applied_versions", "migrate"]

# positions = column << POSITION_COLUMN_SHIFT | token offset (a column holds < 2**20 tokens).
POSITION_COLUMN_SHIFT = 20
# The posting blocks' hits of each chunk in the text, title and terms columns (m009).
TF_COLUMNS = ("tf_text", "tf_title", "tf_terms")
# Tables whose rows belong to an agent (row-level security applies to each).
AGENT_TABLES = ("workspaces", "files", "chunks", "postings", "chunk_vectors")


def _q(schema: str) -> str:
    return f'"{schema}"'


def m001_core(cur: Any, schema: str) -> None:
    """Create the agents, workspaces, files, chunks and postings tables with their indexes."""
    s = _q(schema)
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.agents (agent_id text PRIMARY KEY,"
                " role_name text UNIQUE)")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.shares ("
                f" owner_agent text NOT NULL REFERENCES {s}.agents ON DELETE CASCADE,"
                " reader_agent text NOT NULL, PRIMARY KEY (owner_agent, reader_agent))")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.workspaces ("
                " agent_id text NOT NULL, workspace text NOT NULL,"
                " published_generation bigint NOT NULL DEFAULT 0,"
                " chunk_count bigint NOT NULL DEFAULT 0, token_count bigint NOT NULL DEFAULT 0,"
                " last_sync_at timestamptz, meta jsonb NOT NULL DEFAULT '{}',"
                " PRIMARY KEY (agent_id, workspace))")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.files ("
                " agent_id text NOT NULL, workspace text NOT NULL, path text NOT NULL,"
                " source text NOT NULL, hash text NOT NULL, mtime bigint NOT NULL,"
                " size bigint NOT NULL, gen_from bigint NOT NULL, gen_to bigint)")
    cur.execute(f"CREATE INDEX IF NOT EXISTS files_scope_path ON {s}.files"
                " (agent_id, workspace, path, source)")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.chunks ("
                " chunk_rowid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " agent_id text NOT NULL, workspace text NOT NULL, id text NOT NULL,"
                " path text NOT NULL, source text NOT NULL, start_line int NOT NULL,"
                " end_line int NOT NULL, hash text NOT NULL, model text NOT NULL,"
                " text text NOT NULL, doc_len int NOT NULL, gen_from bigint NOT NULL,"
                " gen_to bigint)")
    cur.execute(f"CREATE INDEX IF NOT EXISTS chunks_scope_id ON {s}.chunks (agent_id, workspace, id)")
    cur.execute(f"CREATE INDEX IF NOT EXISTS chunks_scope_path ON {s}.chunks"
                " (agent_id, workspace, path, source)")
    cur.execute(f"CREATE INDEX IF NOT EXISTS chunks_scope_gen ON {s}.chunks"
                " (agent_id, workspace, gen_from, gen_to)")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.postings ("
                " agent_id text NOT NULL, workspace text NOT NULL, term text NOT NULL,"
                " chunk_rowid bigint NOT NULL,"
                " positions int[] NOT NULL, PRIMARY KEY (agent_id, workspace, term, chunk_rowid))")
    cur.execute(f"CREATE INDEX IF NOT EXISTS postings_chunk ON {s}.postings (chunk_rowid)")


def m002_vectors(cur: Any, schema: str) -> None:
    """Create the shared embedding cache and the chunk vectors (pgvector)."""
    s = _q(schema)
    cur.execute("CREATE EXTENSION IF NOT EXISTS vector")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.embedding_cache ("
                " content_hash text NOT NULL, fingerprint text NOT NULL, dims int NOT NULL,"
                " embedding vector NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (content_hash, fingerprint))")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.chunk_vectors ("
                " chunk_rowid bigint PRIMARY KEY,"
                " agent_id text NOT NULL, workspace text NOT NULL, dims int NOT NULL,"
                " embedding vector NOT NULL)")
    cur.execute(f"CREATE INDEX IF NOT EXISTS chunk_vectors_scope ON {s}.chunk_vectors"
                " (agent_id, workspace)")


def _secure(cur: Any, schema: str, table: str) -> None:
    """Row-level security on one agent table: own rows read/write, shared rows read-only."""
    s = _q(schema)
    own = f"agent_id IN (SELECT a.agent_id FROM {s}.agents a WHERE a.role_name = current_user)"
    shared = (f"agent_id IN (SELECT sh.owner_agent FROM {s}.shares sh JOIN {s}.agents a"
              " ON a.agent_id = sh.reader_agent WHERE a.role_name = current_user)")
    cur.execute(f"ALTER TABLE {s}.{table} ENABLE ROW LEVEL SECURITY")
    cur.execute(f"DROP POLICY IF EXISTS own_rows ON {s}.{table}")
    cur.execute(f"CREATE POLICY own_rows ON {s}.{table} FOR ALL USING ({own}) WITH CHECK ({own})")
    cur.execute(f"DROP POLICY IF EXISTS shared_rows ON {s}.{table}")
    cur.execute(f"CREATE POLICY shared_rows ON {s}.{table} FOR SELECT USING ({shared})")


def m003_row_level_security(cur: Any, schema: str) -> None:
    """Enable row-level security: own rows read/write, shared agents' rows read-only."""
    for table in AGENT_TABLES:
        _secure(cur, schema, table)


def m004_trigram_postings(cur: Any, schema: str) -> None:
    """CJK substring search as the SQLite store's ``chunks_trigram`` does it.

    ``trigram_postings`` holds, for each chunk with CJK text, the FTS5 ``trigram case_sensitive
    0`` tokens of its text (PostgreSQL's own ``pg_trgm`` is not needed, and the bundled server
    has none); ``chunks.trigram_len`` is the chunk's trigram count (NULL: no CJK text), and
    ``workspaces.trigram_chunk_count`` / ``trigram_token_count`` the statistics of that table's
    ``bm25()``.
    """
    s = _q(schema)
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.trigram_postings ("
                " agent_id text NOT NULL, workspace text NOT NULL, term text NOT NULL,"
                " chunk_rowid bigint NOT NULL,"
                " positions int[] NOT NULL, PRIMARY KEY (agent_id, workspace, term, chunk_rowid))")
    cur.execute(f"CREATE INDEX IF NOT EXISTS trigram_postings_chunk ON {s}.trigram_postings (chunk_rowid)")
    cur.execute(f"ALTER TABLE {s}.chunks ADD COLUMN IF NOT EXISTS trigram_len int")
    cur.execute(f"ALTER TABLE {s}.workspaces ADD COLUMN IF NOT EXISTS trigram_chunk_count bigint"
                " NOT NULL DEFAULT 0")
    cur.execute(f"ALTER TABLE {s}.workspaces ADD COLUMN IF NOT EXISTS trigram_token_count bigint"
                " NOT NULL DEFAULT 0")
    _secure(cur, schema, "trigram_postings")


def m005_posting_impacts(cur: Any, schema: str) -> None:
    """Each posting carries what the bm25 upper bound of a search needs, so the bound is
    computed from the postings alone (no join to ``chunks``): ``tf`` (the term's hits per
    column), the chunk's ``doc_len``, ``source`` and ``gen_from``. A posting has no ``gen_to``:
    :meth:`SyncLease.publish` deletes retired rows in the publishing transaction; the rows an
    earlier publish left (retired at or before the published generation) are deleted here."""
    s = _q(schema)
    cur.execute(f"DELETE FROM {s}.postings p USING {s}.chunks c, {s}.workspaces w"
                " WHERE c.chunk_rowid = p.chunk_rowid AND w.agent_id = c.agent_id"
                " AND w.workspace = c.workspace AND c.gen_to <= w.published_generation")
    cur.execute(f"DELETE FROM {s}.postings p WHERE NOT EXISTS"
                f" (SELECT 1 FROM {s}.chunks c WHERE c.chunk_rowid = p.chunk_rowid)")
    cur.execute(f"ALTER TABLE {s}.postings ADD COLUMN IF NOT EXISTS tf int[],"
                " ADD COLUMN IF NOT EXISTS doc_len int, ADD COLUMN IF NOT EXISTS source text,"
                " ADD COLUMN IF NOT EXISTS gen_from bigint")
    hits = ", ".join(f"count(*) FILTER (WHERE x >> {POSITION_COLUMN_SHIFT} = {c})" for c in range(3))
    cur.execute(f"UPDATE {s}.postings p SET doc_len = c.doc_len, source = c.source,"
                f" gen_from = c.gen_from, tf = (SELECT ARRAY[{hits}]::int[] FROM unnest(p.positions) x)"
                f" FROM {s}.chunks c WHERE c.chunk_rowid = p.chunk_rowid")
    cur.execute(f"ALTER TABLE {s}.postings ALTER COLUMN tf SET NOT NULL,"
                " ALTER COLUMN doc_len SET NOT NULL, ALTER COLUMN source SET NOT NULL,"
                " ALTER COLUMN gen_from SET NOT NULL")


def m006_vector_windows(cur: Any, schema: str) -> None:
    """A chunk's vectors are its embedding windows (``fallback/index/windows.py``), as the
    SQLite store keeps them: ``chunk_vectors`` gets ``window_no`` and is keyed by
    ``(chunk_rowid, window_no)``; a vector written before is window 0."""
    s = _q(schema)
    cur.execute(f"ALTER TABLE {s}.chunk_vectors ADD COLUMN IF NOT EXISTS window_no int NOT NULL"
                " DEFAULT 0")
    cur.execute(f"ALTER TABLE {s}.chunk_vectors DROP CONSTRAINT IF EXISTS chunk_vectors_pkey")
    cur.execute(f"ALTER TABLE {s}.chunk_vectors ADD PRIMARY KEY (chunk_rowid, window_no)")


def m007_term_stats(cur: Any, schema: str) -> None:
    """Per term of an agent's published index: ``df`` (the chunks holding it, the ``n`` of its
    IDF), ``max_tf`` (the most hits per column of one posting) and ``min_dl`` (the shortest
    chunk holding it): a search bounds a term's bm25 contribution without reading its postings
    (``store.PostgresStore._top_rows``). ``df`` is exact for the published generation
    (:meth:`SyncLease.publish` adds what it publishes and removes what it retires);
    ``max_tf`` / ``min_dl`` only ever widen, so they stay bounds. Backfilled from the postings."""
    s = _q(schema)
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.term_stats ("
                " agent_id text NOT NULL, workspace text NOT NULL, term text NOT NULL,"
                " df bigint NOT NULL, max_tf int[] NOT NULL, min_dl int NOT NULL,"
                " PRIMARY KEY (agent_id, workspace, term))")
    cur.execute(f"INSERT INTO {s}.term_stats (agent_id, workspace, term, df, max_tf, min_dl)"
                " SELECT p.agent_id, p.workspace, p.term, count(*),"
                " ARRAY[max(p.tf[1]), max(p.tf[2]), max(p.tf[3])], min(p.doc_len)"
                f" FROM {s}.postings p JOIN {s}.workspaces w ON w.agent_id = p.agent_id"
                " AND w.workspace = p.workspace WHERE p.gen_from <= w.published_generation"
                " GROUP BY p.agent_id, p.workspace, p.term ON CONFLICT DO NOTHING")
    _secure(cur, schema, "term_stats")


def m008_file_text(cur: Any, schema: str) -> None:
    """``files.text``: a memory file's text as its sync read it, so an agent it is shared with
    reads its lines with ``memory_get`` (chunks alone cannot give them back exactly: line
    endings, blank runs no chunk holds, a long line's pieces). NULL for the files written
    before; the owner's next sync writes them again (``PostgresSearchStore.lease_paths``)."""
    cur.execute(f"ALTER TABLE {_q(schema)}.files ADD COLUMN IF NOT EXISTS text text")


def m009_posting_blocks(cur: Any, schema: str) -> None:
    """Postings in blocks: ``posting_blocks`` holds, per term, the postings of up to
    ``store.BLOCK_CHUNKS`` chunks of one write (one source) in one row, keyed by its first
    chunk (the row ids of one write's chunks of a source form a range no other write or
    source of the scope overlaps, so a chunk's posting of a term is in the term's block with
    the largest key at or below the chunk's row id); ``chunks.terms`` lists a chunk's terms,
    so the blocks a retired chunk is in are found by key. Each posting of ``postings`` becomes
    a block of one chunk, the grants on ``postings`` move to ``posting_blocks``, and
    ``postings`` is dropped."""
    s = _q(schema)
    cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.posting_blocks ("
                " agent_id text NOT NULL, workspace text NOT NULL, term text NOT NULL,"
                " chunk_rowid bigint NOT NULL, rowids bigint[] NOT NULL, lens int[] NOT NULL,"
                f" {', '.join(f'{c} int[] NOT NULL' for c in TF_COLUMNS)},"
                " ends int[] NOT NULL, positions int[] NOT NULL,"
                " source text NOT NULL, gen_from bigint NOT NULL,"
                " PRIMARY KEY (agent_id, workspace, term, chunk_rowid))")
    # No planner statistics of the arrays (no query filters on their elements): ANALYZE of a
    # first sync's blocks took 2.0 s with them, 0.3 s without.
    for column in ("rowids", "lens", *TF_COLUMNS, "ends", "positions"):
        cur.execute(f"ALTER TABLE {s}.posting_blocks ALTER COLUMN {column} SET STATISTICS 0")
    cur.execute(f"ALTER TABLE {s}.chunks ADD COLUMN IF NOT EXISTS terms text")
    cur.execute("SELECT to_regclass(%s)", (f"{schema}.postings",))
    if cur.fetchone()[0] is None:
        _secure(cur, schema, "posting_blocks")
        return
    cur.execute(f"INSERT INTO {s}.posting_blocks (agent_id, workspace, term, chunk_rowid, rowids,"
                f" lens, {', '.join(TF_COLUMNS)}, ends, positions, source, gen_from) SELECT agent_id,"
                " workspace, term, chunk_rowid, ARRAY[chunk_rowid], ARRAY[doc_len], ARRAY[tf[1]],"
                " ARRAY[tf[2]], ARRAY[tf[3]], ARRAY[cardinality(positions)], positions, source,"
                f" gen_from FROM {s}.postings ON CONFLICT DO NOTHING")
    cur.execute(f"UPDATE {s}.chunks c SET terms = p.terms FROM (SELECT chunk_rowid,"
                " string_agg(term, ' ' ORDER BY term COLLATE \"C\") AS terms"
                f" FROM {s}.postings GROUP BY chunk_rowid) p WHERE p.chunk_rowid = c.chunk_rowid")
    cur.execute("SELECT grantee, string_agg(privilege_type, ', ') FROM information_schema.table_privileges"
                " WHERE table_schema = %s AND table_name = 'postings' AND grantee <> current_user"
                " GROUP BY grantee", (schema,))
    for grantee, privileges in cur.fetchall():
        role = "PUBLIC" if grantee == "PUBLIC" else '"' + str(grantee).replace('"', '""') + '"'
        cur.execute(f"GRANT {privileges} ON {s}.posting_blocks TO {role}")
    _secure(cur, schema, "posting_blocks")
    cur.execute(f"DROP TABLE {s}.postings")


def m010_no_vector_index(cur: Any, schema: str) -> None:
    """Drop the HNSW indexes of ``chunk_vectors`` (one per dimension count, created by the
    syncs before): the vector side of a search compares every window of the scope exactly (its
    mean and spread need every chunk's cosine: ``store.PostgresStore.window_search``), so no
    search of the engine read them, and inserting into them was the larger part of the
    server's work in a sync; ``vector_rows`` orders the scope's vectors exactly (by the
    ``chunk_vectors_scope`` index)."""
    cur.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'chunk_vectors'"
                " AND indexdef LIKE '%% USING hnsw %%'", (schema,))
    for (name,) in cur.fetchall():
        cur.execute(f'DROP INDEX {_q(schema)}."{name}"')


def m011_rows_uncompressed(cur: Any, schema: str) -> None:
    """Keep the rows of ``chunks`` and ``posting_blocks`` whole and uncompressed in their pages
    up to 8,160 bytes (``toast_tuple_target``; by default PostgreSQL compresses a row above
    about 2 kB): compressing a chunk's text and a common term's positions (pglz) on every write
    was a large share of the server's work, for little space. Rows written from now on."""
    for table in ("chunks", "posting_blocks"):
        cur.execute(f"ALTER TABLE {_q(schema)}.{table} SET (toast_tuple_target = 8160)")


MIGRATIONS: tuple[Callable[[Any, str], None], ...] = (
    m001_core, m002_vectors, m003_row_level_security, m004_trigram_postings,
    m005_posting_impacts, m006_vector_windows, m007_term_stats, m008_file_text, m009_posting_blocks,
    m010_no_vector_index, m011_rows_uncompressed)


def migrate(conn: Any, schema: str) -> list[str]:
    """Bring ``schema`` to the latest version (one transaction, under an advisory lock).

    Args:
        conn: a psycopg connection (not in a transaction); committed on return.
        schema: the store's schema (a plain identifier, see ``target.resolve_target``).

    A current schema is left untouched (no DDL, no lock): an agent's own role, which may not
    create anything, opens it. So is a schema a newer qmdbridge migrated further (it holds
    every migration of this one): the schema owner migrates before the hosts upgrade, and a
    host not upgraded yet keeps opening it.

    Returns:
        The names of the migrations applied now (``[]`` when the schema was current).

    Raises:
        psycopg.Error: for the caller to translate (``errors.translate``).
    """
    if set(range(1, len(MIGRATIONS) + 1)) <= {v for v, _ in applied_versions(conn, schema)}:
        return []
    s = _q(schema)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"qmdbridge.migrate:{schema}",))
        # No statement deadline here: a migration rewriting the rows of a large index runs once
        # and must finish (the connection's statement_timeout would end it half way).
        cur.execute("SET LOCAL statement_timeout = 0")
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        cur.execute(f"CREATE TABLE IF NOT EXISTS {s}.schema_migrations (version int PRIMARY KEY,"
                    " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        cur.execute(f"SELECT version FROM {s}.schema_migrations")
        done = {row[0] for row in cur.fetchall()}
        applied = []
        for version, step in enumerate(MIGRATIONS, start=1):
            if version in done:
                continue
            step(cur, schema)
            cur.execute(f"INSERT INTO {s}.schema_migrations (version, name) VALUES (%s, %s)",
                        (version, step.__name__))
            applied.append(step.__name__)
    return applied


def applied_versions(conn: Any, schema: str) -> list[tuple[int, str]]:
    """``(version, name)`` of every applied migration, ascending (``[]`` for a new schema)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (f"{schema}.schema_migrations",))
        if cur.fetchone()[0] is None:
            return []
        cur.execute(f"SELECT version, name FROM {_q(schema)}.schema_migrations ORDER BY version")
        return [(int(v), str(n)) for v, n in cur.fetchall()]
