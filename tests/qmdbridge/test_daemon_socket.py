"""The warm daemon: ``qmdbridge serve`` listens on ``<stateDir>/daemon/<agent>.sock`` and the CLI's
``search``/``get``/``status`` find it by themselves, or work in-process when it serves something else."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from qmdbridge.config import load_config, resolve_agent
from qmdbridge.server import wire
from qmdbridge.server.socket_listener import identity_for
from tests.e2e.cli_proc import cli_argv, run_cli_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import DEADLINE_S, cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = pytest.mark.slow  # each test starts a qmdbridge serve daemon


def cli(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` as a client, run in this process (the daemon is a real ``serve``)."""
    return run_cli_in_process(args, env, cwd=cwd)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ws = make_workspace(tmp_path)
    return ws, cli_env(tmp_path / "state", tmp_path / "home")


@pytest.fixture
def daemon(setup: tuple[Path, dict[str, str]]):  # type: ignore[no-untyped-def]
    ws, env = setup
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    yield proc
    if proc.poll() is None:
        assert stop(proc, signal.SIGTERM) == 0


def test_search_get_status_are_served_by_the_daemon(setup: tuple[Path, dict[str, str]],
                                                     daemon: subprocess.Popen[bytes]) -> None:
    ws, env = setup
    sock = Path(env["OPENCLAW_STATE_DIR"]) / "daemon" / "main.sock"
    assert stat.S_ISSOCK(sock.lstat().st_mode) and stat.S_IMODE(sock.lstat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    p = cli(["search", "Kestrel migration", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["servedBy"] == "daemon" and doc["backend"] == "builtin"
    # the client prints with the standard library, byte for byte what emit_json (orjson) prints
    assert p.stdout == orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"
    hit = doc["results"][0]
    assert (hit["path"], hit["startLine"], hit["endLine"]) == ("memory/2026-01-05.md", 1, 4)
    assert hit["citation"] == "memory/2026-01-05.md#L1-L4"
    plain = cli(["search", "Kestrel migration", "--workspace", str(ws)], env)
    assert plain.stdout.decode().splitlines()[0].endswith(" memory/2026-01-05.md:1-4")
    page = orjson.loads(cli(["get", "MEMORY.md", "--from", "4", "--lines", "1", "--workspace", str(ws),
                             "--json"], env).stdout)
    assert page["servedBy"] == "daemon" and page["text"].startswith("- Coffee: flat white, no sugar.\n")
    assert cli(["get", "MEMORY.md", "--from", "4", "--lines", "1", "--workspace", str(ws)], env).stdout \
        .startswith(b"- Coffee: flat white, no sugar.\n")
    refused = cli(["get", "../secrets.md", "--workspace", str(ws), "--json"], env)
    assert refused.returncode == 3
    assert orjson.loads(refused.stdout) == {"error": "path refused: '../secrets.md': parent segment",
                                            "errorType": "PathRefusedError", "exitCode": 3}
    os.mkfifo(ws / "memory" / "queue.md")  # named like a note: refused, never opened for a blocking read
    for path, reason in (("./.", "not a memory path"), ("memory/queue.md", "not a regular file")):
        refused = cli(["get", path, "--workspace", str(ws), "--json"], env)
        assert (refused.returncode, orjson.loads(refused.stdout)) == (3, {
            "error": f"path refused: {path!r}: {reason}", "errorType": "PathRefusedError", "exitCode": 3})
    status = orjson.loads(cli(["status", "--workspace", str(ws), "--json"], env).stdout)
    assert status["servedBy"] == "daemon" and status["files"] == 2
    # a missing memory file: the tool answers empty text, the command exits 4 (in-process)
    missing = cli(["get", "memory/2030-01-01.md", "--workspace", str(ws), "--json"], env)
    alone = cli(["get", "memory/2030-01-01.md", "--workspace", str(ws), "--json"], {**env, "QMDBRIDGE_DAEMON": "off"})
    assert missing.returncode == alone.returncode == 4 and missing.stdout == alone.stdout
    # an error other than a refused path is left to the in-process run: same message and exit code
    blank = cli(["search", "  ", "--workspace", str(ws), "--json"], env)
    assert blank.returncode == 2 and orjson.loads(blank.stdout)["error"] == "query must not be empty"


def test_a_stopped_daemon_is_named_and_the_command_answers_in_process(setup: tuple[Path, dict[str, str]],
                                                                     daemon: subprocess.Popen[bytes]) -> None:
    """A daemon that accepts a connection but never takes the request (stopped by SIGSTOP) costs
    the handshake's wait, not the reply's 120 s: the command names it on stderr (pid, socket,
    what to do) and answers in-process, exit 0, as it does without a daemon."""
    ws, env = setup
    sock = Path(env["OPENCLAW_STATE_DIR"]) / "daemon" / "main.sock"
    args = ["search", "Kestrel migration", "--workspace", str(ws), "--json"]
    alone = cli(args, {**env, "QMDBRIDGE_DAEMON": "off"})
    daemon.send_signal(signal.SIGSTOP)
    try:
        assert os.WIFSTOPPED(os.waitpid(daemon.pid, os.WUNTRACED)[1])  # returns once it is stopped
        stopped = cli(args, env)
    finally:
        daemon.send_signal(signal.SIGCONT)
    assert (stopped.returncode, stopped.stdout) == (0, alone.stdout) and alone.returncode == 0
    assert stopped.stderr.decode() == (
        f"qmdbridge: the daemon (pid {daemon.pid}, socket {sock}) took no request in 5 s, stopped or hung: "
        f"answered in-process; `kill -CONT {daemon.pid}` resumes a stopped daemon, `kill {daemon.pid}` ends a "
        "hung one (then start `qmdbridge serve` again)\n")
    assert orjson.loads(cli(args, env).stdout)["servedBy"] == "daemon"  # resumed, it serves again


def test_an_argument_of_bytes_that_are_not_utf8_runs_in_process(setup: tuple[Path, dict[str, str]],
                                                               daemon: subprocess.Popen[bytes]) -> None:
    """A query or path holding bytes that are not UTF-8 (a shell passes a file name's bytes as
    they are; Python reads them as surrogate escapes) cannot travel as JSON: the command runs
    in-process, as it does without a daemon, instead of failing with a traceback."""
    ws, env = setup
    for args in (["search", "Kestrel migration \udcff", "--json"], ["get", "memory/caf\udce9.md", "--json"]):
        served = cli([*args, "--workspace", str(ws)], env)
        alone = cli([*args, "--workspace", str(ws)], {**env, "QMDBRIDGE_DAEMON": "off"})
        assert (served.returncode, served.stdout) == (alone.returncode, alone.stdout), served.stderr
    assert orjson.loads(served.stdout)["error"] == (
        "path refused: 'memory/caf\\udce9.md': invalid characters (a file name that is not UTF-8 is "
        "written with \\xHH escapes, as search cites it: memory/caf\\xe9.md)")
    assert orjson.loads(alone.stdout)["error"] == orjson.loads(served.stdout)["error"]


def test_the_served_client_imports_no_pydantic_anyio_or_engine(setup: tuple[Path, dict[str, str]],
                                                                daemon: subprocess.Popen[bytes]) -> None:
    ws, env = setup
    probe = ("import sys\nfrom qmdbridge.cli.main import main\n"
             f"code = main(['search', 'Kestrel', '--workspace', {str(ws)!r}, '--json'])\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'anyio', 'mcp')"
             " or m.startswith('fallback.engine') or m == 'qmdbridge.manager')\n"
             "sys.stderr.write(repr((code, heavy)))\n")
    p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=DEADLINE_S)
    assert p.stderr.decode() == "(0, [])"
    assert orjson.loads(p.stdout)["servedBy"] == "daemon"


def test_another_workspace_agent_or_changed_config_runs_in_process(tmp_path: Path,
                                                                    setup: tuple[Path, dict[str, str]],
                                                                    daemon: subprocess.Popen[bytes]) -> None:
    ws, env = setup
    other = make_workspace(tmp_path / "other")
    (other / "memory" / "2026-01-05.md").write_text("# 2026-01-05\n\n- Kestrel is paused.\n")
    p = orjson.loads(cli(["search", "Kestrel", "--workspace", str(other), "--json"], env).stdout)
    assert p["servedBy"] == "process" and p["results"][0]["endLine"] == 3
    # another agent is not served by main's daemon; without agents.list only "main" exists, so
    # the in-process run names the known agents
    ops = cli(["status", "--workspace", str(ws), "--agent", "ops", "--json"], env)
    assert ops.returncode == 2
    assert orjson.loads(ops.stdout)["error"] == "unknown agent 'ops' (known: main)"
    # a relative --workspace resolves against the caller's cwd, like in-process
    rel = orjson.loads(cli(["status", "--workspace", "ws", "--json"], env, cwd=ws.parent).stdout)
    assert rel["servedBy"] == "daemon"
    cfg = Path(env["OPENCLAW_STATE_DIR"]) / "openclaw.json"  # the default config appears after start
    cfg.write_text("{memory: {citations: 'off'}}")
    changed = orjson.loads(cli(["search", "Kestrel", "--workspace", str(ws), "--json"], env).stdout)
    assert changed["servedBy"] == "process" and changed["citations"] == "off"
    off = orjson.loads(cli(["status", "--workspace", str(ws), "--json"], {**env, "QMDBRIDGE_DAEMON": "off"}).stdout)
    assert off["servedBy"] == "process"


def test_a_killed_daemon_leaves_a_stale_socket_that_the_cli_removes(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    sock = Path(env["OPENCLAW_STATE_DIR"]) / "daemon" / "main.sock"
    assert stop(proc, signal.SIGKILL) == -signal.SIGKILL
    assert sock.exists()
    p = cli(["search", "Kestrel", "--workspace", str(ws), "--json"], env)
    assert p.returncode == 0 and orjson.loads(p.stdout)["servedBy"] == "process"
    assert not os.path.lexists(sock)
    # a new daemon over a stale socket replaces it
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    try:
        sock_stat = sock.lstat()
        assert orjson.loads(cli(["status", "--workspace", str(ws), "--json"], env).stdout)["servedBy"] == "daemon"
        second, lines = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="backend builtin")
        # the second daemon finds the first alive and runs without a socket
        rest = stop(second, signal.SIGTERM)
        assert rest == 0
        assert sock.lstat().st_ino == sock_stat.st_ino
        assert orjson.loads(cli(["status", "--workspace", str(ws), "--json"], env).stdout)["servedBy"] == "daemon"
    finally:
        assert stop(proc, signal.SIGTERM) == 0
    assert not os.path.lexists(sock)
    assert live_children() == []



def test_sighup_stops_the_daemon_as_sigterm_does(setup: tuple[Path, dict[str, str]]) -> None:
    """A closed terminal's SIGHUP stops ``serve`` cleanly: exit 0, the socket removed, the last
    stderr line ``stopped`` (by default it killed the process and left its children)."""
    ws, env = setup
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    sock = Path(env["OPENCLAW_STATE_DIR"]) / "daemon" / "main.sock"
    assert sock.exists()
    proc.send_signal(signal.SIGHUP)
    assert proc.stderr is not None
    rest = proc.stderr.read().decode().splitlines()
    assert stop(proc) == 0
    assert rest[-1:] == ["qmdbridge serve: stopped"]
    assert not os.path.lexists(sock)
    assert live_children() == []

def test_a_peer_with_another_uid_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another uid")
    root = Path(tempfile.mkdtemp(prefix="qmdb-peer-", dir="/tmp"))
    try:
        os.chmod(root, 0o711)
        ws = make_workspace(tmp_path)
        env = cli_env(root / "state", tmp_path / "home")
        proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
        try:
            sock = root / "state" / "daemon" / "main.sock"
            os.chmod(root / "state", 0o711)
            os.chmod(sock.parent, 0o711)  # opened on purpose: the uid check must hold on its own
            os.chmod(sock, 0o666)
            child = ("import os, socket, sys\nos.setgid(65534); os.setuid(65534)\n"
                     "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                     "try:\n    s.sendall(b'{\"id\": 1, \"tool\": \"status\"}\\n')\nexcept OSError:\n    pass\n"
                     "sys.stdout.buffer.write(s.recv(65536))\n")
            out = subprocess.run([sys.executable, "-c", child, str(sock)], capture_output=True,
                                 timeout=DEADLINE_S)
            assert out.returncode == 0, out.stderr
            assert orjson.loads(out.stdout) == {"id": None, "error": "refused: peer uid 65534 is not the daemon's owner"}
            own = socket.socket(socket.AF_UNIX)
            own.connect(str(sock))
            own.sendall(b'{"id": 6, "tool": "sync"}\n{"id": 7, "tool": "status"}\n')
            reply = b""
            while reply.count(b"\n") < 2:
                reply += own.recv(65536)
            own.close()
            synced, status = (orjson.loads(line) for line in reply.splitlines())
            assert synced == {"id": 6, "result": {"ok": True}, "keywordNotice": True,
                              "configWarnings": []}
            assert status["id"] == 7 and status["result"]["files"] == 2
        finally:
            assert stop(proc, signal.SIGTERM) == 0
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_long_state_dir_paths_go_through_proc_fd(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "state"
    ws = make_workspace(tmp_path)
    env = cli_env(deep, tmp_path / "home")
    sock = deep / "daemon" / "main.sock"
    assert len(str(sock)) > 108
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    try:
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert orjson.loads(cli(["status", "--workspace", str(ws), "--json"], env).stdout)["servedBy"] == "daemon"
    finally:
        assert stop(proc, signal.SIGTERM) == 0
    assert not os.path.lexists(sock)


def test_fingerprint_rules_agree_with_config(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json5"
    cfg.write_text("{agents: {list: [{id: 'Ops', default: true, workspace: '" + str(tmp_path / "ops-ws") + "'}]}}")
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    agent = resolve_agent(load_config(cfg, env=env), None, env=env)
    os.environ["OPENCLAW_STATE_DIR"], old_state = env["OPENCLAW_STATE_DIR"], os.environ.get("OPENCLAW_STATE_DIR")
    try:
        ident = identity_for(agent, config=str(cfg), backend=None)
    finally:
        if old_state is None:
            del os.environ["OPENCLAW_STATE_DIR"]
        else:
            os.environ["OPENCLAW_STATE_DIR"] = old_state
    fp = wire.client_fingerprint(agent=None, workspace=None, config=str(cfg), backend=None, env=env)
    assert ident.agent_id == "ops" and ident.mismatch(fp) is None
    assert ident.mismatch({**fp, "agent": " OPS "}) is None
    assert ident.mismatch({**fp, "agent": "main"}) == "agent differs"
    assert ident.mismatch({**fp, "agent": "../x"}) == "invalid agent id"
    assert ident.mismatch({**fp, "workspace": str(tmp_path / "elsewhere")}) == "workspace differs"
    assert ident.mismatch({**fp, "workspace": str(tmp_path / "ops-ws")}) is None
    assert ident.mismatch({**fp, "backend": "qmd"}) == "backend differs"
    assert ident.mismatch({**fp, "backend": "builtin"}) is None
    assert ident.mismatch({**fp, "configStamp": "0:0:0"}) == "config file differs or changed since the daemon started"
    assert ident.mismatch({**fp, "stateDir": "/elsewhere"}) == "state dir differs"
    cfg.write_text(cfg.read_text() + "\n// edited\n")  # size and mtime change
    edited = wire.client_fingerprint(agent=None, workspace=None, config=str(cfg), backend=None, env=env)
    assert ident.mismatch(edited) == "config file differs or changed since the daemon started"


def test_a_variable_the_config_references_is_part_of_its_stamp(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json5"
    cfg.write_text('{agents: {defaults: {workspace: "${AGENT_HOME}/ws", memorySearch: {remote: '
                   '{apiKey: "$${LITERAL}"}}}}}')
    state = str(tmp_path / "state")
    path, a = wire.config_identity(str(cfg), state, {"AGENT_HOME": "/a", "LITERAL": "x", "OTHER": "1"})
    st = cfg.stat()
    assert (path, a) == (str(cfg), f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:env "
                                   f"{zlib.crc32(b'AGENT_HOME=/a'):08x}")
    assert wire.config_identity(str(cfg), state, {"AGENT_HOME": "/a"})[1] == a  # only what it names
    assert wire.config_identity(str(cfg), state, {"AGENT_HOME": "/b"})[1] != a
    assert wire.config_identity(str(cfg), state, {})[1] != a
    cfg.write_text("{}")
    st = cfg.stat()
    assert wire.config_identity(str(cfg), state, {"AGENT_HOME": "/a"})[1] == (
        f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")


def test_concurrent_clients_each_get_their_own_answer(setup: tuple[Path, dict[str, str]],
                                                       daemon: subprocess.Popen[bytes]) -> None:
    import threading

    from qmdbridge.cli.daemon_client import exchange

    ws, env = setup
    sock = wire.socket_path(env["OPENCLAW_STATE_DIR"], "main")
    fp = wire.client_fingerprint(agent=None, workspace=str(ws), config=None, backend=None, env=env)
    queries = {"Kestrel migration": "memory/2026-01-05.md", "flat white": "MEMORY.md"}
    answers: dict[int, Any] = {}

    def ask(i: int) -> None:
        query = list(queries)[i % 2]
        answers[i] = (query, exchange(sock, {"id": i, "tool": "memory_search", "params": {"query": query},
                                             "fingerprint": fp}))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == list(range(16))
    for i, (query, reply) in answers.items():
        assert reply["id"] == i and reply["result"]["results"][0]["path"] == queries[query]
    other = exchange(sock, {"id": 99, "tool": "status", "fingerprint": {**fp, "agent": "ops"}})
    assert other == {"id": 99, "mismatch": "agent differs"}


def test_serve_without_socket(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    proc, _ = start(["serve", "--no-socket", "--workspace", str(ws)], env, ready="qmdbridge serve: agent main",
                    stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    # serve reads stdin only once its socket (if any) is listening: an answer here means "ready"
    proc.stdin.write(b'{"id": 1, "tool": "status"}\n')
    proc.stdin.flush()
    assert orjson.loads(proc.stdout.readline())["id"] == 1
    try:
        assert not os.path.lexists(wire.socket_path(env["OPENCLAW_STATE_DIR"], "main"))
        status = orjson.loads(cli(["status", "--workspace", str(ws), "--json"], env).stdout)
        assert status["servedBy"] == "process"
    finally:
        proc.stdin.close()
        assert stop(proc) == 0


def test_the_fast_path_parser_is_the_full_parsers_subcommand() -> None:
    import argparse

    from qmdbridge.cli.daemon_client import DAEMON_COMMANDS
    from qmdbridge.cli.main import build_parser

    def sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices[name]

    full = build_parser()
    for name in DAEMON_COMMANDS:
        alone = build_parser(name)
        assert sub(alone, name).format_help() == sub(full, name).format_help()
        assert list(sub(alone, name)._option_string_actions) == list(sub(full, name)._option_string_actions)
    args = build_parser("search").parse_args(["search", "x", "--max-results", "3", "--json"])
    assert (args.command, args.query, args.max_results, args.json) == ("search", "x", 3, True)


@pytest.mark.parametrize("columns", ["60", "132", "0", "wide", None])
def test_help_is_as_wide_as_argparse_makes_it(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    # the CLI's formatters size themselves without importing shutil; argparse's own must agree
    import argparse

    from qmdbridge.cli.main import _HelpFormatter, _RawDescriptionFormatter

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    for ours, stock in ((_HelpFormatter, argparse.HelpFormatter),
                        (_RawDescriptionFormatter, argparse.RawDescriptionHelpFormatter)):
        a, b = ours("qmdbridge"), stock("qmdbridge")
        assert (a._width, a._max_help_position) == (b._width, b._max_help_position)
        text = "one line\n  kept as written"
        assert a._fill_text(text, 40, "") == b._fill_text(text, 40, "")


def test_explain_and_warnings_print_the_same_served_or_not(setup: tuple[Path, dict[str, str]],
                                                          daemon: subprocess.Popen[bytes]) -> None:
    ws, env = setup
    explained = cli(["search", "Kestrel migration", "--explain", "--workspace", str(ws), "--json"], env)
    doc = orjson.loads(explained.stdout)
    assert doc["servedBy"] == "process" and doc["results"][0]["explain"]["rank"] == 1
    served = cli(["search", "Kestrel migration", "--workspace", str(ws)], env)
    alone = cli(["search", "Kestrel migration", "--workspace", str(ws)], {**env, "QMDBRIDGE_DAEMON": "off"})
    assert served.returncode == alone.returncode == 0
    assert served.stdout == alone.stdout and served.stderr == alone.stderr
    assert served.stdout.startswith(b"1.000 memory/2026-01-05.md:1-4\n# 2026-01-05\n")


def test_a_reply_line_over_the_limit_or_a_socket_that_is_no_daemon_answers_in_process(
        setup: tuple[Path, dict[str, str]]) -> None:
    """What sits at the daemon's socket path and answers no request line (a peer replying with a
    line longer than ``MAX_LINE_BYTES``, with a line that is no JSON object, or with nothing; a
    regular file; a socket this process may not connect to) costs nothing but the attempt: the command answers in-process, exit 0, stderr quiet, and
    the file is left where it is."""
    import threading

    from tests.fallback.child_procs import unprivileged_prefix

    ws, env = setup
    args = ["search", "Kestrel migration", "--workspace", str(ws), "--json"]
    alone = cli(args, {**env, "QMDBRIDGE_DAEMON": "off"})
    assert alone.returncode == 0 and orjson.loads(alone.stdout)["servedBy"] == "process"
    path = Path(env["OPENCLAW_STATE_DIR"]) / "daemon" / "main.sock"
    path.parent.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(DEADLINE_S)
    requests: list[dict[str, Any]] = []

    replies = [b"x" * (wire.MAX_LINE_BYTES + 1), b"not json\n", b"[1, 2]\n", b""]

    def reply_badly() -> None:
        for reply in replies:
            conn, _ = listener.accept()
            with conn:
                requests.append(orjson.loads(conn.makefile("rb").readline()))
                try:
                    conn.sendall(reply)
                except OSError:  # the client stopped reading past the limit and hung up
                    pass

    server = threading.Thread(target=reply_badly)
    server.start()
    try:
        answers = [cli(args, env) for _ in replies]
    finally:
        server.join(DEADLINE_S)
        listener.close()
    assert [r["tool"] for r in requests] == ["memory_search"] * len(replies)
    assert [(a.returncode, a.stdout, a.stderr) for a in answers] == [(0, alone.stdout, b"")] * len(replies)
    path.chmod(0)  # a socket nobody listens on that this user may not open: EACCES, not refused
    denied = subprocess.run([*unprivileged_prefix(), *cli_argv(args)], env=env, capture_output=True,
                            timeout=DEADLINE_S)
    assert (denied.returncode, denied.stdout, denied.stderr) == (0, alone.stdout, b""), denied.stderr
    assert stat.S_ISSOCK(path.lstat().st_mode)
    path.unlink()
    path.write_text("not a socket\n")
    plain_file = cli(args, env)
    assert (plain_file.returncode, plain_file.stdout, plain_file.stderr) == (0, alone.stdout, b"")
    assert path.read_text() == "not a socket\n"
