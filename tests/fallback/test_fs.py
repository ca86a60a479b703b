"""fallback.fs: the pid-recording inter-process file lock and the atomic file writer.

Locks are held by real child processes (SIGKILL included) and by second lock objects in this
process; every wait is bounded by a deadline and none is timed.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from fallback.errors import IndexStoreError, LockTimeoutError
from fallback.fs.atomic import TEMP_PREFIX, write_atomic
from fallback.fs.lock import PidFileLock
from fallback.store.lock import StoreWriteLock
from tests.fallback.child_procs import DEADLINE_S, finish, unprivileged_prefix

# A child that takes the lock given as argv[1], says so, and releases it on a line on stdin.
HOLDER = ("import sys; from pathlib import Path; from fallback.fs.lock import PidFileLock;"
          " lock = PidFileLock(Path(sys.argv[1]), timeout_ms=0);"
          " print('held' if lock.try_acquire() else 'busy', flush=True);"
          " sys.stdin.readline(); lock.release(); print('released', flush=True)")


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).parents[2])
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "held", f"child said {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    return proc


# -- the lock -----------------------------------------------------------------------------------


def test_holder_pid_is_recorded_while_held_and_cleared_on_release(tmp_path: Path) -> None:
    path = tmp_path / "state" / "x.lock"  # the folder is created on demand
    lock = PidFileLock(path, timeout_ms=0)
    assert not path.exists() and lock.holder_pid() is None
    lock.acquire_blocking()
    assert path.read_text() == f"{os.getpid()}\n"
    assert lock.holder_pid() == os.getpid()
    lock.release()
    assert path.exists() and path.read_text() == ""  # the file stays, the record goes
    assert lock.holder_pid() is None and not lock.held


def test_timeout_names_the_live_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    child = _holder(path)
    try:
        lock = PidFileLock(path, timeout_ms=120)
        with pytest.raises(LockTimeoutError) as info:
            lock.acquire_blocking()
        assert str(info.value) == (f"another process (pid {child.pid}) holds the lock {path};"
                                   " waiting for it timed out after 120 ms")
        assert (info.value.path, info.value.timeout_ms, info.value.holder_pid) == (str(path), 120, child.pid)
        assert isinstance(info.value, TimeoutError) and not lock.held
        with pytest.raises(LockTimeoutError, match="timed out after 0 ms"):
            lock.acquire_blocking(timeout_ms=0)  # a budget of 0 is one attempt
    finally:
        finish(child)


def test_a_killed_holder_leaves_a_stale_record_and_a_free_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    child = _holder(path)
    try:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=DEADLINE_S)
    finally:
        finish(child)
    lock = PidFileLock(path, timeout_ms=0)
    assert path.read_text() == f"{child.pid}\n"  # it never released
    assert lock.holder_pid() is None  # a stale record names no one
    assert lock.try_acquire()  # the kernel dropped the dead holder's lock
    assert path.read_text() == f"{os.getpid()}\n"  # and the stale record is overwritten
    lock.release()


def test_waiter_gets_the_lock_when_the_holder_releases(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    child = _holder(path)
    lock = PidFileLock(path, timeout_ms=DEADLINE_S * 1000)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire_blocking() is None))
    try:
        waiter.start()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("release\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "released"
        waiter.join(timeout=DEADLINE_S)
        assert got == [True] and lock.held
        assert path.read_text() == f"{os.getpid()}\n"
    finally:
        lock.close()
        finish(child)


def test_reentrant_per_object_across_threads_exclusive_between_objects(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first, second = PidFileLock(path, timeout_ms=0), PidFileLock(path, timeout_ms=0)
    first.acquire_blocking()
    assert not second.try_acquire()  # flock belongs to the open file: same process, no entry
    done: list[bool] = []

    def other_thread() -> None:  # the engine takes the lock on the loop and leaves it in a worker
        done.append(first.try_acquire())
        first.release()
        first.release()

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join(timeout=DEADLINE_S)
    assert done == [True] and not first.held
    assert second.try_acquire()
    second.close()
    second.close()  # idempotent
    assert not second.held and path.read_text() == ""


@pytest.mark.anyio
async def test_async_acquire_waits_without_blocking_and_cancels_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    blocker = PidFileLock(path, timeout_ms=0)
    blocker.acquire_blocking()
    lock = PidFileLock(path, timeout_ms=DEADLINE_S * 1000)
    ticks = 0
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            async def count() -> None:  # cancels the wait once the loop ran it three times
                nonlocal ticks
                while ticks < 3:
                    await anyio.sleep(0.01)
                    ticks += 1
                scope.cancel()

            tg.start_soon(count)
            await lock.acquire()
    assert scope.cancelled_caught and ticks == 3  # the loop kept running while it waited
    assert not lock.held  # a cancelled wait holds nothing
    with pytest.raises(LockTimeoutError, match=rf"^another process \(pid {os.getpid()}\) holds"):
        await lock.acquire(timeout_ms=50)
    blocker.release()
    await lock.acquire(timeout_ms=DEADLINE_S * 1000)
    assert lock.held
    lock.release()
    assert not lock.held


def test_bad_budget_and_unopenable_lock_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lock timeout must be >= 0 ms, got -1"):
        PidFileLock(tmp_path / "x.lock", timeout_ms=-1)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(FileExistsError, match="File exists: .*file'$"):  # its folder is a file
        PidFileLock(tmp_path / "file" / "x.lock", timeout_ms=0).try_acquire()
    db = tmp_path / "file" / "main.sqlite"
    with pytest.raises(IndexStoreError, match=r"^cannot open the index writer lock .*main.sqlite.lock"):
        StoreWriteLock(db).try_acquire()


# A child that opens the store writer lock of the store argv[1] and prints the error it meets.
OPEN_STORE_LOCK = ("import sys; from pathlib import Path; from fallback.store.lock import StoreWriteLock\n"
                   "try:\n    StoreWriteLock(Path(sys.argv[1])).try_acquire()\n"
                   "except Exception as exc:\n    print(type(exc).__name__, exc, flush=True)")


def test_a_store_lock_this_process_may_not_write_is_named_with_its_cause(tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    folder.mkdir()
    db, lock = folder / "main.sqlite", folder / "main.sqlite.lock"
    lock.write_text("")
    lock.chmod(0o444)
    argv = [*unprivileged_prefix(), sys.executable, "-c", OPEN_STORE_LOCK, str(db)]
    cwd = Path(__file__).parents[2]
    try:
        unwritable = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S, cwd=cwd)
        lock.unlink()
        folder.chmod(0o555)
        uncreatable = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S, cwd=cwd)
    finally:
        folder.chmod(0o755)
    assert unwritable.stdout == ("IndexStoreReadOnlyError index store is read-only (its writer lock "
                                 f"{lock} cannot be written): Permission denied ({db})\n"), unwritable.stderr
    assert uncreatable.stdout == ("IndexStoreReadOnlyError index store is read-only (its writer lock "
                                  f"{lock} cannot be created): Permission denied ({db})\n"), uncreatable.stderr
    assert not lock.exists()


# -- the atomic writer --------------------------------------------------------------------------


def test_write_atomic_creates_and_replaces_keeping_permissions(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    with open(plain, "w"):
        pass  # what open() gives a new file under this umask
    target = tmp_path / "state.json"
    write_atomic(target, b'{"a": 1}')
    assert target.read_bytes() == b'{"a": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    target.chmod(0o640)
    write_atomic(target, b'{"a": 2}')
    assert target.read_bytes() == b'{"a": 2}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    target.chmod(0o664)  # a group-write bit the usual umask (022) would drop
    write_atomic(target, b"3", durable=False)
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == (b"3", 0o664)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "state.json"]


def test_write_atomic_with_a_mode_sets_it_whatever_the_umask_and_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    old = os.umask(0)
    try:
        write_atomic(target, b"1", mode=0o600)
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        target.chmod(0o666)
        write_atomic(target, b"2", durable=False, mode=0o600)
    finally:
        os.umask(old)
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == (b"2", 0o600)


def test_write_atomic_failure_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "x.json", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_readers_see_old_or_new_content_never_a_mix(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    a, b = b"a" * 300_000, b"b" * 300_000
    write_atomic(target, a)
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            seen.add(data[:1] + data[-1:] + str(len(data)).encode())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(60):
            write_atomic(target, b if i % 2 == 0 else a, durable=False)
    finally:
        stop.set()
        reader.join(timeout=DEADLINE_S)
    assert seen <= {b"aa300000", b"bb300000"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_publish_file_moves_a_finished_file_into_place(tmp_path: Path) -> None:
    from fallback.fs.atomic import publish_file

    target = tmp_path / "model.gguf"
    target.write_bytes(b"old")
    part = tmp_path / "model.gguf.part"
    part.write_bytes(b"GGUF new content")
    publish_file(part, target)
    assert target.read_bytes() == b"GGUF new content" and not part.exists()
    with pytest.raises(FileNotFoundError):
        publish_file(part, target)  # nothing to publish: the target stays as it was
    assert target.read_bytes() == b"GGUF new content"
