#!/usr/bin/env python3
"""Stand-in for a qmd build that silently drops the collection pattern flag: `collection add`
loses `--mask <glob>` (and `--glob <glob>` too when $IGNORE_GLOB is set), then the real qmd named
by $REAL_QMD runs, so the collection gets qmd's default pattern `**/*.md`. Every other command
is the real qmd unchanged. With $MANGLE_PATH set, `collection add` records another (empty)
folder than the one asked for: `.mangled` beside it."""
import os
import sys

args = sys.argv[1:]
dropped = ("--mask", "--glob") if os.environ.get("IGNORE_GLOB") else ("--mask",)
if args[:2] == ["collection", "add"]:
    kept: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in dropped:
            skip = True
            continue
        kept.append(a)
    args = kept
    if os.environ.get("MANGLE_PATH") and args and args[-2] == "--":
        mangled = os.path.join(os.path.dirname(args[-1].rstrip("/")), ".mangled")
        os.makedirs(mangled, exist_ok=True)
        args[-1] = mangled
real = os.environ["REAL_QMD"]
os.execv(real, [real, *args])
