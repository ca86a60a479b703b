#!/usr/bin/env python3
"""Stand-in for a qmd that prints valid JSON and then aborts in native teardown (exit 134)."""
import json
import sys

sys.stdout.write("Expanding query...\n")
sys.stdout.write(json.dumps([{"docid": "#abc123", "score": 0.5,
                              "file": "qmd://memory-dir-main/2026-01-01.md",
                              "snippet": "@@ -7,1 @@\nalpha\n"}]) + "\n")
sys.stdout.flush()
sys.stderr.write("ggml-metal-device.m:612: GGML_ASSERT(residency set empty) assertion failed\n")
sys.exit(134)
