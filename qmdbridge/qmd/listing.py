"""Reading qmd's ``collection list`` and ``collection show`` output (spec 2.6 step 1): qmd 2.8.3
prints text without paths (they come from ``show``); a build that prints JSON is read too."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["ListedCollection", "parse_collection_list", "parse_collection_show"]

_LIST_HEADER_RE = re.compile(r"^\s*([a-z0-9._-]+)\s+\(qmd://[^)]+\)\s*$", re.IGNORECASE)
_FIELD_RE = re.compile(r"^\s*(pattern|mask|path)\s*:\s*(.*?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ListedCollection:
    """What qmd reported about one existing collection (any field may be unknown)."""

    name: str
    path: str | None = None
    pattern: str | None = None


def parse_collection_list(text: str) -> dict[str, ListedCollection]:
    """Parse ``qmd collection list`` output: JSON (names, or objects with ``name``, ``path``,
    ``pattern``/``mask``) or text blocks (``<name> (qmd://<name>/)`` then ``Pattern:``/``Path:``
    lines); name -> :class:`ListedCollection` in listing order, ``{}`` when unparseable."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            data = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, list):
            return _listed_from_json(data)
    out: dict[str, ListedCollection] = {}
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            out[current["name"]] = ListedCollection(**current)

    for line in text.splitlines():
        if not line.strip():
            close()
            current = None
            continue
        if line.strip().lower().startswith("collections") or line.strip().startswith("No collections"):
            continue
        header = _LIST_HEADER_RE.match(line)
        if header or (":" not in line and not line[:1].isspace() and " " not in line.strip()):
            close()
            current = {"name": header.group(1) if header else line.strip()}
            continue
        fieldm = _FIELD_RE.match(line)
        if current is not None and fieldm:
            key = "path" if fieldm.group(1).lower() == "path" else "pattern"
            if fieldm.group(2):
                current[key] = fieldm.group(2)
    close()
    return out


def _listed_from_json(data: list[Any]) -> dict[str, ListedCollection]:
    out: dict[str, ListedCollection] = {}
    for item in data:
        if isinstance(item, str) and item:
            out[item] = ListedCollection(item)
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            path = item.get("path") if isinstance(item.get("path"), str) else None
            pattern = item.get("pattern", item.get("mask"))
            out[item["name"]] = ListedCollection(
                item["name"], path, pattern if isinstance(pattern, str) else None)
    return out


def parse_collection_show(text: str) -> ListedCollection | None:
    """Parse ``qmd collection show <name>`` (``Collection:``, ``Path:``, ``Pattern:``); ``None``
    without a ``Collection:`` line."""
    name: str | None = None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*collection\s*:\s*(.+?)\s*$", line, re.IGNORECASE)
        if m and name is None:
            name = m.group(1)
            continue
        fm = _FIELD_RE.match(line)
        if fm and fm.group(2):
            fields["path" if fm.group(1).lower() == "path" else "pattern"] = fm.group(2)
    if name is None:
        return None
    return ListedCollection(name, fields.get("path"), fields.get("pattern"))
