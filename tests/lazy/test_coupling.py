"""COUPLE (``lz.couple``) and its LOOP formulation (``lz.couple_loop``): every form of libsvm's
pairwise coupling against a line-by-line port of libsvm's ``multiclass_probability``, row by row,
on pairwise probabilities fitted models rarely reach; the native kernel's own checks; the numpy
backend's fallback without numba. numba is a dependency of the project, so the native kernel is
tested, never skipped."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import lazy as lz
from lazy import coupling, native


def _libsvm_coupling(r: np.ndarray) -> np.ndarray:
    """A line-by-line port of libsvm's ``multiclass_probability`` for one row of a full (k, k)
    pairwise matrix (``r[i, j]`` the probability of i over j)."""
    k = len(r)
    q = np.zeros((k, k))
    p = np.full(k, 1.0 / k)
    for t in range(k):
        for j in range(t):
            q[t, t] += r[j, t] * r[j, t]
            q[t, j] = q[j, t]
        for j in range(t + 1, k):
            q[t, t] += r[j, t] * r[j, t]
            q[t, j] = -r[j, t] * r[t, j]
    eps = 0.005 / k
    for _ in range(max(100, k)):
        qp = np.zeros(k)
        pqp = 0.0
        for t in range(k):
            for j in range(k):
                qp[t] += q[t, j] * p[j]
            pqp += p[t] * qp[t]
        if max(abs(qp[t] - pqp) for t in range(k)) < eps:
            break
        for t in range(k):
            diff = (-qp[t] + pqp) / q[t, t]
            p[t] += diff
            pqp = (pqp + diff * (diff * q[t, t] + 2 * qp[t])) / (1 + diff) / (1 + diff)
            for j in range(k):
                qp[j] = (qp[j] + diff * q[t, j]) / (1 + diff)
                p[j] /= 1 + diff
    return p


def _pairs(k: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


def _pairwise_rows(k: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, n_pairs) pairwise probabilities: uniform ones, clipped extremes, a contradictory
    cycle (0 beats 1 beats 2 beats 0) and the all-even row that stops before the first sweep."""
    n = len(_pairs(k))
    uniform = rng.uniform(1e-7, 1 - 1e-7, (rows, n))
    extremes = rng.choice([1e-7, 1 - 1e-7, 0.5, 0.01, 0.99], (rows, n))
    cycle = np.full((1, n), 0.5)
    if k >= 3:
        cycle[0, [0, 1, k - 1]] = [1 - 1e-7, 1e-7, 1 - 1e-7]  # pairs (0,1), (0,2), (1,2)
    return np.concatenate([uniform, extremes, cycle, np.full((1, n), 0.5)])


def _libsvm(rows: np.ndarray, k: int) -> np.ndarray:
    out = []
    for row in rows:
        full = np.zeros((k, k))
        for (i, j), value in zip(_pairs(k), row, strict=True):
            full[i, j], full[j, i] = value, 1.0 - value
        out.append(_libsvm_coupling(full))
    return np.array(out)


def _graph(k: int, dtype: str = "float64", *, loop: bool = False) -> lz.Graph:
    b = lz.Builder()
    r = b.input("r", (len(_pairs(k)),), dtype)
    form = lz.couple_loop if loop else lz.couple
    return b.graph({"p": form(r, classes=k)})


def _compiled(backend: str, *, loop: bool) -> Callable[[np.ndarray, int], np.ndarray]:
    def run(r: np.ndarray, k: int) -> np.ndarray:
        options = lz.Options(backend=backend, dtype_policy=lz.DTypePolicy.X64, max_batch=64)
        # A cache of its own: a plan another test compiled for the same graph must not stand in.
        compiled = lz.compile(
            _graph(k, r.dtype.name, loop=loop), options, cache=lz.ExecutableCache()
        )
        return np.asarray(compiled({"r": r})["p"])

    return run


def _reference(r: np.ndarray, k: int) -> np.ndarray:
    return lz.evaluate(_graph(k, r.dtype.name), {"r": r})["p"].astype(r.dtype)


FORMS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "reference": _reference,
    "native": lambda r, k: coupling.native(k)(r),
    "numpy": _compiled("numpy", loop=False),
    "loop on numpy": _compiled("numpy", loop=True),
    "loop on jax": _compiled("jax", loop=True),
    "loop on torch": _compiled("torch", loop=True),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_every_form_stops_where_libsvm_does(k: int, form: str) -> None:
    # Rows stopping after 0 to many sweeps share a batch: each must stop exactly when libsvm does.
    rows = _pairwise_rows(k, 40, np.random.default_rng(k))
    got = FORMS[form](rows, k)
    assert got.dtype == np.float64 and got.shape == (len(rows), k)
    np.testing.assert_allclose(got, _libsvm(rows, k), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_float32_stays_float32_and_agrees(k: int) -> None:
    rows = _pairwise_rows(k, 40, np.random.default_rng(10 + k)).astype(np.float32)
    want = _libsvm(rows.astype(np.float64), k)
    for form, fn in FORMS.items():
        got = fn(rows, k)
        assert got.dtype == np.float32, form
        np.testing.assert_allclose(got, want, atol=2e-6, err_msg=form)


def test_native_reads_strided_rows() -> None:
    rows = _pairwise_rows(4, 20, np.random.default_rng(0))
    wide = np.repeat(rows, 2, axis=1)[:, ::2]  # a non-contiguous view of the same values
    np.testing.assert_array_equal(coupling.native(4)(wide), coupling.native(4)(rows))


def test_native_refuses_rows_of_another_pair_count() -> None:
    with pytest.raises(lz.BackendError, match="COUPLE of 3 classes needs"):
        coupling.native(3)(np.full((2, 2), 0.5))


def test_a_row_that_never_meets_the_test_runs_every_sweep() -> None:
    # A NaN never passes the stopping test: every form runs libsvm's sweep limit and returns NaN,
    # the row's neighbours unaffected.
    rows = np.array([[np.nan, 0.3, 0.6], [0.2, 0.3, 0.6]])
    for form, fn in FORMS.items():
        got = fn(rows, 3)
        assert np.isnan(got[0]).all(), form
        np.testing.assert_allclose(got[1], _libsvm(rows[1:], 3)[0], rtol=1e-12, err_msg=form)


def _numpy_run(k: int, rows: np.ndarray) -> np.ndarray:
    return FORMS["numpy"](rows, k)


def test_numpy_backend_runs_the_native_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    kernel = coupling.native

    def counted(classes: int) -> Callable[[np.ndarray], np.ndarray]:
        calls.append(classes)
        return kernel(classes)

    monkeypatch.setattr(coupling, "native", counted)
    rows = _pairwise_rows(3, 10, np.random.default_rng(5))
    np.testing.assert_allclose(_numpy_run(3, rows), _libsvm(rows, 3), rtol=1e-12, atol=1e-15)
    assert calls and set(calls) == {3}


def test_numpy_backend_couples_in_numpy_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_native(classes: int) -> None:
        raise AssertionError("the native kernel was used without numba")

    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(coupling, "native", no_native)
    rows = _pairwise_rows(3, 10, np.random.default_rng(6))
    np.testing.assert_allclose(_numpy_run(3, rows), _libsvm(rows, 3), rtol=1e-12, atol=1e-15)
