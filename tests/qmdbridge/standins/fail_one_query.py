#!/usr/bin/env python3
"""Stand-in that logs each search argv to $ARGV_LOG (one JSON line) and fails a search whose
query (the last argument) is $FAIL_QUERY (an `error:` line on stderr, exit 3); with $REJECT_LEX
set, a `query` of typed lex searches is rejected as an unknown option, as a qmd build without it
would; everything else runs the real qmd ($REAL_QMD)."""
import json
import os
import sys

args = sys.argv[1:]
if args and args[0] in ("search", "vsearch", "query"):
    with open(os.environ["ARGV_LOG"], "a") as fh:
        fh.write(json.dumps(args) + "\n")
    if os.environ.get("REJECT_LEX") and args[0] == "query" and args[-1].startswith("lex: "):
        sys.stderr.write("error: unknown option '--no-rerank'\n")
        sys.exit(1)
    if args[-1] == os.environ.get("FAIL_QUERY"):
        sys.stderr.write("error: search broken for the test\n")
        sys.exit(3)
real = os.environ["REAL_QMD"]
os.execv(real, [real, *args])
