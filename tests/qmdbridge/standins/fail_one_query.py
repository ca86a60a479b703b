#!/usr/bin/env python3
"""Stand-in that logs each search argv to $ARGV_LOG (one JSON line) and fails a search whose
query (the last argument) is $FAIL_QUERY (an `error:` line on stderr, exit 3); everything else
runs the real qmd ($REAL_QMD)."""
import json
import os
import sys

args = sys.argv[1:]
if args and args[0] in ("search", "vsearch", "query"):
    with open(os.environ["ARGV_LOG"], "a") as fh:
        fh.write(json.dumps(args) + "\n")
    if args[-1] == os.environ.get("FAIL_QUERY"):
        sys.stderr.write("error: search broken for the test\n")
        sys.exit(3)
real = os.environ["REAL_QMD"]
os.execv(real, [real, *args])
