#!/usr/bin/env python3
"""Stand-in whose first `update` fails with $UPDATE_STDERR on stderr (exit 1) and records it by
creating $FAILED_MARK; every other call, and every later `update`, runs the real qmd ($REAL_QMD).
Each `update` is logged as one line to $UPDATE_LOG."""
import os
import sys

args = sys.argv[1:]
if args and args[0] == "update":
    with open(os.environ["UPDATE_LOG"], "a") as fh:
        fh.write("update\n")
    mark = os.environ["FAILED_MARK"]
    if not os.path.exists(mark):
        open(mark, "w").close()
        sys.stderr.write(os.environ["UPDATE_STDERR"] + "\n")
        sys.exit(1)
real = os.environ["REAL_QMD"]
os.execv(real, [real, *args])
