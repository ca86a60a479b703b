"""Find the qmd executable, and tell a working qmd from a foreign program or a missing runtime.

Search order for ``memory.qmd.command``'s program: a path (with ``/`` or ``\\``) as given and
nothing else; a bare name in ``PATH``, then ``~/.bun/bin``, ``/opt/homebrew/bin``,
``/usr/local/bin``, the npm global bin, and for ``qmd`` this repository's ``.tools/bin/qmd``.
Each candidate is probed with ``--version``; the first that prints ``qmd <version>`` wins,
else the first failure is reported.
"""

from __future__ import annotations

import errno
import ntpath
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fallback.errors import BackendTimeoutError
from qmdbridge.command_line import is_windows_path, program_of
from qmdbridge.qmd.errors import QmdCommandError
from qmdbridge.qmd.runner import RunResult, run_command

__all__ = ["QmdLocation", "npm_global_prefix", "probe_qmd", "repo_tools_qmd"]

# Deadline of the `qmd --version` probe, in ms.
PROBE_TIMEOUT_MS = 5_000
# Fixed install folders checked after PATH (~/.bun/bin and the npm global bin are added per env).
_FIXED_DIRS = ("/opt/homebrew/bin", "/usr/local/bin")
_VERSION_RE = re.compile(r"^qmd (\d+\.\d+\S*)")
_RUNTIME_MISSING_RE = re.compile(
    r"(env: ['\"\u2018\u2019]?[\w.+-]+['\"\u2018\u2019]?: no such file or directory"
    r"|\b(node|bun): (command )?not found"
    r"|bad interpreter)", re.IGNORECASE)
# Exit status of "command not found" (sh, env).
_EXIT_NOT_FOUND = 127
# Longest excerpt of foreign output quoted in a reason, in chars.
_QUOTE_CHARS = 200


def repo_tools_qmd() -> Path:
    """``<repo>/.tools/bin/qmd`` (written by ``scripts/install-qmd.sh``; may not exist)."""
    return Path(__file__).resolve().parents[2] / ".tools" / "bin" / "qmd"


@dataclass(frozen=True)
class QmdLocation:
    """The outcome of locating and probing qmd.

    Attributes:
        path: the executable chosen (or the first problem found), else ``None``.
        found: an executable file is at ``path``. runtime_ok: its interpreter (node/bun) exists.
        version: qmd's version (``"2.8.3"``) when ``--version`` printed ``qmd <version>``.
        reason: ``None`` for a real qmd, else one line for status and doctor.
        searched: folders searched, in order. path_env: the ``PATH`` searched.
        child_path: ``PATH`` for qmd children (plus the executable's and interpreter's folders).
        skipped: reasons for candidates passed over before the chosen one.
    """

    path: str | None
    found: bool
    runtime_ok: bool
    version: str | None
    reason: str | None
    searched: list[str]
    path_env: str
    child_path: str
    skipped: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        """Whether ``path`` is a real qmd that ran."""
        return self.found and self.runtime_ok and self.version is not None


def _append_dirs(path_env: str, dirs: Sequence[str]) -> str:
    parts = [p for p in path_env.split(os.pathsep) if p]
    for d in dirs:
        if d and d not in parts:
            parts.append(d)
    return os.pathsep.join(parts)


def _interpreter_dir(exe: str, path_env: str) -> str | None:
    """Folder of the interpreter of ``exe``'s shebang (``#!/usr/bin/env node`` -> node's)."""
    try:
        with open(exe, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    interpreter = words[0]
    if os.path.basename(interpreter) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if not names:
            return None
        search = _append_dirs(path_env, [os.path.dirname(exe)])
        found = shutil.which(names[0], path=search)
        return os.path.dirname(found) if found else None
    return os.path.dirname(interpreter) if os.path.isfile(interpreter) else None


def _first_line(text: str) -> str:
    return next((line.strip()[:_QUOTE_CHARS] for line in text.splitlines() if line.strip()), "")


def _candidates(token: str, searched: list[str], *, env: Mapping[str, str], path_env: str, cwd: Path,
                usual_dirs: Sequence[str] | None, repo_tools: bool) -> Iterator[str]:
    """Candidate executables, lazily (the usual folders are worked out only when ``PATH`` has none);
    ``searched`` is filled as folders are seen."""
    if "/" in token or "\\" in token:
        exe = token if os.path.isabs(token) or is_windows_path(token) else os.path.normpath(cwd / token)
        searched.append(ntpath.dirname(exe) if is_windows_path(exe) else os.path.dirname(exe))
        if os.path.isfile(exe):
            yield exe
        return
    seen: set[str] = set()

    def look(folder: str) -> str | None:
        if folder in searched:
            return None
        searched.append(folder)
        exe = os.path.abspath(os.path.join(folder, token))
        if exe in seen or not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            return None
        seen.add(exe)
        return exe

    for folder in [d for d in path_env.split(os.pathsep) if d]:
        if (candidate := look(folder)) is not None:
            yield candidate
    if usual_dirs is None:
        npm_prefix = npm_global_prefix(env, path_env=path_env)
        usual_dirs = [*([os.path.join(env["HOME"], ".bun", "bin")] if env.get("HOME") else []),
                      *_FIXED_DIRS, *([os.path.join(npm_prefix, "bin")] if npm_prefix else [])]
    for folder in usual_dirs:
        if (candidate := look(folder)) is not None:
            yield candidate
    if repo_tools and token == "qmd":
        tools = repo_tools_qmd()
        if look(str(tools.parent)) is not None:
            yield str(tools)


async def _probe_path(exe: str, *, env: Mapping[str, str], path_env: str, cwd: Path,
                      timeout_ms: int) -> QmdLocation:
    """Run ``exe --version`` with ``PATH`` plus its folder and its interpreter's, and classify the answer."""
    interp = _interpreter_dir(exe, path_env)
    child_path = _append_dirs(path_env, [os.path.dirname(exe), *([interp] if interp else [])])

    def loc(*, runtime_ok: bool, version: str | None, reason: str | None) -> QmdLocation:
        return QmdLocation(path=exe, found=True, runtime_ok=runtime_ok, version=version,
                           reason=reason, searched=[], path_env=path_env, child_path=child_path)

    # A missing cwd would also fail the spawn with ENOENT and look like a missing runtime;
    # `--version` reads nothing from the cwd, so probe from "/" then.
    try:
        result = await run_command([exe, "--version"], env={**env, "PATH": child_path, "NO_COLOR": "1"},
                                   cwd=cwd if cwd.is_dir() else Path("/"), timeout_ms=timeout_ms,
                                   max_chars=16_384)
    except QmdCommandError as exc:
        if exc.errno == errno.ENOENT and os.path.isfile(exe):
            return loc(runtime_ok=False, version=None,
                       reason=f"qmd found at {exe} but its runtime (node/bun) is missing: {exc.os_error}")
        return loc(runtime_ok=False, version=None,
                   reason=f"qmd found at {exe} but cannot be started: {exc.os_error}")
    except BackendTimeoutError as exc:
        return loc(runtime_ok=True, version=None,
                   reason=f"qmd at {exe} did not answer --version: {exc.reason}")
    runtime_ok, version, reason = _classify(exe, result)
    return loc(runtime_ok=runtime_ok, version=version, reason=reason)


def npm_global_prefix(env: Mapping[str, str], *, path_env: str) -> str | None:
    """npm's global prefix, worked out as npm does but without running it: ``NPM_CONFIG_PREFIX``,
    ``prefix=`` in the user then the global ``npmrc``, else the folder above the folder of the
    ``node`` on ``path_env``; ``None`` when nothing names one. ``env``'s ``HOME`` expands ``~``."""
    home = env.get("HOME") or os.path.expanduser("~")

    def expand(value: str) -> str:
        value = re.sub(r"\$\{([^}]+)\}", lambda m: env.get(m.group(1), ""), value)
        return home + value[1:] if value == "~" or value.startswith("~/") else value

    for key in ("NPM_CONFIG_PREFIX", "npm_config_prefix"):
        if env.get(key):
            return expand(env[key])
    user = env.get("NPM_CONFIG_USERCONFIG") or env.get("npm_config_userconfig") or os.path.join(home, ".npmrc")
    found = _npmrc_prefix(expand(user))
    node = shutil.which("node", path=path_env)
    default = os.path.dirname(os.path.dirname(os.path.realpath(node))) if node else None
    if found is None:
        glob = env.get("NPM_CONFIG_GLOBALCONFIG") or env.get("npm_config_globalconfig") or (
            os.path.join(default, "etc", "npmrc") if default else None)
        found = _npmrc_prefix(expand(glob)) if glob else None
    return expand(found) if found else default


def _npmrc_prefix(path: str) -> str | None:
    """The ``prefix`` an ``.npmrc`` sets (the last one wins, as in npm), or ``None``."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    prefix = None
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "prefix":
            prefix = value.strip().strip("\"'") or None
    return prefix


def _classify(exe: str, result: RunResult) -> tuple[bool, str | None, str | None]:
    """``(runtime_ok, version, reason)`` for a finished ``--version`` run."""
    match = _VERSION_RE.match(result.stdout.strip())
    if result.ok and match:
        return True, match.group(1), None
    stderr_line = _first_line(result.stderr)
    if result.returncode == _EXIT_NOT_FOUND or _RUNTIME_MISSING_RE.search(result.stderr):
        detail = stderr_line or f"exit code {result.returncode}"
        return False, None, f"qmd found at {exe} but its runtime (node/bun) is missing: {detail}"
    if result.signal is not None:  # killed while answering (OOM killer, a user): not foreign
        return True, None, f"qmd at {exe} was ended by signal {result.signal} answering --version"
    printed = _first_line(result.stdout) or stderr_line
    return True, None, f"foreign program at {exe}: --version printed '{printed}'"


async def probe_qmd(command: str | Sequence[str] = "qmd", *, env: Mapping[str, str] | None = None,
                    repo_tools: bool = True, usual_dirs: Sequence[str] | None = None,
                    cwd: Path | str | None = None,
                    timeout_ms: int = PROBE_TIMEOUT_MS) -> QmdLocation:
    """Locate ``command`` (``memory.qmd.command``) in ``env`` (default ``os.environ``) and probe each
    candidate until a real qmd answers: ``repo_tools`` also tries this repository's
    ``.tools/bin/qmd``, ``usual_dirs`` replaces the usual install folders, ``cwd`` resolves
    relative paths, ``timeout_ms`` bounds each ``--version`` probe (ms).

    Returns:
        A :class:`QmdLocation`: the real qmd's, else the first failing candidate's, else a
        not-found one; problems are in ``reason``, never raised.
    """
    env = dict(os.environ if env is None else env)
    path_env = env.get("PATH") or os.defpath
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    token = program_of(command)
    searched: list[str] = []
    skipped: list[str] = []
    first_bad: QmdLocation | None = None
    for exe in _candidates(token, searched, env=env, path_env=path_env, cwd=cwd,
                           usual_dirs=usual_dirs, repo_tools=repo_tools):
        location = await _probe_path(exe, env=env, path_env=path_env, cwd=cwd, timeout_ms=timeout_ms)
        if location.usable:
            return replace(location, searched=list(searched), skipped=skipped)
        skipped.append(location.reason or f"unusable: {exe}")
        first_bad = first_bad or location
    if first_bad is not None:
        return replace(first_bad, searched=searched, skipped=skipped[1:])
    return QmdLocation(path=None, found=False, runtime_ok=False, version=None,
                       reason=f"qmd not found (command {token!r}); searched: " + ", ".join(searched),
                       searched=searched, path_env=path_env, child_path=path_env)
