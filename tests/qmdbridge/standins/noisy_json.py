#!/usr/bin/env python3
"""Stand-in for a qmd that wraps its JSON in a banner, log lines and ANSI colour codes."""
import json
import sys

hits = [{"docid": "#abc123", "score": 0.82, "file": "qmd://memory-root-main/MEMORY.md",
         "title": "Memory", "snippet": "@@ -3,2 @@ (2 before, 0 after)\nalpha\nbeta\n"}]
sys.stdout.write("\x1b[1mqmd\x1b[0m 2.8.3 \x1b[32mready\x1b[0m\n")
sys.stdout.write("[node-llama-cpp] loading model...\n")
sys.stdout.write(json.dumps(hits, indent=2) + "\n")
sys.stdout.write("\x1b[33mWarning:\x1b[0m 1 documents need embeddings\n")
