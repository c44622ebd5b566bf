"""The built-in converters. Importing this package registers them all."""

from __future__ import annotations

from .. import containers  # noqa: F401
from . import (  # noqa: F401 - importing registers each module's converters
    calibration,
    clustering,
    decomposition,
    encoders,
    ensembles,
    imputers,
    linear,
    mixture,
    multioutput,
    naive_bayes,
    neighbors,
    neural,
    preprocessing,
    selection,
    svm,
    target,
    trees,
)
