"""Map qmd's search hits to ``MemorySearchResult`` (spec 2.8.4).

Pure functions over plain values, plus :class:`DocLookup`, a read-only view of qmd's
``index.sqlite`` that turns a docid into its ``(collection, path)`` row.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from fallback.errors import BackendUnavailableError
from fallback.models import MemorySearchResult, Source
from fallback.search.fts_only import clamp_score
from fallback.sources.memory_files import is_root_level_auxiliary
from fallback.store.errors import is_locked
from fallback.text.chunking import split_lines, truncate_chars
from fallback.text.path_names import printable_path
from qmdbridge.qmd.collections import ManagedCollection
from qmdbridge.qmd.index_stats import file_stamp, index_counts
from qmdbridge.qmd.passages import MAX_FOCUS_CHARS, Note, rank_passages
from qmdbridge.qmd.reads import RACY_NS, Listings, clamp_range, hit_lines, resolve_hit_file, slugify_path
from qmdbridge.qmd.results_json import QmdEntry

__all__ = ["DocLookup", "IndexCounts", "entry_hits", "index_locked", "clamp_injected", "display_path",
           "LocatedHit", "line_range", "locate_entries", "passage_hits",
           "qmd_lines_hit", "merge_best", "merge_key", "parse_qmd_uri", "snippet_text"]

log = logging.getLogger("qmdbridge.qmd.backend")

_HEADER_RE = re.compile(r"@@\s*-([0-9]+),([0-9]+)")
_HEADER_LINE_RE = re.compile(r"^@@\s*-[0-9]+,[0-9]+\s*@@[^\n]*(?:\n|$)")


def parse_qmd_uri(uri: str) -> tuple[str, str] | None:
    """``qmd://<collection>/<rel>`` as ``(collection, rel)``, percent-decoded, a trailing
    ``?index=<name>`` dropped; ``None`` for other forms."""
    if not uri[:6].lower() == "qmd://":
        return None
    rest = uri[6:]
    rest = re.sub(r"\?index=[^/]*$", "", rest)
    coll, _, rel = rest.partition("/")
    if not coll:
        return None
    return unquote(coll), unquote(rel).lstrip("/")


def line_range(entry: QmdEntry, snippet: str) -> tuple[int, int]:
    """1-based inclusive line range of a hit (spec 2.8.4 step 5): explicit start/end lines win
    (a lone one takes the header's width), else the ``@@ -a,b`` header, else the snippet's lines."""
    header = _HEADER_RE.search(snippet)
    body_lines = max(1, len(_HEADER_LINE_RE.sub("", snippet).rstrip("\n").split("\n")))
    width = max(1, int(header.group(2))) if header else body_lines
    if header and snippet.endswith("\n") and width == body_lines + 1:
        width = body_lines  # qmd counts the empty "line" after the snippet's final newline
    s, e = entry.start_line, entry.end_line
    if s and e:
        return (s, e) if s <= e else (e, s)
    if s:
        return s, s + width - 1
    if e:
        return max(1, e - width + 1), e
    if header:
        a = max(1, int(header.group(1)))
        return a, a + width - 1
    return 1, body_lines


def display_path(collection: ManagedCollection, rel: str, workspace: Path) -> str:
    """The path shown: workspace-relative inside the workspace (not under ``qmd/``), else
    ``qmd/<collection>/<rel>`` (spec 2.8.4 step 3), in the printable form the builtin engine
    cites (:func:`~fallback.text.path_names.printable_path`: a control character as ``\\xHH``)."""
    rel = rel.replace("\\", "/").lstrip("/")
    absolute = Path(os.path.normpath(collection.path / rel))
    inside = absolute.relative_to(workspace).as_posix() if absolute.is_relative_to(workspace) else None
    if inside and inside != "." and inside != "qmd" and not inside.startswith("qmd/"):
        return printable_path(inside)
    return printable_path(f"qmd/{collection.name}/{rel}")


class DocLookup:
    """Read-only docid and path lookups in qmd's ``index.sqlite`` (``busy_timeout`` 1000 ms), from a
    worker thread; ``close()`` after use.

    Raises (every method):
        BackendUnavailableError: ``qmd index busy while reading results: <msg>``.
    """

    def __init__(self, db_path: Path) -> None:
        self._db_path = db_path
        self._conn: sqlite3.Connection | None = None

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[str, str]]:
        try:
            if self._conn is None:
                if not self._db_path.is_file():
                    return []
                self._conn = sqlite3.connect(f"file:{self._db_path}?mode=ro", uri=True,
                                             check_same_thread=False, timeout=1.0)
            return [(str(c), str(p)) for c, p in self._conn.execute(sql, params).fetchall()]
        except sqlite3.Error as exc:
            if is_locked(exc):  # SQLITE_BUSY / SQLITE_LOCKED, by result code
                raise BackendUnavailableError("qmd", f"qmd index busy while reading results: {exc}") from exc
            return []

    def by_docid(self, docid: str) -> list[tuple[str, str]]:
        """Active ``(collection, path)`` rows of a docid: exact hash first, then as a prefix."""
        h = docid.lstrip("#").lower()
        if not h or not re.fullmatch(r"[0-9a-f]+", h):
            return []
        rows = self._rows("SELECT collection, path FROM documents WHERE hash = ? AND active = 1", (h,))
        return rows or self._rows(
            "SELECT collection, path FROM documents WHERE hash LIKE ? AND active = 1", (h + "%",))

    def paths(self, collection: str) -> list[str]:
        """All active paths of a collection."""
        return [p for _, p in self._rows(
            "SELECT collection, path FROM documents WHERE collection = ? AND active = 1",
            (collection,))]

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _path_matches(row_path: str, hint: str | None) -> bool:
    if not hint:
        return False
    return row_path == hint or row_path.endswith("/" + hint) or hint.endswith("/" + row_path) \
        or slugify_path(row_path) == slugify_path(hint)


def _locate(entry: QmdEntry, *, roots: Mapping[str, ManagedCollection], lookup: DocLookup,
            default_collection: str | None, cache: dict[str, tuple[str, str] | None]
            ) -> tuple[str, str] | None:
    coll_hint, file_hint = entry.collection, entry.file
    if file_hint and (uri := parse_qmd_uri(file_hint)):
        coll_hint, file_hint = coll_hint or uri[0], uri[1]
    coll_hint = coll_hint or default_collection
    if entry.docid:
        key = f"{coll_hint or '*'}:{entry.docid.lstrip('#')}"
        if key not in cache:
            rows = [r for r in lookup.by_docid(entry.docid) if r[0] in roots]
            pick = next((r for r in rows if r[0] == coll_hint), None) or next(
                (r for r in rows if _path_matches(r[1], file_hint)), None) or (
                rows[0] if rows else None)
            cache[key] = pick
        if cache[key] is not None:
            return cache[key]
    if not coll_hint or coll_hint not in roots or not file_hint:
        return None
    paths = lookup.paths(coll_hint)
    if file_hint in paths:
        return coll_hint, file_hint
    fuzzy = [p for p in paths if _path_matches(p, file_hint)]
    if len(fuzzy) == 1:
        return coll_hint, fuzzy[0]
    root = roots[coll_hint].path
    if not Path(os.path.normpath(root / file_hint)).is_relative_to(root):
        return None
    return coll_hint, file_hint


@dataclass(frozen=True)
class LocatedHit:
    """A qmd entry found on disk, before its lines are chosen.

    Attributes:
        path: the path shown (:func:`display_path`). source: its collection's source.
        score: qmd's score, clamped to ``[0, 1]``.
        lines: qmd's lines clamped to the file, or ``None`` when they start past its end.
        snippet: qmd's snippet without its ``@@`` header (or the file's lines ``lines`` as they
            are now, when read), :func:`snippet_text`, cut to the snippet budget.
        text: the file's lines as ``memory_get`` numbers them when read, else ``None``.
    """

    path: str
    source: Source
    score: float
    lines: tuple[int, int] | None
    snippet: str
    text: list[str] | None


def locate_entries(entries: Iterable[tuple[QmdEntry, str | None]], *,
                   roots: Mapping[str, ManagedCollection], workspace: Path, lookup: DocLookup,
                   max_snippet_chars: int, min_score: float, cache: dict[str, tuple[str, str] | None],
                   notes: list[str] | None = None, listings: Listings | None = None,
                   read_lines: bool = False) -> list[LocatedHit]:
    """Find parsed entries on disk (spec 2.8.4 steps 1-7), in qmd's order; those not in a managed
    collection, under ``min_score``, outside the memory-file rule (:meth:`ManagedCollection.admits`)
    or behind a symlink are dropped, a slug-normalised path is mapped back to its file.
    ``entries`` pair each entry with the collection its call searched; ``cache`` maps
    ``<collection or *>:<docid>`` to a row until the next update; ``notes`` receives one line
    per ambiguous hit dropped; ``read_lines`` keeps files up to ``4 x MAX_FOCUS_CHARS`` bytes.

    Raises:
        BackendUnavailableError: the index was busy.
    """
    out: list[LocatedHit] = []
    for entry, hint in entries:
        score = entry.score if entry.score is not None else 0.0
        if score < min_score:
            continue
        loc = _locate(entry, roots=roots, lookup=lookup, default_collection=hint, cache=cache)
        if loc is None:
            continue
        coll = roots[loc[0]]
        raw = entry.snippet if entry.snippet is not None else (entry.body or "")
        text = _HEADER_LINE_RE.sub("", raw, count=1).rstrip("\n")
        span = line_range(entry, raw)
        rel, note = resolve_hit_file(coll, loc[1], text, *span, workspace=workspace,
                                     listings=listings)
        if rel is None:
            if note is not None and notes is not None and note not in notes:
                notes.append(note)
            if note is None:
                log.debug("qmd hit dropped, its file is gone: %s/%s", coll.name, loc[1])
            else:
                log.warning("%s", note)
            continue
        if not coll.admits(rel) or (not coll.is_root_file
                                    and is_root_level_auxiliary(workspace, coll.path / rel)):
            log.debug("qmd hit outside collection %s's files dropped: %s", coll.name, rel)
            continue
        read = hit_lines(coll, rel, workspace=workspace,
                         max_bytes=4 * MAX_FOCUS_CHARS if read_lines else 0)
        if read is None:
            continue  # gone, through a symlink or not a file: no citation
        lines = clamp_range(*span, read[0])
        if lines is None and read[1] is None:
            continue  # qmd's lines are past the end of the file: no citation
        if read[1] is not None and lines is not None:
            # what qmd's lines say now: its index may be older than the file
            text = "\n".join(read[1][lines[0] - 1:lines[1]])
        out.append(LocatedHit(path=display_path(coll, rel, workspace), source=coll.source,
                              score=clamp_score(score), lines=lines,
                              snippet=truncate_chars(snippet_text(text), max_snippet_chars, at_words=True),
                              text=read[1]))
    return out


def snippet_text(text: str) -> str:
    """Lines as a snippet shows them: ``\r\n``/``\r`` read as ``\n`` (``fallback.text.chunking``),
    NUL bytes dropped, trailing line breaks removed."""
    return "\n".join(split_lines(text.replace("\x00", ""))).rstrip("\n")


def qmd_lines_hit(hit: LocatedHit, *, score: float | None = None) -> MemorySearchResult | None:
    """The hit with qmd's lines and snippet (``score`` replaces qmd's when given); ``None`` when
    qmd's lines start past the end of the file."""
    if hit.lines is None:
        return None
    return MemorySearchResult(path=hit.path, start_line=hit.lines[0], end_line=hit.lines[1],
                              score=hit.score if score is None else score, snippet=hit.snippet,
                              source=hit.source)


def passage_hits(question: str, located: list[LocatedHit], *, tokens: int, overlap: int,
                 sections: bool, snippet_chars: int, limit: int,
                 min_score: float) -> list[MemorySearchResult]:
    """``search``-mode hits: the located notes' passages ranked for ``question``
    (``passages.rank_passages``, with the agent's ``tokens``/``overlap``/``sections`` and
    ``snippet_chars`` in code points), then the notes it could not place with qmd's lines in qmd's
    order (score 0 when ranked without the question's words, else qmd's capped by the hit before);
    at most ``limit`` passages, hits under ``min_score`` dropped."""
    first_of: dict[str, LocatedHit] = {}
    for hit in located:
        first_of.setdefault(hit.path, hit)
    firsts = list(first_of.values())  # qmd's order, one per file
    notes = [Note(path=hit.path, source=hit.source, lines=hit.text) for hit in firsts
             if hit.text is not None]
    ranking = rank_passages(question, notes, tokens=tokens, overlap=overlap, sections=sections,
                            snippet_chars=snippet_chars, limit=limit)
    out = [MemorySearchResult(path=p.path, start_line=p.start_line,
                              end_line=p.end_line, score=p.score, snippet=p.snippet,
                              source=p.source, snippet_start_line=p.snippet_start_line,
                              snippet_end_line=p.snippet_end_line) for p in ranking.passages]
    placed = {notes[i].path for i in ranking.matched}
    wordless = {notes[i].path for i in ranking.pooled - ranking.matched}
    cap = out[-1].score if out else 1.0
    for hit in firsts:  # qmd's order
        score = 0.0 if hit.path in wordless else min(hit.score, cap)
        if hit.path not in placed and (kept := qmd_lines_hit(hit, score=score)):
            out.append(kept)
            cap = kept.score
    return [hit for hit in out if hit.score >= min_score]


def entry_hits(entries: list[tuple[QmdEntry, str | None]], *, question: str | None, limit: int,
               min_score: float, notes: list[str], roots: Mapping[str, ManagedCollection],
               workspace: Path, index_db: Path, cache: dict[str, tuple[str, str] | None],
               listings: Listings, snippet_chars: int, tokens: int, overlap: int,
               sections: bool) -> list[MemorySearchResult]:
    """qmd's entries as hits: located (:func:`locate_entries`), then with ``question`` the ranked
    passages (:func:`passage_hits`), else qmd's lines (:func:`qmd_lines_hit`). Arguments as
    theirs; ``notes`` receives the notes of dropped hits.

    Raises:
        BackendUnavailableError: qmd's index could not be read.
    """
    lookup = DocLookup(index_db)
    try:
        located = locate_entries(entries, roots=roots, workspace=workspace, lookup=lookup,
                                 max_snippet_chars=snippet_chars, cache=cache, notes=notes,
                                 listings=listings, read_lines=question is not None,
                                 min_score=min_score if question is None else 0.0)
    finally:
        lookup.close()
    if question is None:
        return [hit for found in located if (hit := qmd_lines_hit(found)) is not None]
    return passage_hits(question, located, tokens=tokens, overlap=overlap, sections=sections,
                        snippet_chars=snippet_chars, limit=limit, min_score=min_score)


def merge_key(entry: QmdEntry, hint: str | None) -> str:
    """Key of one hit across qmd calls: ``docid:<hex>``, else ``file:<collection>:<rel>``."""
    if entry.docid:
        return f"docid:{entry.docid.lstrip('#')}"
    uri = parse_qmd_uri(entry.file or "")
    coll, rel = uri if uri else (entry.collection or hint or "", entry.file or "")
    return f"file:{coll}:{rel}"


def merge_best(pairs: Iterable[tuple[QmdEntry, str | None]], *,
               skip: Container[str] = ()) -> list[tuple[QmdEntry, str | None]]:
    """One ``(entry, collection)`` pair per hit (:func:`merge_key`), its best-scoring one, best
    first (ties keep input order); keys in ``skip`` dropped."""
    best: dict[str, tuple[QmdEntry, str | None]] = {}
    for entry, coll in pairs:
        key = merge_key(entry, coll)
        if key not in skip and (key not in best or (entry.score or 0.0) > (best[key][0].score or 0.0)):
            best[key] = (entry, coll)
    return sorted(best.values(), key=lambda pair: -(pair[0].score or 0.0))


def clamp_injected(results: list[MemorySearchResult], *, max_chars: int) -> list[MemorySearchResult]:
    """Hits (best first) within ``max_chars`` code points of snippets (``limits.maxInjectedChars``):
    whole snippets while they fit, the first that does not cut to what is left, then none."""
    out: list[MemorySearchResult] = []
    budget = max_chars
    for r in results:
        if budget <= 0:
            break
        if len(r.snippet) > budget:
            out.append(r.model_copy(update={"snippet": r.snippet[:budget]}))
            break
        out.append(r)
        budget -= len(r.snippet)
    return out


def index_locked(db: Path) -> bool:
    """Whether a writer holds qmd's index exclusively now (a read with no busy wait fails with
    "database is locked"); ``False`` for a missing or otherwise unreadable index."""
    if not db.is_file():
        return False
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return is_locked(exc)  # by SQLite's result code, never by message
    return False


class IndexCounts:
    """:func:`index_counts` of one ``index.sqlite``, read again only when the ``(mtime_ns, size,
    inode)`` of it or its ``-wal`` changed; a failed read, or one of files written less than
    ``reads.RACY_NS`` ago, is not kept."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self._stamp: tuple[tuple[int, int, int] | None, ...] | None = None
        self._counts: dict[str, int] = {}

    async def read(self) -> tuple[dict[str, int], str | None]:
        """``({collection: active documents}, error or None)``, as :func:`index_counts`."""
        import anyio

        stamp = file_stamp(self.db), file_stamp(self.db.with_name(self.db.name + "-wal"))
        if stamp == self._stamp:
            return dict(self._counts), None
        counts, err = await anyio.to_thread.run_sync(index_counts, self.db)
        newest = max((s[0] for s in stamp if s is not None), default=0)
        settled = time.time_ns() - newest >= RACY_NS
        self._stamp, self._counts = (stamp, counts) if settled and not err else (None, {})
        return dict(counts), err
