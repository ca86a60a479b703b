"""``memory.qmd.command`` as a program and its arguments, on POSIX and on Windows.

A list is used as given. A string starting with a Windows drive or UNC path keeps the path
verbatim (POSIX ``shlex.split`` would eat its backslashes) up to the first word ending in
``.exe``/``.cmd``/``.bat``/``.com``, else up to the first `` -`` flag, else whole. Any other
string is split into POSIX shell words, as the reference does. :func:`batch_command` builds
the ``cmd.exe /c`` line of a ``.cmd``/``.bat`` script so no argument can start a second command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

__all__ = [
    "batch_command",
    "is_batch_script",
    "is_windows_path",
    "program_of",
    "split_command",
]

_WINDOWS_PATH_RE = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\[^\\/\s]+[\\/])")
_WINDOWS_EXE_RE = re.compile(r"^(.+?\.(?:exe|cmd|bat|com))(?=\s|$)", re.IGNORECASE)
_FLAG_START_RE = re.compile(r"\s+(?=-)")
# cmd.exe metacharacters that must be caret-escaped outside a quoted span it can see.
_CMD_META_RE = re.compile(r'([()\][%!^"`<>&|;, *?])')


def is_windows_path(text: str) -> bool:
    """Whether ``text`` starts with a Windows drive (``C:\\``, ``C:/``) or UNC (``\\\\host\\``)
    path."""
    return bool(_WINDOWS_PATH_RE.match(text.strip()))


def split_command(command: str | Sequence[str]) -> list[str]:
    """``memory.qmd.command`` -> ``[program, *arguments]`` (see the module docstring);
    ``["qmd"]`` for an empty command; an unbalanced quote falls back to whitespace splitting."""
    if not isinstance(command, str):
        words = [str(w) for w in command if str(w).strip()]
        return words or ["qmd"]
    text = command.strip()
    if not text:
        return ["qmd"]
    if text[0] in "\"'" and is_windows_path(text[1:]):
        end = text.find(text[0], 1)
        if end > 0:
            return [text[1:end], *text[end + 1:].split()]
    if is_windows_path(text):
        exe = _WINDOWS_EXE_RE.match(text)
        if exe:
            return [exe.group(1), *text[exe.end():].split()]
        flag = _FLAG_START_RE.search(text)
        if flag:
            return [text[:flag.start()], *text[flag.end():].split()]
        return [text]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return words or ["qmd"]


def program_of(command: str | Sequence[str]) -> str:
    """The program of ``memory.qmd.command`` (the first item of :func:`split_command`)."""
    return split_command(command)[0]


def is_batch_script(program: str) -> bool:
    """Whether Windows must run ``program`` through ``cmd.exe`` (a ``.cmd`` or ``.bat`` file)."""
    return program.lower().endswith((".cmd", ".bat"))


def _quote_for_cmd(arg: str) -> str:
    """One argument for a batch script: MSVCRT-quoted, then every cmd metacharacter
    caret-escaped twice (cmd reads the line once, and the batch file's ``%*`` once more)."""
    # MSVCRT rules: backslashes before a quote are doubled and the quote escaped; trailing
    # backslashes are doubled before the closing quote.
    quoted = re.sub(r'(\\*)"', r'\1\1\\"', arg)
    quoted = re.sub(r"(\\*)$", r"\1\1", quoted)
    quoted = f'"{quoted}"'
    once = _CMD_META_RE.sub(r"^\1", quoted)
    return _CMD_META_RE.sub(r"^\1", once)


def batch_command(script: str, args: Sequence[str]) -> str:
    """What ``cmd.exe /c`` must run for a ``.cmd``/``.bat`` ``script`` with ``args``: the
    script path caret-escaped, then each argument quoted and escaped (:func:`_quote_for_cmd`),
    so ``a & del x`` stays one argument.

    Source: the Microsoft C runtime's argument rules ("Parsing C command-line arguments") and
    cross-spawn's double caret escaping for batch files (``lib/util/escape.js``).
    """
    return " ".join([_CMD_META_RE.sub(r"^\1", script), *(_quote_for_cmd(a) for a in args)])
