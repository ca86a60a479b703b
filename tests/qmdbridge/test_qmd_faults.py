"""QmdBackend against stand-ins for failures the real qmd cannot be made to show."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import orjson
import psutil
import pytest

from fallback.errors import BackendTimeoutError, BackendUnavailableError, LockTimeoutError
from fallback.fs.lock import PidFileLock
from fallback.request import SearchRequest
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.errors import QmdOutputError
from qmdbridge.qmd.locate import QmdLocation
from qmdbridge.qmd.search_calls import VEC0_HINT
from qmdbridge.qmd.update import UpdateCycle

pytestmark = pytest.mark.anyio


def make(tmp_path: Path, standins_dir: Path, base_path_env: str, behaviour: str,
         timeout_ms: int = 4000, mode: str = "search", update: dict | None = None,
         **env_extra: str) -> tuple[QmdBackend, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n\nalpha\nbeta\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {
        "searchMode": mode, "limits": {"timeoutMs": timeout_ms},
        "update": {"onBoot": False, **(update or {})}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    exe = str(standins_dir / "c2_qmd.py")
    loc = QmdLocation(path=exe, found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    log = tmp_path / "calls.jsonl"
    env = {"PATH": base_path_env, "HOME": str(tmp_path / "home"), "C2_LOG": str(log),
           "C2_BEHAVIOUR": behaviour, **env_extra}
    return QmdBackend(agent, location=loc, mode="cli", env=env), log


def search_calls(log: Path) -> list[list[str]]:
    calls = [orjson.loads(line) for line in log.read_text().splitlines()]
    return [c for c in calls if c and c[0] in ("search", "vsearch", "query")]


@pytest.mark.parametrize("behaviour", ["noisy", "crash"])
async def test_noise_and_crash_after_output_recovered(tmp_path: Path, standins_dir: Path,
                                                      base_path_env: str, behaviour: str) -> None:
    b, _ = make(tmp_path, standins_dir, base_path_env, behaviour)
    try:
        await b.start()
        [hit] = (await b.search(SearchRequest.of("alpha", min_score=0))).results
        # the four-line note is one chunk: the hit is the whole note (qmd said 3-4), scored as
        # the best passage of the notes qmd found (qmd said 0.82)
        assert (hit.path, hit.start_line, hit.end_line, hit.snippet, hit.score) == (
            "MEMORY.md", 1, 4, "# Memory\n\nalpha\nbeta", 1.0)
    finally:
        await b.close()


async def test_a_hit_without_the_question_words_keeps_qmds_lines(
        tmp_path: Path, standins_dir: Path, base_path_env: str) -> None:
    """The stand-in answers MEMORY.md lines 3-4 whatever was asked: asked for a word the note
    does not hold (qmd matched a prefix, or the path), the hit keeps qmd's lines and snippet."""
    b, _ = make(tmp_path, standins_dir, base_path_env, "noisy")
    try:
        await b.start()
        [hit] = (await b.search(SearchRequest.of("gamma", min_score=0))).results
        assert (hit.start_line, hit.end_line, hit.snippet_start_line, hit.snippet_end_line,
                hit.snippet) == (3, 4, 3, 4, "alpha\nbeta")
    finally:
        await b.close()


async def test_flag_rejection_reruns_with_query(tmp_path: Path, standins_dir: Path,
                                                base_path_env: str) -> None:
    b, log = make(tmp_path, standins_dir, base_path_env, "flagreject")
    try:
        await b.start()
        assert [h.path for h in (await b.search(SearchRequest.of("alpha", min_score=0))).results] == ["MEMORY.md"]
        calls = search_calls(log)
        # one call per collection, side by side (any order), all rerun with query
        assert [c[0] for c in calls] == ["search", "search", "query", "query"]
        assert sorted(calls[:2]) == [
            ["search", "--json", "-n", "6", "-c", "memory-dir-main", "--index", "index", "--", "alpha"],
            ["search", "--json", "-n", "6", "-c", "memory-root-main", "--index", "index", "--", "alpha"]]
        assert sorted(calls[2:]) == [
            ["query", "--json", "-n", "6", "-c", "memory-dir-main", "--index", "index", "--", "alpha"],
            ["query", "--json", "-n", "6", "-c", "memory-root-main", "--index", "index", "--", "alpha"]]
        assert b.search_fallback_reason == "unsupported-search-flags"
    finally:
        await b.close()


async def test_after_a_flag_rejection_query_mode_reads_the_question_as_written(
        tmp_path: Path, standins_dir: Path, base_path_env: str) -> None:
    b, log = make(tmp_path, standins_dir, base_path_env, "flagreject")
    try:
        await b.start()
        await b.search(SearchRequest.of("Where is alpha?", min_score=0))
        calls = search_calls(log)
        # search gets the content word (qmdbridge/qmd/lexical.py), query the sentence
        assert [(c[0], c[-1]) for c in calls] == [("search", "alpha")] * 2 + [
            ("query", "Where is alpha?")] * 2
    finally:
        await b.close()


async def test_garbage_raises_output_error(tmp_path: Path, standins_dir: Path, base_path_env: str) -> None:
    b, _ = make(tmp_path, standins_dir, base_path_env, "garbage")
    try:
        await b.start()
        with pytest.raises(QmdOutputError) as ei:
            await b.search(SearchRequest.of("alpha"))
        # the message names the subcommand that printed it (search mode: qmd search)
        assert str(ei.value) == ("qmd unavailable: qmd search returned invalid JSON: qmd search JSON"
                                 " response was not an array (stdout: not json at all)")
    finally:
        await b.close()


async def test_missing_collection_repaired_once(tmp_path: Path, standins_dir: Path,
                                                base_path_env: str) -> None:
    b, log = make(tmp_path, standins_dir, base_path_env, "missing")
    try:
        await b.start()
        assert [h.path for h in (await b.search(SearchRequest.of("alpha", min_score=0))).results] == ["MEMORY.md"]
        calls = [orjson.loads(line) for line in log.read_text().splitlines()]
        lists = [i for i, c in enumerate(calls) if c[:2] == ["collection", "list"]]
        searches = [i for i, c in enumerate(calls) if c[0] == "search"]
        assert [calls[i][-1] for i in searches] == ["alpha"] * 4
        # both collections searched side by side, the repair, then both again
        assert sorted(calls[i][5] for i in searches[:2]) == ["memory-dir-main", "memory-root-main"]
        assert sorted(calls[i][5] for i in searches[2:]) == ["memory-dir-main", "memory-root-main"]
        assert len(lists) == 2 and searches[1] < lists[1] < searches[2]
    finally:
        await b.close()


async def test_hang_times_out_and_leaves_no_process(tmp_path: Path, standins_dir: Path,
                                                    base_path_env: str) -> None:
    b, log = make(tmp_path, standins_dir, base_path_env, "hang", timeout_ms=1500)
    try:
        await b.start()
        with pytest.raises(BackendTimeoutError) as ei:
            await b.search(SearchRequest.of("alpha"))
        assert ei.value.timeout_ms == 1500
        assert str(ei.value).endswith("timed out after 1500ms (memory.qmd.limits.timeoutMs)")
        pid = int(Path(str(log) + ".pid").read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert psutil.Process(os.getpid()).children(recursive=True) == []
    finally:
        await b.close()


def cycle(tmp_path: Path, log: list[str], *, mode: str = "query", fail_embed: bool = False,
          clock: list[int] | None = None, update_errors: list[str] | None = None,
          lock_budget_ms: int = 5000) -> UpdateCycle:
    now = clock if clock is not None else [1_000_000]
    errors = update_errors if update_errors is not None else []

    async def update() -> None:
        log.append("update")
        if errors:
            raise BackendUnavailableError("qmd", errors.pop(0))
        await anyio.sleep(0.05)

    async def embed() -> None:
        log.append("embed")
        if fail_embed:
            raise BackendTimeoutError("qmd", "qmd embed", 120000)

    async def nothing() -> None:
        return None

    return UpdateCycle(update=update, embed=embed, repair=nothing, export_sessions=None,
                       after_update=lambda: None, write_lock=tmp_path / "w.lock",
                       embed_lock=tmp_path / "e.lock", search_mode=mode, debounce_ms=15000,
                       embed_interval_ms=3_600_000, lock_budget_ms=lock_budget_ms,
                       embed_lock_budget_ms=5000, now_ms=lambda: now[0], boot_retry_delays_ms=(10, 20))


async def test_unforced_runs_debounced_forced_runs_queue(tmp_path: Path) -> None:
    log: list[str] = []
    c = cycle(tmp_path, log, mode="search")
    await c.run("a")
    await c.run("b")
    assert log == ["update"]
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: c.run("f0", force=True))
        await anyio.sleep(0.01)
        tg.start_soon(lambda: c.run("f1", force=True))
        tg.start_soon(lambda: c.run("f2", force=True))
    assert log == ["update"] * 4


async def test_explicit_runs_are_neither_debounced_nor_joined(tmp_path: Path) -> None:
    """A ``sync`` request (``debounce=False``) must index what changed before it: within the
    debounce window it still updates, and while an update runs (which may have listed the
    files before the change) it runs one more after it, without forcing an embed."""
    log: list[str] = []
    clock = [1_000_000]
    c = cycle(tmp_path, log, clock=clock)
    await c.run("boot", force=True)
    assert log == ["update", "embed"]
    await c.run("serve", debounce=False)
    assert log == ["update", "embed", "update"]
    clock[0] += 15_000  # past the debounce: the interval run updates
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: c.run("interval"))
        await anyio.sleep(0.01)
        tg.start_soon(lambda: c.run("serve", debounce=False))
    assert log == ["update", "embed", "update", "update", "update"]


async def test_embed_failure_backs_off_and_never_fails_update(tmp_path: Path) -> None:
    log: list[str] = []
    clock = [1_000_000]
    c = cycle(tmp_path, log, fail_embed=True, clock=clock)
    await c.run("boot", force=True)
    assert log == ["update", "embed"]
    assert (c.embed.failures, c.embed.backoff_until) == (1, 1_060_000)
    await c.run("manual", force=True)
    assert log == ["update", "embed", "update"]
    clock[0] = 1_060_001
    await c.run("manual", force=True)
    assert (c.embed.failures, c.embed.backoff_until) == (2, 1_060_001 + 120_000)


async def test_boot_update_retries_busy_failures_then_succeeds(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    busy = "qmd update failed (code 1): SQLITE_BUSY: database is locked"
    c = cycle(tmp_path, log, mode="search", update_errors=[busy, busy])
    await c.run("boot", force=True)
    assert log == ["update"] * 3 and c.updates_run == 1 and c.last_error is None
    assert [r.getMessage() for r in caplog.records if "retry" in r.getMessage()] == [
        f"qmd update retry 1/2 after failure (boot): qmd unavailable: {busy}",
        f"qmd update retry 2/2 after failure (boot): qmd unavailable: {busy}"]


async def test_update_retries_stop_after_two_and_only_for_boot_busy_or_timeout(tmp_path: Path) -> None:
    log: list[str] = []
    busy = "database is locked"
    c = cycle(tmp_path, log, mode="search", update_errors=[busy, busy, "timed out"])
    with pytest.raises(BackendUnavailableError, match="timed out$"):
        await c.run("boot:startup", force=True)
    assert log == ["update"] * 3 and c.last_error == "qmd unavailable: timed out"
    log.clear()
    c = cycle(tmp_path, log, mode="search", update_errors=[busy])
    with pytest.raises(BackendUnavailableError, match="database is locked$"):
        await c.run("manual", force=True)  # not a boot run: one attempt
    c = cycle(tmp_path, log, mode="search", update_errors=["disk full"])
    with pytest.raises(BackendUnavailableError, match="disk full$"):
        await c.run("boot", force=True)  # not busy: no retry
    assert log == ["update", "update"]


async def test_update_lock_held_elsewhere_times_out_with_the_holder(tmp_path: Path) -> None:
    log: list[str] = []
    holder = PidFileLock(tmp_path / "w.lock", timeout_ms=0)
    holder.acquire_blocking()
    try:
        c = cycle(tmp_path, log, mode="search", lock_budget_ms=60)
        with pytest.raises(BackendTimeoutError) as info:
            await c.run("manual", force=True)
    finally:
        holder.release()
    assert str(info.value) == f"qmd unavailable: waiting for lock {tmp_path / 'w.lock'} timed out after 60ms"
    assert isinstance(info.value.__cause__, LockTimeoutError)
    assert info.value.__cause__.holder_pid == os.getpid()
    assert log == []  # qmd update never ran without the lock
    await c.run("manual", force=True)
    assert log == ["update"] and (tmp_path / "w.lock").read_text() == ""


async def test_answer_before_a_bun_panic_is_used_with_a_warning(tmp_path: Path, standins_dir: Path,
                                                                 base_path_env: str) -> None:
    """A complete JSON array on stdout, then `panic: Segmentation fault` and exit 3: the answer
    was thrown away (exit 3 was not the 134 the rule knew); it is used, and the answer says so."""
    b, _ = make(tmp_path, standins_dir, base_path_env, "panic")
    try:
        await b.start()
        outcome = await b.search(SearchRequest.of("alpha", min_score=0))
        [hit] = outcome.results
        assert (hit.path, hit.start_line, hit.end_line) == ("MEMORY.md", 1, 4)
        assert outcome.warnings == [
            "qmd search exited with code 3 after printing a complete answer (panic: Segmentation "
            "fault at address 0x18); the answer was used"]
    finally:
        await b.close()


async def test_missing_vec0_switches_the_agent_to_search_with_a_hint(tmp_path: Path, standins_dir: Path,
                                                                      base_path_env: str) -> None:
    # The embedding model is there (an override naming a local file): only vec0 is missing.
    b, log = make(tmp_path, standins_dir, base_path_env, "vec0", mode="vsearch",
                  QMD_EMBED_MODEL=str(tmp_path / "embed.gguf"))
    try:
        await b.start()
        info = await b.search(SearchRequest.of("alpha", min_score=0))
        assert [h.path for h in info.results] == ["MEMORY.md"]
        assert (info.mode, info.warnings) == ("search", [VEC0_HINT])
        assert [h.path for h in (await b.search(SearchRequest.of("alpha", min_score=0))).results] == ["MEMORY.md"]
        # vsearch once per collection, then search only, this search and the next
        assert [c[0] for c in search_calls(log)] == ["vsearch", "vsearch"] + ["search"] * 4
        st = await b.status()
        assert (st.search_mode, st.custom["qmd"]["searchModeOverride"]) == ("search", "search")
        assert VEC0_HINT in st.issues
    finally:
        await b.close()


async def test_the_search_vec0_switched_to_sends_the_content_words_as_the_next_ones_do(
        tmp_path: Path, standins_dir: Path, base_path_env: str) -> None:
    """This stand-in's ``query`` cannot open the vector table either, so the lex call fails
    too: plain search calls, then the relaxed pass, now and in the next searches."""
    b, log = make(tmp_path, standins_dir, base_path_env, "vec0", mode="vsearch",
                  QMD_EMBED_MODEL=str(tmp_path / "embed.gguf"))
    try:
        await b.start()
        for _ in range(2):
            assert [h.path for h in (await b.search(SearchRequest.of("When is alpha due?", min_score=0))).results] == ["MEMORY.md"]
        calls = [(c[0], c[-1]) for c in search_calls(log)]
        # vsearch reads the sentence; the search it fell back to, like the next one, sends the
        # content words ANDed, then each alone (one hit fills one of six slots)
        assert calls[:2] == [("vsearch", "When is alpha due?")] * 2
        assert calls[2:4] == [("query", "lex: alpha due\nlex: alpha\nlex: due")] * 2
        first, second = calls[4:10], calls[10:]
        for search in (first, second):
            assert search[:2] == [("search", "alpha due")] * 2
            assert sorted(search[2:]) == [("search", "alpha")] * 2 + [("search", "due")] * 2
        assert len(second) == 6
    finally:
        await b.close()


async def test_status_and_doctor_try_a_search_instead_of_trusting_version(
        tmp_path: Path, standins_dir: Path, base_path_env: str) -> None:
    """`--version` answers, every search exits 1: status said `qmd: healthy`, doctor `[ok]`."""
    from qmdbridge.doctor import run_doctor

    b, log = make(tmp_path, standins_dir, base_path_env, "searchfail")
    failure = ("qmd search --json -n 1 --index index -- qmdbridge-health-probe failed (code 1): "
               "error: Cannot find module '@tobilu/qmd/dist/store.js'")
    try:
        await b.start()
        st = await b.status()
        assert (st.healthy, st.last_error) == (False, f"qmd search probe failed: {failure}")
        assert st.custom["qmd"]["searchProbe"] == {"ok": False, "error": failure}
        with pytest.raises(BackendUnavailableError):
            await b.search(SearchRequest.of("alpha"))
        assert (await b.status()).custom["qmd"]["lastSearchError"] == (
            "qmd search --json -n 6 -c memory-root-main --index index -- alpha failed (code 1): "
            "error: Cannot find module '@tobilu/qmd/dist/store.js'")
    finally:
        await b.close()
    agent = b.agent.model_copy(update={"memory": b.agent.memory.model_copy(update={
        "qmd": b.agent.memory.qmd.model_copy(update={"command": str(standins_dir / "c2_qmd.py")})})})
    env = {"PATH": base_path_env, "HOME": str(tmp_path / "home"), "C2_LOG": str(log),
           "C2_BEHAVIOUR": "searchfail", "OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    check = next(c for c in (await run_doctor(agent, env=env)).checks if c.name == "qmd")
    assert (check.level, check.detail) == (
        "error", f"2.8.3 at {standins_dir / 'c2_qmd.py'} answers --version but its searches fail: {failure}")
    healthy = next(c for c in (await run_doctor(agent, env={**env, "C2_BEHAVIOUR": "noisy"})).checks
                   if c.name == "qmd")
    assert (healthy.level, healthy.detail) == (
        "ok", f"2.8.3 at {standins_dir / 'c2_qmd.py'}; a test search answered")
    # the manager's status carries it into the one problem list `status` and `doctor` print
    from qmdbridge import MemoryManager
    from qmdbridge.problems import status_problems

    async with MemoryManager(agent, env=env) as m:
        doc = (await m.status()).to_json_dict()
    assert doc["backends"]["qmd"]["healthy"] is False
    assert [(p["check"], p["message"]) for p in status_problems(doc)] == [
        ("qmd", f"qmd is not healthy: qmd search probe failed: {failure}")]


async def test_a_failed_embed_is_shown_by_status(tmp_path: Path, standins_dir: Path,
                                                 base_path_env: str) -> None:
    """An embed killed at update.embedTimeoutMs: status said healthy, with no word of it."""
    b, _ = make(tmp_path, standins_dir, base_path_env, "embedhang", mode="vsearch",
                update={"embedTimeoutMs": 1000}, QMD_EMBED_MODEL=str(tmp_path / "embed.gguf"))
    try:
        await b.start()
        await b.cycle.run("manual", force=True, debounce=False)  # the update, then the embed
        st = await b.status()
        failed = ("qmd embed failed: qmd unavailable: qmd embed --index index timed out after "
                  "1000ms (memory.qmd.update.embedTimeoutMs)")
        assert failed in st.issues
        assert (st.healthy, st.last_error) == (False, failed)
        assert st.custom["qmd"]["embedFailures"] == 1
    finally:
        await b.close()
