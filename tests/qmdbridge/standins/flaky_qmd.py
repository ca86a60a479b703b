#!/usr/bin/env python3
"""Stand-in that is broken while the file named by $FLAKY_FLAG exists (prints garbage for a
search), and otherwise execs the real qmd named by $REAL_QMD: lets a test show the manager's
circuit breaker going back to qmd once it is healthy again."""
import os
import sys

flag = os.environ.get("FLAKY_FLAG", "")
if flag and os.path.exists(flag) and len(sys.argv) > 1 and sys.argv[1] in ("search", "query", "vsearch"):
    sys.stdout.write("garbage, not JSON\n")
    sys.exit(0)
real = os.environ["REAL_QMD"]
os.execv(real, [real, *sys.argv[1:]])
