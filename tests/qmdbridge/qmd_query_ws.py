"""A workspace where the real qmd's ``query`` needs no GGUF model (helpers, not collected).

qmd's ``query`` expands the query with a 1.7 GB model and embeds it unless BM25 gives a strong
signal (top hit >= 0.85 and 0.15 ahead of the next) and nothing is embedded or reranked. Every
query of :data:`QUERIES` has such a hit in each collection of :func:`make_workspace`; search with
``rerank: false`` and the environment of :func:`model_free_env`, whose ``QMD_*_MODEL`` name files
that do not exist: qmd never needs them, and would fail at once instead of downloading.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

# Every query has a strong BM25 hit in both collections.
QUERIES = ("zanzibar ferry", "spice zanzibar")
_WORDS = ("router wan link dropped cats garden tomato budget meeting dentist flight coffee laptop "
          "battery backup server disk printer invoice salary rent train bike project deadline").split()


def make_workspace(root: Path) -> Path:
    """``root/ws``: ``MEMORY.md``, 40 filler notes, a short note and a long note (several qmd
    chunks, the match on line 91) that mention the queries' words."""
    rnd = random.Random(11)
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Zanzibar\n\n## Travel\n- The zanzibar ferry leaves Dar es Salaam "
                                  "at 07:00.\n- Spice tour booked.\n")
    for i in range(40):
        lines = [f"# Day {i}", ""] + [" ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(5, 12))) + "."
                                      for _ in range(rnd.randint(4, 20))]
        (ws / "memory" / f"2026-02-{i:02d}.md").write_text("\n".join(lines) + "\n")
    (ws / "memory" / "2026-03-01.md").write_text(
        "# Zanzibar trip\n\nZanzibar: ferry tickets, spice tour, Stone Town walk.\n")
    long = ["# Long log", ""] + [" ".join(rnd.choice(_WORDS) for _ in range(12)) + "." for _ in range(120)]
    long.insert(90, "Checked the zanzibar ferry timetable again.")
    (ws / "memory" / "2026-03-02.md").write_text("\n".join(long) + "\n")
    return ws


def model_free_env(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) without ``CI``, ``HOME`` under ``root`` and
    ``QMD_EMBED_MODEL`` / ``QMD_GENERATE_MODEL`` / ``QMD_RERANK_MODEL`` naming absent files."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != "CI"}
    env.setdefault("HOME", str(root / "home"))
    env.update(QMD_EMBED_MODEL=str(root / "absent-embed.gguf"),
               QMD_GENERATE_MODEL=str(root / "absent-generate.gguf"),
               QMD_RERANK_MODEL=str(root / "absent-rerank.gguf"))
    return env
