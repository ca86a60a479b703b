"""Benchmark one poll of the polling file watcher over an extra path that is a code checkout.

The tree is deterministic: ``--notes`` Markdown notes in folders, next to a ``node_modules``
tree (``--packages`` packages of 40 files), a ``.venv`` (200 folders of 20 files) and a
``.git`` object store (100 folders of 10 files). One poll is one watchdog ``DirectorySnapshot``
of the extra path; it is timed in CPU time of this process (best of ``--repeat``) twice: with
watchdog's defaults (``os.stat``, ``os.scandir``: every folder walked, symlinks followed) and
with the watcher's listing (:meth:`fallback.sources.watcher.MemoryWatcher.list_folder`:
hidden and skipped folders never listed, 12 folders deep at most, ``os.lstat``). The
``paths`` rows say how many entries each poll stats.

Usage: python3 scripts/bench_watch.py [--notes 50] [--packages 600] [--repeat 3] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Row, emit  # noqa: E402
from watchdog.utils.dirsnapshot import DirectorySnapshot  # noqa: E402

from fallback.sources.watcher import MemoryWatcher  # noqa: E402


def build_tree(root: Path, *, notes: int, packages: int) -> None:
    """The checkout: notes, ``node_modules``, ``.venv`` and ``.git`` (deterministic)."""
    for i in range(notes):
        folder = root / "notes" / f"topic-{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"note-{i}.md").write_text(f"# Note {i}\nplain text\n")
    for i in range(packages):
        folder = root / "node_modules" / f"pkg{i}" / "lib"
        folder.mkdir(parents=True)
        for j in range(40):
            (folder / f"f{j}.js").write_text("x")
    for i in range(200):
        folder = root / ".venv" / "lib" / f"m{i}"
        folder.mkdir(parents=True)
        for j in range(20):
            (folder / f"f{j}.py").write_text("x")
    for i in range(100):
        folder = root / ".git" / "objects" / f"{i:02x}"
        folder.mkdir(parents=True)
        for j in range(10):
            (folder / f"{j:038x}").write_text("x")


def best_cpu_ms(fn: object, repeat: int) -> tuple[float, int]:
    """Best CPU time in ms of ``fn()`` (a snapshot) over ``repeat`` runs, and its path count."""
    best, paths = float("inf"), 0
    for _ in range(repeat):
        start = time.process_time()
        snap = fn()  # type: ignore[operator]
        best = min(best, (time.process_time() - start) * 1000)
        paths = len(snap.paths)
    return best, paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=50, help="Markdown notes (default 50)")
    parser.add_argument("--packages", type=int, default=600,
                        help="node_modules packages of 40 files (default 600)")
    parser.add_argument("--repeat", type=int, default=3, help="polls per timing; the best counts")
    parser.add_argument("--quick", action="store_true", help="20 packages, 1 run (a smoke run)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    packages, repeat = (20, 1) if args.quick else (args.packages, max(1, args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = root / "repo"
        build_tree(repo, notes=args.notes, packages=packages)
        (root / "ws" / "memory").mkdir(parents=True)

        async def ignore(paths: set[str], reason: str) -> None:
            return None

        watcher = MemoryWatcher(root / "ws", extra_paths=[repo], on_change=ignore,
                                force_polling=True)
        plain_ms, plain_paths = best_cpu_ms(lambda: DirectorySnapshot(str(repo)), repeat)
        ours_ms, our_paths = best_cpu_ms(lambda: DirectorySnapshot(
            str(repo), stat=os.lstat, listdir=watcher.list_folder), repeat)
    section = f"one poll of a checkout ({args.notes} notes, {packages} packages)"
    rows = [
        Row(section, "watchdog defaults (every folder)", plain_ms, "ms CPU"),
        Row(section, "watcher listing (skip list, depth, lstat)", ours_ms, "ms CPU"),
        Row(section, "ratio", plain_ms / ours_ms if ours_ms else float("nan"), "x"),
        Row("paths", "watchdog defaults", float(plain_paths), "paths"),
        Row("paths", "watcher listing", float(our_paths), "paths"),
    ]
    emit("bench_watch", rows, as_json=args.json,
         meta={"notes": args.notes, "packages": packages, "repeat": repeat,
               "python": sys.version.split()[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
