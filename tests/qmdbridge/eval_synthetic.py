"""A tiny made-up LoCoMo-shaped conversation and a tiny JSONL query set, with their hand-checked
outcomes (the eval tests share them; no real LoCoMo data is ever used in tests).

The conversation, as the conversion must write it::

    memory/2024-03-03.md    (session 1, 2:05 pm on 3 March 2024)
      1 # Conversation on 2:05 pm on 3 March, 2024
      2
      3 Ines: I adopted a beagle called Quillon from the harbour shelter.       D1:1
      4 Tomas: Bring Quillon to the orchard picnic!                             D1:2
    memory/2024-03-03-2.md  (session 2, same day: suffix -2)
      3 Tomas: My trombone recital is at Vellmar hall.  Come along! [shares a photo: a photo of a brass trombone]   D2:1
      4 Ines: I will bring my cousin Marisol.                                   D2:2
    (session 3 has no turns: no file)
    memory/2024-04-12.md    (session 4; the first turn's newline becomes a space)
      3 Ines: The glassblowing class in Porvenza was tiring. I made a zaffre vase.   D4:1
      4 Tomas: Show me the zaffre vase sometime.                               D4:2

Every question's words occur in exactly one file, so the keyword search returns that file's one
chunk (lines 1-4) alone, whatever the ranking details:

    qa[0] single-hop  "Quillon beagle harbour shelter"   D1:1          -> found
    qa[1] temporal    "trombone recital Vellmar"         D2:1          -> found (snippet: collapsed spaces)
    qa[2] multi-hop   "zaffre vase"                      D4:1, D4:2    -> both found (one "D4:1; D4:2" string, D9:9 dropped)
    qa[3] open-domain "saxophone lessons"                D2:2          -> no hit at all
    qa[4] adversarial (category 5)                                     -> left out
    qa[5] single-hop  evidence D7:1 only (no such turn)                -> dropped
    qa[6] single-hop  "Marisol cousin"                   D2:2, D1:2    -> D2:2 found, D1:2's file never returned

So 5 questions, 7 evidence turns, 5 found at rank 1: R@k = file R@k = snippet R@5 = 5/7; four hits
of 4 lines each: lines/hit 4.0; R@5 per category: multi-hop 1.0 (2 turns), temporal 1.0 (1),
open-domain 0.0 (1), single-hop 2/3 (3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LOCOMO_R = 5 / 7
LOCOMO_CATEGORIES = {
    "multi-hop": {"questions": 1, "evidence": 2, "recallAt5": 1.0},
    "temporal": {"questions": 1, "evidence": 1, "recallAt5": 1.0},
    "open-domain": {"questions": 1, "evidence": 1, "recallAt5": 0.0},
    "single-hop": {"questions": 2, "evidence": 3, "recallAt5": 2 / 3},
}


def locomo_sample() -> dict[str, Any]:
    """The made-up conversation in LoCoMo's flat shape (sessions and ``qa`` at the top level)."""
    return {
        "speaker_a": "Ines",
        "speaker_b": "Tomas",
        "session_1_date_time": "2:05 pm on 3 March, 2024",
        "session_1": [
            {"speaker": "Ines", "dia_id": "D1:1",
             "text": "I adopted a beagle called Quillon from the harbour shelter."},
            {"speaker": "Tomas", "dia_id": "D1:2", "text": "Bring Quillon to the orchard picnic!"},
        ],
        "session_2_date_time": "9:40 am on 3 March, 2024",
        "session_2": [
            {"speaker": "Tomas", "dia_id": "D2:1", "text": "My trombone recital is at Vellmar hall.  Come along!",
             "img_url": ["https://example.invalid/trombone.jpg"],
             "blip_caption": "a photo of a brass trombone"},
            {"speaker": "Ines", "dia_id": "D2:2", "text": "I will bring my cousin Marisol."},
        ],
        "session_3_date_time": "1:00 pm on 20 March, 2024",
        "session_3": [],
        "session_4_date_time": "7:15 pm on 12 April, 2024",
        "session_4": [
            {"speaker": "Ines", "dia_id": "D4:1",
             "text": "The glassblowing class in Porvenza was tiring.\nI made a zaffre vase.\n"},
            {"speaker": "Tomas", "dia_id": "D4:2", "text": "Show me the zaffre vase sometime."},
        ],
        "session_5_date_time": "8:00 am on 1 May, 2024",
        "qa": [
            {"question": "Quillon beagle harbour shelter", "answer": "Quillon", "evidence": ["D1:1"],
             "category": 4},
            {"question": "trombone recital Vellmar", "answer": "next Friday", "evidence": ["D2:1"],
             "category": 2},
            {"question": "zaffre vase", "answer": "glassblowing", "evidence": ["D4:1; D4:2", "D9:9"],
             "category": 1},
            {"question": "saxophone lessons", "answer": "none", "evidence": ["D2:2"], "category": 3},
            {"question": "Quillon the poodle?", "evidence": ["D1:1"], "category": 5,
             "adversarial_answer": "no"},
            {"question": "orphan question", "answer": "-", "evidence": ["D7:1"], "category": 4},
            {"question": "Marisol cousin", "answer": "Marisol", "evidence": ["D2:2", "D1:2"], "category": 4},
        ],
    }


def write_locomo(folder: Path, name: str = "conv-syn.json") -> Path:
    """Write the made-up conversation as ``folder/name``; returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(locomo_sample()), encoding="utf-8")
    return path


QUERY_LINES = [
    {"query": "zucchini netting", "path": "memory/projects.md", "line": 2,
     "text": "zucchini bed needs netting", "category": "garden"},
    {"query": "zucchini netting", "path": "memory/projects.md", "line": 5, "category": "garden"},
    {"query": "lantern oil", "path": "memory/2024-05-01.md", "text": "Bought  lantern\noil"},
    {"query": "bicycle chain", "path": "memory/projects.md", "line": 5, "text": "The chain was oiled"},
]
"""The JSONL set over :func:`write_query_workspace`. ``projects.md`` has two sections, so two chunks
(lines 1-3 and 4-5); ``2024-05-01.md`` is one chunk (lines 1-2). Outcomes:

1. "zucchini netting", line 2: the hit 1-3 holds it; its snippet holds the text.
2. "zucchini netting", line 5: the only hit (1-3) names the file but does not hold line 5.
3. "lantern oil", no line: the file is enough; the text matches once whitespace is collapsed.
4. "bicycle chain", line 5: the hit 4-5 holds it; the text is in no snippet.

R@k 3/4, file R@k 1.0, snippet R@5 2/3 (3 lines have a text), lines/hit (3+3+2+2)/4 = 2.5,
category garden: 2 questions, R@5 0.5.
"""


def write_query_workspace(root: Path) -> tuple[Path, Path]:
    """Write the workspace and ``queries.jsonl`` (with a blank line) under ``root``; returns both."""
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "projects.md").write_text(
        "# Garden\nThe zucchini bed needs netting.\n\n# Garage\nThe bicycle chain was replaced.\n",
        encoding="utf-8")
    (ws / "memory" / "2024-05-01.md").write_text("# Errands\nBought lantern oil at the hardware store.\n",
                                                 encoding="utf-8")
    queries = root / "queries.jsonl"
    lines = [json.dumps(q) for q in QUERY_LINES]
    queries.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n", encoding="utf-8")
    return ws, queries
