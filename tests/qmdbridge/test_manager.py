"""MemoryManager end to end: builtin answers, qmd answers, every qmd fault class falls back to
the builtin engine with the reason and within the deadline, the circuit breaker recovers,
scope rules hold through the fallback, citations and the injected-chars budget."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from fallback.errors import ManagerClosedError, PathRefusedError, UsageError
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import MemoryManager, decorate_citations
from qmdbridge.policy.citations import format_citation

pytestmark = pytest.mark.anyio

STANDINS = Path(__file__).resolve().parent / "standins"


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nRouter: Omada ER605 with AdGuard at 192.168.10.2.\n")
    (ws / "memory" / "2026-03-01.md").write_text(
        "# 2026-03-01\n\nDeployed the billing webhook fix.\nThe zebra migration is done.\n")
    return ws


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY", "GEMINI_API_KEY",
                                                           "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                                                           "MISTRAL_API_KEY")}
    env["OPENCLAW_STATE_DIR"] = str(tmp_path / "state")
    env["HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def _manager(tmp_path: Path, memory: dict[str, Any] | None = None, *,
             memory_search: dict[str, Any] | None = None, **env_extra: str) -> MemoryManager:
    ws = _workspace(tmp_path) if not (tmp_path / "ws").exists() else tmp_path / "ws"
    env = _env(tmp_path, **env_extra)
    cfg = parse_config({"memory": memory or {}, "agents": {"defaults": {"memorySearch": {
        "provider": "none", **(memory_search or {})}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env=env)
    return MemoryManager(agent, env=env)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def test_builtin_answers_with_citation_footer_for_owner_calls(tmp_path: Path,
                                                                   store: dict[str, Any]) -> None:
    async with _manager(tmp_path, memory_search={"store": store}) as m:
        resp = await m.search("zebra migration")
    assert resp.backend == "builtin" and resp.fallback is None
    assert resp.mode == "fts-only" and resp.provider == "none"
    top = resp.results[0]
    assert (top.path, top.start_line, top.end_line) == ("memory/2026-03-01.md", 1, 4)
    assert top.citation == "memory/2026-03-01.md#L1-L4"
    assert top.snippet.endswith("\n\nSource: memory/2026-03-01.md#L1-L4")


async def test_blank_query_and_bad_limits_are_usage_errors(tmp_path: Path) -> None:
    async with _manager(tmp_path) as m:
        with pytest.raises(UsageError, match="query must not be empty"):
            await m.search("   ")
        with pytest.raises(UsageError, match="max results"):
            await m.search("x", max_results=0)
        with pytest.raises(UsageError, match="from must be between 1 and 2147483647"):
            await m.read_file("MEMORY.md", from_line=0)
    with pytest.raises(ManagerClosedError):
        await m.search("zebra")


async def test_backend_none_disables_both_memory_tools(tmp_path: Path) -> None:
    from fallback.errors import BackendUnavailableError
    from qmdbridge.tools import handle_memory_get, handle_memory_search

    disabled = "none unavailable: memory tools are disabled (memory.backend = none)"
    async with _manager(tmp_path, {"backend": "none"}) as m:
        with pytest.raises(BackendUnavailableError, match=r"^none unavailable: memory tools are disabled"):
            await m.search("zebra")
        with pytest.raises(BackendUnavailableError) as caught:
            await m.read_file("MEMORY.md")
        assert str(caught.value) == disabled
        with pytest.raises(UsageError):  # a bad request is still told as such
            await m.read_file("MEMORY.md", from_line=0)
        searched = await handle_memory_search(m, {"query": "zebra"})
        got = await handle_memory_get(m, {"path": "MEMORY.md"})
        status = await m.status()
    assert (status.backend, status.backends["builtin"]["backend"]) == ("none", "builtin")
    assert searched == {"results": [], "disabled": True, "error": disabled}
    assert got == {"path": "MEMORY.md", "text": "", "disabled": True, "error": disabled, "refused": False}


async def test_read_file_refuses_and_reads(tmp_path: Path) -> None:
    async with _manager(tmp_path) as m:
        page = await m.read_file("memory/2026-03-01.md", from_line=3, lines=1)
        assert (page.text, page.from_line, page.lines, page.next_from) == (
            "Deployed the billing webhook fix.\n\n[More content available. Use from=4 to continue.]",
            3, 1, 4)
        missing = await m.read_file("memory/2099-01-01.md")
        assert missing.missing and missing.text == ""
        with pytest.raises(PathRefusedError):
            await m.read_file("../etc/passwd.md")
        # a hit's citation given as the path: refused, and told how to read it
        with pytest.raises(PathRefusedError) as caught:
            await m.read_file("memory/2026-03-01.md#L3-L4")
        assert str(caught.value) == (
            "path refused: 'memory/2026-03-01.md#L3-L4': not markdown (that is a citation: read "
            "it with path 'memory/2026-03-01.md', from 3, lines 2)")
        with pytest.raises(PathRefusedError) as caught:
            await m.read_file("memory/2026-03-01.md#L7")
        assert caught.value.hint == "that is a citation: read it with path 'memory/2026-03-01.md', from 7, lines 1"
        # a hit as plain `qmdbridge search` output prints it (`path:start-end`), copied as the path
        with pytest.raises(PathRefusedError) as caught:
            await m.read_file("memory/2026-03-01.md:3-4")
        assert caught.value.hint == "that is a citation: read it with path 'memory/2026-03-01.md', from 3, lines 2"


async def test_scope_denies_group_chat_with_reason(tmp_path: Path) -> None:
    async with _manager(tmp_path) as m:
        resp = await m.search("zebra", session_key="agent:main:discord:group:g1")
        assert resp.results == [] and resp.denied is not None
        assert resp.denied.allowed is False and resp.denied.chat_type == "group"
        assert "deny" in resp.denied.reason
        direct = await m.search("zebra", session_key="agent:main:discord:direct:u1")
        assert direct.results and direct.denied is None


async def test_citations_auto_off_in_channels_and_off_mode(tmp_path: Path,
                                                           store: dict[str, Any]) -> None:
    scope = {"default": "allow"}
    async with _manager(tmp_path, {"citations": "auto", "qmd": {"scope": scope}},
                        memory_search={"store": store}) as m:
        resp = await m.search("zebra", session_key="agent:main:slack:channel:c1")
    assert resp.results[0].citation == "memory/2026-03-01.md#L1-L4"
    assert "Source:" not in resp.results[0].snippet
    async with _manager(tmp_path, {"citations": "off"}, memory_search={"store": store}) as m:
        resp = await m.search("zebra")
    assert "Source:" not in resp.results[0].snippet and resp.citations == "off"


def test_format_citation_and_budget() -> None:
    from fallback.models import MemorySearchResult

    assert format_citation("MEMORY.md", 3, 3) == "MEMORY.md#L3"
    assert format_citation("a.md", 1, 9) == "a.md#L1-L9"
    hits = [MemorySearchResult(path=f"m{i}.md", start_line=1, end_line=2, score=0.9, snippet="x" * 30)
            for i in range(3)]
    out = decorate_citations(hits, include=True, max_injected_chars=100)
    assert [len(r.snippet) for r in out] == [51, 49]
    assert out[0].snippet == "x" * 30 + "\n\nSource: m0.md#L1-L2"


# -- qmd backend --------------------------------------------------------------------------------

def _qmd_memory(command: str, *, timeout_ms: int = 15000, **qmd: Any) -> dict[str, Any]:
    return {"backend": "qmd", "qmd": {"command": command, "limits": {"timeoutMs": timeout_ms}, **qmd}}


async def test_real_qmd_answers(tmp_path: Path, qmd_bin: Path) -> None:
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:
        resp = await m.search("zebra migration")
        st = await m.status()
    assert resp.backend == "qmd" and resp.fallback is None and resp.mode == "search"
    assert resp.results[0].path == "memory/2026-03-01.md"
    assert resp.results[0].citation is not None and resp.results[0].citation.startswith("memory/2026-03-01.md#L")
    assert st.backend == "qmd" and st.backends["qmd"]["breaker"]["state"] == "closed"
    assert st.backends["builtin"]["backend"] == "builtin"


async def test_a_defect_in_the_qmd_backend_is_answered_by_builtin_and_counted(
        tmp_path: Path, qmd_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the qmd path (an exception none of ours: a defect put in on purpose) never
    silences memory: the builtin engine answers with the exception named as the reason, and
    the breaker records the failure."""
    from qmdbridge.qmd.backend import QmdBackend

    async def broken(self: Any, request: Any, **kwargs: Any) -> Any:
        raise KeyError("collection")

    monkeypatch.setattr(QmdBackend, "search", broken)
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:
        resp = await m.search("zebra migration")
        assert (resp.backend, [r.path for r in resp.results]) == ("builtin", ["memory/2026-03-01.md"])
        assert resp.fallback is not None and resp.fallback.reason == "KeyError: 'collection'"
        assert (m.breaker.state.failures, m.breaker.state.last_failure) == (1, "KeyError: 'collection'")


async def test_the_builtin_engine_is_opened_only_beside_a_qmd_search_that_takes_a_while(
        tmp_path: Path, qmd_bin: Path) -> None:
    """A qmd answer that comes before ``builtin_prepare_delay_ms`` (by default 1 s before the
    search deadline) does not wait for the builtin engine to open; a search running longer has
    it opened beside it, ready for a fallback at the deadline."""
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:  # timeoutMs 15000
        first = await m.search("zebra migration")
        assert first.backend == "qmd" and m._builtin is None
        m.builtin_prepare_delay_ms = 0
        again = await m.search("zebra migration")
        assert again == first
        assert m._builtin is not None and m._builtin._stores.store is not None  # type: ignore[attr-defined]


async def test_missing_qmd_falls_back_with_reason(tmp_path: Path) -> None:
    async with _manager(tmp_path, _qmd_memory(str(tmp_path / "nowhere" / "qmd"))) as m:
        resp = await m.search("zebra")
        st = await m.status()
    assert resp.backend == "builtin" and resp.fallback is not None
    assert resp.fallback.from_backend == "qmd" and "not found" in resp.fallback.reason
    assert resp.results[0].path == "memory/2026-03-01.md"
    assert st.fallback is not None and st.backend == "builtin"
    assert st.backends["qmd"]["healthy"] is False


def _search_standin(tmp_path: Path, qmd_bin: Path, standin: str) -> Path:
    """A qmd whose searches run ``standin`` and whose other commands run the real qmd."""
    wrapper = tmp_path / f"qmd-{Path(standin).stem}"
    wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in search|query|vsearch) exec {sys.executable} "
                       f"{STANDINS / standin} \"$@\" ;; *) exec {qmd_bin} \"$@\" ;; esac\n")
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize("standin,reason_part", [
    ("garbage.py", "qmd search returned invalid JSON: qmd search JSON response was not an array"),
    ("flag_reject.py", "failed"),
])
async def test_failing_qmd_search_falls_back(tmp_path: Path, qmd_bin: Path, standin: str,
                                            reason_part: str) -> None:
    command = _search_standin(tmp_path, qmd_bin, standin)
    async with _manager(tmp_path, _qmd_memory(str(command))) as m:
        resp = await m.search("zebra")
    assert resp.backend == "builtin" and resp.fallback is not None
    assert reason_part in resp.fallback.reason
    assert resp.results and resp.results[0].path == "memory/2026-03-01.md"


async def test_session_hits_read_back_at_their_lines_whichever_backend_answered(
        tmp_path: Path, qmd_bin: Path) -> None:
    """A session hit is readable with ``memory_get`` at the lines it cites: qmd's
    (``qmd/sessions-main/<id>.md``, the exported Markdown) and, when qmd fails, the builtin
    fallback's (``sessions/<file>.jsonl``, the transcript's lines), which the manager reads
    through the builtin engine."""
    import orjson

    sessions = tmp_path / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    records = [{"type": "session", "id": "s1"},
               {"type": "message", "message": {"role": "user", "content": "Which bird was at the lake?"}},
               {"type": "custom", "note": "not a message"},
               {"type": "message", "message": {"role": "assistant", "content": "A grey heron."}}]
    (sessions / "s1.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    with_sessions = {"sources": ["memory", "sessions"], "experimental": {"sessionMemory": True}}

    async def read_back(m: MemoryManager) -> tuple[str, str, str]:
        resp = await m.search("grey heron")
        [hit] = [h for h in resp.results if h.source == "sessions"]
        first, last = hit.snippet_start_line, hit.snippet_end_line
        page = await m.read_file(hit.path, from_line=first, lines=last - first + 1)
        assert (page.from_line, page.lines) == (first, last - first + 1)
        return resp.backend, f"{hit.path}#L{first}-L{last}", page.text.split("\n\n[More")[0]

    qmd_sessions = {"sessions": {"enabled": True}}
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin), **qmd_sessions) | {"citations": "off"},
                        memory_search=with_sessions) as m:
        await m.sync(reason="test")  # exports the transcript for qmd and indexes it
        assert await read_back(m) == (
            "qmd", "qmd/sessions-main/s1.md#L1-L4",
            "# Session s1\n\nUser: Which bird was at the lake?\nAssistant: A grey heron.")
    garbage = _search_standin(tmp_path, qmd_bin, "garbage.py")
    async with _manager(tmp_path, _qmd_memory(str(garbage), **qmd_sessions) | {"citations": "off"},
                        memory_search=with_sessions) as m:
        assert await read_back(m) == (  # JSONL line 3 is no message: read as a blank line
            "builtin", "sessions/s1.jsonl#L2-L4",
            "User: Which bird was at the lake?\n\nAssistant: A grey heron.")


async def test_memory_and_session_hits_mix_by_one_rule_on_both_backends(tmp_path: Path, qmd_bin: Path) -> None:
    """Two transcripts that match better than the notes: on qmd (its exported transcripts) as on
    the builtin engine, the hits stay in score order and sessions take at most half the slots
    (``fusion.select_results``). qmd's answer interleaved the sources round-robin instead
    (``s1, MEMORY.md, s2, 2026-01-05`` for four hits)."""
    import orjson

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\n- The Kestrel migration is owned by Priya.\n- Coffee: flat white.\n")
    (ws / "memory" / "2026-01-05.md").write_text(
        "# 2026-01-05\n\n- Kestrel migration kickoff moved to Monday.\n- Lunch with Sam.\n")
    sessions = tmp_path / "state" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    for name, said in (("s1", ("When does the Kestrel migration start? The Kestrel migration worries me.",
                               "The Kestrel migration starts Monday; Kestrel migration runbook is ready.")),
                       ("s2", ("Remind me about the Kestrel migration rollback plan for the Kestrel migration.",
                               "Kestrel migration rollback: restore the Kestrel backup."))):
        records = [{"type": "message", "message": {"role": role, "content": text}}
                   for role, text in zip(("user", "assistant"), said, strict=True)]
        (sessions / f"{name}.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    with_sessions = {"sources": ["memory", "sessions"], "experimental": {"sessionMemory": True}}
    answers = {}
    for backend, memory in (("qmd", _qmd_memory(str(qmd_bin), sessions={"enabled": True})), ("builtin", None)):
        async with _manager(tmp_path, memory, memory_search=with_sessions) as m:
            await m.sync(reason="test")  # exports the transcripts for qmd and indexes them
            for limit in (4, 3):
                resp = await m.search("Kestrel migration", max_results=limit)
                assert resp.backend == backend
                answers[backend, limit] = [(h.source, Path(h.path).stem) for h in resp.results]
    assert answers == {
        **{(b, 4): [("sessions", "s1"), ("sessions", "s2"), ("memory", "MEMORY"), ("memory", "2026-01-05")]
           for b in ("qmd", "builtin")},
        **{(b, 3): [("sessions", "s1"), ("memory", "MEMORY"), ("memory", "2026-01-05")] for b in ("qmd", "builtin")}}


def _search_printing(tmp_path: Path, qmd_bin: Path, stdout: str) -> Path:
    """A qmd whose searches print ``stdout`` (exit 0) and whose other commands run the real qmd."""
    answer = tmp_path / "search-stdout"
    answer.write_text(stdout)
    wrapper = tmp_path / "qmd-prints"
    wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in search|query|vsearch) exec cat {answer} ;; "
                       f"*) exec {qmd_bin} \"$@\" ;; esac\n")
    wrapper.chmod(0o755)
    return wrapper


async def test_results_of_the_wrong_types_are_garbage_and_fall_back(tmp_path: Path, qmd_bin: Path) -> None:
    """A result array whose entries carry no file qmd could have meant is garbage, as other
    unreadable output is: the builtin engine answers, saying why. (Each such entry, a number,
    null, a list, nothing, is refused by the parser: test_qmd_parse.)"""
    stdout = '[{"file": ["qmd://memory-dir-main/2026-03-01.md"]}]'
    async with _manager(tmp_path, _qmd_memory(str(_search_printing(tmp_path, qmd_bin, stdout)))) as m:
        resp = await m.search("zebra")
    assert resp.backend == "builtin" and resp.fallback is not None
    assert resp.fallback.reason == ("qmd search returned invalid JSON: qmd search JSON response was"
                                    f" not an array (stdout: {stdout})")
    assert resp.results[0].path == "memory/2026-03-01.md"


async def test_an_empty_result_array_is_no_matches(tmp_path: Path, qmd_bin: Path) -> None:
    async with _manager(tmp_path, _qmd_memory(str(_search_printing(tmp_path, qmd_bin, "[]\n")))) as m:
        resp = await m.search("zebra")
    assert (resp.backend, resp.fallback, resp.results) == ("qmd", None, [])


async def test_foreign_program_named_qmd_falls_back(tmp_path: Path) -> None:
    async with _manager(tmp_path, _qmd_memory(str(STANDINS / "foreign" / "qmd"))) as m:
        resp = await m.search("zebra")
    assert resp.backend == "builtin" and resp.fallback is not None
    assert "foreign program" in resp.fallback.reason


async def test_hanging_qmd_falls_back_within_deadline_and_leaves_no_process(tmp_path: Path,
                                                                            qmd_bin: Path) -> None:
    # A real qmd first (so collections exist), then a hang for the search itself.
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:
        await m.search("zebra")
    before = _children()
    hang = _search_standin(tmp_path, qmd_bin, "hang.py")
    async with _manager(tmp_path, _qmd_memory(str(hang), timeout_ms=1000)) as m:
        resp = await m.search("zebra")
        assert resp.backend == "builtin" and resp.fallback is not None
        assert resp.fallback.reason == ("qmd search --json -n 6 -c memory-root-main -- zebra timed out after "
                                        "1000ms (memory.qmd.limits.timeoutMs)")
        assert resp.results[0].path == "memory/2026-03-01.md"
        second = await m.search("zebra")  # breaker open: no second wait
        assert second.fallback is not None and "circuit open" in second.fallback.reason
    with anyio.fail_after(60):  # a hang guard: a loaded machine reaps slowly
        while _children() - before:
            await anyio.sleep(0.05)


async def test_a_qmd_hanging_on_its_version_probe_costs_the_search_its_own_deadline(
        tmp_path: Path) -> None:
    # hang.py hangs on every command, --version included: the probe gets limits.timeoutMs
    hang = tmp_path / "qmd-hang"
    hang.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDINS / 'hang.py'} \"$@\"\n")
    hang.chmod(0o755)
    before = _children()
    async with _manager(tmp_path, _qmd_memory(str(hang), timeout_ms=1000)) as m:
        resp = await m.search("zebra")
    assert resp.backend == "builtin" and resp.fallback is not None
    assert resp.fallback.reason == (f"qmd at {hang} did not answer --version: qmd --version "
                                    "timed out after 1000ms")
    assert resp.results[0].path == "memory/2026-03-01.md"
    with anyio.fail_after(60):  # a hang guard: a loaded machine reaps slowly
        while _children() - before:
            await anyio.sleep(0.05)


async def test_a_qmd_hanging_after_its_version_probe_fails_the_start_up_once(tmp_path: Path) -> None:
    # --version answers; every other command hangs (and is logged): the first start-up command
    # to time out ends the start-up and opens the start-up breaker, so neither the rest of the
    # collection reconcile nor a re-index of the "lost" index waits its own timeout, and the
    # next manager (the next one-shot search) does not run qmd again
    calls = tmp_path / "calls.log"
    stuck = tmp_path / "qmd-stuck"
    stuck.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "qmd 2.8.3" && exit 0\n'
                     f'echo "$1 $2" >> {calls}\nexec {sys.executable} {STANDINS / "hang.py"}\n')
    stuck.chmod(0o755)
    memory = _qmd_memory(str(stuck), timeout_ms=1000,
                         update={"commandTimeoutMs": 1000, "updateTimeoutMs": 1000})
    reason = ("start-up: qmd collection list --json --index index timed out after 1000ms "
              "(memory.qmd.update.commandTimeoutMs)")
    async with _manager(tmp_path, memory) as m:
        first = await m.search("zebra")
    assert first.backend == "builtin" and first.fallback is not None
    assert first.fallback.reason == reason
    assert first.results[0].path == "memory/2026-03-01.md"
    async with _manager(tmp_path, memory) as m:
        second = await m.search("zebra")
    assert second.fallback is not None and second.fallback.reason.startswith(f"{reason} (start-up retry in ")
    assert calls.read_text() == "collection list\n"


async def test_a_qmd_crash_is_told_with_the_crash_hint(tmp_path: Path, qmd_bin: Path) -> None:
    """qmd killed by SIGSEGV in query mode (llama.cpp on a model it cannot run): the reason and
    the status problem say it crashed and what avoids reloading models, not to check
    memory.qmd.command."""
    from qmdbridge.problems import CRASH_HINT, status_problems

    crash = _search_standin(tmp_path, qmd_bin, "segfault.py")
    models = {f"QMD_{k}_MODEL": str(tmp_path / f"{k}.gguf") for k in ("EMBED", "RERANK", "GENERATE")}
    async with _manager(tmp_path, _qmd_memory(str(crash), searchMode="query"), **models) as m:
        resp = await m.search("zebra")
        st = await m.status()
    assert resp.backend == "builtin" and resp.fallback is not None
    assert resp.fallback.reason.startswith("qmd query --json -n 6 -c memory-")
    assert resp.fallback.reason.endswith(f" failed (signal 11; {CRASH_HINT}): "
                                         "panic: Segmentation fault at address 0x0")
    [problem] = [p for p in status_problems(st.to_json_dict()) if p["check"] == "qmd"]
    assert problem["hint"] == ('qmd crashed: set memory.qmd.searchMode to "search" (BM25, no model '
                               "loaded) or keep `qmdbridge serve` running (models load once)")


async def test_a_qmd_crash_in_bm25_search_mode_is_not_told_to_use_search_mode(
        tmp_path: Path, qmd_bin: Path) -> None:
    """A crash of a call that loads no model (a ``search`` mode call: ``qmd search``, or ``qmd
    query`` of ``lex:`` lines only) is a crash, without the advice to switch to the mode it ran
    in; status gives the general qmd fix."""
    from qmdbridge.problems import CRASH_HINT, status_problems

    crash = _search_standin(tmp_path, qmd_bin, "segfault.py")
    async with _manager(tmp_path, _qmd_memory(str(crash))) as m:  # searchMode "search"
        resp = await m.search("zebra migration")
        st = await m.status()
    assert resp.backend == "builtin" and resp.fallback is not None
    assert resp.fallback.reason.startswith("qmd query --json -n 24 --no-rerank -c memory-")
    assert resp.fallback.reason.endswith(
        " failed (signal 11; qmd crashed): panic: Segmentation fault at address 0x0")
    assert CRASH_HINT not in resp.fallback.reason
    [problem] = [p for p in status_problems(st.to_json_dict()) if p["check"] == "qmd"]
    assert problem["hint"] == ("check memory.qmd.command and `qmdbridge qmd collections`, or run "
                               "scripts/install-qmd.sh")


async def test_breaker_recovers_when_qmd_is_healthy_again(tmp_path: Path, qmd_bin: Path) -> None:
    flag = tmp_path / "broken.flag"
    flag.write_text("1")
    m = _manager(tmp_path, _qmd_memory(str(STANDINS / "flaky_qmd.py")),
                 FLAKY_FLAG=str(flag), REAL_QMD=str(qmd_bin))
    async with m:
        bad = await m.search("zebra")
        assert bad.backend == "builtin" and bad.fallback is not None
        assert m.breaker.describe()["state"] == "open"
        flag.unlink()
        m.breaker.state.open_until_ms = 0  # the cooldown has passed
        m.breaker._save()
        good = await m.search("zebra")
        assert good.backend == "qmd" and good.fallback is None
        assert m.breaker.describe()["state"] == "closed"


async def test_a_query_too_long_to_start_qmd_with_falls_back_without_opening_the_breaker(
        tmp_path: Path, qmd_bin: Path) -> None:
    # 1,120,015 bytes: more than one argument may hold (128 KiB on Linux) and than a whole
    # command line (1 MiB on macOS); the query's size says nothing of qmd's health
    pasted = "zebra migration " + " ".join(f"w{i:06d}" for i in range(140_000))
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:
        resp = await m.search(pasted)
        assert resp.backend == "builtin" and resp.fallback is not None
        # the argument is the lex call's document: "lex: " and the 140,002 content words
        # (1,120,015 bytes), then "lex: " and each of the first six words alone on its line
        assert resp.fallback.reason == ("query too long for qmd: 1120098 bytes in one argument "
                                        "(Argument list too long)")
        assert resp.results[0].path == "memory/2026-03-01.md"
        assert m.breaker.describe()["state"] == "closed"
        after = await m.search("zebra migration")
        assert (after.backend, after.fallback) == ("qmd", None)
        assert after.results[0].path == "memory/2026-03-01.md"


async def test_scope_applies_through_the_fallback(tmp_path: Path) -> None:
    async with _manager(tmp_path, _qmd_memory(str(tmp_path / "missing-qmd"))) as m:
        resp = await m.search("zebra", session_key="agent:main:telegram:group:g7")
    assert resp.results == [] and resp.denied is not None and resp.denied.chat_type == "group"


async def test_ci_set_makes_model_modes_fall_back_with_the_reason(tmp_path: Path, qmd_bin: Path) -> None:
    """The fallback route of a model mode under CI; the backend decides it alike for ``query``
    and ``vsearch`` (test_qmd_backend: test_ci_env_fails_fast)."""
    mode = "vsearch"
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin), searchMode=mode), CI="true") as m:
        resp = await m.search("zebra migration")
    assert resp.backend == "builtin" and resp.fallback is not None
    # Known before any qmd process starts: the model state says CI refuses model work.
    assert resp.fallback.reason == (
        f"qmd {mode} skipped: qmd refuses model operations while the CI environment variable is "
        "set; unset CI to embed or warm up the models")
    assert resp.results[0].path == "memory/2026-03-01.md"


async def test_status_names_the_folders_searched_for_a_missing_qmd(tmp_path: Path) -> None:
    async with _manager(tmp_path, _qmd_memory("qmd-not-installed-anywhere")) as m:
        st = await m.status()
    view = st.backends["qmd"]
    assert view["healthy"] is False and view["lastError"].startswith("qmd not found")
    assert view["locate"]["found"] is False and view["locate"]["searched"]
    assert view["locate"]["pathEnv"] == os.environ.get("PATH", "")


def test_one_line_keeps_the_error_line() -> None:
    from qmdbridge.qmd.errors import one_line

    trace = ("qmd query x failed (code 1): Warning: 3 documents need embeddings\n"
             "1197 |   if (this._ciMode)\n   ^\nerror: LLM operations are disabled in CI (set CI=true)\n"
             "      at expandQuery (llm.js:1198:23)\n")
    assert one_line(trace) == ("qmd query x failed (code 1): "
                                           "error: LLM operations are disabled in CI (set CI=true)")
    assert one_line("one line") == "one line"
    assert len(one_line("x" * 1000)) == 300


async def test_a_query_too_long_for_one_argument_is_answered_by_builtin_without_opening_the_breaker(
        tmp_path: Path, qmd_bin: Path) -> None:
    """Linux refuses to start a program with one argument past 128 KiB (``E2BIG``): a pasted
    page is the caller's text, not a qmd failure, so the builtin engine answers it, the reason
    says so and the next search goes to qmd again."""
    query = "zebra migration " + " ".join(f"pasted{i}" for i in range(20_000))  # distinct words
    async with _manager(tmp_path, _qmd_memory(str(qmd_bin))) as m:
        long = await m.search(query)
        told = re.fullmatch(r"query too long for qmd: (\d+) bytes in one argument \(Argument list too long\)",
                            long.fallback.reason if long.fallback else "")
        assert long.backend == "builtin" and told and int(told[1]) >= len(query), long.fallback
        assert long.results[0].path == "memory/2026-03-01.md"
        assert m.breaker.state.failures == 0
        assert (await m.search("zebra migration")).backend == "qmd"
