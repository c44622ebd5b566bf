"""The built-in converters. Importing this package registers them all."""

from __future__ import annotations

from importlib.util import find_spec

from .. import containers  # noqa: F401
from . import (  # noqa: F401 - importing registers each module's converters
    calibration,
    clustering,
    decomposition,
    discretization,
    encoders,
    ensembles,
    imputers,
    linear,
    mixture,
    multioutput,
    naive_bayes,
    neighbors,
    neural,
    power,
    preprocessing,
    quantile,
    selection,
    splines,
    svm,
    target,
    target_encoding,
    trees,
)

# Optional libraries: their converters import them, so they register only where installed.
if find_spec("lightgbm") is not None:
    from . import lgbm  # noqa: F401
if find_spec("xgboost") is not None:
    from . import xgb  # noqa: F401
