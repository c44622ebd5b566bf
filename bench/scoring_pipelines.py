"""The pipelines of the scoring benchmark (issue 6, a–j) and the data they are fitted and scored on.

Every pipeline is a binary classifier fitted on synthetic data. Numeric pipelines read 50 float32
features; ``f`` reads a DataFrame of 8 float32 columns with NaN and 4 string columns. Rows to score
come from a held-out pool of the same distribution, so trees see unseen values near thresholds.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Kind = Literal["linear", "mlp", "trees", "kernel"]

N_FEATURES = 50
FRAME_NUMERIC = 8
FRAME_STRINGS = 4
# Cardinalities of the string columns of ``f`` (one-hot widths 5 + 10 + 20 + 40).
FRAME_CARDINALITY = (5, 10, 20, 40)
FRAME_NAN_RATE = 0.05


@dataclass(frozen=True)
class Scale:
    """Sizes that differ between a full run and a ``--quick`` smoke run."""

    train_rows: int
    svc_train_rows: int  # libsvm's fit (5-fold Platt scaling) is quadratic in rows
    trees: int
    mlp_iter: int

    @classmethod
    def full(cls) -> Scale:
        return cls(train_rows=10_000, svc_train_rows=5_000, trees=100, mlp_iter=60)

    @classmethod
    def quick(cls) -> Scale:
        return cls(train_rows=1_000, svc_train_rows=500, trees=10, mlp_iter=10)


@dataclass(frozen=True)
class Pipeline:
    """One benchmarked pipeline: ``build(scale)`` gives the unfitted estimator."""

    key: str
    name: str
    title: str
    kind: Kind  # selects the performance targets that apply
    build: Callable[[Scale], Any]
    frame: bool = False  # scored on a DataFrame (else a float32 matrix)
    requires: tuple[str, ...] = ()  # modules the estimator itself needs

    @property
    def label(self) -> str:
        return f"{self.key} {self.name}"

    def missing(self) -> list[str]:
        """Required modules that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


def _lr(scale: Scale) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))


def _rf(depth: int | None) -> Callable[[Scale], Any]:
    def build(scale: Scale) -> Any:
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(scale.trees, max_depth=depth, random_state=0, n_jobs=1)

    return build


def _gbc(scale: Scale) -> Any:
    from sklearn.ensemble import GradientBoostingClassifier

    return GradientBoostingClassifier(n_estimators=scale.trees, max_depth=3, random_state=0)


def _hgb(scale: Scale) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_iter=scale.trees, early_stopping=False, random_state=0
    )


def _ct_rf(scale: Scale) -> Any:
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline as SkPipeline
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric = [f"n{i}" for i in range(FRAME_NUMERIC)]
    strings = [f"s{i}" for i in range(FRAME_STRINGS)]
    features = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), strings),
        ]
    )
    forest = RandomForestClassifier(scale.trees, max_depth=8, random_state=0, n_jobs=1)
    return SkPipeline([("features", features), ("forest", forest)])


def _lgbm(scale: Scale) -> Any:
    from lightgbm import LGBMClassifier

    return LGBMClassifier(
        n_estimators=scale.trees, num_leaves=31, n_jobs=1, random_state=0, verbose=-1
    )


def _xgb(scale: Scale) -> Any:
    from xgboost import XGBClassifier

    return XGBClassifier(n_estimators=scale.trees, max_depth=6, n_jobs=1, random_state=0)


def _mlp(scale: Scale) -> Any:
    from sklearn.neural_network import MLPClassifier

    return MLPClassifier((100, 100), max_iter=scale.mlp_iter, random_state=0)


def _pca_svc(scale: Scale) -> Any:
    from sklearn.decomposition import PCA
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import SVC

    return make_pipeline(
        PCA(10, random_state=0), SVC(kernel="rbf", probability=True, random_state=0)
    )


PIPELINES: dict[str, Pipeline] = {
    p.key: p
    for p in (
        Pipeline("a", "lr", "StandardScaler + LogisticRegression", "linear", _lr),
        Pipeline("b", "rf_d8", "RandomForest 100 trees, depth 8", "trees", _rf(8)),
        Pipeline("c", "rf_deep", "RandomForest 100 trees, unlimited depth", "trees", _rf(None)),
        Pipeline("d", "gbc", "GradientBoosting 100 trees, depth 3", "trees", _gbc),
        Pipeline("e", "hgb", "HistGradientBoosting 100 iterations", "trees", _hgb),
        Pipeline(
            "f",
            "ct_rf",
            "ColumnTransformer (impute + scale numeric with NaN, one-hot strings) + "
            "RandomForest 100 trees, depth 8",
            "trees",
            _ct_rf,
            frame=True,
        ),
        Pipeline(
            "g", "lgbm", "LightGBM 100 trees × 31 leaves", "trees", _lgbm, requires=("lightgbm",)
        ),
        Pipeline("h", "xgb", "XGBoost 100 trees, depth 6", "trees", _xgb, requires=("xgboost",)),
        Pipeline("i", "mlp", "MLP (100, 100)", "mlp", _mlp),
        Pipeline("j", "pca_svc", "PCA(10) + SVC(rbf, probability=True)", "kernel", _pca_svc),
    )
}


@dataclass
class Data:
    """Training rows and a pool of held-out rows to score (a matrix, or a DataFrame for ``f``)."""

    x_train: Any
    y_train: np.ndarray
    pool: Any

    def rows(self, n: int) -> Any:
        """The first ``n`` pool rows (cycled if the pool is shorter), as a fresh contiguous object."""
        index = np.arange(n) % len(self.pool)
        if hasattr(self.pool, "iloc"):
            return self.pool.iloc[index].reset_index(drop=True)
        return np.ascontiguousarray(self.pool[index])


def make_data(frame: bool, train_rows: int, pool_rows: int, seed: int = 0) -> Data:
    """Synthetic binary-classification data: float32 matrix, or the DataFrame ``f`` reads."""
    from sklearn.datasets import make_classification

    n_features = FRAME_NUMERIC + FRAME_STRINGS if frame else N_FEATURES
    x, y = make_classification(
        train_rows + pool_rows,
        n_features,
        n_informative=max(4, n_features // 3),
        n_redundant=n_features // 5,
        random_state=seed,
    )
    x = x.astype(np.float32)
    table: Any = _frame(x, np.random.default_rng(seed)) if frame else x
    if frame:
        return Data(table.iloc[:train_rows], y[:train_rows], table.iloc[train_rows:])
    return Data(table[:train_rows], y[:train_rows], table[train_rows:])


def _frame(x: np.ndarray, rng: np.random.Generator) -> Any:
    """8 float32 columns with NaN, then 4 string columns binned from informative features."""
    import pandas as pd

    columns: dict[str, Any] = {}
    for i in range(FRAME_NUMERIC):
        values = x[:, i].copy()
        values[rng.random(len(values)) < FRAME_NAN_RATE] = np.nan
        columns[f"n{i}"] = values
    for i, k in enumerate(FRAME_CARDINALITY):
        source = x[:, FRAME_NUMERIC + i]
        edges = np.quantile(source, np.linspace(0, 1, k + 1)[1:-1])
        codes = np.searchsorted(edges, source)
        columns[f"s{i}"] = np.array([f"v{c}" for c in range(k)], dtype=object)[codes]
    return pd.DataFrame(columns)


def work(pipeline: Pipeline, est: Any, rows: int) -> tuple[float, str] | None:
    """What bounds a scorer of ``pipeline`` at ``rows`` rows: bytes it must read and write (a
    linear model: memory-bound) or its matrix-product FLOPs (an MLP); None for other pipelines."""
    if pipeline.kind == "linear":
        n_out = len(est.classes_)
        return rows * (N_FEATURES + n_out) * 4.0, "bytes"
    if pipeline.kind == "mlp":
        return rows * sum(2.0 * w.shape[0] * w.shape[1] for w in est.coefs_), "flops"
    return None


def fit(pipeline: Pipeline, scale: Scale, data: Data) -> Any:
    """The fitted estimator (SVC pipelines on fewer rows: their fit is quadratic)."""
    from sklearn.exceptions import ConvergenceWarning

    est = pipeline.build(scale)
    rows = scale.svc_train_rows if pipeline.kind == "kernel" else scale.train_rows
    with warnings.catch_warnings():
        # The MLP stops at max_iter on purpose: scoring cost does not depend on convergence.
        warnings.simplefilter("ignore", category=ConvergenceWarning)
        x = data.x_train.iloc[:rows] if pipeline.frame else data.x_train[:rows]
        est.fit(x, data.y_train[:rows])
    return est
