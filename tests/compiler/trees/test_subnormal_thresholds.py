"""XGBoost splits ``x < c``; in the trees' ``x > t`` form a split at ``c = 0.0`` compares with
``t = -1.4e-45``, a subnormal that XLA:CPU reads as zero, so ``x = 0`` went right. The device
graph reads such thresholds moved off the subnormals (``lazy.subnormals.for_flushing``): every
row, on every strategy and with every bucket on the device, is decided as XGBoost decides it."""

from __future__ import annotations

import numpy as np
import pytest
from xgboost import XGBClassifier, XGBRegressor

import compiler
from compiler.trees.strategies import IMPLEMENTED


def _integer_rows(n: int, seed: int) -> np.ndarray:
    """Columns of small integers on both sides of zero: XGBoost splits them at 0.0."""
    return np.random.default_rng(seed).integers(-2, 3, (n, 3)).astype(float)


@pytest.mark.parametrize("strategy", sorted(IMPLEMENTED))
def test_splits_at_zero_decide_as_xgboost_on_the_device(strategy: str) -> None:
    x = _integer_rows(3000, 0)
    y = ((x[:, 0] >= 0) ^ (x[:, 1] > 0)).astype(int)
    model = XGBClassifier(n_estimators=20, max_depth=3, random_state=0).fit(x, y)
    splits = model.get_booster().trees_to_dataframe().query("Feature != 'Leaf'")["Split"]
    assert (splits == 0.0).any()  # the case under test
    options = compiler.CompileOptions(host_rows=0, tree_strategy=strategy)
    compiled = compiler.compile(model, options=options)
    rows = np.vstack([x, [[0.0, -0.0, 0.0], [-0.0, 0.0, -0.0]]])
    np.testing.assert_array_equal(compiled.predict(rows), model.predict(rows))
    np.testing.assert_allclose(compiled.predict_proba(rows), model.predict_proba(rows), atol=1e-6)


def test_a_regressor_margin_is_bit_identical_at_zero_on_the_device() -> None:
    x = _integer_rows(2000, 1)
    y = np.where(x[:, 2] < 0, -1.0, 1.0) + 0.5 * (x[:, 0] >= 0)
    model = XGBRegressor(n_estimators=15, max_depth=2, random_state=0).fit(x, y)
    compiled = compiler.compile(model, options=compiler.CompileOptions(host_rows=0))
    np.testing.assert_array_equal(compiled.predict(x).astype(np.float32), model.predict(x))
