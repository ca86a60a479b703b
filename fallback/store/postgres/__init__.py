"""The PostgreSQL + pgvector store (``memorySearch.store.driver = "postgres"``).

One database for many agents on many hosts: every row belongs to an agent and workspace, row-level
security keeps an agent's role to its own rows (plus the rows of agents that share theirs with it,
read-only), and embeddings are shared by content hash. Modules:

- ``target``: where to connect (``store.dsn`` or libpq's environment) and the one redaction of the
  password from any text that may leave the process;
- ``errors``: psycopg's exceptions translated into the project's hierarchy, in one place;
- ``migrations``: the numbered, idempotent schema migrations, run under an advisory lock;
- ``tokens``: the terms of a text exactly as the SQLite store's FTS5 ``porter unicode61``
  tokenizer produces them (SQLite itself tokenizes), so both stores rank the same terms;
- ``bm25``: FTS5's ``bm25()`` over a keyword plan's ``MATCH`` expression, from stored postings;
- ``store``: :class:`~fallback.store.postgres.store.PostgresStore`, the store itself.

Needs the ``postgres`` extra (psycopg 3, psycopg_pool, pgvector); nothing here is imported unless
the postgres driver is configured.
"""
