"""CompiledGraph: validation, padding, chunking, empty batches, backends."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz


def _x(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 6)).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 19, 40])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_padding_and_chunking_match_the_interpreter(graph, cache, backend, rows) -> None:
    compiled = lz.compile(graph, lz.Options(backend=backend, max_batch=8), cache)
    x = _x(rows)
    out, ref = compiled({"x": x}), lz.evaluate(graph, {"x": x})
    assert out["proba"].dtype == np.float32 and out["label"].dtype == np.int32
    np.testing.assert_allclose(out["proba"], ref["proba"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["label"], ref["label"])


def test_stats_count_padding_and_chunks(graph, cache) -> None:
    # On the device (host plans take any rows unpadded: test_numpy_backend.py).
    options = lz.Options(max_batch=8, call_rows=8, host_rows=0)
    compiled = lz.compile(graph, options, cache).graphs[0]
    compiled({"x": _x(19)})  # chunks of 8, 8 and 3 (padded to 4)
    assert compiled.stats.snapshot() == {
        "calls": 1,
        "rows": 19,
        "padded_rows": 1,
        "chunks": 3,
        "subnormal_rows": 0,
    }


def test_padding_never_changes_real_rows(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache)
    x = _x(8)
    full = compiled({"x": x})["proba"]
    for rows in range(5, 8):  # the same 8-row bucket: real rows are bit-identical
        np.testing.assert_array_equal(compiled({"x": x[:rows]})["proba"], full[:rows])
    for rows in range(1, 5):  # smaller buckets are other executables: equal up to rounding
        np.testing.assert_allclose(compiled({"x": x[:rows]})["proba"], full[:rows], rtol=1e-6)


def test_empty_batch_returns_empty_outputs(graph, cache) -> None:
    out = lz.compile(graph, lz.Options(max_batch=8), cache)({"x": np.zeros((0, 6), np.float32)})
    assert out["proba"].shape == (0, 3) and out["label"].shape == (0,)


def test_inputs_are_converted_to_the_declared_dtype(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache)
    x = _x(4)
    as_f64 = compiled({"x": x.astype(np.float64)})
    as_list = compiled({"x": x.tolist()})
    np.testing.assert_array_equal(as_f64["proba"], compiled({"x": x})["proba"])
    np.testing.assert_array_equal(as_list["proba"], compiled({"x": x})["proba"])


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({}, "missing input"),
        ({"x": np.zeros((2, 5), np.float32)}, r"input 'x' must have shape \(rows, 6\)"),
        ({"x": np.zeros(6, np.float32)}, r"input 'x' must have shape \(rows, 6\)"),
    ],
)
def test_bad_inputs_name_the_problem(graph, cache, feed, message) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8), cache)
    with pytest.raises(lz.InputError, match=message):
        compiled(feed)


def test_inputs_with_different_row_counts_are_rejected(cache) -> None:
    b = lz.Builder()
    a, c = b.input("a", (2,)), b.input("c", (2,))
    compiled = lz.compile(b.graph({"s": a + c}), lz.Options(max_batch=4), cache)
    with pytest.raises(lz.InputError, match="'c' has 3 rows, others have 2"):
        compiled({"a": np.zeros((2, 2), np.float32), "c": np.zeros((3, 2), np.float32)})


def test_inline_param_mode_gives_the_same_results(graph, cache) -> None:
    x = _x(5)
    args = lz.compile(graph, lz.Options(max_batch=8), cache)({"x": x})
    inline = lz.compile(graph, lz.Options(max_batch=8, param_mode=lz.ParamMode(1 << 20)), cache)
    assert not inline.graphs[0].graph.param_nodes
    np.testing.assert_allclose(inline({"x": x})["proba"], args["proba"], rtol=1e-6, atol=1e-7)


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend 'tpu-magic'"):
        lz.get_backend("tpu-magic")


def test_jax_device_can_be_chosen(graph, cache) -> None:
    import jax

    device = jax.devices("cpu")[-1]
    backend = lz.get_backend("jax", device=device)
    assert f"device_kind={device.device_kind}" in backend.fingerprint()
    out = lz.compile(graph, lz.Options(backend=backend, max_batch=2), cache)({"x": _x(2)})
    assert out["proba"].shape == (2, 3)


_X64_PROCESS = """
import numpy as np
import lazy as lz

rng = np.random.default_rng(0)
b = lz.Builder()
x = b.input("x", (5,), "float64")
w = b.param(rng.standard_normal((5, 2)), "w")
graph = b.graph({"y": lz.tanh(x @ w), "n": lz.cast(x, "int64").sum(-1)})
model = lz.compile(graph, lz.Options(max_batch=4, dtype_policy=lz.DTypePolicy.X64))
feed = {"x": rng.standard_normal((6, 5)) * 1e3}
out, ref = model(feed), lz.evaluate(graph, feed)
assert out["y"].dtype == np.float64 and out["n"].dtype == np.int64, (out["y"].dtype, out["n"].dtype)
np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-13, atol=1e-15)
np.testing.assert_array_equal(out["n"], ref["n"])
print("ok")
"""


def test_x64_policy_keeps_64_bit_types_without_any_environment_variable() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    done = subprocess.run(
        [sys.executable, "-c", _X64_PROCESS], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


# -- the per-call hot path ----------------------------------------------------------------------
class _Recording:
    """A real executable that also records the input arrays each call hands it."""

    def __init__(self, exe: lz.backends.Executable, seen: list[list[np.ndarray]]) -> None:
        self.exe, self.seen = exe, seen

    def __call__(self, inputs, params):
        self.seen.append(list(inputs))
        return self.exe(inputs, params)


def _recording_backend():
    from lazy.backends.jax_backend import JaxBackend

    class RecordingJax(JaxBackend):
        """The JAX backend, its executables wrapped in :class:`_Recording`."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[list[np.ndarray]] = []

        def compile(self, graph, bucket, policy):
            exe, times = super().compile(graph, bucket, policy)
            return _Recording(exe, self.seen), times

    return RecordingJax()


def test_an_exact_bucket_runs_the_callers_rows_without_a_padded_copy(graph, cache) -> None:
    backend = _recording_backend()
    # host_rows=0: every bucket on the recording backend (none placed on the numpy host plan)
    options = lz.Options(backend=backend, max_batch=8, host_rows=0)
    compiled = lz.compile(graph, options, cache).graphs[0]
    backend.seen.clear()  # the warm-up calls
    x = _x(4)
    out = compiled({"x": x})
    assert backend.seen[-1][0] is x  # the caller's array itself reached the executable
    assert compiled.stats.padded_rows == 0 and out["proba"].shape == (4, 3)
    compiled({"x": _x(3)})
    assert backend.seen[-1][0].shape == (4, 6) and compiled.stats.padded_rows == 1
    np.testing.assert_allclose(out["proba"], lz.evaluate(graph, {"x": x})["proba"], rtol=1e-5)


def test_parameters_are_not_transferred_per_call(graph, cache, capfd) -> None:
    import jax

    compiled = lz.compile(graph, lz.Options(max_batch=8, host_rows=0), cache).graphs[0]
    x = _x(4)
    assert len(compiled.params) >= 2  # the optimized graph's parameters
    capfd.readouterr()
    with jax.transfer_guard_host_to_device("log"):  # logs every implicit host → device copy
        for _ in range(3):
            compiled({"x": x})
    # One per call (the rows); parameters passed from the host would add theirs to each call.
    assert capfd.readouterr().err.count("host-to-device transfer") == 3

    exe, rows = compiled.executable(4), jax.device_put(x)
    with jax.transfer_guard_host_to_device("disallow"):
        out = exe([rows], compiled.params)  # device rows and resident params: nothing to copy
        with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
            exe([rows], [np.asarray(p) for p in compiled.params])  # the guard is live
    expected = compiled.run_list({"x": x})
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_executable_is_the_bucket_a_call_would_run(graph, cache) -> None:
    compiled = lz.compile(graph, lz.Options(max_batch=8, call_rows=8), cache).graphs[0]
    assert compiled.executable(3) is compiled.executable(4)  # both run the 4-row bucket
    for rows in (0, 9):
        with pytest.raises(lz.InputError, match=rf"rows must be in 1\.\.8, got {rows}"):
            compiled.executable(rows)


def test_a_program_output_named_twice_reads_one_graph_output(cache) -> None:
    b = lz.Builder()
    x = b.input("x", (2,))
    doubled = x * 2.0
    program = b.build({"first": doubled, "again": doubled, "plus": x + 1.0})
    compiled = lz.compile(program, lz.Options(max_batch=4), cache)
    assert compiled.graphs[0].output_names and len(compiled.graphs[0].output_names) == 2
    feed = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
    out = compiled(feed)
    assert list(out) == ["first", "again", "plus"]
    np.testing.assert_array_equal(out["first"], feed["x"] * 2)
    np.testing.assert_array_equal(out["again"], feed["x"] * 2)
    np.testing.assert_array_equal(out["plus"], feed["x"] + 1)
