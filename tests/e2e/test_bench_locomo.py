"""``scripts/bench_locomo.py`` as a real process on the made-up LoCoMo conversation (never the real
data): every system's row, the FTS5 floor's hand-checked values, the Markdown table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.qmdbridge.eval_synthetic import LOCOMO_R, write_locomo

pytestmark = pytest.mark.slow  # runs the LoCoMo benchmark script as a process

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_locomo.py"
QMD = REPO / ".tools" / "bin" / "qmd"


def bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=180)


def test_all_systems_side_by_side(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_locomo(data)
    out = tmp_path / "bench.json"
    p = bench(str(data), "--json", "--out", str(out), "--model", str(tmp_path / "no-model.gguf"),
              tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == doc
    assert (doc["conversations"], doc["questions"], doc["maxResults"]) == (1, 5, 10)
    rows = {r["system"]: r for r in doc["results"]}
    assert list(rows) == ["keyword", "hybrid", "fts5", "qmd", "bridge-qmd"]
    keyword, floor = rows["keyword"]["metrics"], rows["fts5"]["metrics"]
    assert keyword["recallAt5"] == pytest.approx(LOCOMO_R) and keyword["linesPerHit"] == 4.0
    # the floor: one 10-line window per (4-line) file, the same files found
    assert floor["recallAt1"] == pytest.approx(LOCOMO_R) and floor["snippetRecallAt5"] == pytest.approx(LOCOMO_R)
    assert (floor["linesPerHit"], floor["hits"], floor["perCategory"]["open-domain"]["recallAt5"]) == (4.0, 4, 0.0)
    assert rows["hybrid"]["metrics"] is None and rows["hybrid"]["note"].startswith("skipped: ")
    if os.access(QMD, os.X_OK):
        assert rows["qmd"]["metrics"]["fileRecallAt5"] == pytest.approx(LOCOMO_R)
        assert rows["qmd"]["metrics"]["questions"] == 5
        # through the bridge on the warm child: the notes qmd finds, their passages ranked
        bridge = rows["bridge-qmd"]
        assert bridge["metrics"]["recallAt5"] == pytest.approx(LOCOMO_R)
        assert bridge["note"] == ("maxResults 6 (qmd's cap), answered {'qmd': 5, 'builtin': 0}, "
                                  "warm calls {'answered': 5, 'spawned': 0}")
    else:
        assert rows["qmd"]["note"].startswith("skipped: qmd not found")
        assert rows["bridge-qmd"]["note"].startswith("skipped: qmd not found")
    assert list((tmp_path / "tmp").iterdir()) == []


def test_markdown_table_and_bad_arguments(tmp_path: Path) -> None:
    data = write_locomo(tmp_path / "data")
    p = bench(str(data), "--systems", "fts5,keyword", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0] == "LoCoMo: 1 conversations, 5 questions, maxResults 10"
    assert lines[2].startswith("| system | R@1 | R@5 | R@10 | file R@5 | snippet R@5 | lines/hit |")
    assert lines[4].startswith("| SQLite FTS5 floor") and "| 0.714 | 0.714 | 0.714 | 0.714 | 0.714 | 4.0 |" in lines[4]
    assert lines[5].startswith("| qmdbridge builtin, keyword-only") and len(lines) == 6
    bad = bench(str(data), "--systems", "bm42", tmp_path=tmp_path)
    assert bad.returncode == 2 and "unknown system bm42" in bad.stderr
    missing = bench(str(tmp_path / "missing"), tmp_path=tmp_path)
    assert missing.returncode == 2 and "LoCoMo path does not exist" in missing.stderr
