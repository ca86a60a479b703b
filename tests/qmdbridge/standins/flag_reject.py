#!/usr/bin/env python3
"""Stand-in for a qmd build that rejects a flag: message on stderr, exit 2."""
import sys

flag = next((a for a in sys.argv[1:] if a.startswith("--")), "--json")
sys.stderr.write(f"error: unknown flag: {flag}\n")
sys.exit(2)
