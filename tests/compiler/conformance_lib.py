"""The conformance suite's vocabulary: cases, data sets and the checks' tolerances.

Every registered class must have at least one :class:`Case` in a ``cases_*.py`` module beside this
file (the suite fails otherwise). Known gaps go in a module's ``XFAIL`` table with a reason: they
run as strict expected failures, never as skips.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from sklearn.datasets import make_classification, make_regression

from compiler.precision import TOLERANCE

#: The tolerance of float outputs (relative, scaled by the output's magnitude): the compiler's.
RTOL32 = TOLERANCE


@dataclass(frozen=True)
class Data:
    x: np.ndarray
    y: np.ndarray | None


@cache
def dataset(kind: str, n_features: int = 8, rows: int = 240) -> Data:
    """Deterministic data sets. Class labels are strings, so labels must round-trip exactly."""
    rng = np.random.default_rng(7)
    if kind in ("binary", "multiclass"):
        classes = 2 if kind == "binary" else 3
        x, y = make_classification(
            rows,
            n_features,
            n_informative=min(5, n_features),
            n_redundant=0,
            n_classes=classes,
            random_state=7,
        )
        labels = np.array(["cat", "dog", "eel"])[:classes]
        return Data(x, labels[y])
    if kind == "regression":
        x, y = make_regression(rows, n_features, n_informative=5, noise=0.5, random_state=7)
        return Data(x, y / np.abs(y).max() * 10)
    if kind == "multioutput":
        x, y = make_regression(rows, n_features, n_targets=3, noise=0.5, random_state=7)
        return Data(x, y / np.abs(y).max() * 10)
    if kind == "positive":  # non-negative features (counts), e.g. for chi2 or MultinomialNB
        x = rng.poisson(3.0, (rows, n_features)).astype(np.float64)
        y = np.array(["cat", "dog"])[(x[:, 0] + x[:, 1] > 6).astype(int)]
        return Data(x, y)
    raise ValueError(kind)


@dataclass(frozen=True, eq=False)  # hashed by identity: compiled models are cached per case
class Case:
    """One fitted configuration of a registered class.

    ``make`` builds the unfitted estimator; ``data`` names a :func:`dataset` (or is a callable
    returning :class:`Data`); ``nan`` says whether the *source* accepts NaN inputs (then the
    compiled model must match it on NaN; otherwise it must reject NaN like the source).
    """

    id: str
    make: Callable[[], Any]
    data: str | Callable[[], Data] = "binary"
    nan: bool = False
    sample: Callable[[], Any] | None = None  # a table (e.g. DataFrame) to fit and score on
    extra: dict[str, Any] = field(default_factory=dict)

    def fitted(self) -> tuple[Any, Any, Data]:
        data = self.data() if callable(self.data) else dataset(self.data)
        table = self.sample() if self.sample else data.x
        est = self.make()
        est.fit(table, data.y) if data.y is not None else est.fit(table)
        return est, table, data


@dataclass(frozen=True)
class Unsupported:
    """A hyper-parameter the converter rejects: ``make`` builds an estimator using it."""

    make: Callable[[], Any]
    data: str = "binary"
    match: str = ""
