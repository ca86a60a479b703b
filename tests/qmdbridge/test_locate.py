"""Tests for qmdbridge.qmd.locate: the real qmd, a foreign `qmd`, missing runtimes, search order."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qmdbridge.qmd.locate import npm_global_prefix, probe_qmd, repo_tools_qmd

pytestmark = pytest.mark.anyio


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


async def test_real_qmd_found_in_repo_tools(tmp_path: Path, qmd_bin: Path,
                                            base_path_env: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": str(empty), "HOME": str(tmp_path)}
    location = await probe_qmd("qmd", env=env, usual_dirs=[], cwd=tmp_path)
    assert location.path == str(qmd_bin)
    assert (location.found, location.runtime_ok, location.version) == (True, True, "2.8.3")
    assert location.reason is None
    assert location.usable is True
    assert location.searched == [str(empty), str(qmd_bin.parent)]
    assert location.path_env == str(empty)
    assert location.child_path == os.pathsep.join([str(empty), str(qmd_bin.parent), "/bin"])
    assert location.skipped == []


async def test_explicit_command_with_args(tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    env = {"PATH": base_path_env, "HOME": str(tmp_path)}
    location = await probe_qmd(f'"{qmd_bin}" --no-gpu', env=env, repo_tools=False, usual_dirs=[])
    assert (location.path, location.version, location.reason) == (str(qmd_bin), "2.8.3", None)
    assert location.searched == [str(qmd_bin.parent)]


async def test_usual_folders_in_order_npm_bin_last(tmp_path: Path, qmd_bin: Path) -> None:
    if any(os.path.exists(f"{d}/qmd") for d in ("/opt/homebrew/bin", "/usr/local/bin")):
        pytest.skip("a system-wide qmd would be found before the test's one")
    home = tmp_path / "home"
    (home / ".bun" / "bin").mkdir(parents=True)
    link = tmp_path / "npm" / "bin" / "qmd"
    link.parent.mkdir(parents=True)
    link.symlink_to(qmd_bin)  # the launcher follows symlinks to find its install
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": str(empty), "HOME": str(home), "NPM_CONFIG_PREFIX": str(tmp_path / "npm")}
    location = await probe_qmd(env=env, repo_tools=False, cwd=tmp_path)
    assert (location.path, location.version) == (str(link), "2.8.3")
    assert location.searched == [str(empty), str(home / ".bun" / "bin"), "/opt/homebrew/bin",
                                 "/usr/local/bin", str(tmp_path / "npm" / "bin")]


async def test_bun_bin_found_before_later_folders(tmp_path: Path, qmd_bin: Path) -> None:
    home = tmp_path / "home"
    link = home / ".bun" / "bin" / "qmd"
    link.parent.mkdir(parents=True)
    link.symlink_to(qmd_bin)
    env = {"PATH": str(tmp_path), "HOME": str(home), "NPM_CONFIG_PREFIX": str(tmp_path / "npm")}
    location = await probe_qmd(env=env, cwd=tmp_path)
    assert (location.path, location.version) == (str(link), "2.8.3")
    assert location.searched == [str(tmp_path), str(home / ".bun" / "bin")]


async def test_foreign_program_named_qmd(tmp_path: Path, standins_dir: Path,
                                         base_path_env: str) -> None:
    foreign = standins_dir / "foreign"
    env = {"PATH": f"{foreign}{os.pathsep}{base_path_env}", "HOME": str(tmp_path)}
    location = await probe_qmd(env=env, repo_tools=False, usual_dirs=[], cwd=tmp_path)
    exe = foreign / "qmd"
    assert location.path == str(exe)
    assert (location.found, location.runtime_ok, location.version) == (True, True, None)
    assert location.reason == (f"foreign program at {exe}: --version printed "
                               "'Quick Markdown Viewer 0.4.1'")
    assert location.usable is False


async def test_a_qmd_killed_while_answering_version_is_not_called_foreign(tmp_path: Path) -> None:
    """A ``--version`` run ended by a signal (the OOM killer, a user's kill) says so; it printed
    nothing, which is not a foreign program's answer."""
    exe = _script(tmp_path / "bin" / "qmd", "#!/bin/sh\nkill -9 $$\n")
    location = await probe_qmd(str(exe), env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                               repo_tools=False, usual_dirs=[], cwd=tmp_path)
    assert (location.found, location.runtime_ok, location.version, location.usable) == (True, True, None, False)
    assert location.reason == f"qmd at {exe} was ended by signal 9 answering --version"


async def test_foreign_first_on_path_real_one_later(tmp_path: Path, standins_dir: Path,
                                                    qmd_bin: Path, base_path_env: str) -> None:
    foreign = standins_dir / "foreign"
    env = {"PATH": f"{foreign}{os.pathsep}{base_path_env}", "HOME": str(tmp_path)}
    location = await probe_qmd(env=env, usual_dirs=[], cwd=tmp_path)
    assert (location.path, location.version, location.reason) == (str(qmd_bin), "2.8.3", None)
    assert location.skipped == [f"foreign program at {foreign / 'qmd'}: --version printed "
                                "'Quick Markdown Viewer 0.4.1'"]


async def test_env_shebang_runtime_missing(tmp_path: Path) -> None:
    exe = _script(tmp_path / "bin" / "qmd", "#!/usr/bin/env node\nconsole.log('qmd 2.8.3')\n")
    env = {"PATH": str(exe.parent), "HOME": str(tmp_path), "LANG": "C"}
    location = await probe_qmd(env=env, repo_tools=False, usual_dirs=[], cwd=tmp_path)
    assert location.path == str(exe)
    assert (location.found, location.runtime_ok, location.version) == (True, False, None)
    assert location.reason == (f"qmd found at {exe} but its runtime (node/bun) is missing: "
                               "/usr/bin/env: 'node': No such file or directory")


async def test_sh_launcher_without_bun(tmp_path: Path) -> None:
    exe = _script(tmp_path / "bin" / "qmd", '#!/bin/sh\nexec bun "$0.js" "$@"\n')
    env = {"PATH": str(exe.parent), "HOME": str(tmp_path)}
    location = await probe_qmd(env=env, repo_tools=False, usual_dirs=[], cwd=tmp_path)
    assert location.runtime_ok is False
    assert location.reason == (f"qmd found at {exe} but its runtime (node/bun) is missing: "
                               f"{exe}: 2: exec: bun: not found")


async def test_absolute_interpreter_missing(tmp_path: Path) -> None:
    exe = _script(tmp_path / "bin" / "qmd", "#!/nonexistent/runtime/bun\n")
    location = await probe_qmd(str(exe), env={"PATH": "/usr/bin:/bin"}, repo_tools=False,
                               usual_dirs=[], cwd=tmp_path)
    assert (location.found, location.runtime_ok) == (True, False)
    assert location.reason == (f"qmd found at {exe} but its runtime (node/bun) is missing: "
                               f"[Errno 2] No such file or directory: '{exe}'")


async def test_interpreter_folder_added_to_child_path(tmp_path: Path) -> None:
    runtime = _script(tmp_path / "rt" / "fakenode", '#!/bin/sh\necho "qmd 9.9.1 (abc)"\n')
    exe = _script(tmp_path / "bin" / "qmd", f"#!{runtime}\n")
    env = {"PATH": "/usr/bin:/bin"}
    location = await probe_qmd("bin/qmd", env=env, repo_tools=False, usual_dirs=[], cwd=tmp_path)
    assert (location.path, location.version) == (str(exe), "9.9.1")
    assert location.child_path == os.pathsep.join(
        ["/usr/bin", "/bin", str(exe.parent), str(runtime.parent)])


async def test_not_found(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    location = await probe_qmd(env={"PATH": str(empty)}, repo_tools=False, usual_dirs=[],
                               cwd=tmp_path)
    assert (location.path, location.found, location.runtime_ok) == (None, False, False)
    assert location.reason == f"qmd not found (command 'qmd'); searched: {empty}"
    assert location.child_path == str(empty)


async def test_explicit_path_missing_does_not_search_further(tmp_path: Path,
                                                             qmd_bin: Path) -> None:
    env = {"PATH": str(qmd_bin.parent)}
    missing = tmp_path / "opt" / "qmd"
    location = await probe_qmd(str(missing), env=env, usual_dirs=[], cwd=tmp_path)
    assert location.found is False
    assert location.reason == f"qmd not found (command '{missing}'); searched: {missing.parent}"


async def test_the_usual_folders_and_the_npm_global_bin_are_searched_after_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": str(empty), "HOME": str(tmp_path), "npm_config_prefix": "/srv/npm"}
    location = await probe_qmd(env=env, repo_tools=False, cwd=tmp_path)
    assert (location.found, location.searched) == (False, [
        str(empty), f"{tmp_path}/.bun/bin", "/opt/homebrew/bin", "/usr/local/bin", "/srv/npm/bin"])


def test_repo_tools_path() -> None:
    assert repo_tools_qmd() == Path(__file__).resolve().parents[2] / ".tools" / "bin" / "qmd"


async def test_missing_cwd_is_not_a_missing_runtime(tmp_path: Path, qmd_bin: Path) -> None:
    location = await probe_qmd(str(qmd_bin), env={"PATH": "/usr/bin:/bin"}, repo_tools=False,
                               usual_dirs=[], cwd=tmp_path / "deleted-workspace")
    assert (location.runtime_ok, location.version, location.reason) == (True, "2.8.3", None)


async def test_npm_prefix_from_npmrc_and_from_nodes_folder(tmp_path: Path) -> None:
    """npm's own order, read without running npm: the user .npmrc, the global npmrc beside the
    default prefix, the folder above node's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".npmrc").write_text("; comment\nregistry=https://registry.npmjs.org/\nprefix = ~/.npm-global\n")
    assert npm_global_prefix({"PATH": str(tmp_path), "HOME": str(home)}, path_env=str(tmp_path)) == (
        f"{home}/.npm-global")
    node_dir = tmp_path / "node" / "bin"
    node_dir.mkdir(parents=True)
    (node_dir / "node").write_text("#!/bin/sh\n")
    (node_dir / "node").chmod(0o755)
    bare = tmp_path / "bare"
    bare.mkdir()
    assert npm_global_prefix({"HOME": str(bare)}, path_env=str(node_dir)) == str(tmp_path / "node")
    (tmp_path / "node" / "etc").mkdir()
    (tmp_path / "node" / "etc" / "npmrc").write_text("prefix=/srv/global\n")
    assert npm_global_prefix({"HOME": str(bare)}, path_env=str(node_dir)) == "/srv/global"
    assert npm_global_prefix({"HOME": str(bare)}, path_env=str(bare)) is None


def test_npm_prefix_matches_npm_itself(tmp_path: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not on PATH")
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env["HOME"] = str(tmp_path)  # npm writes its logs here, not in the user's home
    expected = subprocess.run([npm, "prefix", "-g"], capture_output=True, text=True, check=True,
                              env=env).stdout.strip()
    assert npm_global_prefix(env, path_env=env["PATH"]) == expected


def test_doctor_looking_for_qmd_leaves_nothing_in_home(tmp_path: Path) -> None:
    """Before, the search of the npm global bin ran `npm prefix -g`, which wrote
    ~/.npm/_logs/<time>-debug-0.log on every doctor, status or search that looked for qmd."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH (the lookup never ran it then)")
    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    (ws / "MEMORY.md").write_text("# Memory\n")
    cfg = tmp_path / "cfg.json5"
    cfg.write_text("{memory: {backend: 'qmd', qmd: {command: 'qmd-not-installed'}}}")
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    env.update(HOME=str(home), OPENCLAW_STATE_DIR=str(tmp_path / "state"))
    p = subprocess.run([sys.executable, "-m", "qmdbridge.cli.main", "doctor", "--workspace", str(ws),
                        "--config", str(cfg)], env=env, capture_output=True, text=True, timeout=120)
    assert "qmd-not-installed" in p.stdout, p.stdout + p.stderr
    assert sorted(str(f.relative_to(home)) for f in home.rglob("*")) == []
