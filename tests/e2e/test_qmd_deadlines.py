"""Deadlines that mean one thing, with the real qmd and real CLI processes: the boot update of
``waitForBootSync`` runs under ``updateTimeoutMs``, never under the search deadline
(``limits.timeoutMs``), so a slow start-up neither fails the search nor opens the breaker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.slow  # a real process's deadlines against the real qmd

REPO = Path(__file__).resolve().parents[2]
# Enough notes that registering the collections and the boot update take longer than the
# search deadline below (about 2 s on an idle two-core machine; the old behaviour timed out).
NOTES = 1000
SEARCH_TIMEOUT_MS = 1500


def _launcher() -> Path:
    launcher = REPO / ".tools" / "bin" / "qmd"
    if not launcher.exists():
        if os.environ.get("CI"):
            pytest.fail("real qmd missing: run scripts/install-qmd.sh")
        pytest.skip("real qmd missing: run scripts/install-qmd.sh")
    return launcher


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router dropped the WAN link twice on Friday.\n")
    for i in range(NOTES):
        (ws / "memory" / f"2025-01-{i:04d}.md").write_text(
            f"# Note {i}\n\n" + f"Inventory line {i} for the storage shelf.\n" * 20)
    return ws


def _search(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())",
            "search", *args]
    return subprocess.run(argv, env=env, capture_output=True, timeout=300)


@pytest.mark.qmd
def test_one_shot_searches_with_wait_for_boot_sync_are_all_answered_by_qmd(tmp_path: Path) -> None:
    launcher = _launcher()
    ws = _workspace(tmp_path)
    cfg = tmp_path / "qmd.json5"
    cfg.write_text(f"{{memory: {{backend: 'qmd', qmd: {{command: '{launcher}', "
                   f"limits: {{timeoutMs: {SEARCH_TIMEOUT_MS}}}, update: {{waitForBootSync: true}}}}}},"
                   f" agents: {{defaults: {{memorySearch: {{provider: 'none'}}}}}}}}")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY", "GEMINI_API_KEY",
                                                           "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                                                           "MISTRAL_API_KEY")}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    answers = []
    for _ in range(2):  # a fresh state dir: the first registers the collections too, then an update alone
        p = _search(["router dropped the WAN link", "--workspace", str(ws), "--config", str(cfg),
                     "--json"], env)
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        doc = orjson.loads(p.stdout)
        answers.append((doc["backend"], doc["fallback"], doc["results"][0]["path"]))
    assert answers == [("qmd", None, "MEMORY.md")] * 2
    breaker = orjson.loads((tmp_path / "state/agents/main/qmd/breaker.json").read_bytes())
    assert (breaker["failures"], breaker["lastFailure"]) == (0, None)
