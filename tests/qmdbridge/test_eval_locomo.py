"""LoCoMo -> workspace conversion (``qmdbridge.evaluation.locomo``) on a made-up conversation."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from fallback.errors import UsageError
from qmdbridge.evaluation.locomo import (
    convert_sample,
    load_locomo,
    locomo_files,
    parse_session_date,
    write_workspace,
)
from qmdbridge.evaluation.metrics import EvalQuestion, Evidence
from tests.qmdbridge.eval_synthetic import locomo_sample, write_locomo


def test_session_dates() -> None:
    assert parse_session_date("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert parse_session_date("10:37 am on 27 June, 2023") == date(2023, 6, 27)
    assert parse_session_date("12:09 am on 13 Sept 2023") == date(2023, 9, 13)
    assert parse_session_date("on 4 Jan., 2024") == date(2024, 1, 4)
    with pytest.raises(ValueError, match="no '<day> <month> <year>' date in 'yesterday'"):
        parse_session_date("yesterday")
    with pytest.raises(ValueError):
        parse_session_date("3:00 pm on 31 June, 2023")
    with pytest.raises(ValueError):
        parse_session_date("3:00 pm on 3 Ma, 2023")  # too short to name a month


def test_files_follow_the_conversion_rules() -> None:
    conv = convert_sample(locomo_sample(), name="conv-syn", source="syn.json")
    assert conv.name == "conv-syn"
    assert list(conv.files) == ["memory/2024-03-03.md", "memory/2024-03-03-2.md", "memory/2024-04-12.md"]
    assert conv.files["memory/2024-03-03.md"] == (
        "# Conversation on 2:05 pm on 3 March, 2024\n"
        "\n"
        "Ines: I adopted a beagle called Quillon from the harbour shelter.\n"
        "Tomas: Bring Quillon to the orchard picnic!\n")
    assert conv.files["memory/2024-03-03-2.md"].splitlines()[2] == (
        "Tomas: My trombone recital is at Vellmar hall.  Come along! "
        "[shares a photo: a photo of a brass trombone]")
    assert conv.files["memory/2024-04-12.md"].splitlines()[2] == (
        "Ines: The glassblowing class in Porvenza was tiring. I made a zaffre vase.")


def test_turns_map_to_file_line_and_snippet_text() -> None:
    conv = convert_sample(locomo_sample(), name="conv-syn")
    assert conv.turns["D1:2"] == Evidence("memory/2024-03-03.md", 4, "Bring Quillon to the orchard picnic!", "D1:2")
    # first 60 characters after "<speaker>: ", whitespace collapsed (the caption counts)
    assert conv.turns["D2:1"] == Evidence("memory/2024-03-03-2.md", 3,
                                          "My trombone recital is at Vellmar hall. Come along! [shares ", "D2:1")
    assert len(conv.turns["D2:1"].text or "") == 60
    assert conv.turns["D4:1"].line == 3 and conv.turns["D4:2"].line == 4


def test_questions_keep_categories_1_to_4_with_known_evidence() -> None:
    conv = convert_sample(locomo_sample(), name="conv-syn")
    t = conv.turns
    assert conv.questions == (
        EvalQuestion("Quillon beagle harbour shelter", (t["D1:1"],), "single-hop", "qa[0]"),
        EvalQuestion("trombone recital Vellmar", (t["D2:1"],), "temporal", "qa[1]"),
        EvalQuestion("zaffre vase", (t["D4:1"], t["D4:2"]), "multi-hop", "qa[2]"),
        EvalQuestion("saxophone lessons", (t["D2:2"],), "open-domain", "qa[3]"),
        EvalQuestion("Marisol cousin", (t["D2:2"], t["D1:2"]), "single-hop", "qa[6]"),
    )


def test_release_shape_and_lists_of_samples(tmp_path: Path) -> None:
    sample = locomo_sample()
    qa = sample.pop("qa")
    release = [{"sample_id": "conv-a", "conversation": sample, "qa": qa},
               {"sample_id": "conv-b", "conversation": sample, "qa": qa[:1]}]
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(release), encoding="utf-8")
    convs = load_locomo(path)
    assert [c.name for c in convs] == ["conv-a", "conv-b"]
    assert [len(c.questions) for c in convs] == [5, 1]
    assert convs[0].files == convert_sample(locomo_sample(), name="x").files
    assert convs[1].source == str(path)


@pytest.mark.parametrize(("change", "message"), [
    ({"session_2": "not a list"}, "syn.json (conv-syn): session_2 must be a list of turns"),
    ({"session_1_date_time": "someday"}, "session_1_date_time: no '<day> <month> <year>' date in 'someday'"),
    ({"session_4_date_time": None}, "session_4 has turns but no session_4_date_time"),
    ({"session_1": [{"dia_id": "D1:1", "text": "hi"}]}, "session_1[0]: turn D1:1 has no 'speaker'"),
    ({"session_1": [{"speaker": "Ines", "text": "hi"}]}, "session_1[0]: turn without a 'dia_id'"),
    ({"session_1": [{"speaker": "Ines", "dia_id": "D1:1", "text": 5}]}, "turn D1:1: 'text' must be a string"),
    ({"qa": {"question": "x"}}, "'qa' must be a list of questions"),
    ({"qa": [{"question": " ", "evidence": ["D1:1"], "category": 1}]}, "qa[0] has no 'question' text"),
])
def test_malformed_samples_are_named(change: dict, message: str) -> None:
    sample = {**locomo_sample(), **change}
    with pytest.raises(UsageError) as info:
        convert_sample(sample, name="conv-syn", source="syn.json")
    assert message in str(info.value)


def test_a_repeated_dialogue_id_is_refused() -> None:
    sample = locomo_sample()
    sample["session_4"][1]["dia_id"] = "D1:1"
    with pytest.raises(UsageError, match="session_4\\[1\\]: dialogue id D1:1 appears twice"):
        convert_sample(sample, name="conv-syn")


def test_files_and_folders(tmp_path: Path) -> None:
    one = write_locomo(tmp_path / "data", "b.json")
    two = write_locomo(tmp_path / "data", "a.json")
    (tmp_path / "data" / "notes.txt").write_text("not json", encoding="utf-8")
    assert locomo_files(tmp_path / "data") == [two, one]
    assert locomo_files(one) == [one]
    with pytest.raises(UsageError, match="LoCoMo path does not exist: .*missing"):
        locomo_files(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no \\*.json LoCoMo file in"):
        locomo_files(tmp_path / "empty")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(UsageError, match="bad.json: not valid JSON"):
        load_locomo(bad)
    bad.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(UsageError, match="a LoCoMo sample must be a JSON object"):
        load_locomo(bad)


def test_write_workspace_writes_exact_bytes_and_never_overwrites(tmp_path: Path) -> None:
    conv = convert_sample(locomo_sample(), name="conv-syn")
    ws = write_workspace(conv, tmp_path / "ws")
    written = sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file())
    assert written == sorted(conv.files)
    for rel, text in conv.files.items():
        assert (ws / rel).read_bytes() == text.encode("utf-8")
    assert not (ws / "MEMORY.md").exists()
    (ws / "memory" / "2024-03-03.md").write_text("mine", encoding="utf-8")
    with pytest.raises(UsageError, match="refusing to overwrite .*2024-03-03.md"):
        write_workspace(conv, ws)
    assert (ws / "memory" / "2024-03-03.md").read_text(encoding="utf-8") == "mine"
