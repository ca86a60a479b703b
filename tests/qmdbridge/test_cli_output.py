"""The CLI's JSON writers: the fast paths' standard-library writer prints exactly what the orjson
writer prints, on any document of plain JSON values."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from qmdbridge.cli.common import _floats_print_alike, emit_json, emit_plain_json

STRINGS = ["", "plain", "東京チーム", "emoji 👨\u200d👩\u200d👧", "tab\tnew\nline", 'quote " back \\ slash',
           "\x00\x1f\x7f", "line sep \u2028 para \u2029", "café"]
FLOATS = [0.0, -0.0, 1.0, 0.35, 0.5417501291266662, 1e-4, 9.9999e-5, 1.2e-7, 3.4e-05, 1e16, 9.99e15,
          -0.123, 1e300, 5e-324, math.nan, math.inf, -math.inf]


def _doc(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice(STRINGS)
    if kind == 1:
        return rng.choice(FLOATS) if rng.random() < 0.5 else rng.random() ** rng.choice([1, 3, 9, 30])
    if kind == 2:
        return rng.choice([0, 1, -7, 2**31 - 1, 2**53])
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind == 5:
        return [_doc(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(STRINGS) + str(i): _doc(rng, depth + 1) for i in range(rng.randrange(4))}


def test_the_plain_writer_prints_what_the_orjson_writer_prints(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    rng = random.Random(11)
    plain_used = 0
    for _ in range(3000):
        doc = {"results": [_doc(rng) for _ in range(rng.randrange(5))], "score": _doc(rng)}
        emit_json(doc)
        want = capsysbinary.readouterr().out
        emit_plain_json(doc)
        assert capsysbinary.readouterr().out == want, doc
        plain_used += _floats_print_alike(doc)
    assert 1000 < plain_used < 3000  # both ways were taken
    for doc in ({"empty": {}, "none": [], "t": (0.5, 1e-9)}, {"t": (0.5, 0.25)}, {"n": [math.nan]}):
        emit_json(doc)
        want = capsysbinary.readouterr().out
        emit_plain_json(doc)
        assert capsysbinary.readouterr().out == want
    assert _floats_print_alike({"t": (0.5, 0.25)}) and not _floats_print_alike({"t": (0.5, 1e-9)})


@pytest.mark.parametrize(("reason", "note"), [
    ("qmd unavailable: qmd timed out after 4000ms (memory.qmd.limits.timeoutMs)",
     "note: answered by builtin (qmd unavailable: qmd timed out after 4000ms (memory.qmd.limits.timeoutMs))\n"),
    ("circuit breaker open", "note: answered by builtin (qmd unavailable: circuit breaker open)\n"),
])
def test_the_fallback_note_says_qmd_unavailable_once(capsys: pytest.CaptureFixture[str], reason: str,
                                                     note: str) -> None:
    from qmdbridge.cli.render import print_search_doc

    print_search_doc({"backend": "builtin", "mode": "fts-only", "results": [], "warnings": [],
                      "fallback": {"from": "qmd", "reason": reason}}, keyword_notice=False)
    assert capsys.readouterr().err == note


def test_the_parsers_choices_are_their_owners_values() -> None:
    """The parser stays standard library only (a served search loads no owner), so its choices
    are written out: they must be the owners' values, in the owners' order."""
    import argparse
    from typing import get_args

    from qmdbridge.cli.main import build_parser
    from qmdbridge.config import QmdConfig
    from qmdbridge.evaluation.runner import EvalBackend
    from qmdbridge.manager import BackendName
    from qmdbridge.policy.corpus import GET_CORPORA, SEARCH_CORPORA

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    choices = {(name, flag): tuple(action.choices) for name, command in sub.choices.items()
               for action in command._actions if action.choices for flag in action.option_strings}
    assert choices[("search", "--corpus")] == SEARCH_CORPORA and choices[("get", "--corpus")] == GET_CORPORA
    assert choices[("eval", "--qmd-search-mode")] == get_args(QmdConfig.model_fields["search_mode"].annotation)
    assert {v for (_, flag), v in choices.items() if flag == "--backend"} == {get_args(EvalBackend)}
    assert set(get_args(EvalBackend)) == set(get_args(BackendName)) - {"none"}
