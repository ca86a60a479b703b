"""Every route that answers ``qmdbridge search`` gives the in-process answer, over generated
workspaces, configs and store states.

Each case is drawn from a seeded generator: notes of words from a small vocabulary (so queries
hit several of them), a config with random keyword-only settings (citations, maxResults,
minScore, candidateMultiplier, chunking, extraPaths, sync.onSearch, temporal decay, sessions),
and a store state after the first search recorded its settings (unchanged, a note changed, a
note added, a binary note, a note the sync cannot read, the workspace gone). Each query is
answered by the command as a user runs it (daemon off, recorded settings on: the read-only
route whenever it may answer) and by the in-process engine (``QMDBRIDGE_CLI_CACHE=off``); stdout,
stderr and the exit code must be the same, warnings included. The CLI runs in this process
(``qmdbridge.cli.main.main``): process start-up is not the subject here (``test_cli_fast_search.py``
runs what a fresh process loads, and a store another user cannot write, as real processes).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

import qmdbridge.cli.fast_search as fast_search
from qmdbridge.cli.main import main

PAST_NS = 1_600_000_000_000_000_000  # well before any sync: no note is racily clean
WORDS = ("router", "firmware", "kestrel", "backup", "wan", "link", "dns", "alpha", "rollout",
         "quokka", "lte", "modem", "vlan", "printer", "東京", "garden", "heron", "feeder")
STATES = ("unchanged", "changed", "added", "binary", "folder", "gone")
CASES = 18


def _note(rng: random.Random, lines: int) -> str:
    body = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(lines)]
    return "# Notes\n\n" + "\n".join(f"- {line}" for line in body) + "\n"


def _workspace(rng: random.Random, root: Path) -> Path:
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text(_note(rng, rng.randint(3, 12)))
    for day in rng.sample(range(1, 28), rng.randint(2, 7)):
        (ws / "memory" / f"2026-11-{day:02d}.md").write_text(_note(rng, rng.randint(2, 40)))
    extra = root / "notes"
    extra.mkdir()
    (extra / "wan.md").write_text(_note(rng, 5))
    return ws


def _config(rng: random.Random) -> dict[str, Any]:
    search: dict[str, Any] = {
        "provider": rng.choice(["none", "auto"]),
        "query": {"maxResults": rng.randint(1, 8), "minScore": rng.choice([0.0, 0.2, 0.35, 0.6]),
                  "hybrid": {"candidateMultiplier": rng.choice([1, 2, 4, 6])}},
        "chunking": {"tokens": rng.choice([40, 100, 400]), "overlap": rng.choice([0, 10])},
        "sync": {"onSearch": rng.random() < 0.8},
    }
    if rng.random() < 0.5:
        search["extraPaths"] = ["../notes"]
    if rng.random() < 0.3:
        search["query"]["hybrid"]["temporalDecay"] = {"enabled": True, "halfLifeDays": 30}
    if rng.random() < 0.2:
        search["sources"] = ["memory", "sessions"]
        search["experimental"] = {"sessionMemory": True}
    return {"memory": {"citations": rng.choice(["auto", "on", "off"])},
            "agents": {"defaults": {"memorySearch": search}}}


def _backdate(root: Path) -> None:
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            os.utime(f, ns=(PAST_NS, PAST_NS))


def _change(state: str, rng: random.Random, ws: Path) -> None:
    notes = sorted((ws / "memory").glob("*.md"))
    if state == "changed":
        notes[0].write_text(notes[0].read_text() + f"- {rng.choice(WORDS)} replaced\n")
    elif state == "added":
        (ws / "memory" / "2026-12-01.md").write_text(_note(rng, 4))
    elif state == "binary":
        (ws / "memory" / "scan.md").write_bytes(b"\x00\x01\x02 router dump\n")
    elif state == "folder":
        (ws / "memory" / "loop.md").mkdir()  # a folder named like a note
    elif state == "gone":
        shutil.rmtree(ws)
        return
    _backdate(ws)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _same(routed: tuple[int, str, str], engine: tuple[int, str, str], *, decay: bool) -> None:
    assert routed[0] == engine[0] and routed[2] == engine[2]
    if not decay or routed[0] != 0:
        assert routed[1] == engine[1]
        return
    # temporal decay reads the clock, which moves between two runs: scores may differ by 1e-4
    a, b = orjson.loads(routed[1]), orjson.loads(engine[1])
    assert [r["score"] for r in a["results"]] == pytest.approx([r["score"] for r in b["results"]], abs=1e-4)
    assert ({**a, "results": [{**r, "score": None} for r in a["results"]]}
            == {**b, "results": [{**r, "score": None} for r in b["results"]]})


@pytest.mark.parametrize("seed", range(CASES))
def test_every_route_gives_the_in_process_answer(seed: int, tmp_path: Path, env: dict[str, str],
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    ws = _workspace(rng, tmp_path)
    state_dir = Path(env["OPENCLAW_STATE_DIR"])
    state_dir.mkdir()
    config = _config(rng)
    (state_dir / "openclaw.json").write_text(json.dumps(config))
    _backdate(tmp_path)
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in {**env, "QMDBRIDGE_DAEMON": "off"}.items():
        monkeypatch.setenv(key, value)
    fast_answers: list[int | None] = []
    answer = fast_search.answer_recorded

    def counted(*a: Any, **k: Any) -> int | None:
        fast_answers.append(answer(*a, **k))
        return fast_answers[-1]

    monkeypatch.setattr(fast_search, "answer_recorded", counted)
    queries = [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(3)]
    state = STATES[seed % len(STATES)]
    decay = "temporalDecay" in config["agents"]["defaults"]["memorySearch"]["query"]["hybrid"]
    for n, query in enumerate(queries):
        text = n == 1 and not decay  # the plain output prints decayed scores rounded: JSON then
        argv = ["search", query, "--workspace", str(ws), *([] if text else ["--json"])]
        first = _run(argv, capsys)  # indexes the workspace, records this command line's settings
        assert first[0] == (2 if state == "gone" and n else 0), first[2]
        if n == 0:
            _change(state, rng, ws)
        monkeypatch.setenv("QMDBRIDGE_CLI_CACHE", "off")
        engine = _run(argv, capsys)
        monkeypatch.delenv("QMDBRIDGE_CLI_CACHE")
        routed = _run(argv, capsys)
        _same(routed, engine, decay=decay)
    plain_keyword = (config["agents"]["defaults"]["memorySearch"]["provider"] == "none"
                     and "sources" not in config["agents"]["defaults"]["memorySearch"])
    if plain_keyword and state != "gone":  # the read-only route answered (else it was declined)
        assert any(code == 0 for code in fast_answers), fast_answers
