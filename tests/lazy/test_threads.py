"""lazy.threads: a large call's chunks on several threads give the same answers as on one, and
the pool runs every job once, at most ``threads`` at a time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import lazy as lz
from lazy import threads


def _jobs(n: int, log: list[int], busy: list[int], peak: list[int]):  # type: ignore[no-untyped-def]
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.01)
        with lock:
            busy[0] -= 1
            log.append(i)

    return [lambda i=i: job(i) for i in range(n)]


@pytest.mark.parametrize("wanted", [1, 2, 3])
def test_every_job_runs_once_at_most_threads_at_a_time(wanted: int) -> None:
    log: list[int] = []
    busy, peak = [0], [0]
    threads.spread(_jobs(7, log, busy, peak), wanted)
    assert sorted(log) == list(range(7))
    assert peak[0] <= min(wanted, 7)
    if wanted == 1:
        assert log == list(range(7))  # inline, in order


def test_the_first_failure_is_raised_after_every_share_finished() -> None:
    """A share stops at its failure; the other share runs to its end."""
    done: list[int] = []

    def fail() -> None:
        raise ValueError("chunk 3")

    jobs = [lambda: done.append(0), fail, lambda: done.append(2), lambda: done.append(3)]
    with pytest.raises(ValueError, match="chunk 3"):
        threads.spread(jobs, 2)
    assert sorted(done) == [0, 2]  # shares: jobs 0 and 2 here, 1 (fails) and 3 in the pool


def test_a_pool_thread_spreading_again_runs_inline() -> None:
    """No pool thread waits on the pool (which could deadlock it)."""
    seen: list[str] = []

    def inner() -> None:
        threads.spread([lambda: seen.append(threading.current_thread().name)] * 3, 4)

    threads.spread([inner, inner], 2)
    assert len(seen) == 6


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_call_of_many_chunks_answers_alike_on_one_and_several_threads(backend: str) -> None:
    """Same chunks, same buckets, so the same bits; and the chunks are counted once each."""
    b = lz.Builder()
    x = b.input("x", (3,), "float32")
    w = b.param(np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32), "w")
    graph = b.build({"y": lz.sigmoid(lz.matmul(x, w)) * lz.exp(x[:, :2])})
    rows = np.random.default_rng(1).normal(size=(1000, 3)).astype(np.float32)
    answers, chunks = [], []
    for n in (1, 2, 4):
        options = lz.Options(backend=backend, max_batch=64, call_rows=64, threads=n, host_rows=0)
        compiled = lz.compile(graph, options)
        answers.append(compiled({"x": rows})["y"])
        chunks.append(compiled.graphs[0].stats.chunks)
    assert all(np.array_equal(a, answers[0]) for a in answers)
    assert chunks == [16, 16, 16]


def test_the_default_is_the_cores_the_process_may_use() -> None:
    assert threads.available_cores() >= 1
    b = lz.Builder()
    graph = b.build({"y": b.input("x", (1,), "float32") * 2.0})
    compiled = lz.compile(graph, lz.Options(backend="numpy"))
    assert compiled.graphs[0]._threads == threads.available_cores()


def test_spreading_is_chosen_by_its_measured_seconds_per_chunk() -> None:
    from lazy.threads import SpreadChoice

    choice = SpreadChoice()
    assert choice.pays is None
    assert choice.choose() is False  # first sequential
    choice.record(False, 1.0)
    assert choice.choose() is True  # then spread
    choice.record(True, 0.55)
    assert choice.pays is True
    ways = []
    for _ in range(2 * SpreadChoice.EXPLORE):
        ways.append(choice.choose())
        choice.record(ways[-1], 0.55 if ways[-1] else 1.0)
    assert ways.count(False) == 2  # the other way, every EXPLORE-th call only

    # Load that slows one spread call does not decide for good: the average recovers.
    choice.record(True, 3.0)
    assert choice.pays is False
    for _ in range(4 * SpreadChoice.EXPLORE):
        spreading = choice.choose()
        choice.record(spreading, 0.55 if spreading else 1.0)
    assert choice.pays is True


def test_chunks_that_hold_the_gil_stop_spreading() -> None:
    from lazy.threads import SpreadChoice

    choice = SpreadChoice()
    for _ in range(3 * SpreadChoice.EXPLORE):
        spreading = choice.choose()
        choice.record(spreading, 1.3 if spreading else 1.0)
    assert choice.pays is False
