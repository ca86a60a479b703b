"""memory.qmd.command on Windows and POSIX: drive and UNC paths kept verbatim, the list form,
and the cmd.exe line for .cmd/.bat scripts (unit level: no Windows machine here)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fallback.errors import ConfigError
from qmdbridge.command_line import (
    batch_command,
    is_batch_script,
    is_windows_path,
    program_of,
    split_command,
)
from qmdbridge.config import parse_config
from qmdbridge.qmd.locate import probe_qmd


@pytest.mark.parametrize(("command", "words"), [
    ("C:\\Program Files\\qmd\\qmd.cmd", ["C:\\Program Files\\qmd\\qmd.cmd"]),
    ("D:\\tools\\qmd.exe --index main", ["D:\\tools\\qmd.exe", "--index", "main"]),
    ("\\\\fileserver\\tools\\qmd.exe", ["\\\\fileserver\\tools\\qmd.exe"]),
    ("\\\\fileserver\\Shared Tools\\qmd.bat --no-gpu", ["\\\\fileserver\\Shared Tools\\qmd.bat", "--no-gpu"]),
    ("C:/Users/Ann Lee/AppData/Roaming/npm/qmd.CMD", ["C:/Users/Ann Lee/AppData/Roaming/npm/qmd.CMD"]),
    ('"C:\\Program Files\\qmd\\qmd" --no-gpu', ["C:\\Program Files\\qmd\\qmd", "--no-gpu"]),
    ("C:\\tools\\qmd --index main", ["C:\\tools\\qmd", "--index", "main"]),
    ("C:\\Program Files\\qmd\\qmd", ["C:\\Program Files\\qmd\\qmd"]),
    ('"/opt/QMD Tools/qmd" --x', ["/opt/QMD Tools/qmd", "--x"]),
    ("qmd", ["qmd"]),
    ("   ", ["qmd"]),
    ('"/opt/unbalanced --x', ['"/opt/unbalanced', "--x"]),
    (["C:\\Program Files\\qmd\\qmd.cmd", "--no-gpu"], ["C:\\Program Files\\qmd\\qmd.cmd", "--no-gpu"]),
    (["/usr/bin/qmd"], ["/usr/bin/qmd"]),
])
def test_split_command(command: str | list[str], words: list[str]) -> None:
    assert split_command(command) == words
    assert program_of(command) == words[0]


def test_posix_shlex_mangles_windows_paths_that_split_command_keeps() -> None:
    """The failure: POSIX shell words read backslashes as escapes."""
    assert shlex.split("C:\\Program Files\\qmd\\qmd.cmd") == ["C:Program", "Filesqmdqmd.cmd"]
    assert program_of("C:\\Program Files\\qmd\\qmd.cmd") == "C:\\Program Files\\qmd\\qmd.cmd"


def test_windows_path_and_batch_detection() -> None:
    assert [is_windows_path(p) for p in ("C:\\x", "c:/x", "\\\\h\\s\\x", "/usr/bin/qmd", "qmd", "C:x")] == [
        True, True, True, False, False, False]
    assert [is_batch_script(p) for p in ("a\\qmd.cmd", "A\\QMD.BAT", "qmd.exe", "/usr/bin/qmd")] == [
        True, True, False, False]


def test_batch_arguments_are_quoted_and_escaped_for_cmd() -> None:
    """Every argument is one quoted word with cmd's metacharacters caret-escaped twice (cmd
    reads the line, then the batch file's %* once more), so `&` cannot start a command."""
    assert batch_command("C:\\Program Files\\qmd\\qmd.cmd", ["search", "a & del x"]) == (
        'C:\\Program^ Files\\qmd\\qmd.cmd ^^^"search^^^" ^^^"a^^^ ^^^&^^^ del^^^ x^^^"')
    # MSVCRT rules: an inner quote is escaped, backslashes before it and at the end doubled
    assert batch_command("q.cmd", ['say "hi"\\']) == 'q.cmd ^^^"say^^^ \\^^^"hi\\^^^"\\\\^^^"'
    assert batch_command("q.cmd", ["50%", "!x!", "a|b", "(c)"]) == (
        'q.cmd ^^^"50^^^%^^^" ^^^"^^^!x^^^!^^^" ^^^"a^^^|b^^^" ^^^"^^^(c^^^)^^^"')


def test_config_accepts_the_list_form_and_windows_strings() -> None:
    listed = parse_config({"memory": {"qmd": {"command": ["C:\\Program Files\\qmd\\qmd.cmd", "--no-gpu"]}}})
    assert program_of(listed.memory.qmd.command) == "C:\\Program Files\\qmd\\qmd.cmd"
    assert split_command(listed.memory.qmd.command) == ["C:\\Program Files\\qmd\\qmd.cmd", "--no-gpu"]
    text = parse_config({"memory": {"qmd": {"command": "D:\\tools\\qmd.exe --index main"}}})
    assert program_of(text.memory.qmd.command) == "D:\\tools\\qmd.exe"
    with pytest.raises(ConfigError) as info:
        parse_config({"memory": {"qmd": {"command": ["", " "]}}})
    assert info.value.key == "memory.qmd.command"
    with pytest.raises(ConfigError) as info:
        parse_config({"memory": {"qmd": {"command": 7}}})
    assert info.value.key == "memory.qmd.command"


@pytest.mark.anyio
@pytest.mark.parametrize(("command", "folder"), [
    ("C:\\Program Files\\qmd\\qmd.cmd", "C:\\Program Files\\qmd"),
    (["\\\\fileserver\\tools\\qmd.exe", "--no-gpu"], "\\\\fileserver\\tools\\"),  # the share root
])
async def test_locate_treats_a_windows_path_as_a_path_not_a_name(
        tmp_path: Path, command: str | list[str], folder: str) -> None:
    """Not looked up on PATH under a mangled name: the path itself is the only candidate."""
    location = await probe_qmd(command, env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
                               repo_tools=False, usual_dirs=[], cwd=tmp_path)
    assert location.searched == [folder]
    assert location.reason == f"qmd not found (command {program_of(command)!r}); searched: {folder}"
