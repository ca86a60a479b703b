"""BlockingMemoryManager answers a keyword-only search in the caller's thread when nothing is due
(``MemoryManager.search_settled``), with the answer the event loop's ranking gives, and hands
the search to the event loop when a file changed, so the change is searched. Real SQLite files,
real file events."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import BlockingMemoryManager

DEADLINE_S = 60.0
NOTES = {
    "MEMORY.md": "# Memory\n\nRouter: Omada ER605 with AdGuard at 192.168.10.2.\n"
                 "Caroline prefers tea; Melanie runs the pottery class.\n",
    "memory/2026-03-01.md": "# 2026-03-01\n\nCaroline went to the LGBTQ support group.\n"
                            "The zebra migration is done.\n",
    "memory/2026-03-02.md": "# 2026-03-02\n\nMelanie painted a sunrise by the lake.\n"
                            "Caroline researched adoption agencies.\n",
    "memory/2026-03-05.md": "# 2026-03-05\n\nThe pottery class made a bowl.\nMelanie and the kids "
                            "went camping by the lake; the zebra at the zoo.\n",
    "memory/projects/router.md": "# Router\n\nAdGuard blocks ads; the Omada controller runs on "
                                 "the NAS.\n",
}
QUESTIONS = ("When did Caroline go to the LGBTQ support group?", "What did Melanie paint?",
             "zebra", "pottery class bowl", "Where does the Omada controller run?",
             "lake camping kids", "nothing matches this at all")


def _agent(tmp_path: Path, search: dict[str, Any] | None = None) -> tuple[Any, dict[str, str]]:
    ws = tmp_path / "ws"
    for rel, text in NOTES.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {"provider": "none", **(search or {})}}}})
    return resolve_agent(cfg, "main", workspace=ws, env=env), env


def test_a_keyword_search_is_answered_in_the_callers_thread_while_the_event_loop_is_busy(
        tmp_path: Path) -> None:
    agent, env = _agent(tmp_path)
    with BlockingMemoryManager(agent, env=env) as m:
        first = m.search("zebra migration")  # indexes the workspace (in the event loop)
        busy, release = threading.Event(), threading.Event()

        async def hold_the_loop() -> None:
            busy.set()
            release.wait(DEADLINE_S)  # blocks the portal's event loop thread

        held = m._portal.start_task_soon(hold_the_loop)
        answers: list[Any] = []
        done = threading.Event()

        def search() -> None:
            answers.append(m.search("zebra migration"))
            done.set()

        try:
            assert busy.wait(DEADLINE_S)
            threading.Thread(target=search, daemon=True).start()
            answered_while_busy = done.wait(DEADLINE_S)
        finally:
            release.set()
            held.result(DEADLINE_S)
        assert answered_while_busy
        assert done.wait(DEADLINE_S)
        assert answers[0] == first
        assert [r.citation for r in first.results] == ["memory/2026-03-01.md#L1-L4"]


@pytest.mark.parametrize("search", [{}, {"query": {"hybrid": {"temporalDecay": {
    "enabled": True, "halfLifeDays": 30}}, "minScore": 0.1, "maxResults": 3}}])
def test_the_callers_thread_answer_is_the_ranking_pipelines_answer(
        tmp_path: Path, search: dict[str, Any]) -> None:
    agent, env = _agent(tmp_path, search)
    with BlockingMemoryManager(agent, env=env, now_ms=lambda: 1_775_000_000_000) as m:
        m.search("zebra")
        for question in QUESTIONS:
            for kwargs in ({}, {"max_results": 2, "min_score": 0.5}, {"session_key": "agent:main:dm:1"}):
                settled = m._manager.search_settled(question, **kwargs)
                assert settled is not None  # nothing due: answered in this thread
                # explain: the event loop's ranking (the pipeline's Searcher), traced
                traced = m.search(question, explain=True, **kwargs)
                assert settled.model_dump() == traced.model_copy(update={"results": [
                    r.model_copy(update={"explain": None}) for r in traced.results]}).model_dump()


def test_a_note_saved_after_a_search_is_found_by_the_next_blocking_search(tmp_path: Path) -> None:
    agent, env = _agent(tmp_path, {"sync": {"watchDebounceMs": 600_000}})  # handed over: never
    with BlockingMemoryManager(agent, mode="full", env=env) as m:
        m.start()
        assert m.search("quokka").results == []
        engine = m._portal.call(m._manager.builtin)
        watcher = engine._live.watcher
        seen = watcher.unsent()[0]
        (tmp_path / "ws" / "memory" / "2026-03-09.md").write_text("# 2026-03-09\n\nA quokka visited.\n")
        deadline = time.monotonic() + DEADLINE_S
        while watcher.unsent()[0] == seen:  # the watcher saw the save (its debounce holds it)
            assert time.monotonic() < deadline, "the watcher saw no event"
            threading.Event().wait(0.05)
        assert m._manager.search_settled("quokka") is None  # the event loop syncs it first
        assert [r.path for r in m.search("quokka").results] == ["memory/2026-03-09.md"]


def test_read_file_and_sync_through_the_blocking_facade(tmp_path: Path) -> None:
    """``read_file`` pages a note and ``sync`` indexes a note written since (the docs' blocking
    example); both raise ``ManagerClosedError`` once the manager is closed."""
    from qmdbridge import ManagerClosedError

    agent, env = _agent(tmp_path)
    m = BlockingMemoryManager(agent, env=env)
    with m:
        page = m.read_file("memory/2026-03-02.md", from_line=3, lines=1)
        assert (page.path, page.text, page.from_line, page.lines, page.truncated, page.next_from) == (
            "memory/2026-03-02.md", "Melanie painted a sunrise by the lake.\n\n"
            "[More content available. Use from=4 to continue.]", 3, 1, True, 4)
        assert m.status().files == 0  # nothing indexed yet: reading needs no index
        (agent.workspace_dir / "memory" / "2026-03-09.md").write_text("# 2026-03-09\n\nA narwhal.\n")
        m.sync(reason="test", force=True)
        assert m.status().files == len(NOTES) + 1
        assert [h.path for h in m.search("narwhal", min_score=0).results] == ["memory/2026-03-09.md"]
    with pytest.raises(ManagerClosedError, match="memory manager is closed"):
        m.read_file("MEMORY.md")
    with pytest.raises(ManagerClosedError, match="memory manager is closed"):
        m.sync()


def test_read_file_refuses_bad_ranges_and_non_notes_with_the_reason(tmp_path: Path) -> None:
    from qmdbridge import PathRefusedError, UsageError

    agent, env = _agent(tmp_path)
    (tmp_path / "ws" / "memory" / "queue.md").parent.mkdir(exist_ok=True)
    os.mkfifo(tmp_path / "ws" / "memory" / "queue.md")
    with BlockingMemoryManager(agent, env=env) as m:
        for kwargs, message in (({"lines": 0}, "lines must be between 1 and 2147483647"),
                                ({"from_line": 0}, "from must be between 1 and 2147483647")):
            with pytest.raises(UsageError) as usage:
                m.read_file("MEMORY.md", **kwargs)
            assert str(usage.value) == message
        for path, reason in ((".", "not a memory path"), ("memory", "not a memory path"),
                             ("memory/queue.md", "not a regular file")):
            with pytest.raises(PathRefusedError) as refused:
                m.read_file(path)
            assert str(refused.value) == f"path refused: {path!r}: {reason}"
        page = m.read_file("MEMORY.md", from_line=3, lines=1)
        assert (page.path, page.text) == ("MEMORY.md", "Router: Omada ER605 with AdGuard at 192.168.10.2.\n\n"
                                                       "[More content available. Use from=4 to continue.]")
