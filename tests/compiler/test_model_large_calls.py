"""A linear model's large calls run in few large chunks, with the chunked results."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import compiler
from compiler.options import CompileOptions


def test_linear_model_runs_large_chunks_with_identical_results() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 50)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    est = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, y)
    fast = compiler.compile(est, options=CompileOptions(max_batch=64))
    chunked = compiler.compile(est, options=CompileOptions(max_batch=64, call_rows=64))
    graph = fast.compiled.graphs[0]
    assert graph.buckets.call_rows == 1024  # 64 x 2**4: a linear model's rows are cheap
    rows = rng.standard_normal((20_000, 50)).astype(np.float32)
    got, want = fast.predict_proba(rows), chunked.predict_proba(rows)
    assert chunked.compiled.graphs[0].stats.chunks == 313
    assert graph.stats.chunks <= 22  # 19 x 1024, then 512 + 32 (+ an alignment prefix)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, est.predict_proba(rows), atol=1e-5)
    np.testing.assert_array_equal(fast.predict(rows), est.predict(rows))
