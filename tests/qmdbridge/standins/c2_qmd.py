#!/usr/bin/env python3
"""Stand-in qmd for the backend fault tests; behaviour from $C2_BEHAVIOUR, argv logged to $C2_LOG.

Collection commands succeed silently. Search commands (search/vsearch/query):
flagreject (search rejects --json, query answers), garbage, noisy (banner + ANSI around JSON),
crash (JSON then exit 134 with a ggml assertion), panic (JSON, then a Bun segfault panic and
exit 3), vec0 (vsearch and query fail with "no such module: vec0", search answers), searchfail
(every search exits 1), hang (sleeps with a grandchild), missing (first search says
"Collection not found", later ones answer), embedhang (`embed` sleeps). `--version` prints
"qmd 2.8.3".
"""
import json
import os
import subprocess
import sys
import time

args = sys.argv[1:]
with open(os.environ["C2_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\n")
behaviour = os.environ.get("C2_BEHAVIOUR", "")
hits = [{"score": 0.82, "file": "qmd://memory-root-main/MEMORY.md", "title": "Memory",
         "snippet": "@@ -3,2 @@ (2 before, 0 after)\nalpha\nbeta\n"}]
cmd = args[0] if args else ""
if cmd == "--version":
    print("qmd 2.8.3")
    sys.exit(0)
if cmd == "embed" and behaviour == "embedhang":
    time.sleep(600)
if cmd not in ("search", "vsearch", "query"):
    sys.exit(0)
if behaviour == "flagreject" and cmd != "query":
    sys.stderr.write("error: unknown flag: --json\n")
    sys.exit(2)
if behaviour == "garbage":
    print("not json at all")
    sys.exit(0)
if behaviour == "noisy":
    sys.stdout.write("\x1b[1mqmd\x1b[0m ready\n[node-llama-cpp] loading\n" + json.dumps(hits, indent=2)
                     + "\n\x1b[33mWarning:\x1b[0m 1 documents need embeddings\n")
    sys.exit(0)
if behaviour == "crash":
    sys.stdout.write("initializing\n" + json.dumps(hits) + "\n")
    sys.stderr.write("ggml-metal-device.m:612: GGML_ASSERT assertion failed\n")
    sys.stdout.flush()
    os._exit(134)
if behaviour == "panic":
    sys.stdout.write(json.dumps(hits) + "\n")
    sys.stdout.flush()
    sys.stderr.write("panic: Segmentation fault at address 0x18\noh no: Bun has crashed. This "
                     "indicates a bug in Bun, not your code.\n")
    os._exit(3)
if behaviour == "vec0" and cmd != "search":
    sys.stderr.write("SQLiteError: no such module: vec0\n      errno: 1,\n  code: \"SQLITE_ERROR\"\n")
    sys.exit(1)
if behaviour == "searchfail":
    sys.stderr.write("error: Cannot find module '@tobilu/qmd/dist/store.js'\n")
    sys.exit(1)
if behaviour == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["C2_LOG"] + ".pid", "w") as fh:
        fh.write(f"{child.pid}\n")
    time.sleep(600)
if behaviour == "missing":
    marker = os.environ["C2_LOG"] + ".missing"
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("[]")
        sys.stderr.write("Collection not found: memory-root-main\n")
        sys.exit(1)
print(json.dumps(hits))
