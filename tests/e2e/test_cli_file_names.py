"""File names that are not valid UTF-8 (``caf\\xe9.md`` written by another system) through the
``qmdbridge`` command (in this process; ``serve``, which reads stdin to its end, as a real
process): ``index``, ``search``, ``status``, ``get`` and ``serve`` keep working, the file is
indexed under its printable path and ``get`` opens it by that path."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import run_cli
from tests.e2e.cli_proc import run_cli_in_process as run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "workspace"
LATIN1_NAME = b"caf\xe9.md"  # "café.md" as Latin-1 bytes: not UTF-8
SHOWN = "memory/caf\\xe9.md"  # its printable path (fallback/text/path_names.py)
NOTE = "file name is not valid UTF-8 (path shown with \\xHH escapes)"


def _write_latin1_note(ws: Path) -> None:
    with open(os.path.join(os.fsencode(ws / "memory"), LATIN1_NAME), "wb") as fh:
        fh.write(b"# Espresso\nThe grinder setting for espresso is 7.\n")


def test_index_search_status_get_with_a_latin1_file_name(ws: Path, env: dict[str, str]) -> None:
    _write_latin1_note(ws)
    indexed = run(["index", "--workspace", str(ws), "--json"], env)
    assert indexed.returncode == 0, indexed.stderr
    assert b"Traceback" not in indexed.stderr
    assert orjson.loads(indexed.stdout)["ok"] is True
    found = run(["search", "espresso grinder", "--workspace", str(ws), "--json"], env)
    assert found.returncode == 0, found.stderr
    hits = orjson.loads(found.stdout)["results"]
    assert [(h["path"], h["startLine"], h["endLine"]) for h in hits] == [(SHOWN, 1, 2)]
    assert hits[0]["citation"] == f"{SHOWN}#L1-L2"
    # one odd name stops nothing: every file of the example workspace is indexed too
    other = run(["search", "router dropped the WAN link", "--workspace", str(ws), "--json"], env)
    assert orjson.loads(other.stdout)["results"][0]["path"] == "memory/2026-11-05.md"
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert status["files"] == 16 and status["dirty"] is False
    assert [(s["path"], s["reason"]) for s in status["skipped"]] == [(SHOWN, NOTE)]
    page = run(["get", SHOWN, "--workspace", str(ws), "--json"], env)
    assert page.returncode == 0, page.stderr
    doc = orjson.loads(page.stdout)
    assert (doc["path"], doc["text"], doc["missing"]) == (
        SHOWN, "# Espresso\nThe grinder setting for espresso is 7.", False)


def test_a_latin1_name_that_appears_after_a_good_index(ws: Path, env: dict[str, str]) -> None:
    first = run(["index", "--workspace", str(ws), "--json"], env)
    assert first.returncode == 0, first.stderr
    _write_latin1_note(ws)
    found = run(["search", "espresso grinder", "--workspace", str(ws), "--json"], env)
    assert found.returncode == 0, found.stderr
    assert [h["path"] for h in orjson.loads(found.stdout)["results"]] == [SHOWN]
    status = run(["status", "--workspace", str(ws), "--json"], env)
    assert status.returncode == 0, status.stderr
    assert orjson.loads(status.stdout)["files"] == 16


@pytest.mark.slow
def test_serve_answers_with_a_latin1_file_name(ws: Path, env: dict[str, str]) -> None:
    _write_latin1_note(ws)
    get = orjson.dumps({"id": 2, "tool": "memory_get", "params": {"path": SHOWN}})
    lines = [b'{"id": 1, "tool": "memory_search", "params": {"query": "espresso grinder"}}', get,
             b'{"id": 3, "tool": "memory_search", "params": {"query": "Atlas rollback"}}']
    p = run_cli(["serve", "--workspace", str(ws)], env, stdin=b"\n".join(lines) + b"\n")
    assert p.returncode == 0, p.stderr
    replies = {r["id"]: r["result"] for r in map(orjson.loads, p.stdout.splitlines())}
    assert replies[1].get("disabled") is None
    assert [h["path"] for h in replies[1]["results"]] == [SHOWN]
    assert replies[2]["text"] == "# Espresso\nThe grinder setting for espresso is 7."
    assert replies[3]["results"][0]["path"].startswith("memory/2026-11-")


def test_a_note_whose_name_holds_a_percent_escape_is_read_where_search_cites_it(
        ws: Path, env: dict[str, str]) -> None:
    """``20%Deal.md`` holds ``%De``, which reads like a URL escape: the name is taken literally
    (never decoded), so the note search cites is the note ``get`` reads; an escape that names no
    file is still refused as ``encoded characters``."""
    (ws / "memory" / "20%Deal.md").write_text("# Deal\nThe blackfriday deal is 20 percent off.\n")
    found = run(["search", "blackfriday deal", "--workspace", str(ws), "--json"], env)
    assert found.returncode == 0, found.stderr
    hits = orjson.loads(found.stdout)["results"]
    assert [(h["path"], h["startLine"], h["endLine"]) for h in hits] == [("memory/20%Deal.md", 1, 2)]
    page = run(["get", "memory/20%Deal.md", "--workspace", str(ws), "--json"], env)
    assert page.returncode == 0, page.stderr
    assert orjson.loads(page.stdout)["text"] == "# Deal\nThe blackfriday deal is 20 percent off."
    for encoded in ("memory/%2e%2e/MEMORY.md", "memory%2f2026-11-05.md", "memory/20%44eal.md"):
        refused = run(["get", encoded, "--workspace", str(ws), "--json"], env)
        assert (refused.returncode, orjson.loads(refused.stdout)["error"]) == (
            3, f"path refused: {encoded!r}: encoded characters")


def test_a_name_with_a_control_character_is_noted_as_such_not_as_invalid_utf8(ws: Path, env: dict[str, str]) -> None:
    """A valid UTF-8 name holding a newline is shown with escapes too, and its caveat says why
    (a control character), not that the name is not UTF-8."""
    (ws / "memory" / "two\nlines.md").write_text("# Kiln\nThe kiln reaches cone 6.\n")
    assert run(["index", "--workspace", str(ws), "--json"], env).returncode == 0
    status = orjson.loads(run(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert [(s["path"], s["reason"]) for s in status["skipped"]] == [
        ("memory/two\\x0alines.md", "file name holds a control character or backslash (path shown with "
                                    "\\xHH escapes)")]
    assert status["dirty"] is False
    doctor = run(["doctor", "--workspace", str(ws)], env)
    assert doctor.returncode == 0, doctor.stdout
