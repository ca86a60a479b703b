"""The builtin memory engine: FTS5 BM25 + vectors over Markdown memory files in SQLite.

Knows nothing about qmd; the public names are ``qmdbridge``'s (which re-exports the errors and
models of :mod:`fallback.errors` and :mod:`fallback.models`).
"""
