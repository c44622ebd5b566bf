"""Code an operator trusts: skops uploads in ``test_host_steps.py`` reference this module's
function and class, which then run as host steps (``KESTREL_HOST_STEP_MODULES``)."""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin


def with_ranks(x):
    """Each row beside the within-row ranks of its values (ties by position): arbitrary numpy,
    not traceable (``np.asarray`` of a lazy value), and twice as wide as its input."""
    x = np.asarray(x, dtype=float)
    return np.column_stack([x, np.argsort(np.argsort(x, axis=1, kind="stable"), axis=1)])


class Clipper(TransformerMixin, BaseEstimator):
    """A custom transformer: clips every column to its fitted 10th-90th percentile range."""

    def fit(self, x, y=None):
        x = np.asarray(x, dtype=float)
        self.n_features_in_ = x.shape[1]
        self.low_, self.high_ = np.percentile(x, [10, 90], axis=0)
        return self

    def transform(self, x):
        return np.clip(np.asarray(x, dtype=float), self.low_, self.high_)
