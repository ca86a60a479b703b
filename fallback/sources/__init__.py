"""What is memory and how it is read: the memory-file rule, memory_get paging, transcripts, the file watcher."""
