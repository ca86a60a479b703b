"""LoCoMo conversations -> memory workspaces and labelled questions (the benchmark's fixed conversion).

As ``bench/locomo-dev``'s README fixes it, so figures compare: one daily note per session with
turns, ``memory/YYYY-MM-DD.md`` from ``session_N_date_time`` (``-2``, ``-3`` ... for a second
session that day), holding ``# Conversation on <date_time>``, an empty line, then one
``<speaker>: <text>`` line per turn (newlines as spaces; `` [shares a photo: <blip_caption>]``
appended); a turn's ``dia_id`` maps to that file and 1-based line, its snippet text to the first
60 characters after the speaker, whitespace collapsed. Questions: ``qa`` entries of categories
1-4 (5, adversarial, is left out), evidence ids the ``D<n>:<n>`` in each ``evidence`` string
that name a turn; a question left without evidence is dropped. No ``MEMORY.md`` is written.

Source: Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents"
(ACL 2024, snap-research/locomo).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from fallback.errors import UsageError
from qmdbridge.evaluation.metrics import EvalQuestion, Evidence, collapse_whitespace

__all__ = [
    "CATEGORY_NAMES",
    "LocomoConversation",
    "SNIPPET_CHARS",
    "convert_sample",
    "load_locomo",
    "locomo_files",
    "parse_session_date",
    "write_workspace",
]

# LoCoMo's question categories kept by the benchmark (5, adversarial, has no answer to find).
CATEGORY_NAMES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# Snippet recall looks for this many leading characters of an evidence turn (after the speaker).
SNIPPET_CHARS = 60

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_DATE_RE = re.compile(r"\b(\d{1,2})\s+([A-Za-z]+)\.?,?\s+(\d{4})\b")
_SESSION_RE = re.compile(r"session_(\d+)")
_EVIDENCE_RE = re.compile(r"D\d+:\d+")
_NEWLINES_RE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class LocomoConversation:
    """One converted conversation: its ``sample_id`` (else the file's stem, ``#i`` added for the
    i-th of several), the file it was read from, workspace-relative path -> file text in session
    order, ``dia_id`` -> its :class:`Evidence`, and the kept questions in ``qa`` order."""

    name: str
    source: str
    files: dict[str, str]
    turns: dict[str, Evidence]
    questions: tuple[EvalQuestion, ...]


def parse_session_date(text: str) -> date:
    """The date of a ``session_N_date_time`` (``"1:56 pm on 8 May, 2023"``): ``<day>
    <month name or abbreviation>[,] <year>`` anywhere in the text.

    Raises:
        ValueError: no such date in ``text``, or it does not exist (``31 June``).
    """
    m = _DATE_RE.search(text)
    if m:
        word = m.group(2).lower()
        month = next((i for i, name in enumerate(_MONTHS, start=1)
                      if word == name or (len(word) >= 3 and name.startswith(word))), None)
        if month is not None:
            return date(int(m.group(3)), month, int(m.group(1)))
    raise ValueError(f"no '<day> <month> <year>' date in {text!r}")


def _one_line(value: str) -> str:
    return _NEWLINES_RE.sub(" ", value).strip()


def _turn_line(turn: Any, *, where: str) -> tuple[str, str, str]:
    """``(dia_id, speaker, line text after '<speaker>: ')`` of one turn."""
    if not isinstance(turn, Mapping):
        raise UsageError(f"{where}: a turn must be an object")
    dia_id, speaker, text = turn.get("dia_id"), turn.get("speaker"), turn.get("text", "")
    if not isinstance(dia_id, str) or not dia_id.strip():
        raise UsageError(f"{where}: turn without a 'dia_id'")
    if not isinstance(speaker, str) or not speaker.strip():
        raise UsageError(f"{where}: turn {dia_id} has no 'speaker'")
    if not isinstance(text, str):
        raise UsageError(f"{where}: turn {dia_id}: 'text' must be a string")
    body = _one_line(text)
    caption = turn.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        body += f" [shares a photo: {_one_line(caption)}]"
    return dia_id.strip(), _one_line(speaker), body


def _questions(qa: Any, turns: Mapping[str, Evidence], *,
               where: str) -> list[EvalQuestion]:
    if not isinstance(qa, list):
        raise UsageError(f"{where}: 'qa' must be a list of questions")
    questions: list[EvalQuestion] = []
    for i, entry in enumerate(qa):
        if not isinstance(entry, Mapping):
            raise UsageError(f"{where}: qa[{i}] must be an object")
        category = entry.get("category")
        if isinstance(category, bool) or category not in CATEGORY_NAMES:
            continue
        query = entry.get("question")
        if not isinstance(query, str) or not query.strip():
            raise UsageError(f"{where}: qa[{i}] has no 'question' text")
        raw = entry.get("evidence") or []
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise UsageError(f"{where}: qa[{i}]: 'evidence' must be a list of strings")
        ids = list(dict.fromkeys(m for item in raw if isinstance(item, str)
                                 for m in _EVIDENCE_RE.findall(item)))
        known = [turns[x] for x in ids if x in turns]
        if not known:
            continue
        questions.append(EvalQuestion(query=query, evidence=tuple(known),
                                      category=CATEGORY_NAMES[category], ref=f"qa[{i}]"))
    return questions


def convert_sample(sample: Mapping[str, Any], *, name: str, source: str = "<memory>") -> LocomoConversation:
    """Convert one LoCoMo sample (rules in the module docstring): ``{"sample_id", "conversation",
    "qa"}`` or a conversation with its ``qa`` at the top level; ``name`` when it has no
    ``sample_id``, ``source`` where it came from.

    Raises:
        UsageError: the sample does not have LoCoMo's shape (the message names file and key).
    """
    where = f"{source} ({name})"
    conversation = sample.get("conversation", sample)
    if not isinstance(conversation, Mapping):
        raise UsageError(f"{where}: 'conversation' must be an object")
    sample_id = sample.get("sample_id")
    if isinstance(sample_id, str) and sample_id.strip():
        name, where = sample_id.strip(), f"{source} ({sample_id.strip()})"
    files: dict[str, str] = {}
    turns: dict[str, Evidence] = {}
    per_day: dict[date, int] = {}
    sessions = sorted(((int(m.group(1)), key, value) for key, value in conversation.items()
                       if (m := _SESSION_RE.fullmatch(key))), key=lambda s: s[0])
    for number, key, session in sessions:
        if not isinstance(session, list):
            raise UsageError(f"{where}: {key} must be a list of turns")
        if not session:
            continue
        stamp = conversation.get(f"session_{number}_date_time")
        if not isinstance(stamp, str):
            raise UsageError(f"{where}: session_{number} has turns but no session_{number}_date_time")
        try:
            day = parse_session_date(stamp)
        except ValueError as exc:
            raise UsageError(f"{where}: session_{number}_date_time: {exc}") from None
        per_day[day] = per_day.get(day, 0) + 1
        suffix = "" if per_day[day] == 1 else f"-{per_day[day]}"
        path = f"memory/{day.isoformat()}{suffix}.md"
        lines = [f"# Conversation on {_one_line(stamp)}", ""]
        for i, turn in enumerate(session):
            dia_id, speaker, body = _turn_line(turn, where=f"{where}: session_{number}[{i}]")
            lines.append(f"{speaker}: {body}")
            if dia_id in turns:
                raise UsageError(f"{where}: session_{number}[{i}]: dialogue id {dia_id} appears twice")
            turns[dia_id] = Evidence(path=path, line=len(lines),
                                     text=collapse_whitespace(body)[:SNIPPET_CHARS], ref=dia_id)
        files[path] = "\n".join(lines) + "\n"
    questions = _questions(sample.get("qa", []), turns, where=where)
    return LocomoConversation(name=name, source=source, files=files, turns=turns,
                              questions=tuple(questions))


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Read one LoCoMo JSON file: a sample, or a list of samples (``locomo10.json``).

    Raises:
        UsageError: the file cannot be read, is not JSON, or a sample has the wrong shape.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read LoCoMo file {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{p}: not valid JSON: {exc}") from None
    samples = data if isinstance(data, list) else [data]
    out = []
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise UsageError(f"{p}: a LoCoMo sample must be a JSON object")
        name = p.stem if len(samples) == 1 else f"{p.stem}#{i}"
        out.append(convert_sample(sample, name=name, source=str(p)))
    return out


def locomo_files(path: str | Path) -> list[Path]:
    """The LoCoMo files to evaluate: ``path`` itself when it is a file, else every ``*.json``
    directly in the folder, sorted by name.

    Raises:
        UsageError: ``path`` does not exist, or the folder holds no ``*.json`` file.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise UsageError(f"LoCoMo path does not exist: {p}")
    files = sorted(f for f in p.glob("*.json") if f.is_file())
    if not files:
        raise UsageError(f"no *.json LoCoMo file in {p}")
    return files


def write_workspace(conversation: LocomoConversation, root: str | Path) -> Path:
    """Write the conversation's daily notes under ``root`` (created); returns ``root``.

    Raises:
        UsageError: ``root`` already holds one of the files (nothing is overwritten).
    """
    base = Path(root)
    for rel, text in conversation.files.items():
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(target, "xb") as fh:
                fh.write(text.encode("utf-8"))
        except FileExistsError:
            raise UsageError(f"refusing to overwrite {target}") from None
    return base
