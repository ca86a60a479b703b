"""CircuitBreaker: exponential cooldown, half-open trial, shared state file, scope reset."""

from __future__ import annotations

from pathlib import Path

from qmdbridge.policy.breaker import CircuitBreaker, breaker_scope


def test_cooldown_doubles_and_success_closes(tmp_path: Path) -> None:
    b = CircuitBreaker(tmp_path / "b.json", scope="qmd")
    assert b.allow(1_000)
    assert b.record_failure("boom", now_ms=1_000) == 30_000
    assert not b.allow(20_000) and b.describe(20_000)["state"] == "open"
    assert b.allow(31_000) and b.describe(31_000)["state"] == "half-open"
    assert b.record_failure("boom again", now_ms=31_000) == 60_000
    assert b.record_failure("x", now_ms=0) == 120_000
    for _ in range(10):
        b.record_failure("x", now_ms=0)
    assert b.record_failure("x", now_ms=0) == 600_000  # capped at 10 minutes
    b.record_success(now_ms=5)
    assert b.allow(5) and b.describe(5)["state"] == "closed"


def test_state_is_shared_through_the_file_and_scoped(tmp_path: Path) -> None:
    a = CircuitBreaker(tmp_path / "b.json", scope="/opt/qmd")
    a.record_failure("qmd not found", now_ms=1_000)
    same = CircuitBreaker(tmp_path / "b.json", scope="/opt/qmd")
    assert not same.allow(2_000) and same.state.last_failure == "qmd not found"
    other = CircuitBreaker(tmp_path / "b.json", scope="/usr/local/bin/qmd")
    assert other.allow(2_000) and other.state.failures == 0


def test_successes_rewrite_the_file_at_most_every_interval_unless_it_changed(tmp_path: Path) -> None:
    from qmdbridge.policy.breaker import SUCCESS_SAVE_INTERVAL_MS

    state = tmp_path / "b.json"
    b = CircuitBreaker(state, scope="qmd")
    b.record_success(now_ms=1_000)
    written = state.read_bytes()
    b.record_success(now_ms=1_000 + SUCCESS_SAVE_INTERVAL_MS - 1)  # closed, file as written
    assert state.read_bytes() == written
    b.record_success(now_ms=1_000 + SUCCESS_SAVE_INTERVAL_MS)
    assert CircuitBreaker(state, scope="qmd").state.last_success_at_ms == 1_000 + SUCCESS_SAVE_INTERVAL_MS
    # another process records a failure: the next success here closes the shared breaker at once
    CircuitBreaker(state, scope="qmd").record_failure("qmd crashed", now_ms=7_000)
    assert not CircuitBreaker(state, scope="qmd").allow(7_001)
    b.record_success(now_ms=7_002)
    assert CircuitBreaker(state, scope="qmd").allow(7_003)


def test_unwritable_state_dir_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    b = CircuitBreaker(blocker / "b.json")
    assert b.record_failure("x", now_ms=0) == 30_000
    assert not b.allow(1)


def test_a_failure_recorded_under_ci_does_not_explain_a_search_without_it(tmp_path: Path) -> None:
    """An earlier run with CI set opened the breaker ("disabled in CI"); a run without CI must
    not report that stale reason: the state belongs to another scope and is ignored."""
    state = tmp_path / "breaker.json"
    ci_scope = breaker_scope("qmd", "query", {"CI": "true"})
    plain_scope = breaker_scope("qmd", "query", {})
    assert ci_scope != plain_scope
    CircuitBreaker(state, scope=ci_scope).record_failure("LLM operations are disabled in CI", now_ms=1_000)
    assert CircuitBreaker(state, scope=ci_scope).allow(now_ms=2_000) is False
    fresh = CircuitBreaker(state, scope=plain_scope)
    assert fresh.allow(now_ms=2_000) is True
    assert fresh.state.failures == 0 and "CI" not in str(fresh.describe(now_ms=2_000))
