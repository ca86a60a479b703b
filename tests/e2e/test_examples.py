"""The files in ``examples/`` work as shipped: the OpenClaw-style config loads and resolves, and
the Python and Node clients of ``qmdbridge serve`` search the example workspace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qmdbridge.config import load_config, resolve_agent

pytestmark = pytest.mark.slow  # runs the examples' clients, each starting qmdbridge serve

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EXPECTED = ("1.000 memory/2026-11-05.md#L1-L5\n# 2026-11-05\n\n- 1:1 with Dana. She wants a written rollout "
            "plan for Atlas by the 20th, including a rollback path.\n\n[More content available. Use from=4 "
            "to continue.]\n")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY")}
    e.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    return e


def test_the_example_config_loads_and_resolves_both_agents(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLES / "openclaw.json5", env={"OPENCLAW_STATE_DIR": str(tmp_path)})
    env = {"OPENCLAW_STATE_DIR": str(tmp_path), "HOME": str(tmp_path / "home")}
    main = resolve_agent(cfg, None, env=env)
    ops = resolve_agent(cfg, "ops", env=env)
    assert (main.agent_id, ops.agent_id) == ("main", "ops")
    assert main.memory.backend == "builtin" and main.memory.citations == "auto"
    assert main.memory_search.provider == "local" and main.memory_search.local.model_path is None
    assert main.memory_search.query.hybrid.temporal_decay.enabled is True
    assert main.memory_search.extra_paths == ["notes"] and ops.memory_search.extra_paths == ["notes", "runbooks"]
    assert ops.workspace_dir == Path("~/ops-agent").expanduser().resolve()
    assert [r.action for r in main.memory.qmd.scope.rules] == ["allow"]


def test_the_python_serve_client(tmp_path: Path, env: dict[str, str]) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(EXAMPLES / "workspace", ws)
    p = subprocess.run([sys.executable, str(EXAMPLES / "serve_client.py"), "--workspace", str(ws),
                        "router dropped the WAN link"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == EXPECTED


def test_the_node_serve_client(tmp_path: Path, env: dict[str, str]) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    ws = tmp_path / "ws"
    shutil.copytree(EXAMPLES / "workspace", ws)
    exe = shutil.which("qmdbridge")
    if exe is None:
        pytest.skip("the qmdbridge command is not on PATH (pip install -e .)")
    p = subprocess.run([node, str(EXAMPLES / "serve_client.mjs"), "--workspace", str(ws),
                        "router dropped the WAN link"], env={**env, "QMDBRIDGE_CMD": exe},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == EXPECTED
