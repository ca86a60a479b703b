"""Plain-text rendering of the JSON documents of ``search`` (with ``--explain``), ``get`` and ``status``.

It works on the dicts ``--json`` prints, with the standard library only (rich only on a
terminal), so the daemon client prints a served answer without pydantic or the engine.
"""

from __future__ import annotations

import re
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["KEYWORD_ONLY_NOTICE", "QMD_UNAVAILABLE", "explain_lines", "get_page_text", "keyword_notice",
           "print_answer", "print_get_doc", "print_search_doc", "print_status_doc"]

# Printed once (stderr) by a plain search that the builtin engine answered keyword-only.
KEYWORD_ONLY_NOTICE = 'keyword-only: no embedding provider — see README "Semantic search"'
# How the fallback note names qmd's failure (and how a qmd BackendUnavailableError's text starts).
QMD_UNAVAILABLE = "qmd unavailable: "


def keyword_notice(provider: str) -> bool:
    """Whether a plain search answer may say it is keyword-only
    (:data:`KEYWORD_ONLY_NOTICE`): not when ``memorySearch.provider`` is ``"none"``. Every
    route asks this."""
    return provider != "none"


def print_answer(args: Any, doc: dict[str, Any], *, served_by: str, keyword_notice: bool = True) -> int:
    """Print a ``search`` / ``get`` / ``status`` answer as every route prints it: ``doc`` (a
    status with its ``problems`` added) with ``servedBy`` under ``--json``, else as text; exit 0."""
    from qmdbridge.cli.common import EXIT_OK, emit_plain_json

    if args.command == "status":
        from qmdbridge.problems import status_problems

        doc = {**doc, "problems": status_problems(doc)}
    if args.json:
        emit_plain_json({**doc, "servedBy": served_by})
    elif args.command == "search":
        print_search_doc(doc, keyword_notice=keyword_notice)
    elif args.command == "get":
        print_get_doc(doc, from_line=args.from_line)
    else:
        print_status_doc(doc)
    return EXIT_OK


def print_search_doc(doc: dict[str, Any], *, keyword_notice: bool = True) -> None:
    """Print a search answer (``doc``, as ``--json`` prints it) as ``<score> <path>:<start>-<end>``
    and the snippet per hit (a table on a TTY; plain lines with each hit's :func:`explain_lines`
    when asked for); its fallback note, warnings and, with ``keyword_notice``,
    :data:`KEYWORD_ONLY_NOTICE` for a keyword-only builtin answer go to stderr."""
    out = sys.stdout
    fallback = doc.get("fallback")
    if fallback:
        reason = str(fallback.get("reason"))
        reason = reason.removeprefix(QMD_UNAVAILABLE)  # the reason of a BackendUnavailableError has it
        sys.stderr.write(f"note: answered by {doc.get('backend')} ({QMD_UNAVAILABLE}{reason})\n")
    if (keyword_notice and doc.get("backend") == "builtin" and doc.get("mode") == "fts-only"
            and doc.get("provider") in (None, "none")):  # a failing provider has its warning
        sys.stderr.write(KEYWORD_ONLY_NOTICE + "\n")
    for warning in doc.get("warnings") or []:
        sys.stderr.write(f"warning: {warning}\n")
    denied = doc.get("denied")
    if denied:
        out.write(f"Search denied by scope: {denied.get('reason')}\n")
        return
    results = doc.get("results") or []
    if not results:
        out.write("No matches.\n")
        return
    explained = any(r.get("explain") for r in results)
    if out.isatty() and not explained:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"memory search ({doc.get('backend')}, {doc.get('mode')})", show_lines=True)
        table.add_column("score", justify="right")
        table.add_column("location")
        table.add_column("snippet")
        for r in results:
            table.add_row(f"{r['score']:.3f}", f"{r['path']}:{r['startLine']}-{r['endLine']}", r["snippet"])
        Console().print(table)
        return
    for i, r in enumerate(results):
        if i:
            out.write("\n")
        out.write(f"{r['score']:.3f} {r['path']}:{r['startLine']}-{r['endLine']}\n{r['snippet'].rstrip()}\n")
        if r.get("explain"):
            out.write("".join(f"  {line}\n" for line in explain_lines(r["explain"])))


def explain_lines(e: dict[str, Any]) -> list[str]:
    """The ``--explain`` block of one hit as lines: mode and rank, then one line per
    ranking step that applied (scores to 4 decimals, BM25 to 4 significant digits, ages to 1)."""
    lines = [f"explain: {e['mode']}, rank {e['rank']}"]
    if (k := e.get("keyword")) is not None:
        bm25 = "-" if k["bm25"] is None else f"{k['bm25']:.4g}"
        lines.append(f"  keyword: rank {k['rank']}, bm25 {bm25}, text score {k['textScore']:.4f}")
    if (v := e.get("vector")) is not None:
        lines.append(f"  vector: rank {v['rank']}, cosine {v['cosine']:.4f}")
    if (f := e.get("fusion")) is not None:
        lines.append(f"  fusion ({f['method']}): evidence vector {f['vectorEvidence']:.4f}, text "
                     f"{f['textEvidence']:.4f}; 0.5 x max + 0.5 x ({f['vectorWeight']:g} x vector + "
                     f"{f['textWeight']:g} x text) = {f['score']:.4f}")
    if (d := e.get("decay")) is not None:
        age = "evergreen" if d["ageDays"] is None else f"age {d['ageDays']:.1f} days (by {d['datedBy']})"
        lines.append(f"  decay: {age}, half-life {d['halfLifeDays']:g} days, factor {d['factor']:.4f}"
                     f" -> {d['score']:.4f}")
    if (rr := e.get("rerank")) is not None:
        rel = "-" if rr["relevance"] is None else f"{rr['relevance']:.4f}"
        lines.append(f"  rerank: {rr['provider']} {rr['model']}, relevance {rel}, rank {rr['rankBefore']}"
                     f" -> {rr['rankAfter']}")
    if (m := e.get("mmr")) is not None:
        lines.append(f"  mmr: lambda {m['lambda']:g}, rank {m['rankBefore']} -> {m['rankAfter']}")
    lines.append(f"  floor: {'kept' if e['floor']['kept'] else 'dropped'} ({e['floor']['reason']})")
    return lines


# The tool's words for reading on at the end of a truncated page (fallback/sources/read_page.py).
_READ_ON = re.compile(r"Use from=(\d+)(?: fromChar=(\d+))? to continue\.\]\Z")


def get_page_text(doc: dict[str, Any]) -> str:
    """The text of a ``memory_get`` page for a person: the continuation notice names the CLI's
    own flags (``Use --from 16 to continue.``, ``Use --from 5 --from-char 12001 ...``) instead
    of the tool's ``from=16`` / ``from=5 fromChar=12001``."""
    text = str(doc.get("text") or "")
    found = _READ_ON.search(text) if doc.get("truncated") else None
    if found is not None:
        line, char = found.groups()
        flags = f"--from {line}" + (f" --from-char {char}" if char else "")
        text = text[: found.start()] + f"Use {flags} to continue.]"
    return text


def print_get_doc(doc: dict[str, Any], *, from_line: int | None = None) -> None:
    """Print the text of a ``memory_get`` page (newline-terminated, :func:`get_page_text`); a
    ``--from`` past the end of the file prints nothing on stdout and says so on stderr."""
    if not doc.get("lines") and (from_line or 1) > 1:
        sys.stderr.write(f"qmdbridge: --from {from_line} is past the end of {doc.get('path')} "
                         "(nothing from that line on); try a smaller --from\n")
        return
    text = get_page_text(doc)
    sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))


def print_status_doc(st: dict[str, Any]) -> None:
    """Print a status document (with its ``problems``) as ``Key: value`` lines (spec 11.1
    layout) with the roots memory is read from and the problems with their fixes (``none found
    yet`` before the first sync)."""
    from qmdbridge.problems import files_checked, is_indexed_caveat

    w = sys.stdout.write
    w(f"Memory Search ({st.get('agentId')})\n")
    w(f"Backend: {st.get('backend')}\n")
    fallback = st.get("fallback")
    if fallback:
        w(f"Fallback: from {fallback.get('from')}: {fallback.get('reason')}\n")
    w(f"Provider: {st.get('provider')} (requested: {st.get('requestedProvider') or st.get('provider')})\n")
    w(f"Model: {st.get('model') or '-'}\n")
    mode = st.get("searchMode")
    if mode == "unavailable":
        w(f"Mode: unavailable, search fails until this is fixed ({st.get('providerUnavailableReason')})\n")
    else:
        w(f"Mode: {mode or '-'}{' (keyword-only)' if mode == 'fts-only' else ''}\n")
        if st.get("providerUnavailableReason"):
            w(f"Provider note: {st['providerUnavailableReason']}\n")
    w(f"Sources: {', '.join(st.get('sources') or [])}\n")
    roots = st.get("roots") or ((st.get("backends") or {}).get("builtin") or {}).get("roots") or []
    for root in roots:
        pattern = "" if root.get("kind") == "root" else f" ({root.get('pattern')})"
        w(f"Root: {root.get('path')}{pattern}{'' if root.get('exists') else ' (missing)'}\n")
    w(f"Indexed: {st.get('files')} files · {st.get('chunks')} chunks\n")
    reason = st.get("dirtyReason")
    w(f"Dirty: {'yes' if st.get('dirty') else 'no'}{' (' + reason + ')' if reason else ''}\n")
    w(f"Store: {st.get('dbPath') or '-'}\n")
    scopes = ((st.get("custom") or {}).get("store") or {}).get("sharedScopes")
    if scopes:  # the postgres store: the scopes other agents share with this one
        shown = ", ".join(f"{s['agent']} ({s['workspace']})" for s in scopes)
        w(f"Shared scopes: {shown}\n")
    w(f"Workspace: {st.get('workspaceDir')}\n")
    fts = st.get("fts") or {}
    if fts:
        w(f"FTS: {'ready' if fts.get('available') else 'unavailable'} {fts.get('tokenizer', '')}"
          f"{' (keyword search: substring scan)' if fts.get('keyword') == 'substring' else ''}\n")
    vector = st.get("vector") or {}
    if vector:
        w(f"Vector: {vector.get('mode', '-')}"
          f"{' (' + str(vector.get('reason')) + ')' if vector.get('reason') else ''}"
          f"{', dims ' + str(vector.get('dims')) if vector.get('dims') else ''}\n")
    cache = st.get("cache") or {}
    if cache:
        w(f"Embedding cache: {'enabled' if cache.get('enabled') else 'disabled'}"
          f" ({cache.get('entries', 0)} entries, cap {cache.get('maxEntries')})\n")
    for name, view in (st.get("backends") or {}).items():
        if name == "builtin" and st.get("backend") != "builtin":
            w(f"Builtin index: {view.get('files', 0)} files · {view.get('chunks', 0)} chunks\n")
        if name == "qmd":
            colls = view.get("collections") or []
            w(f"qmd collections: {len(colls)}"
              f"{' (' + ', '.join(c['name'] + ': ' + c['path'] + ' ' + c['pattern'] for c in colls) + ')' if colls else ''}\n")
            breaker = view.get("breaker", {})
            healthy = view.get("healthy", True) and breaker.get("state") == "closed"
            w(f"qmd: {'healthy' if healthy else 'unhealthy'}"
              f"; breaker {breaker.get('state', '-')}; last error: {view.get('lastError') or breaker.get('lastFailure') or '-'}\n")
            startup = view.get("startup") or {}
            if startup:
                w(f"qmd start-up: {startup.get('state', '-')}"
                  f"{'; ' + str(startup['lastError']) if startup.get('lastError') else ''}\n")
    bg = st.get("background") or {}
    if bg.get("running") or bg.get("lastError"):
        failing = bg.get("failing") or []
        w(f"Background: {bg.get('running', 0)} task(s){'; failing: ' + ', '.join(failing) if failing else ''}\n")
        err = bg.get("lastError")
        if err:
            w(f"Background error: {err.get('task')}: {err.get('message')} "
              f"(at {err.get('atMs')}, {err.get('failures')} in a row)\n")
    for s in st.get("skipped") or []:
        label = "Indexed with a caveat" if is_indexed_caveat(str(s.get("reason"))) else "Skipped"
        w(f"{label}: {s.get('path')}: {s.get('reason')}\n")
    for issue in st.get("issues") or []:
        w(f"Issue: {issue}\n")
    problems = st["problems"]
    if not problems and not files_checked(st):
        w("Problems: none found yet: memory files are checked by the first sync (run `qmdbridge index`)\n")
    else:
        w(f"Problems: {len(problems) or 'none'}\n")
    for p in problems:
        w(f"  [{p.get('check')}] {p.get('message')}\n")
        if p.get("hint"):
            w(f"    fix: {p['hint']}\n")
    for warning in st.get("configWarnings") or []:
        w(f"Config warning: {warning}\n")
