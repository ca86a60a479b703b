"""Index sync: identity of an index and the indexer that diffs, chunks, embeds and writes."""
