"""Warm-up places buckets on the host (the numpy backend) where that is faster than the graph's
backend: largest bucket first, timing both lowerings until the host wins one, which then takes
that bucket and every smaller one without a device compile. Every other bucket, and every graph
too big for the host, stays on the backend. Results are the graph's either way."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lazy as lz
from lazy import executor
from lazy.backends.jax_backend import JaxBackend
from lazy.backends.numpy_backend import NumpyBackend, NumpyExecutable


class _Slow:
    """An executable that takes an extra millisecond per call (a slow device)."""

    def __init__(self, exe: lz.backends.Executable) -> None:
        self.exe = exe
        self.calls = 0

    def __call__(self, inputs, params):
        self.calls += 1
        time.sleep(5e-3)
        return self.exe(inputs, params)


class SlowJax(JaxBackend):
    def __init__(self) -> None:
        super().__init__()
        self.exes: dict[int, _Slow] = {}

    def fingerprint(self) -> str:
        return super().fingerprint() + ";slow"

    def compile(self, graph, bucket, policy):
        exe, times = super().compile(graph, bucket, policy)
        self.exes[bucket] = _Slow(exe)
        return self.exes[bucket], times


def _rows(n: int, features: int = 6) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, features)).astype(np.float32)


def test_small_buckets_run_on_the_host_when_the_device_is_slower(graph, cache) -> None:
    backend = SlowJax()
    options = lz.Options(backend=backend, max_batch=64, call_rows=64, host_rows=16)
    compiled = lz.compile(graph, options, cache).graphs[0]
    placements = compiled.placements
    assert {b: p.runs_on for b, p in placements.items()} == {
        1: "host",
        2: "host",
        4: "host",
        8: "host",
        16: "host",
        32: "device",
        64: "device",
    }
    assert placements[16].reason == "measured"
    assert 0 < placements[16].host_us < placements[16].device_us  # type: ignore[operator]
    for rows in (1, 2, 4, 8):
        assert placements[rows].reason == "the host won the larger bucket 16"
        assert placements[rows].host_us is None  # not timed
    assert placements[64].reason == "over host_rows (16)"
    # Only what runs was compiled on the device, and the bucket the host won to time it.
    assert sorted(backend.exes) == [16, 32, 64]
    before = {bucket: exe.calls for bucket, exe in backend.exes.items()}
    for rows in (1, 3, 16, 17, 64):
        x = _rows(rows)
        out = compiled({"x": x})
        want = lz.evaluate(graph, {"x": x})
        np.testing.assert_allclose(out["proba"], want["proba"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out["label"], want["label"])
    calls = {b: exe.calls - before[b] for b, exe in backend.exes.items()}
    assert calls == {16: 0, 32: 1, 64: 1}  # 17 rows: bucket 32


@pytest.fixture
def slow_host(monkeypatch):
    """Every host plan call takes 5 ms more (a device call: tens of µs; a loaded machine
    stretches it, never near 5 ms)."""
    call = NumpyExecutable.__call__

    def slow(self, inputs, params):
        time.sleep(5e-3)
        return call(self, inputs, params)

    monkeypatch.setattr(NumpyExecutable, "__call__", slow)


def test_every_bucket_is_timed_while_the_device_wins(graph, cache, slow_host) -> None:
    # A host kernel may change algorithm with the rows (FOREST_SUM: bit-vectors from 16 rows):
    # losing a large bucket says nothing of a smaller one, so each is timed until the host wins.
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache).graphs[0]
    assert sorted(compiled.placements) == sorted(compiled.buckets.sizes)
    for placement in compiled.placements.values():
        assert placement.runs_on == "device" and placement.reason == "measured"
        assert placement.device_us < placement.host_us  # type: ignore[operator]
    x = _rows(2)
    np.testing.assert_array_equal(
        compiled({"x": x})["label"], lz.evaluate(graph, {"x": x})["label"]
    )


def test_host_rows_zero_keeps_every_bucket_on_the_device(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8, host_rows=0), cache).graphs[0]
    assert {p.runs_on for p in compiled.placements.values()} == {"device"}
    assert {p.reason for p in compiled.placements.values()} == {
        "host placement is off (host_rows 0)"
    }


def test_the_numpy_backend_itself_needs_no_timing(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(backend="numpy", max_batch=8), cache).graphs[0]
    assert {p.runs_on for p in compiled.placements.values()} == {"host"}
    assert all(p.host_us is None for p in compiled.placements.values())
    x = _rows(5)
    np.testing.assert_allclose(
        compiled({"x": x})["proba"], lz.evaluate(graph, {"x": x})["proba"], rtol=1e-5, atol=1e-6
    )


def test_graphs_with_more_host_calls_than_the_limit_are_not_timed(cache) -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    body_calls = 2
    trips = executor.HOST_MAX_CALLS // body_calls + 1
    y = lz.fori_loop(trips, lambda i, carry, step: carry * 0.5 + step, x, x)
    graph = b.graph({"y": y})
    assert executor.host_calls(graph.order) > executor.HOST_MAX_CALLS
    compiled = lz.compile(graph, lz.Options(max_batch=4), cache).graphs[0]
    assert {p.runs_on for p in compiled.placements.values()} == {"device"}
    for placement in compiled.placements.values():
        assert "numpy calls a run" in placement.reason and placement.host_us is None


@pytest.mark.parametrize("host_rows", [1, 4])
def test_only_buckets_up_to_host_rows_may_run_on_the_host(graph, cache, host_rows: int) -> None:
    options = lz.Options(backend=SlowJax(), max_batch=16, call_rows=16, host_rows=host_rows)
    compiled = lz.compile(graph, options, cache).graphs[0]
    on_host = sorted(b for b, p in compiled.placements.items() if p.runs_on == "host")
    assert on_host == [b for b in (1, 2, 4) if b <= host_rows]
    measured = [b for b, p in compiled.placements.items() if p.reason == "measured"]
    assert measured == [host_rows]  # the largest it may take; the host won it


def _variant_graph() -> lz.Graph:
    """Deliberately unequal formulations, to see which one each placement runs: the device's
    is x * 2 behind a 64-trip loop (too many numpy calls to time on the host), the host's x * 3."""
    b = lz.Builder()
    x = b.input("x", (6,))
    device = lz.fori_loop(64, lambda i, c, x: c + x * (1.0 / 32.0) + (c - c), x * 0.0, x)
    for _ in range(3):  # body calls x trips > executor.HOST_MAX_CALLS
        device = device + lz.fori_loop(64, lambda i, c: c * 1.0, x * 0.0)
    return b.graph({"y": lz.variant(device, x * 3.0)})


def test_host_placement_runs_the_host_formulation_of_a_variant(cache) -> None:
    graph = _variant_graph()
    options = lz.Options(backend=SlowJax(), max_batch=4, call_rows=4, host_rows=2)
    compiled = lz.compile(graph, options, cache).graphs[0]
    assert executor.host_calls(compiled.graph.order) > executor.HOST_MAX_CALLS
    assert executor.host_calls(compiled.host_graph.order) <= executor.HOST_MAX_CALLS
    assert {b: p.runs_on for b, p in compiled.placements.items()} == {
        1: "host",
        2: "host",
        4: "device",
    }
    for rows, factor in ((1, 3.0), (2, 3.0), (3, 2.0), (4, 2.0)):  # 3 and 4 rows: bucket 4
        x = _rows(rows)
        np.testing.assert_allclose(compiled({"x": x})["y"], factor * x, rtol=1e-5)


def test_a_pinned_formulation_runs_every_call_whatever_the_placement(cache) -> None:
    """The parity gate pins each formulation in turn: every row count (host buckets, the device
    bucket, chunks, one head) then runs on the pinned one, and placement resumes after."""
    graph = _variant_graph()
    options = lz.Options(backend=SlowJax(), max_batch=4, call_rows=4, host_rows=2)
    program = lz.compile(graph, options, cache)
    compiled = program.graphs[0]
    assert program.formulations == compiled.formulations == (lz.DEVICE, lz.HOST)
    compiles = sum(compiled.compiles.values())
    for formulation, factor in ((lz.DEVICE, 2.0), (lz.HOST, 3.0)):
        with program.pinned(formulation):
            for rows in (1, 2, 3, 4, 9):
                x = _rows(rows)
                np.testing.assert_allclose(program({"x": x})["y"], factor * x, rtol=1e-5)
                np.testing.assert_allclose(program.run_one({"x": x}, "y"), factor * x, rtol=1e-5)
    assert sum(compiled.compiles.values()) == compiles  # the largest bucket was compiled
    x = _rows(1)
    np.testing.assert_allclose(program({"x": x})["y"], 3.0 * x, rtol=1e-5)  # placed on the host
    with pytest.raises(ValueError, match="no 'device' formulation"):
        numpy_only = lz.compile(graph, lz.Options(backend="numpy", max_batch=4), cache)
        with numpy_only.pinned(lz.DEVICE):
            pass


@pytest.mark.parametrize("backend", ["slow-jax", "numpy"])
def test_one_output_runs_a_host_plan_of_that_output_alone(graph, cache, monkeypatch, backend):
    plans: list[tuple[tuple[str, ...], int]] = []  # (outputs, bucket) of every host plan built
    compile_plan = NumpyBackend.compile

    def recording(self, g, bucket, policy):
        plans.append((g.output_names, bucket))
        return compile_plan(self, g, bucket, policy)

    monkeypatch.setattr(NumpyBackend, "compile", recording)
    device = SlowJax() if backend == "slow-jax" else "numpy"
    options = lz.Options(backend=device, max_batch=64, call_rows=64, host_rows=16)
    program = lz.compile(graph, options, cache)
    plans.clear()  # those warm-up built: every output
    before = {b: e.calls for b, e in device.exes.items()} if backend == "slow-jax" else {}
    for rows in (1, 3, 16, 17, 64, 100):  # host buckets, device buckets (slow-jax), chunks
        x = _rows(rows)
        want = lz.evaluate(graph, {"x": x})
        for name in ("proba", "label"):
            got = program.run_one({"x": x}, name)
            assert got.shape == want[name].shape
            np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6)
    host_buckets = [1, 4, 16] if backend == "slow-jax" else [1, 4, 16, 32, 64]
    # One plan per host bucket and output, of that output alone, built once.
    assert sorted(plans) == sorted(
        (names, b) for b in host_buckets for names in [("proba",), ("label",)]
    )
    if backend == "slow-jax":  # the device buckets computed both outputs in one call each
        calls = {b: e.calls - before[b] for b, e in device.exes.items()}
        assert calls == {16: 0, 32: 2, 64: 2 + 4}  # 100 rows: 2 chunks
