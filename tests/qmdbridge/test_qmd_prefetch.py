"""Starting a one-shot search's qmd calls ahead (``qmdbridge/cli/qmd_prefetch.py``): how many run
at once, and nothing started from a record it cannot read. The calls themselves, against the real
qmd, are in ``tests/e2e/test_cli_qmd_prefetch.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from qmdbridge.cli import qmd_prefetch
from qmdbridge.cli.main import build_parser
from qmdbridge.cli.qmd_prefetch import MAX_AHEAD, ahead_limit, start_prefetch


@pytest.mark.parametrize(("cores", "limit"), [(1, 1), (2, 1), (3, 2), (5, 4), (64, MAX_AHEAD)])
def test_calls_ahead_leave_a_core_to_the_search_loading_beside_them(
        monkeypatch: pytest.MonkeyPatch, cores: int, limit: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert ahead_limit() == limit


def _doc(tmp_path: Path, **qmd: Any) -> dict[str, Any]:
    return {"backend": "qmd", "qmd": {
        "command": "/bin/false", "childPath": None, "stateDir": str(tmp_path / "state"), "agentId": "main",
        "workspace": str(tmp_path), "collections": ["memory-root-main"], "maxResults": 6,
        "marker": "{}", "indexYml": [1, 2, 3], **qmd}}


@pytest.mark.parametrize("broken", [
    {"maxResults": "6"}, {"collections": "memory-root-main"}, {"agentId": "../x"}, {"command": None},
])
def test_a_record_this_version_did_not_write_starts_nothing(tmp_path: Path, broken: dict[str, Any]) -> None:
    args = build_parser("search").parse_args(["search", "router WAN"])
    assert start_prefetch(args, _doc(tmp_path, **broken)) is None
    assert start_prefetch(args, {"backend": "qmd", "qmd": None}) is None


def test_nothing_starts_without_the_reconcile_marker_and_the_index_it_recorded(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser("search").parse_args(["search", "router WAN"])
    assert start_prefetch(args, _doc(tmp_path)) is None  # no qmd home at all
    monkeypatch.setattr(qmd_prefetch.os, "name", "nt")
    assert start_prefetch(args, _doc(tmp_path)) is None


def test_the_probe_cache_read_without_loading_anything_heavy_is_the_sidecars(tmp_path: Path) -> None:
    """``probe_cache.cached_location`` (what the prefetch checks) holds exactly while
    ``ProbeCache.get`` (what the sidecar uses) does: same key, same ``PATH``, the executable as
    probed, a fresh entry."""
    from qmdbridge.qmd.locate import QmdLocation
    from qmdbridge.qmd.probe_cache import PROBE_CACHE_TTL_MS, ProbeCache, cached_location, probe_key

    exe = tmp_path / "qmd"
    exe.write_text("#!/bin/sh\necho qmd 2.8.3\n")
    cache_file = tmp_path / "probe-cache.json"
    now = [1_000_000]
    cache = ProbeCache(cache_file, now_ms=lambda: now[0])
    location = QmdLocation(path=str(exe), found=True, runtime_ok=True, version="2.8.3", reason=None,
                           searched=["/bin"], path_env="/bin", child_path="/p")
    cache.put(probe_key(["qmd", "--x"], "/bin"), location)

    def both(command: Any, path_env: str) -> tuple[bool, bool]:
        light = cached_location(cache_file, command, {"PATH": path_env}, now_ms=now[0])
        assert light is None or (light["path"], light["child_path"]) == (str(exe), "/p")
        return light is not None, cache.get(probe_key(command, path_env)) is not None

    assert both(["qmd", "--x"], "/bin") == (True, True)
    assert both(["qmd", "--x"], "/usr/bin") == (False, False)  # another PATH: probed again
    assert both("qmd", "/bin") == (False, False)
    now[0] += PROBE_CACHE_TTL_MS
    assert both(["qmd", "--x"], "/bin") == (False, False)  # expired
    now[0] -= PROBE_CACHE_TTL_MS
    exe.write_text("#!/bin/sh\necho Quick Markdown Viewer 0.4.1\n")  # another program there
    assert both(["qmd", "--x"], "/bin") == (False, False)


QUIET = """
import json, sys
from pathlib import Path
from qmdbridge.cli import qmd_prefetch
from qmdbridge.cli.main import build_parser
from qmdbridge.qmd.early import EarlyCalls
args = build_parser("search").parse_args(["search", "router WAN"])
calls = EarlyCalls()
qmd_prefetch._start_calls(calls, args, json.loads(sys.argv[1]), {"PATH": "/usr/bin:/bin"})  # the thread
calls.close()
sys.stdout.write(str(calls.started))
"""


def test_the_thread_starting_calls_ahead_prints_nothing_when_the_index_cannot_be_read(
        tmp_path: Path) -> None:
    """Before the search configures logging (one-shot commands keep records below ERROR off
    stderr), a warning logged by the prefetch thread would reach stderr through logging's
    last-resort handler: a qmd index it cannot read only means nothing is started."""
    import json
    import subprocess
    import sys

    from qmdbridge.paths import qmd_home

    qmd = _doc(tmp_path)["qmd"]
    home = qmd_home(Path(qmd["stateDir"]), "main")
    home.index_db.parent.mkdir(parents=True)
    home.index_db.write_bytes(b"not a database " * 100)
    out = subprocess.run([sys.executable, "-c", QUIET, json.dumps(qmd)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert (out.returncode, out.stdout, out.stderr) == (0, "0", "")


def test_an_executable_replaced_with_the_same_size_and_mtime_is_probed_again(tmp_path: Path) -> None:
    """``cp -p``, ``rsync -t`` or an installer that keeps mtimes can put another program of the
    same size at qmd's path with its mtime put back: its change time (and inode) still differ,
    so neither the sidecar nor the one-shot prefetch trusts the old probe."""
    from qmdbridge.qmd.locate import QmdLocation
    from qmdbridge.qmd.probe_cache import ProbeCache, cached_location, probe_key

    exe = tmp_path / "qmd"
    exe.write_text("#!/bin/sh\necho qmd 2.8.3\n")
    cache_file = tmp_path / "probe-cache.json"
    cache = ProbeCache(cache_file)
    location = QmdLocation(path=str(exe), found=True, runtime_ok=True, version="2.8.3", reason=None,
                           searched=["/bin"], path_env="/bin", child_path="/p")
    key = probe_key("qmd", "/bin")
    cache.put(key, location)
    assert cache.get(key) is not None
    before = os.stat(exe)
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho qmd 9.9.9\n")  # same length
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, exe)
    after = os.stat(exe)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert cache.get(key) is None
    assert cached_location(cache_file, "qmd", {"PATH": "/bin"}) is None
