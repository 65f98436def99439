"""OpenMP threads on a CPU shared with other processes (`turnforge.machine.CpuThreads`)."""

from __future__ import annotations

import doctest
import os
import subprocess
import time

import pytest
import torch

import turnforge.machine as machine
from turnforge.models import load_model


def test_free_cores_hand_numbers():
    assert doctest.testmod(machine).failed == 0 and doctest.testmod(machine).attempted >= 1


@pytest.fixture()
def two_cpus(monkeypatch):
    """A CpuThreads on two CPUs whose jiffies are given by the test."""
    counters = {"busy": 0, "total": 0, "own": 0}
    monkeypatch.setattr(machine, "cpu_jiffies", lambda cpus: (counters["busy"], counters["total"]))
    monkeypatch.setattr(machine, "own_jiffies", lambda: counters["own"])
    monkeypatch.setattr(machine, "FIRST_WINDOW_S", 0.0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    return machine.CpuThreads(), counters


def test_other_processes_busy_jiffies_take_cores_and_this_process_own_do_not(two_cpus):
    threads, counters = two_cpus
    assert threads.measure() == 2  # nothing moved: no window yet, the cores as they are
    # 200 jiffies of two CPUs (100 a CPU): 150 busy, 50 of them this process's -> others used 1.0 core
    counters.update(busy=150, total=200, own=50)
    assert threads.measure() == 1
    # the next 200: all busy, all this process's (its own two threads) -> others used nothing
    counters.update(busy=350, total=400, own=250)
    assert threads.measure() == 2
    # 0.4 of a core taken by others leaves both; 0.6 takes one
    counters.update(busy=390, total=600, own=250)
    assert threads.measure() == 2
    counters.update(busy=450, total=800, own=250)
    assert threads.measure() == 1


def test_a_forward_sets_its_threads_count_once_measured(two_cpus, tiny_model_dir, monkeypatch):
    threads, counters = two_cpus
    monkeypatch.setattr(machine, "_CPU_THREADS", threads)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    before = torch.get_num_threads()

    def a_second_later(**jiffies):
        counters.update(jiffies)
        threads.sample = (threads.sample[0] - machine.RECHECK_S, *threads.sample[1:])

    try:
        threads.measure()
        a_second_later(busy=150, total=200, own=50)
        model(input_ids=torch.tensor([[1, 2, 3]]))
        assert torch.get_num_threads() == 1
        counters.update(busy=360, total=410, own=50)  # within the second: not measured again
        model(input_ids=torch.tensor([[1, 2, 3]]))
        assert torch.get_num_threads() == 1
        a_second_later(busy=560, total=610, own=450)
        model(input_ids=torch.tensor([[1, 2, 3]]))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_is_the_users_fixed_choice(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert not model._forward_pre_hooks
    monkeypatch.delenv("OMP_NUM_THREADS")
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert len(model._forward_pre_hooks) == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_busy_process_on_one_of_this_process_cpus_is_measured():
    """A real `yes` pinned to one of two CPUs that this measurement watches: others used ~1 core of the two."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    threads = machine.CpuThreads()
    threads.cpus = set(cpus)
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, {cpus[0]}))
    try:
        threads.measure()
        time.sleep(0.5)
        assert threads.measure() == 1
    finally:
        busy.kill()
        busy.wait()


def test_a_held_count_is_not_measured_again(two_cpus, monkeypatch):
    threads, counters = two_cpus
    monkeypatch.setattr(machine, "_CPU_THREADS", threads)
    monkeypatch.setattr(machine, "RECHECK_S", 0.0)
    threads.measure()
    counters.update(busy=150, total=200, own=50)
    with machine.held_cpu_threads():  # measured on entry: others took a core
        assert threads.threads == 1
        counters.update(busy=350, total=400, own=250)
        threads.keep()
        assert threads.threads == 1
    threads.keep()
    assert threads.threads == 2


def test_threads_computing_at_once_share_the_free_cores(two_cpus, monkeypatch):
    """OpenMP's count is per thread: async GRPO's trainer and engine, both computing on 2 free cores, get 1 each (not
    2 + 2); one waiting, the other gets both again; never below 1."""
    threads, counters = two_cpus
    monkeypatch.setattr(machine, "_CPU_THREADS", threads)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    try:
        threads.measure()
        for computing in (2, 1, 3):
            machine.computing_threads(computing)
            threads.keep()
        machine.computing_threads(0)
        threads.keep()
    finally:
        machine.computing_threads(1)
        torch._C.set_num_threads(before)
    assert seen == [1, 2, 1, 2]  # 3 on 2 cores: 1 each, never 0; 0 computing reads as 1
