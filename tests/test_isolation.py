"""Checker children (turnforge.envs.isolation, issue 40): a call's own cost (CPU, memory) is its outcome, the
same on an idle or a loaded machine; a child that gives no answer (hung, starved, crashed) is no outcome at
all but CheckerUnavailable, and is replaced; the pool stays within its size and leaves no open pipes."""

from __future__ import annotations

import gc
import os
import signal
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from turnforge.envs.isolation import MEMORY_BYTES, CheckerUnavailable, ChildPool, pool_size


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    pool = ChildPool(2)
    yield pool
    pool.close()


def _call(pool: ChildPool, method: str, cpu_s: float = 5.0, wall_s: float = 600.0, memory_bytes: int = MEMORY_BYTES,
          **arguments):
    """A wall clock far beyond any load unless a test asks for a short one (a test must not depend on load)."""
    return pool.call(("isolation_targets", "Targets", method, arguments, cpu_s, memory_bytes), wall_s)


def test_a_call_answers_and_its_warm_child_is_reused(pool):
    assert _call(pool, "add", a=2, b=3).value == 5
    assert _call(pool, "pid").value == _call(pool, "pid").value


def test_a_starved_call_still_answers_when_it_used_little_cpu(pool):
    """A loaded machine, simulated: the child gets no CPU (SIGSTOP) for 2.5 s, more than the call's 1 s budget.
    Before issue 40 the budget was wall-clock time, and the check came back as timed out (a wrong verdict)."""
    child_pid = _call(pool, "pid").value
    os.kill(child_pid, signal.SIGSTOP)
    threading.Timer(2.5, os.kill, (child_pid, signal.SIGCONT)).start()
    result = _call(pool, "add", cpu_s=1.0, a=2, b=3)
    assert (result.value, result.over_budget) == (5, None)


def test_a_call_past_its_cpu_budget_is_over_budget_and_its_child_replaced(pool):
    first = _call(pool, "pid").value
    result = _call(pool, "spin", cpu_s=1.0)
    assert result.over_budget == "cpu" and result.value is None
    assert _call(pool, "pid").value != first


def test_a_call_past_its_memory_is_over_budget(pool):
    result = _call(pool, "allocate", memory_bytes=512 << 20, n_bytes=1 << 30)
    assert result.over_budget == "memory"
    assert _call(pool, "allocate", n_bytes=1 << 20).value == 1 << 20  # the limit was lifted after the call


def test_a_hung_checker_is_no_answer_and_is_replaced(pool):
    first = _call(pool, "pid").value
    with pytest.raises(CheckerUnavailable, match="no answer within 1 s .*no verdict"):
        _call(pool, "sleep", wall_s=1.0, seconds=60)
    assert _call(pool, "pid").value != first


def test_a_crashed_checker_is_no_answer(pool):
    with pytest.raises(CheckerUnavailable, match=r"ended without an answer \(exit status 3\)"):
        _call(pool, "crash")
    assert _call(pool, "add", a=1, b=1).value == 2


def test_a_child_killed_while_idle_is_replaced_not_an_env_error(pool):
    """The OOM killer may end an idle child: the next check takes a live one (the old pool did; the shared one
    handed out the dead child, and that check became an env error)."""
    import time

    dead = _call(pool, "pid").value
    os.kill(dead, signal.SIGKILL)
    time.sleep(0.2)
    assert _call(pool, "add", a=1, b=2).value == 3
    assert _call(pool, "pid").value != dead


def test_a_raising_call_is_its_error(pool):
    result = _call(pool, "add", a=1, b="x")
    assert "unsupported operand" in result.error and result.over_budget is None


def test_the_pool_keeps_at_most_its_size_of_children(pool):
    with ThreadPoolExecutor(8) as threads:
        pids = set(threads.map(lambda _: _call(pool, "sleep", seconds=0.05) and _call(pool, "pid").value, range(16)))
    assert 1 <= len(pids) <= 2
    assert 1 <= pool_size() <= 8


def test_killed_and_closed_children_leave_no_resource_warnings(pool):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckerUnavailable):
            _call(pool, "sleep", wall_s=0.5, seconds=60)
        _call(pool, "add", a=1, b=1)
        pool.close()
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
