"""``lazy.warm``: the native kernels built at start are every kernel a tree or SVC model then
runs, so no model's first call compiles one (seconds each on a cold cache)."""

from __future__ import annotations

import lightgbm
import numpy as np
import pytest
import xgboost
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestRegressor
from sklearn.svm import SVC

import compiler
from lazy import coupling, forest, forest_bits, native, warm


def _signatures() -> set[object]:
    kernels = (forest._kernel(), forest_bits._kernel(), coupling._kernel())
    return {signature for kernel in kernels for signature in kernel.signatures}


def _rows() -> np.ndarray:
    # Integer-valued and binary columns, values on the splits, a missing value.
    rng = np.random.default_rng(0)
    x = np.column_stack(
        [rng.integers(0, 5, 400), rng.integers(0, 2, 400), rng.normal(size=(400, 3))]
    )
    x[7, 2] = np.nan
    return x


@pytest.mark.filterwarnings("ignore:.*probability.*:FutureWarning")
def test_warm_kernels_are_every_kernel_a_tree_or_svc_model_runs() -> None:
    assert native.AVAILABLE  # numba is a dependency: the kernels are tested, never skipped
    warm.warm_kernels()
    warmed = _signatures()
    x = _rows()
    y = (x[:, 0] + x[:, 1] > 2).astype(int)
    finite = np.nan_to_num(x)  # SVC takes no missing values
    models = [
        RandomForestRegressor(5, max_depth=4, random_state=0).fit(x, y),
        HistGradientBoostingClassifier(max_iter=5, random_state=0).fit(x, y),
        lightgbm.LGBMClassifier(n_estimators=5, verbose=-1).fit(x, y),
        xgboost.XGBClassifier(n_estimators=5).fit(x, y),
        SVC(probability=True, random_state=0).fit(finite, y),
        SVC(probability=True, random_state=0).fit(finite, x[:, 0].astype(int)),
    ]
    for model in models:
        inputs = finite if isinstance(model, SVC) else x
        for dtype in ("float32", "float64"):
            options = compiler.CompileOptions(backend="numpy", max_batch=16, dtype=dtype)
            compiled = compiler.compile(model, options=options)
            for rows in (1, 3, 16, 40):
                batch = inputs[:rows]
                read_only = batch.astype(np.float32)
                read_only.flags.writeable = False
                for view in (batch, read_only, np.asfortranarray(batch), inputs[:rows, ::1]):
                    compiled.run(view)
    assert _signatures() == warmed, "a model compiled a kernel that warm_kernels does not build"


def test_warm_kernels_without_numba_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    assert warm.warm_kernels() == 0.0


def test_warm_kernels_builds_each_pair_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    warm.warm_kernels()

    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("warm_kernels built a pair this process had built already")

    monkeypatch.setattr(warm, "compile", no_compile)
    warm.warm_kernels()
