"""A one-shot ``qmdbridge search`` in qmd mode, as a real process with the real qmd behind a
wrapper that logs each search: once a search recorded its settings, the next one starts its qmd
calls before it loads the config (``qmdbridge/cli/qmd_prefetch.py``), loading nothing heavy to
do so, and the in-process search takes them: the same calls, none twice, the same bytes on
stdout, the same fallback when qmd hangs; nothing is started ahead when a reconcile will run or
a breaker holds a failure."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

pytestmark = pytest.mark.slow  # the subject is a fresh process: what it loads, its signals and children

STANDINS = Path(__file__).resolve().parents[1] / "qmdbridge" / "standins"
QUESTION = "When did the router drop the WAN?"
# The question's qmd searches: one call per collection, the content words ANDed and each word
# alone as qmd's typed lex searches (the wrapper logs the document's lines joined by "|").
LEX = "lex: router drop WAN|lex: router|lex: drop|lex: WAN"
CALLS = [f"-c memory-root-main -- {LEX}", f"-c memory-dir-main -- {LEX}"]
# The wrapper: logs each search command (search, query) on one line, and runs hang.py instead
# while $QMD_HANG exists; everything else is the real qmd.
LOGGED = ('case "$1" in search|query) printf "%s\\n" "$(printf "%s" "$*" | tr "\\n" "|")" >> "{log}" ;; '
          'esac\n')
AHEAD = "INFO qmdbridge.cli: qmd calls started ahead of the config: "
# Loading one of these to start the calls would cost what starting them early saves.
HEAVY = ("pydantic", "pydantic_core", "anyio", "asyncio", "psutil", "tenacity", "json5", "orjson",
         "qmdbridge.config", "qmdbridge.manager", "qmdbridge.cli.commands", "qmdbridge.qmd.backend",
         "qmdbridge.qmd.runner", "qmdbridge.qmd.parse", "fallback.models", "fallback.settings",
         "fallback.engine.builtin")

# What a search qmd answers does not need: the process-tree killer (qmd exited by itself), the
# builtin engine (a fallback would open it), its store writer, the embedding providers, nor the
# builtin fast path (a qmd-mode search records what its qmd calls are made of, not its settings).
NOT_NEEDED = ("psutil", "fallback.engine.builtin", "fallback.engine.in_sync", "fallback.store.db",
              "fallback.embeddings", "fallback.index.indexer", "fallback.index.identity")
AFTER = """
import json, sys
from qmdbridge.cli.main import main
code = main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.write("\\nLOADED " + json.dumps(sorted(n for n in NAMES if n in sys.modules)) + "\\n")
sys.exit(code)
""".replace("NAMES", repr(NOT_NEEDED))

PROBE = """
import json, sys, time
import qmdbridge.cli.qmd_prefetch as qp
start = qp.start_prefetch
def started(*args, **kwargs):
    calls = start(*args, **kwargs)
    deadline = time.monotonic() + 60
    while calls is not None and calls.started == 0 and time.monotonic() < deadline:
        time.sleep(0.005)  # the thread's first call (its imports are done by then)
    loaded = sorted(n for n in NAMES if n in sys.modules)
    sys.stderr.write("\\nLOADED " + json.dumps(loaded) + "\\n")
    return calls
qp.start_prefetch = started
from qmdbridge.cli.main import main
sys.exit(main(sys.argv[1:]))
""".replace("NAMES", repr(HEAVY))


@pytest.fixture
def setup(tmp_path: Path, qmd_bin: Path, env: dict[str, str]) -> dict[str, Any]:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Notes\nrouter dropped the WAN link on tuesday\n")
    (ws / "memory" / "2026-03-01.md").write_text("# Firmware\n\nthe router firmware was updated\n")
    (ws / "memory" / "2026-03-02.md").write_text("# Outage\n\nWAN outage again, the ISP dropped us\n")
    wrapper = tmp_path / "qmd-logged"
    wrapper.write_text("#!/bin/sh\n" + LOGGED.format(log="$QMD_CALL_LOG")
                       + f'case "$1" in search|query) [ -e "$QMD_HANG" ] && exec "{STANDINS / "hang.py"}" "$@" ;; esac\n'
                       f'exec "{qmd_bin}" "$@"\n')
    wrapper.chmod(0o755)
    state = Path(env["OPENCLAW_STATE_DIR"])
    state.mkdir()
    (state / "openclaw.json").write_text(json.dumps({
        "memory": {"backend": "qmd", "qmd": {"command": str(wrapper), "limits": {"timeoutMs": 4000}}},
        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}}))
    log, hang, pids = tmp_path / "calls.log", tmp_path / "hang", tmp_path / "hang.pids"
    e = {**env, "QMDBRIDGE_DAEMON": "off", "QMD_CALL_LOG": str(log), "QMD_HANG": str(hang),
         "STANDIN_PIDFILE": str(pids)}
    return {"ws": ws, "env": e, "log": log, "hang": hang, "pids": pids, "state": state,
            "qmd_dir": state / "agents" / "main" / "qmd"}


def search(s: dict[str, Any], *flags: str, probe: str | None = None, query: str = QUESTION,
           **env: str) -> subprocess.CompletedProcess[str]:
    """``qmdbridge search QUERY --workspace WS --json -v FLAGS`` (``probe``: Python code that
    runs it and reports loaded modules on stderr); the wrapper's log starts empty."""
    s["log"].unlink(missing_ok=True)
    head = [sys.executable, "-c", probe] if probe else [sys.executable, "-m", "qmdbridge"]
    return subprocess.run([*head, "search", query, "--workspace", str(s["ws"]), "--json", "-v", *flags],
                          env={**s["env"], **env}, capture_output=True, text=True, timeout=180)


def record(s: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """An in-process search that recorded its settings. One that took its key within 50 ms of
    the config write records nothing (the config is racily clean then, fallback/index/racy.py):
    the next one does."""
    for _ in range(2):
        run = search(s)
        assert run.returncode == 0 and ahead(run) is None, run.stderr
        if any(json.loads(p.read_text()).get("backend") == "qmd"
               for p in (s["state"] / "cli-cache").glob("*.json")):
            return run
    raise AssertionError("the search settings were not recorded")


def calls(s: dict[str, Any]) -> list[str]:
    """The qmd searches of the last run (collection and query), sorted."""
    lines = s["log"].read_text().splitlines() if s["log"].exists() else []
    return sorted(re.sub(r"^.* -c (\S+) --index index -- ", r"-c \1 -- ", ln).rstrip("|") for ln in lines)


def ahead(run: subprocess.CompletedProcess[str]) -> str | None:
    """The ``-v`` line saying how many calls were started ahead and taken, if any."""
    return next((ln.removeprefix(AHEAD) for ln in run.stderr.splitlines() if ln.startswith(AHEAD)), None)


def all_taken(run: subprocess.CompletedProcess[str], *, most: int = len(CALLS)) -> bool:
    """Whether calls were started ahead and the search took every one. How many start ahead
    depends on the cores (``qmd_prefetch.ahead_limit``: one at a time on two) and on when the
    search gets there: it starts those not started yet itself."""
    m = re.fullmatch(r"(\d+), taken by the search: (\d+)", ahead(run) or "")
    return m is not None and 1 <= int(m[1]) == int(m[2]) <= most


def test_the_next_search_starts_its_qmd_calls_ahead_and_prints_the_same_bytes(setup: dict[str, Any]) -> None:
    first = record(setup)  # in-process
    assert calls(setup) == sorted(CALLS)
    second = search(setup)
    assert second.returncode == 0, second.stderr
    assert all_taken(second)
    assert calls(setup) == sorted(CALLS)  # the same calls, none twice
    off = search(setup, QMDBRIDGE_CLI_CACHE="off")
    assert ahead(off) is None and calls(setup) == sorted(CALLS)
    assert second.stdout == off.stdout == first.stdout
    doc = orjson.loads(second.stdout)
    assert (doc["backend"], doc["fallback"]) == ("qmd", None)
    assert [r["path"] for r in doc["results"]][:1] == ["MEMORY.md"]
    assert psutil.Process().children(recursive=True) == []


def loaded(run: subprocess.CompletedProcess[str]) -> list[str]:
    """The modules a probe reported loaded."""
    assert run.returncode == 0, run.stderr
    return json.loads(run.stderr.split("\nLOADED ")[1].splitlines()[0])


def test_another_question_of_the_command_line_is_started_ahead_as_the_search_sends_it(
        setup: dict[str, Any]) -> None:
    """The recorded settings hold for every query of the command line; a query with a quote
    left open is sent without it (``without_stray_quote``), ahead as by the search."""
    record(setup)
    run = search(setup, query='When did the router "drop the WAN?')
    assert all_taken(run) and calls(setup) == sorted(CALLS)
    run = search(setup, query="router")
    assert all_taken(run, most=2)
    assert calls(setup) == ["-c memory-dir-main -- router", "-c memory-root-main -- router"]


def test_starting_the_calls_ahead_loads_nothing_heavy(setup: dict[str, Any]) -> None:
    record(setup)
    run = search(setup, probe=PROBE)
    assert loaded(run) == []
    assert all_taken(run)


def test_a_search_qmd_answers_loads_neither_the_builtin_engine_nor_the_process_killer(
        setup: dict[str, Any]) -> None:
    record(setup)
    run = search(setup, probe=AFTER)  # its qmd calls started ahead
    assert loaded(run) == [] and all_taken(run)
    spawned = search(setup, probe=AFTER, QMDBRIDGE_CLI_CACHE="off")  # spawned by the runner
    assert loaded(spawned) == [] and ahead(spawned) is None
    assert orjson.loads(spawned.stdout)["backend"] == "qmd"


def test_nothing_starts_ahead_when_a_breaker_holds_a_failure_or_the_collections_changed(
        setup: dict[str, Any]) -> None:
    record(setup)
    breaker = setup["qmd_dir"] / "breaker.json"
    breaker.write_text(json.dumps({"failures": 1, "openUntilMs": 0, "scope": "another command"}))
    run = search(setup)
    assert ahead(run) is None and orjson.loads(run.stdout)["backend"] == "qmd"
    assert all_taken(search(setup))  # the success cleared it
    index_yml = setup["qmd_dir"] / "xdg-config" / "qmd" / "index.yml"
    st = index_yml.stat()
    os.utime(index_yml, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    run = search(setup)  # the search reconciles the collections first: its answers come after
    assert ahead(run) is None and orjson.loads(run.stdout)["backend"] == "qmd"
    assert all_taken(search(setup))


def test_a_hanging_qmd_started_ahead_falls_back_as_it_does_without(setup: dict[str, Any]) -> None:
    record(setup)
    setup["hang"].touch()
    hung = search(setup)
    assert hung.returncode == 0, hung.stderr
    assert all_taken(hung, most=2)
    (setup["qmd_dir"] / "breaker.json").unlink()  # else the next search skips qmd (breaker open)
    off = search(setup, QMDBRIDGE_CLI_CACHE="off")
    assert hung.stdout == off.stdout
    doc = orjson.loads(hung.stdout)
    assert doc["backend"] == "builtin" and doc["fallback"]["reason"] == (
        "qmd query --json -n 24 --no-rerank -c memory-root-main -- router drop WAN | "
        "router | drop | WAN timed out after 4000ms (memory.qmd.limits.timeoutMs)")
    for pid in (int(line) for line in setup["pids"].read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sigterm_while_a_call_started_ahead_hangs_reaps_it(setup: dict[str, Any]) -> None:
    """SIGTERM stops the search with exit 130 (as in-process) and kills what it started ahead,
    the hanging stand-in's grandchildren too (one of them out of its process group)."""
    import time

    record(setup)
    setup["hang"].touch()
    proc = subprocess.Popen([sys.executable, "-m", "qmdbridge", "search", QUESTION, "--workspace",
                             str(setup["ws"]), "--json"], env=setup["env"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not setup["pids"].exists():  # the stand-in started ahead wrote its grandchildren
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        grandchildren = [int(line) for line in setup["pids"].read_text().split()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130, proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in grandchildren:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert psutil.Process().children(recursive=True) == []


def test_a_program_put_at_the_recorded_qmd_path_is_probed_before_any_search_runs_it(
        setup: dict[str, Any]) -> None:
    """The recorded path is what the search spawns only while the probe cache vouches for the
    executable there (its size and mtime as probed): a foreign program written over it gets
    ``--version`` from the probe and nothing else, as without the cache."""
    record(setup)
    wrapper, seen = setup["ws"].parent / "qmd-logged", setup["ws"].parent / "foreign.log"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{seen}"\necho "Quick Markdown Viewer 0.4.1"\n')
    run = search(setup)
    assert run.returncode == 0, run.stderr
    assert seen.read_text().splitlines() == ["--version"]  # not `search ... -- router drop WAN`
    assert ahead(run) is None
    for breaker in ("breaker.json", "startup-breaker.json"):  # else the next one skips qmd
        (setup["qmd_dir"] / breaker).unlink(missing_ok=True)
    seen.unlink()
    off = search(setup, QMDBRIDGE_CLI_CACHE="off")
    assert seen.read_text().splitlines() == ["--version"]
    assert run.stdout == off.stdout and orjson.loads(run.stdout)["backend"] == "builtin"
    assert psutil.Process().children(recursive=True) == []


def test_a_path_that_finds_another_qmd_starts_nothing_ahead(setup: dict[str, Any], qmd_bin: Path) -> None:
    """``command: "qmd"`` is looked up in ``PATH``: under another ``PATH`` the search runs the
    qmd found there, so the one recorded under the old ``PATH`` is not started ahead."""
    config = setup["state"] / "openclaw.json"
    doc = json.loads(config.read_text())
    doc["memory"]["qmd"]["command"] = "qmd"
    config.write_text(json.dumps(doc))
    first, second = setup["ws"].parent / "first", setup["ws"].parent / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "qmd").write_text("#!/bin/sh\n" + LOGGED.format(log=f"{folder}.log")
                                    + f'exec "{qmd_bin}" "$@"\n')
        (folder / "qmd").chmod(0o755)
    path = setup["env"]["PATH"]
    setup["env"]["PATH"] = f"{first}{os.pathsep}{path}"
    record(setup)
    Path(f"{first}.log").unlink()
    run = search(setup, PATH=f"{second}{os.pathsep}{first}{os.pathsep}{path}")
    assert run.returncode == 0 and ahead(run) is None, run.stderr
    assert not Path(f"{first}.log").exists()  # the qmd of the old PATH ran nothing
    assert len(Path(f"{second}.log").read_text().splitlines()) == len(CALLS)
    assert orjson.loads(run.stdout)["backend"] == "qmd"


SIGNAL_AT_START = """
import os, signal, sys, threading, time
start = threading.Thread.start
def started(self):
    start(self)
    if self.name == "qmd-prefetch":  # SIGTERM once a call started ahead hangs, before the
        deadline = time.monotonic() + 60  # calls are handed back to main()
        while not os.path.exists(os.environ["STANDIN_PIDFILE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the handler raises here
threading.Thread.start = started
from qmdbridge.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_signal_while_the_calls_ahead_start_reaps_them(setup: dict[str, Any]) -> None:
    """SIGTERM (or Ctrl-C) that lands while the thread starting the calls is itself starting
    leaves nothing running: the command owns the calls from before their first start."""
    record(setup)
    setup["hang"].touch()
    run = search(setup, probe=SIGNAL_AT_START)
    # the stand-in and its grandchildren, all in the workspace
    left = [p for p in psutil.process_iter() if _cwd(p) == str(setup["ws"]) and _running(p)]
    for proc in left:  # (killed so that a failure leaves nothing behind either)
        proc.kill()
    assert run.returncode == 130, run.stderr
    assert setup["pids"].exists() and left == []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cwd(proc: psutil.Process) -> str | None:
    try:
        return proc.cwd()
    except psutil.Error:
        return None


def test_a_reader_gone_before_the_answer_exits_141_quietly_with_nothing_left(setup: dict[str, Any]) -> None:
    """``qmdbridge search ... | head -c1`` where the reader is gone before the answer is
    written: exit 141 (128 + SIGPIPE, as a shell reports a program SIGPIPE ended), no
    traceback, with the calls started ahead and without them, and no qmd left running."""
    record(setup)
    setup["log"].unlink()
    runs = []
    for env in ({}, {"QMDBRIDGE_CLI_CACHE": "off"}):
        proc = subprocess.Popen([sys.executable, "-m", "qmdbridge", "search", QUESTION, "--workspace",
                                 str(setup["ws"]), "--json"], env={**setup["env"], **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # type: ignore[union-attr]  # gone before anything is written
        err = proc.stderr.read()  # type: ignore[union-attr]
        runs.append((proc.wait(timeout=180), err))
    assert runs == [(141, ""), (141, "")]
    assert calls(setup) == sorted(CALLS * 2)  # each searched, none twice
    assert psutil.Process().children(recursive=True) == []
