"""The documentation holds together: README.md stays a short front page, every relative link and
anchor in README.md and docs/*.md resolves, and docs/cli.md names every command and option of
the real argument parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from qmdbridge.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown page outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: inline-code marks and punctuation dropped, lower case,
    spaces to hyphens (``## The `serve` protocol`` -> ``the-serve-protocol``)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's ``-1``, ``-2`` ... for repeated headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page's prose (not in code blocks or inline code)."""
    out = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        out.extend(m.group(1) for m in _LINK.finditer(_INLINE_CODE.sub("", line)))
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file or ``#anchor`` does not exist."""
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    return bad


def test_readme_is_a_short_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_slug_and_link_checks_catch_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## The `serve` protocol\n\n## Top\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#the-serve-protocol) [dup](a.md#top-1) [here](#b)\n# B\n"
                    "[gone](missing.md) [anchor](a.md#nope) `[code](missing.md)`\n"
                    "```\n[fenced](missing.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file",
                                  "a.md#nope: no heading with that anchor"]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_cli_page_names_every_command_and_option() -> None:
    cli_doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = []
    for name, sub in _commands(build_parser()).items():
        if not re.search(rf"qmdbridge {re.escape(name)}\b", cli_doc):
            missing.append(f"qmdbridge {name}")
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and not re.search(
                        rf"(?<![\w-]){re.escape(flag)}(?![\w-])", cli_doc):
                    missing.append(f"qmdbridge {name} {flag}")
            if not action.option_strings and action.choices:
                missing.extend(f"qmdbridge {name} {choice}" for choice in action.choices
                               if not re.search(rf"\b{re.escape(str(choice))}\b", cli_doc))
    assert missing == []
