"""The passage of a lexical qmd hit that the question's words point at.

``qmd search`` ranks whole documents and reports, for each, a snippet of about four lines
around the first line holding the most of the words it was sent (``extractSnippet``: raw
substring counts, first best line). For a question the bridge sends content words, and in the
relaxed pass (``lexical.py``) one word at a time, so a document found by ``caroline`` alone is
shown at the first line naming Caroline, wherever the rest of the question is answered. On the
LoCoMo development conversations qmd named the right file for 0.76 of the evidence turns
within five hits, but its four lines held the evidence for 0.51 (the snippet text for 0.32).

So, in ``search`` mode, each hit's file is read (as ``memory_get`` reads it) and its lines are
chosen again with every content word of the question:

1. the file is marked with FTS5 ``highlight()`` in a throw-away in-memory table with the builtin
   index's tokenizer (``porter unicode61``: ``painting`` marks ``paint``), the query an ``OR``
   of the content words, each as an FTS5 string;
2. with ``chunking.sections`` (the default), the Markdown section holding the most weight of the
   marked words is chosen (:func:`fallback.search.snippets.best_span`: inverse line frequency
   over the file, plus a tenth of the lines' scores), as the builtin engine starts a chunk at
   every heading; without it, the whole file;
3. the hit's range is the best window of whole lines of that section within the chunk budget
   (``chunking.tokens`` x 4 chars, 1,600 by default, the size of a builtin hit), grown from its
   best line (:func:`fallback.search.snippets.best_window`);
4. the snippet is the best window of that range within ``limits.maxSnippetChars``, with its own
   lines (``snippetStartLine``/``snippetEndLine``; citations point at them).

On LoCoMo (``qmdbridge eval --backend qmd``), ranges centred this way held the evidence for
0.695 of the turns within five hits; the builtin engine's fixed chunks of the same notes, the
best-matching one taken, for 0.659, at the same 10.9 lines per hit.

A hit whose file holds none of the words (qmd matched a prefix the stemmer reads otherwise, or
the path) keeps qmd's lines and snippet, as does every hit of ``vsearch`` and ``query`` (their
snippet sits on the chunk qmd's vectors chose). Files over :data:`MAX_FOCUS_CHARS` keep qmd's
lines too.

Source: passage retrieval inside retrieved documents (Salton, Allan & Buckley, "Approaches to
passage retrieval in full text information systems", SIGIR 1993), with the builtin engine's
snippet window as the passage scorer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from fallback.search.snippets import MARK_CLOSE, MARK_OPEN, best_span, best_window
from fallback.text.chunking import CHARS_PER_TOKEN, MIN_CHUNK_CHARS, section_spans

__all__ = ["MAX_FOCUS_CHARS", "Passage", "PassageFinder"]

# Files longer than this (code points, their lines joined by \n) keep qmd's lines: choosing the
# lines costs ~0.4 ms for a 20-line note and ~20 ms at this size, more than a search should
# spend on one hit.
MAX_FOCUS_CHARS = 200_000
# The builtin index's tokenizer, so a word marks the forms the builtin engine would match.
_TOKENIZER = "porter unicode61"


@dataclass(frozen=True)
class Passage:
    """The lines of a file chosen for a hit (1-based, inclusive).

    Attributes:
        start_line / end_line: the hit's range (``start_line <= end_line``), at most the chunk
            budget, inside one section.
        snippet: whole lines of the range (a single line longer than the snippet budget is cut
            around its first matched word; NUL bytes left out), at most the snippet budget in
            code points.
        snippet_start_line / snippet_end_line: the snippet's lines, inside the range.
    """

    start_line: int
    end_line: int
    snippet: str
    snippet_start_line: int
    snippet_end_line: int


def _fts_string(term: str) -> str:
    """``term`` as an FTS5 string (a phrase of its tokens: ``Wi-Fi`` -> ``wi fi``)."""
    return '"' + term.replace('"', '""') + '"'


class PassageFinder:
    """Chooses the passage of a file that holds a question's words (module docstring).

    One in-memory SQLite connection per finder (per search); use as a context manager or call
    :meth:`close`. Not thread-safe: one search's mapping thread uses it.

    Args:
        terms: the question's content words (``lexical.lexical_terms``); none gives a finder
            that never finds (every hit keeps qmd's lines).
        chunk_tokens: the agent's ``chunking.tokens`` (4 chars each): the range's budget.
        sections: the agent's ``chunking.sections``: the range stays inside one Markdown section.
        snippet_chars: the snippet's budget in code points (``limits.maxSnippetChars``), ``> 0``.
    """

    def __init__(self, terms: Sequence[str], *, chunk_tokens: int, sections: bool,
                 snippet_chars: int) -> None:
        words = [t for t in dict.fromkeys(terms) if t.strip()]
        self._match = " OR ".join(_fts_string(t) for t in words)
        self._range_chars = max(MIN_CHUNK_CHARS, chunk_tokens * CHARS_PER_TOKEN)
        self._sections = sections
        self._snippet_chars = max(1, snippet_chars)
        self._db: sqlite3.Connection | None = None

    def __enter__(self) -> PassageFinder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Drop the in-memory table (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def _marked(self, text: str) -> str | None:
        """``text`` with the words matched wrapped in the snippet markers; ``None`` when no
        word matches."""
        if self._db is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False)
            self._db.execute(f"CREATE VIRTUAL TABLE doc USING fts5(body, tokenize='{_TOKENIZER}')")
        db = self._db
        try:
            db.execute("INSERT INTO doc(rowid, body) VALUES (1, ?)", (text,))
            row = db.execute("SELECT highlight(doc, 0, ?, ?) FROM doc WHERE doc MATCH ?",
                             (MARK_OPEN, MARK_CLOSE, self._match)).fetchone()
        except sqlite3.Error:  # a term FTS5 cannot read: keep qmd's lines
            return None
        finally:
            db.execute("DELETE FROM doc")
        return None if row is None else str(row[0])

    def find(self, lines: Sequence[str]) -> Passage | None:
        """The passage of a file for the question.

        Args:
            lines: the file's lines as ``memory_get`` numbers them (line ``i`` is
                ``lines[i - 1]``), without line ends.

        Returns:
            The passage; ``None`` when no word of the question is in the file, there are no
            words, the file is empty or longer than :data:`MAX_FOCUS_CHARS`.
        """
        if not self._match or not lines:
            return None
        # The markers are control characters no note needs; any already there would read as
        # marks, so they are dropped (the builtin engine's snippets do the same). FTS5 reads a
        # NUL as the end of the text, which would move or hide the lines after it: NULs are
        # dropped too, as the builtin index drops them from a note (line numbers unchanged).
        text = "\n".join(lines)
        for control in (MARK_OPEN, MARK_CLOSE, "\x00"):
            text = text.replace(control, "")
        if len(text) > MAX_FOCUS_CHARS:
            return None
        marked = self._marked(text)
        if marked is None or MARK_OPEN not in marked:
            return None
        marked_lines = marked.split("\n")
        spans = section_spans(marked_lines) if self._sections else [(0, len(marked_lines) - 1)]
        pick = best_span(marked, spans)
        if pick is None:
            return None
        first = spans[pick][0]
        span = best_window("\n".join(marked_lines[first:spans[pick][1] + 1]),
                           max_chars=self._range_chars)
        start = first + span.first_line
        inner = "\n".join(marked_lines[start:first + span.last_line + 1])
        snip = best_window(inner, max_chars=self._snippet_chars)
        return Passage(start_line=start + 1, end_line=first + span.last_line + 1,
                       snippet=snip.text, snippet_start_line=start + snip.first_line + 1,
                       snippet_end_line=start + snip.last_line + 1)
