"""Tests for qmdbridge.flush: threshold boundaries, once per compaction cycle, read-only workspaces."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest

from fallback.errors import UsageError
from qmdbridge.config import DEFAULT_FLUSH_PROMPT, DEFAULT_FLUSH_SYSTEM_PROMPT, CompactionSettings
from qmdbridge.flush import (
    FlushPlan,
    FlushPlanner,
    flush_threshold_tokens,
    should_flush,
    workspace_is_writable,
)

WINDOW = 200_000
THRESHOLD = WINDOW - 20_000 - 4000  # 176,000


def test_should_flush_boundaries() -> None:
    assert should_flush(THRESHOLD, WINDOW) is True
    assert should_flush(THRESHOLD - 1, WINDOW) is False
    assert should_flush(THRESHOLD + 1, WINDOW) is True
    assert should_flush(1000, 10_000, reserve_tokens_floor=5000, soft_threshold_tokens=4000) is True
    assert should_flush(999, 10_000, reserve_tokens_floor=5000, soft_threshold_tokens=4000) is False


@pytest.mark.parametrize(("tokens", "window", "reserve", "soft"), [
    (0, WINDOW, 20_000, 4000),
    (-5, WINDOW, 20_000, 4000),
    (THRESHOLD, 0, 20_000, 4000),
    (THRESHOLD, -1, 20_000, 4000),
    (THRESHOLD, WINDOW, -1, 4000),
    (THRESHOLD, WINDOW, 20_000, -1),
    (50_000, 24_000, 20_000, 4000),  # threshold 0: never
    (float("nan"), WINDOW, 20_000, 4000),
    (THRESHOLD, float("inf"), 20_000, 4000),
    (True, WINDOW, 20_000, 4000),
])
def test_should_flush_invalid_inputs(tokens: float, window: float, reserve: int, soft: int) -> None:
    assert should_flush(tokens, window, reserve_tokens_floor=reserve,  # type: ignore[arg-type]
                        soft_threshold_tokens=soft) is False


def test_flush_threshold_tokens() -> None:
    assert flush_threshold_tokens(WINDOW) == 176_000
    assert flush_threshold_tokens(WINDOW, reserve_tokens_floor=0, soft_threshold_tokens=0) == WINDOW
    assert flush_threshold_tokens(24_000) is None


def make_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    return ws


def test_plan_fires_once_per_compaction_cycle(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    planner = FlushPlanner(tmp_path / "state", CompactionSettings())
    key = "agent:main:slack:dm:u1"
    plan = planner.plan(key, session_tokens=THRESHOLD, context_window=WINDOW, compaction_count=0,
                        workspace_dir=ws)
    assert plan == FlushPlan(system_prompt=DEFAULT_FLUSH_SYSTEM_PROMPT, prompt=DEFAULT_FLUSH_PROMPT,
                             session_key=key, compaction_count=0)
    # planning alone records nothing
    assert planner.last_fired(key) is None
    record = planner.mark_fired(key, compaction_count=0, now_ms=1_700_000_000_000)
    assert record.parent == tmp_path / "state" / "memory-flush"
    assert record.name.startswith("agent_main_slack_dm_u1-") and record.suffix == ".json"
    assert orjson.loads(record.read_bytes()) == {
        "sessionKey": key, "compactionCount": 0, "firedAtMs": 1_700_000_000_000}
    assert planner.plan(key, session_tokens=THRESHOLD + 5000, context_window=WINDOW,
                        compaction_count=0, workspace_dir=ws) is None
    # next cycle: fires again
    again = planner.plan(key, session_tokens=THRESHOLD, context_window=WINDOW, compaction_count=1,
                         workspace_dir=ws)
    assert again is not None and again.compaction_count == 1
    # other sessions are independent, and a fresh planner reads the record from disk
    other = FlushPlanner(tmp_path / "state", CompactionSettings())
    assert other.last_fired(key) == 0
    assert other.plan("agent:main:main", session_tokens=THRESHOLD, context_window=WINDOW,
                      compaction_count=0, workspace_dir=ws) is not None
    assert sorted(os.listdir(tmp_path / "state" / "memory-flush")) == [record.name]


def test_plan_below_threshold_and_disabled(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    planner = FlushPlanner(tmp_path / "state", CompactionSettings())
    assert planner.plan("k", session_tokens=THRESHOLD - 1, context_window=WINDOW,
                        compaction_count=0, workspace_dir=ws) is None
    settings = CompactionSettings.model_validate(
        {"reserveTokensFloor": 1000, "memoryFlush": {"enabled": False}})
    disabled = FlushPlanner(tmp_path / "state", settings)
    assert disabled.plan("k", session_tokens=WINDOW, context_window=WINDOW, compaction_count=0,
                         workspace_dir=ws) is None


def test_plan_uses_configured_margins_and_prompts(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    settings = CompactionSettings.model_validate({
        "reserveTokensFloor": 10_000,
        "memoryFlush": {"softThresholdTokens": 2000, "prompt": "Write it down.",
                        "systemPrompt": "Flush now."}})
    planner = FlushPlanner(tmp_path / "state", settings)
    assert planner.plan("k", session_tokens=87_999, context_window=100_000, compaction_count=3,
                        workspace_dir=ws) is None
    assert planner.plan("k", session_tokens=88_000, context_window=100_000, compaction_count=3,
                        workspace_dir=ws) == FlushPlan(system_prompt="Flush now.",
                                                       prompt="Write it down.", session_key="k",
                                                       compaction_count=3)


def test_read_only_workspaces(tmp_path: Path) -> None:
    planner = FlushPlanner(tmp_path / "state", CompactionSettings())

    def plan_for(ws: Path) -> FlushPlan | None:
        return planner.plan("k", session_tokens=THRESHOLD, context_window=WINDOW,
                            compaction_count=0, workspace_dir=ws)

    memory_file = tmp_path / "memfile"
    memory_file.mkdir()
    (memory_file / "memory").write_text("not a directory")
    assert workspace_is_writable(memory_file) is False
    assert plan_for(memory_file) is None

    locked_ws = tmp_path / "locked"
    locked_ws.mkdir()
    locked_ws.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert workspace_is_writable(locked_ws) is False
        assert plan_for(locked_ws) is None
    finally:
        locked_ws.chmod(0o755)

    locked_mem = make_workspace(tmp_path / "lm")
    (locked_mem / "memory").chmod(0o555)
    try:
        assert plan_for(locked_mem) is None
    finally:
        (locked_mem / "memory").chmod(0o755)
    assert plan_for(locked_mem) is not None

    assert plan_for(tmp_path / "missing") is None
    no_memory_dir = tmp_path / "fresh"
    no_memory_dir.mkdir()
    assert workspace_is_writable(no_memory_dir) is True


def test_empty_session_key_and_corrupt_record(tmp_path: Path) -> None:
    planner = FlushPlanner(tmp_path / "state", CompactionSettings())
    with pytest.raises(UsageError, match="session key required for the memory flush planner"):
        planner.plan(" ", session_tokens=THRESHOLD, context_window=WINDOW, compaction_count=0,
                     workspace_dir=tmp_path)
    record = planner.record_path("agent:main:main")
    record.parent.mkdir(parents=True)
    record.write_bytes(b"{oops")
    assert planner.last_fired("agent:main:main") is None
    planner.mark_fired("agent:main:main", compaction_count=2)
    assert planner.last_fired("agent:main:main") == 2
    planner.forget("agent:main:main")
    assert planner.last_fired("agent:main:main") is None


def test_record_names_are_distinct_and_confined(tmp_path: Path) -> None:
    planner = FlushPlanner(tmp_path / "state", CompactionSettings())
    a = planner.record_path("agent:main:x")
    b = planner.record_path("agent_main_x")
    c = planner.record_path("../../etc/passwd")
    assert a != b
    assert a.name.startswith("agent_main_x-") and b.name.startswith("agent_main_x-")
    assert c.parent == tmp_path / "state" / "memory-flush"
    assert c.name.startswith("_.._etc_passwd-")  # no separator survives
