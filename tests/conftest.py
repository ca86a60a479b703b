"""Shared pytest fixtures for the whole test tree."""

from __future__ import annotations

import compileall
import contextlib
import gc
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import psutil
import pytest

# The PostgreSQL fixtures (one server per session, a database per test, the both-stores `store`),
# registered once here so every module shares the one server.
pytest_plugins = ["tests.pg_fixtures"]

TEST_MODEL_NAME = "all-MiniLM-L6-v2.Q8_0.gguf"


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only."""
    return "asyncio"


def find_test_model() -> Path | None:
    """``$QMDBRIDGE_TEST_MODEL``, else ``shared/models/<name>`` beside any parent of the repo."""
    env = os.environ.get("QMDBRIDGE_TEST_MODEL")
    if env:
        p = Path(env).expanduser()
        return p if p.is_file() else None
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "models" / TEST_MODEL_NAME
        if candidate.is_file():
            return candidate
    return None


def _missing(problem: str) -> NoReturn:
    """Skip the test for ``problem``, or fail it under ``CI`` (a missing install step must not
    pass as green)."""
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.fixture(scope="session")
def gguf_test_model() -> Path:
    """The GGUF test model file (:func:`find_test_model`); skips without it, fails in CI."""
    return find_test_model() or _missing(f"test model {TEST_MODEL_NAME} not found (set QMDBRIDGE_TEST_MODEL)")


@pytest.fixture(scope="session")
def local_model_path(gguf_test_model: Path) -> Path:
    """The real GGUF embedding model; skips without it (or llama-cpp-python), fails in CI."""
    from fallback.embeddings.local_gguf import is_llama_cpp_installed

    if not is_llama_cpp_installed():
        _missing("llama-cpp-python is not installed (pip install 'qmdbridge[local]')")
    return gguf_test_model


@pytest.fixture(scope="session")
def qmd_bin() -> Path:
    """Absolute path of the real qmd 2.8.3 launcher installed by ``scripts/install-qmd.sh``
    (skip without it, fail under CI)."""
    from qmdbridge.qmd.locate import repo_tools_qmd

    launcher = repo_tools_qmd()
    if launcher.is_file() and os.access(launcher, os.X_OK):
        return launcher
    _missing(f"real qmd not installed at {launcher}; run: bash scripts/install-qmd.sh")


# -- leak guards ----------------------------------------------------------------------------------
# Every test must leave no thread it started running, no child process it started alive and no
# index store it opened open. A thread or process that is on its way out gets LEAK_GRACE_S to
# finish (a closed server's thread returning, a killed child being reaped); after that the test
# fails and what it left behind is named (and the processes killed, so the next test starts
# clean). Fixtures wider than one test (module, session) are created before the test's "before"
# snapshot and so never count.
LEAK_GRACE_S = 5.0


def _open_stores() -> list[object]:
    """The index stores (``Store``, ``ReadOnlyStore``, a vector index's read-only connection)
    still open, of those created so far."""
    return [s for s in list(_STORES) if _is_open(s)]


def _is_open(store: object) -> bool:
    conn = store if isinstance(store, sqlite3.Connection) else getattr(store, "_conn", None)
    if conn is None:
        return False
    try:
        conn.total_changes  # noqa: B018 - raises ProgrammingError once the connection is closed
    except sqlite3.ProgrammingError:
        return False
    return True


_STORES: weakref.WeakSet[object] = weakref.WeakSet()


def _track_stores() -> None:
    """Test-only hook: register every store the product opens in :data:`_STORES` (weakly, so a
    store nothing refers to any more is dropped, and closed by SQLite on deallocation)."""
    from fallback.store.db import Store
    from fallback.store.readonly import ReadOnlyConnection, ReadOnlyStore

    def tracking(init: Any) -> Any:
        def tracked(self: Any, *args: Any, **kwargs: Any) -> None:
            _STORES.add(self)
            init(self, *args, **kwargs)
        return tracked

    for cls in (Store, ReadOnlyStore, ReadOnlyConnection):  # every read-only connection too
        cls.__init__ = tracking(cls.__init__)  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _track_stores()
    if not hasattr(config, "workerinput"):
        _compile_packages()


def _compile_packages() -> None:
    """Write the bytecode of ``qmdbridge`` and ``fallback`` once, before any worker starts, as
    ``pip install`` does for a regular install: the suite starts hundreds of Python processes
    that import them, and under ``PYTHONDONTWRITEBYTECODE`` (or from an editable install never
    compiled) each of them would compile the packages again. Silent: a checkout that cannot
    be written stays as it is."""
    import fallback
    import qmdbridge

    for pkg in (qmdbridge, fallback):
        compileall.compile_dir(str(Path(pkg.__file__).parent), quiet=2)


# -- the whole suite on two workers --------------------------------------------------------------
# Most of the suite's time is one core running real processes (qmd, CLI commands, scripts) one
# after another; a second worker keeps the second core busy. Two, not one per core: the CI
# machine has two, and more would only queue on them.
SUITE_WORKERS = 2


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run the whole suite (``python -m pytest`` with no path: the configured testpaths) on
    :data:`SUITE_WORKERS` pytest-xdist workers, each test file whole in one worker (so module
    fixtures and a file's order hold), when pytest-xdist is installed and the command names no
    ``-n``, ``--dist``, ``--tx``, ``--pdb`` or ``--collect-only``. A run of named files or tests
    stays in this process; ``-n 0`` keeps the whole suite in it too."""
    option = config.option
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or config.args_source is not pytest.Config.ArgsSource.TESTPATHS
            or option.numprocesses is not None or option.dist != "no" or option.tx
            or option.usepdb or option.collectonly):
        return
    option.numprocesses = SUITE_WORKERS
    option.dist = "loadfile"
    option.loadscopereorder = False  # the files go out in the order pytest_collection_modifyitems sets
    option.tx = ["popen"] * SUITE_WORKERS


# What makes a test slow by itself: the real qmd (a Bun process per call) or the GGUF model.
SLOW_FIXTURES = frozenset({"qmd_bin", "local_model_path"})
SLOW_MARKERS = frozenset({"qmd", "local_model"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that drives the real qmd or loads the GGUF model (by fixture or
    marker), besides those marked ``slow`` by hand (real processes, benchmarks): ``-m "not slow"``
    leaves them out of a quick run; the default run keeps them all.

    In a pytest-xdist worker the files are put in order of their slow tests, most first (a
    stable sort: tests keep their order within a file), so the workers take the long files
    first and end on short ones together instead of one waiting for the other's last long file.
    """
    for item in items:
        if (SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or any(m.name in SLOW_MARKERS for m in item.iter_markers())):
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):
        slow_per_file: dict[Path, int] = {}
        for item in items:
            slow_per_file[item.path] = slow_per_file.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
        items.sort(key=lambda item: -slow_per_file[item.path])


def _threads_left(before: set[threading.Thread]) -> list[threading.Thread]:
    deadline = time.monotonic() + LEAK_GRACE_S
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in left if t.is_alive()]


def _children_left(before: set[int]) -> list[psutil.Process]:
    me = psutil.Process()
    try:
        fresh = [p for p in me.children(recursive=True) if p.pid not in before]
    except psutil.Error:
        return []
    _, alive = psutil.wait_procs(fresh, timeout=LEAK_GRACE_S) if fresh else ([], [])
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.Error:
            pass
    return left


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:200]}"
    except psutil.Error:
        return str(p.pid)


@pytest.fixture(autouse=True)
def leak_guard() -> Iterator[None]:
    """Fail a test that leaves a thread running, a child process alive or an index store open."""
    threads_before = set(threading.enumerate())
    try:
        children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        children_before = set()
    stores_before = {id(s) for s in _open_stores()}
    yield
    problems: list[str] = []
    stores = [s for s in _open_stores() if id(s) not in stores_before]
    if stores:
        gc.collect()  # a cycle that holds a store no one can reach is closed when collected
        stores = [s for s in _open_stores() if id(s) not in stores_before]
    problems += [f"store left open: {type(s).__name__} {getattr(s, 'path', '')}" for s in stores]
    problems += [f"thread left running: {t.name} ({t.__class__.__module__}.{t.__class__.__qualname__})"
                 for t in _threads_left(threads_before)]
    procs = _children_left(children_before)
    problems += [f"child process left alive: {_describe(p)}" for p in procs]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if problems:
        pytest.fail("leak: " + "; ".join(problems), pytrace=False)
