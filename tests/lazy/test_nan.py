"""lazy.nan: which input columns a NaN certainly reaches each output from."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import scaler_logreg

import lazy as lz
from lazy.nan import nan_reaching_columns

ALL = frozenset(range(4))


def _graph(outputs) -> lz.Graph:
    """``outputs(x, w)`` on an input of 4 float32 columns and a (4, 2) weight."""
    b = lz.Builder()
    x = b.input("x", (4,))
    w = b.param(np.arange(8, dtype=np.float32).reshape(4, 2) - 3, "w")  # a zero weight too
    return b.graph(outputs(x, w))


def test_linear_heads_carry_every_column_and_argmax_none() -> None:
    reach = nan_reaching_columns(scaler_logreg(n_features=6), "x")
    assert reach == {"proba": frozenset(range(6)), "label": frozenset()}


def test_elementwise_layout_and_reductions_carry_columns() -> None:
    def outputs(x, w):
        logit = lz.sigmoid(lz.tanh(x * 2.0) @ w)
        return {
            "proba": lz.concat([1.0 - logit, logit], axis=1),
            "total": lz.log1p(abs(x)).sum(axis=1),
            "rows": lz.reshape(lz.exp(x), (lz.B, 2, 2)),
            "cast": lz.cast(x, "float64"),
        }

    reach = nan_reaching_columns(_graph(outputs), "x")
    assert reach == {"proba": ALL, "total": ALL, "rows": ALL, "cast": ALL}


def test_ops_that_can_drop_a_nan_stop_it() -> None:
    def outputs(x, w):
        return {
            "relu": lz.maximum(x, 0.0),  # NaN handling of max differs between backends
            "select": lz.where(x > 0.0, x, 0.0),
            "power": x**2.0,  # pow(nan, 0) == 1
            "slice": lz.slice_axis(x, 1, 0, 2),  # the NaN may be cut away
            "isnan": lz.cast(lz.isnan(x), "float32"),
            "max": x.max(axis=1),
            "ints": lz.cast(x, "int32"),
            "mixed": lz.slice_axis(x, 1, 0, 2) + x[:, 3:4].sum(axis=1, keepdims=True),
        }

    reach = nan_reaching_columns(_graph(outputs), "x")
    assert {k: v for k, v in reach.items() if k != "mixed"} == dict.fromkeys(
        ("relu", "select", "power", "slice", "isnan", "max", "ints"), frozenset()
    )
    assert reach["mixed"] == frozenset()  # slices on both sides


def test_columns_of_one_branch_only() -> None:
    def outputs(x, w):
        left = lz.slice_axis(x, 1, 0, 2)  # columns 0-1 only through a slice: stopped
        return {"sum": x.sum(axis=1) + lz.maximum(left, 0.0).sum(axis=1)}

    assert nan_reaching_columns(_graph(outputs), "x") == {"sum": ALL}


def test_what_the_analysis_claims_holds_on_every_backend() -> None:
    """A NaN in a claimed column makes the row NaN, whatever the other values (inf, 0, NaN)."""

    def outputs(x, w):
        logit = (x - 1.0) / 3.0 @ w + 0.5
        return {"proba": lz.softmax(logit), "score": lz.sigmoid(logit.sum(axis=1))}

    graph = _graph(outputs)
    reach = nan_reaching_columns(graph, "x")
    assert reach == {"proba": ALL, "score": ALL}
    rows = np.array(
        [[0.0, 0.0, 0.0, 0.0], [np.inf, -np.inf, 1.0, 0.0], [1e30, -1e30, 1e-30, 2.0]], np.float32
    )
    cases = []
    for column in range(4):
        for row in rows:
            case = row.copy()
            case[column] = np.nan
            cases.append(case)
    x = np.stack(cases)
    for name, run in (
        ("interpreter", lambda feed: lz.evaluate(graph, feed)),
        # Not warmed: only the bucket of these 12 rows is compiled.
        ("jax", lz.compile(graph, lz.Options(backend="jax", max_batch=16), warmup=False)),
        ("torch", lz.compile(graph, lz.Options(backend="torch", max_batch=16), warmup=False)),
    ):
        out = run({"x": x})
        for head in ("proba", "score"):
            values = np.asarray(out[head]).reshape(len(x), -1)
            assert np.isnan(values).any(axis=1).all(), (name, head)


def test_unknown_or_non_matrix_inputs_are_refused() -> None:
    graph = scaler_logreg()
    with pytest.raises(lz.GraphError, match=r"no input 'y'; it has \['x'\]"):
        nan_reaching_columns(graph, "y")
    b = lz.Builder()
    v = b.input("v", ())
    with pytest.raises(lz.GraphError, match="must be rows × columns"):
        nan_reaching_columns(b.graph({"out": v * 2.0}), "v")


def test_a_variant_passes_on_only_what_both_formulations_surface() -> None:
    def outputs(x, w):
        every = x.sum(axis=1)  # all columns
        stopped = lz.maximum(x, 0.0).sum(axis=1)  # none: MAXIMUM may drop a NaN
        return {
            "both": lz.variant(every, (x @ w).sum(axis=1)),
            "device_only": lz.variant(every, stopped),
            "host_only": lz.variant(stopped, every),
        }

    reach = nan_reaching_columns(_graph(outputs), "x")
    assert reach == {"both": ALL, "device_only": frozenset(), "host_only": frozenset()}
