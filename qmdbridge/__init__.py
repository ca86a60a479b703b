"""qmdbridge: memory_search / memory_get for AI agents over qmd, with a builtin SQLite fallback."""
