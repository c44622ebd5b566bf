"""Inputs whose float32 form is subnormal, on a device that flushes them (XLA:CPU): a split at
0.0 decides them as the source does."""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import RandomForestClassifier

import compiler

TINY32 = float(np.finfo(np.float32).smallest_subnormal)


def test_a_forest_split_at_zero_decides_subnormals_as_scikit_learn() -> None:
    # Values one decimal apart around zero: a split at exactly 0.0, whose float32 neighbours
    # are subnormal, as the registration's parity probes send them.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 4)).round(1)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    forest = RandomForestClassifier(n_estimators=6, max_depth=4, random_state=0).fit(x, y)
    (column,) = {
        f
        for e in forest.estimators_
        for f, t in zip(e.tree_.feature, e.tree_.threshold, strict=True)
        if t == 0.0
    }
    options = compiler.CompileOptions(max_batch=64, call_rows=64, host_rows=0)
    model = compiler.compile(forest, options=options)
    rows = np.repeat(x[:16], 4, axis=0)
    rows[:, column] = np.tile([TINY32, -TINY32, TINY32 / 2 * 1.0001, 0.0], 16)
    np.testing.assert_array_equal(model.predict(rows), forest.predict(rows))
    np.testing.assert_allclose(model.predict_proba(rows), forest.predict_proba(rows), atol=1e-6)
