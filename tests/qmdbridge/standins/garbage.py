#!/usr/bin/env python3
"""Stand-in for a qmd that prints bytes that are neither JSON nor valid UTF-8, exit 0."""
import sys

sys.stdout.buffer.write(b"\xff\xfe not json \xc3\x28 {oops\n")
