#!/usr/bin/env python3
"""Stand-in for a hanging qmd: spawns two sleeping grandchildren, then sleeps.

One grandchild stays in our process group; the other calls setsid() and leaves it, so only a
descendant walk (psutil) can find it. Their pids are written, one per line, to the file named
by $STANDIN_PIDFILE (added to what other stand-ins wrote there, under a lock, and replaced
atomically) before the stand-in starts to sleep.
"""
import fcntl
import os
import subprocess
import sys
import time

sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
in_group = subprocess.Popen(sleeper)
escaped = subprocess.Popen(sleeper, start_new_session=True)
pidfile = os.environ.get("STANDIN_PIDFILE")
if pidfile:  # several stand-ins may run at once (one per collection): each adds its pids
    with open(pidfile + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(pidfile) as fh:
                before = fh.read()
        except FileNotFoundError:
            before = ""
        tmp = f"{pidfile}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{before}{in_group.pid}\n{escaped.pid}\n")
        os.replace(tmp, pidfile)
print("searching...", flush=True)
time.sleep(600)
