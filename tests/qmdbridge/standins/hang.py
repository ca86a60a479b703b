#!/usr/bin/env python3
"""Stand-in for a hanging qmd: spawns two sleeping grandchildren, then sleeps.

One grandchild stays in our process group; the other calls setsid() and leaves it, so only a
descendant walk (psutil) can find it. Their pids are written, one per line, to the file named
by $STANDIN_PIDFILE (written atomically) before the stand-in starts to sleep.
"""
import os
import subprocess
import sys
import time

sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
in_group = subprocess.Popen(sleeper)
escaped = subprocess.Popen(sleeper, start_new_session=True)
pidfile = os.environ.get("STANDIN_PIDFILE")
if pidfile:
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{in_group.pid}\n{escaped.pid}\n")
    os.replace(tmp, pidfile)
print("searching...", flush=True)
time.sleep(600)
