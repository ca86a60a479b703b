"""Running the ``qmdbridge`` command for the tests: in a child process (:func:`run_cli`) where
process start-up, imports, signals or process lifetimes are what a test is about, else in this
process (:func:`run_cli_in_process`), which gives the same exit code and output bytes without
starting an interpreter."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


def without_progress(stderr: str) -> str:
    """``stderr`` without the sync's progress lines (``indexing: ...``), which a sync shows once it
    runs past a second: on a loaded machine also a first index of a few notes."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("indexing: "))


def cli_argv(args: list[str]) -> list[str]:
    """The argv of ``qmdbridge <args>``: the installed console script, else this Python running
    the CLI's ``main``."""
    exe = shutil.which("qmdbridge")
    return [exe, *args] if exe else [
        sys.executable, "-c", "import sys; from qmdbridge.cli.main import main; sys.exit(main())", *args]


def run_cli(args: list[str], env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``qmdbridge <args>`` to its end (at most 120 s), output captured as bytes."""
    return subprocess.run(cli_argv(args), env=env, capture_output=True, timeout=120, input=stdin)


@contextlib.contextmanager
def _process_state(env: Mapping[str, str], cwd: Path | None) -> Iterator[None]:
    """``os.environ`` replaced by ``env`` and the working folder by ``cwd`` (when given) for the
    block, as a child process would have them, and the standard library's cached temporary
    folder forgotten (a child picks it from its ``TMPDIR``); all put back afterwards."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_tempdir = tempfile.tempdir
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        tempfile.tempdir = saved_tempdir


def run_cli_in_process(args: Sequence[str], env: Mapping[str, str], *, cwd: Path | None = None,
                       stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run ``qmdbridge <args>`` by calling ``qmdbridge.cli.main.main`` in this process, with
    ``env`` as the whole environment, ``cwd`` as the working folder and ``stdin`` as its input;
    stdout and stderr are captured as the bytes a child process would write (UTF-8, stderr with
    ``backslashreplace``). An exception that escapes ``main`` is printed to stderr as Python
    would print it and gives exit code 1, a ``SystemExit`` its code.

    Returns:
        ``CompletedProcess(args, returncode, stdout, stderr)``, the shape :func:`run_cli` returns.
    """
    out, err = io.BytesIO(), io.BytesIO()
    streams = (io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"),
               io.TextIOWrapper(out, encoding="utf-8", write_through=True),
               io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True))
    saved = sys.stdin, sys.stdout, sys.stderr
    with _process_state(env, cwd):
        sys.stdin, sys.stdout, sys.stderr = streams
        try:
            from qmdbridge.cli.main import main

            code = main(list(args))
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except Exception:  # the interpreter's edge: print the traceback, exit 1
            import traceback

            traceback.print_exc(file=sys.stderr)
            code = 1
        finally:
            for stream in streams[1:]:
                stream.flush()
            sys.stdin, sys.stdout, sys.stderr = saved
    return subprocess.CompletedProcess(["qmdbridge", *args], code, out.getvalue(), err.getvalue())


def _exit_code(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``: 0 for ``None``, an int as it is, else
    1 (after printing the value to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1
