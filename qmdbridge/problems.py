"""The one list of problems a status shows: what keeps memory from being searched as configured.

``qmdbridge status`` prints it and ``qmdbridge doctor`` fails a check per entry. It reads the
status as JSON with the standard library only, so the daemon client can use it too.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the daemon client path)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CI_REFUSAL", "CRASH_HINT", "INDEXED_CAVEATS", "NEVER_MATCHES", "QMD_UNHEALTHY", "files_checked",
           "is_indexed_caveat", "model_missing_problem", "status_problems", "store_failure_hint"]

# How the problem of a qmd whose test search (or update) failed starts.
QMD_UNHEALTHY = "qmd is not healthy"
# How a qmd crash (QmdCommandError's crash signal) is told; a reason holding it gets the crash hint.
CRASH_HINT = ("qmd crashed; BM25 search mode (memory.qmd.searchMode \"search\") or the daemon "
              "(qmdbridge serve) avoid reloading models")
# How qmd's refusal of model work under ``CI`` is told; its fix is to unset ``CI``, not a warmup.
CI_REFUSAL = "qmd refuses model operations while the CI environment variable is set"

# How the caveat of a file whose name is not UTF-8 starts; qmd skips such a file (and one whose
# name holds a backslash, shown as \x5c).
_UNDECODABLE_NAME = "file name is not valid UTF-8"
# How a ``skipped`` reason starts when the file *is* indexed, with a caveat (fallback/index/indexer.py's
# notes; tests/qmdbridge/test_doctor.py keeps the two in step).
INDEXED_CAVEATS = ("invalid UTF-8", "NUL bytes stripped", _UNDECODABLE_NAME,
                   "file name holds a control character")
# Skip reasons that are notes, not problems (the file is indexed, or hidden on purpose).
_NOT_PROBLEMS = (*INDEXED_CAVEATS, "hidden name")
# How the scan issue of an extra folder whose pattern admits no ``.md`` name starts (the text of
# fallback.sources.memory_files.NEVER_MATCHES; tests/qmdbridge/test_doctor.py keeps the two in step).
NEVER_MATCHES = "extra path pattern can never match a memory file:"
# The fix of a symlink in the memory paths (a note, a folder in one, a memory folder, an extra path).
_LINK_FIX = ("symlinks are never followed: replace the link with what it points to, or add the "
             "target's real path to memorySearch.extraPaths")
# Issues that describe a normal young workspace.
_NORMAL_ISSUES = ("memory directory missing",)


def is_indexed_caveat(reason: str) -> bool:
    """Whether a ``skipped`` entry's ``reason`` is the caveat of a file that was indexed anyway
    (see :data:`INDEXED_CAVEATS`), rather than the reason a file was left out."""
    return reason.startswith(INDEXED_CAVEATS)


def store_failure_hint(error_type: str, db_path: str | None) -> str | None:
    """What to do about a failed write of the index store (``db_path``; ``None``: not known), by
    the error's class name (``errorType``: ``IndexStoreFullError``, ``IndexStoreLockedError``,
    ``IndexStoreReadOnlyError``), or ``None`` for any other failure."""
    folder = os.path.dirname(db_path) if db_path else "the store's folder"
    if error_type == "IndexStoreFullError":
        return f"free disk space for {db_path}, then run `qmdbridge index`"
    if error_type == "IndexStoreLockedError":
        return ("another process is writing the index (a `qmdbridge index` or `serve` of this "
                "agent, or a program holding the file in a transaction): run `qmdbridge index` "
                "again once it is done")
    if error_type == "IndexStoreReadOnlyError":
        return (f"make {folder} and the store file writable for this user (their permissions, or "
                "a read-only mount), then run `qmdbridge index`")
    return None


def _problem(check: str, message: str, hint: str | None) -> dict[str, Any]:
    return {"check": check, "message": message, "hint": hint}


def model_missing_problem(missing: str) -> dict[str, Any]:
    """The ``{check, message, hint}`` of an embedding model not downloaded yet
    (``missing``: the provider's ``model_problem()``)."""
    return _problem("embedding provider", f"{missing}: searches answer from keyword search only "
                    "until it is", "run `qmdbridge models pull` where the model host is reachable "
                    "(or set memorySearch.local.modelPath to a .gguf file you have)")


# The fix of a skipped file, by how its reason starts (a symlink: a note or a folder).
_SKIP_HINTS = (("too large", "split the file, or raise memorySearch.maxFileBytes"),
               ("binary", "memory files are Markdown text; move the file out of the memory folders"),
               ("symlink", _LINK_FIX), ("unreadable", "fix the file's permissions"),
               ("not a regular file", "memory files are regular Markdown files; move it out of the memory folders"))


def _issue_hint(issue: str) -> str | None:
    if issue.startswith(NEVER_MATCHES):
        return ('memory files are Markdown: give the entry a pattern whose names end in .md '
                '(the default is "**/*.md"), or remove it from memorySearch.extraPaths')
    if "is a symlink (not followed)" in issue:  # a memory folder or an extra path
        return _LINK_FIX
    if issue.startswith("extra path missing"):
        return "create it, or fix or remove its entry in memorySearch.extraPaths or memory.qmd.paths"
    if issue.startswith("extra path"):  # not Markdown, not a file or folder, the filesystem root
        return "point the entry at a .md file or a folder, or remove it from memorySearch.extraPaths"
    if issue.startswith("memory is not a directory"):
        return "rename that file (move its notes into MEMORY.md): memory/ is the folder of the daily notes"
    if "legacy memory.md" in issue:
        return "run `qmdbridge doctor --fix` to merge memory.md into MEMORY.md"
    return None


def _files_view(status: dict[str, Any]) -> dict[str, Any]:
    # in qmd mode the builtin engine's view supplies the memory files: its index follows the
    # same memory-file rule
    builtin: dict[str, Any] = (status.get("backends") or {}).get("builtin") or {}
    return status if status.get("backend") == "builtin" or not builtin else builtin


def files_checked(status: dict[str, Any]) -> bool:
    """Whether a sync has run, so the memory-file and memory-path problems are known
    (qmd mode: an index holding qmd's documents counts, as only the process that ran its
    update knows when)."""
    if status.get("backend") == "qmd" and (status.get("files") or status.get("lastSyncAtMs") is not None):
        return True
    return _files_view(status).get("lastSyncAtMs") is not None


def status_problems(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The problems of a status document (camelCase keys; in qmd mode
    ``backends.builtin`` supplies skipped files and path issues, and ``backends.qmd`` those its
    discovery found before the builtin engine's sync), in a stable order.

    Returns:
        ``[{"check", "message", "hint"}]``, ``check`` one of ``memory file``, ``memory
        paths``, ``index``, ``FTS5``, ``embedding provider``, ``qmd index``, ``qmd models``,
        ``qmd``; ``hint`` says how to fix it, or is ``None``.
    """
    backends: dict[str, Any] = status.get("backends") or {}
    view = _files_view(status)
    skipped: list[dict[str, Any]] = list(view.get("skipped") or [])
    if view is not status:  # qmd mode: qmd's status runs the memory-file discovery, also before a sync
        seen = {s.get("path") for s in skipped}
        skipped += [s for s in (backends.get("qmd") or {}).get("skipped") or [] if s.get("path") not in seen]
    out = [_problem("memory file", f"{s.get('path')} is not indexed: {s.get('reason')}",
                    next((fix for start, fix in _SKIP_HINTS if str(s.get("reason")).startswith(start)), None))
           for s in skipped if not str(s.get("reason")).startswith(_NOT_PROBLEMS)]
    if backends.get("qmd"):  # qmd skips such a file ("unreadable"): only the builtin engine has it
        out += [_problem("memory file", f"{s.get('path')} is not indexed by qmd: {s.get('reason')}; qmd "
                         "skips it, so only the builtin engine's answers (a fallback) can find it",
                         "rename the file: qmd indexes valid UTF-8 names without a backslash")
                for s in skipped if str(s.get("reason")).startswith(_UNDECODABLE_NAME)
                or "\\x5c" in str(s.get("path"))]
    issues = [str(i) for i in view.get("issues") or []]
    if view is not status:  # qmd mode: qmd's status checks its collections' paths, also before a sync
        issues += [i for i in map(str, (backends.get("qmd") or {}).get("issues") or [])
                   if _issue_hint(i) and i not in issues]
    out += [_problem("memory paths", i, _issue_hint(i)) for i in issues if not i.startswith(_NORMAL_ISSUES)]
    failed = (view.get("custom") or {}).get("syncFailure")
    if failed:  # recorded with the store, so every process tells it (postgres counts no files)
        waiting = failed.get("filesWaiting")
        out.append(_problem("index", f"last sync ({failed.get('reason')}) failed: {failed.get('error')}"
                            + ("" if waiting is None else f"; memory files waiting to be indexed: {waiting}"),
                            store_failure_hint(str(failed.get("errorType")), view.get("dbPath"))
                            or "run `qmdbridge index -v` to see the failure"))
    elif status.get("lastError") and status.get("backend") != "qmd":  # qmd's own: below
        out.append(_problem("index", str(status["lastError"]), "run `qmdbridge index -v` to see the failure"))
    fts = status.get("fts") or {}
    if fts and fts.get("available") is False:
        out.append(_problem("FTS5", f"keyword search unavailable: {fts.get('error')}",
                            "use a Python whose SQLite has FTS5"))
    vector = view.get("vector") or {}
    if vector.get("modelMissing"):  # one problem, whatever the failed download said
        out.append(model_missing_problem(str(vector["modelMissing"])))
    elif vector.get("providerError") and status.get("searchMode") != "unavailable":
        out.append(_problem("embedding provider",
                            f"{view.get('provider')} is failing: {vector['providerError']}; "
                            "searches answer from keyword search only"
                            + (f" and {vector.get('pending')} chunks wait for vectors"
                               if vector.get("pending") else ""),
                            "check the provider (endpoint, API key, rate limit); the next sync "
                            "embeds what waits, or set memorySearch.provider to \"none\""))
    if status.get("searchMode") == "unavailable":
        out.append(_problem("embedding provider",
                            str(status.get("providerUnavailableReason") or
                                f"{status.get('requestedProvider')}: unavailable"),
                            'fix the provider settings, or set memorySearch.provider to "auto" or "none"'))
    qmd: dict[str, Any] = backends.get("qmd") or {}
    lost = ((qmd.get("custom") or {}).get("qmd") or {}).get("indexProblem")
    if lost:  # deleted, replaced or corrupt: the builtin engine answers until it is re-indexed
        out.append(_problem("qmd index", f"{lost}; the builtin engine answers meanwhile",
                            "a running serve re-indexes it by itself; else run `qmdbridge qmd update`"))
    mode = qmd.get("searchMode")
    models = ((qmd.get("custom") or {}).get("qmd") or {}).get("modelProblem")
    if models:  # every query/vsearch search falls back at once; the test search (BM25) works
        fix = ("unset CI in the environment qmdbridge runs in" if models.startswith(CI_REFUSAL)
               else "run `qmdbridge warmup` where the model host is reachable")
        out.append(_problem("qmd models", f"qmd {mode} searches cannot run: {models}; the builtin "
                            "engine answers them",
                            f'{fix}, or set memory.qmd.searchMode: "search" (BM25, no models)'))
    breaker: dict[str, Any] = qmd.get("breaker") or {}
    fallback: dict[str, Any] | None = status.get("fallback")
    reason = (fallback or {}).get("reason") or breaker.get("lastFailure") or "qmd failed recently"
    same_cause = bool(models) and reason.startswith(f"qmd {mode} skipped: ")  # listed above
    if qmd and (breaker.get("state") == "open" or fallback) and not same_cause:
        retry = breaker.get("retryInMs")
        when = f" (circuit open, retry in {int(retry) // 1000}s)" if breaker.get("state") == "open" and retry else ""
        out.append(_problem("qmd", f"qmd is not answering: {reason}{when}; the builtin engine answers meanwhile",
                            'qmd crashed: set memory.qmd.searchMode to "search" (BM25, no model '
                            "loaded) or keep `qmdbridge serve` running (models load once)"
                            if CRASH_HINT in reason else
                            "check memory.qmd.command and `qmdbridge qmd collections`, or run "
                            "scripts/install-qmd.sh"))
    elif qmd and qmd.get("healthy") is False and qmd.get("lastError"):
        # status tried a real search (not just --version) and it failed
        out.append(_problem("qmd", f"{QMD_UNHEALTHY}: {qmd['lastError']}",
                            "run the failing qmd command by hand to see its error; reinstall qmd "
                            "(scripts/install-qmd.sh) or fix memory.qmd.command"))
    return out
