#!/usr/bin/env python3
"""Stand-in for qmd builds that mishandle several `-c` in one search (their `--help` still says
"one or more collections"): with $QUIRK=last-only only the last `-c` is kept; with
$QUIRK=empty-if-any-empty the answer is `[]` when any named collection is in $EMPTY (comma
list). Search argv is appended to $ARGV_LOG (one JSON line); then the real qmd ($REAL_QMD)
runs."""
import json
import os
import sys

args = sys.argv[1:]
if args and args[0] in ("search", "vsearch", "query"):
    with open(os.environ["ARGV_LOG"], "a") as fh:
        fh.write(json.dumps(args) + "\n")
    named = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-c"]
    quirk = os.environ.get("QUIRK", "")
    if quirk == "empty-if-any-empty" and set(named) & set(os.environ.get("EMPTY", "").split(",")):
        print("[]")
        sys.exit(0)
    if quirk == "last-only" and len(named) > 1:
        keep: list[str] = []
        skip = False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a == "-c" and args[i + 1] != named[-1]:
                skip = True
                continue
            keep.append(a)
        args = keep
real = os.environ["REAL_QMD"]
os.execv(real, [real, *args])
