"""Text handling: script classes and word runs, chunking, keyword extraction, secret redaction (pure, no I/O)."""
