"""Search over one store: FTS5 query building, keyword candidates, ranking (fusion, decay, MMR), the pipeline."""
