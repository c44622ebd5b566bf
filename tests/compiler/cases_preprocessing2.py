"""Conformance cases: discretizers, quantile and power transforms, splines, target encoding."""

from __future__ import annotations

import numpy as np
from cases_preprocessing import _strings
from conformance_lib import Case, Data, Unsupported, dataset
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    KBinsDiscretizer,
    PowerTransformer,
    QuantileTransformer,
    SplineTransformer,
    StandardScaler,
    TargetEncoder,
)

# -- data ---------------------------------------------------------------------------------------


def _ties() -> Data:
    """Features rounded to eighths: repeated quantiles and bin edges with rows exactly on them.

    The values are float32 numbers, so float64 rows on an edge are still on it in float32 (an
    edge that is not a float32 value cannot be matched for float64 rows next to it)."""
    base = dataset("binary")
    return Data(np.round(base.x * 8) / 8, base.y)


def _holes() -> Data:
    """float32-valued regression features with NaN (column 5 has two rows 2e-6 apart, a segment
    too narrow for float64 rows rounded to float32 to interpolate within 1e-5)."""
    base = dataset("regression")
    x = base.x.astype(np.float32).astype(np.float64)
    x[::7, 0] = np.nan
    x[2::11, 3] = np.nan
    return Data(x, base.y)


def _positive() -> Data:
    """Strictly positive, skewed features (Box-Cox needs x > 0)."""
    base = dataset("regression")
    return Data(np.exp(base.x / 2.0), base.y)


# -- cases --------------------------------------------------------------------------------------

CASES = {
    KBinsDiscretizer: [
        Case(
            "kbins-ordinal-quantile",
            lambda: KBinsDiscretizer(n_bins=5, encode="ordinal", strategy="quantile"),
        ),
        Case(
            "kbins-onehot-uniform",
            lambda: KBinsDiscretizer(n_bins=4, encode="onehot", strategy="uniform"),
            data="regression",
        ),
        Case(
            "kbins-onehot-dense-kmeans",
            lambda: make_pipeline(
                KBinsDiscretizer(n_bins=3, encode="onehot-dense", strategy="kmeans"),
                LogisticRegression(max_iter=300),
            ),
            data="multiclass",
        ),
        Case(
            "kbins-ties-inverted-cdf",
            lambda: KBinsDiscretizer(
                n_bins=6, encode="ordinal", strategy="quantile", quantile_method="inverted_cdf"
            ),
            data=_ties,
        ),
    ],
    QuantileTransformer: [
        Case("quantile-uniform", lambda: QuantileTransformer(n_quantiles=100), nan=True),
        Case("quantile-all-rows", QuantileTransformer, data=_holes, nan=True),
        Case("quantile-ties", lambda: QuantileTransformer(n_quantiles=50), data=_ties, nan=True),
        Case(
            "quantile-normal",
            lambda: QuantileTransformer(n_quantiles=100, output_distribution="normal"),
            nan=True,
        ),
        Case(
            "quantile-normal-all-rows",
            lambda: QuantileTransformer(output_distribution="normal"),
            data=_holes,
            nan=True,
        ),
        Case(
            "quantile-normal-ties",
            lambda: QuantileTransformer(n_quantiles=50, output_distribution="normal"),
            data=_ties,
            nan=True,
        ),
    ],
    PowerTransformer: [
        Case("power-yeo-johnson", PowerTransformer, data="regression", nan=True),
        Case(
            "power-yeo-johnson-raw",
            lambda: PowerTransformer(standardize=False),
            data=_holes,
            nan=True,
        ),
        Case(
            "power-box-cox",
            lambda: PowerTransformer(method="box-cox"),
            data=_positive,
            nan=True,
        ),
    ],
    SplineTransformer: [
        Case("spline-cubic", SplineTransformer, data="regression"),
        Case(
            "spline-quantile-knots-linear",
            lambda: SplineTransformer(
                n_knots=4, degree=2, knots="quantile", extrapolation="linear", include_bias=False
            ),
        ),
        Case(
            "spline-periodic-missing",
            lambda: SplineTransformer(
                n_knots=6, degree=3, extrapolation="periodic", handle_missing="zeros"
            ),
            data=_holes,
            nan=True,
        ),
        Case(
            "spline-periodic-degree0",
            lambda: SplineTransformer(n_knots=5, degree=0, extrapolation="periodic"),
            data="multiclass",
        ),
        Case(
            "spline-constant-degree1",
            lambda: SplineTransformer(n_knots=3, degree=1, extrapolation="constant"),
            data="multiclass",
        ),
    ],
    TargetEncoder: [
        Case("target-encoder-binary", TargetEncoder, sample=_strings, nan=True),
        Case(
            "target-encoder-multiclass",
            lambda: TargetEncoder(smooth=2.0),
            data="multiclass",
            sample=_strings,
            nan=True,
        ),
        Case(
            "target-encoder-continuous-pipeline",
            lambda: make_pipeline(
                ColumnTransformer(
                    [
                        (
                            "enc",
                            make_pipeline(SimpleImputer(strategy="most_frequent"), TargetEncoder()),
                            ["color", "size"],
                        )
                    ],
                    remainder=StandardScaler(),
                ),
                Ridge(),
            ),
            data="regression",
            sample=_strings,
            nan=True,
        ),
    ],
}

UNSUPPORTED = {
    KBinsDiscretizer: "none: every encode and strategy is supported (sparse one-hot as dense)",
    QuantileTransformer: "none: both output distributions are supported "
    "(ignore_implicit_zeros only concerns sparse input, which is not accepted)",
    SplineTransformer: Unsupported(
        lambda: SplineTransformer(n_knots=3, sparse_output=True), match="sparse_output"
    ),
    TargetEncoder: Unsupported(
        lambda: make_pipeline(StandardScaler(), TargetEncoder()), match="computed by an earlier"
    ),
    PowerTransformer: "none: both methods, with and without standardize, are supported",
}
