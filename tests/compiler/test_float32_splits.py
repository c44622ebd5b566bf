"""Float32 codes of raw float64 split columns decide every split as the float64 value does."""

from __future__ import annotations

import numpy as np
import pytest

from compiler import float32_splits
from compiler.float32_inputs import float32_floor
from compiler.float32_splits import SplitInputs, encode_column
from lazy import native

F32 = np.float32


def _thresholds() -> np.ndarray:
    """Thresholds as real models hold them: integers and halves (integer and binary columns),
    decimals, float32 values, float64 values between two float32 ones (2.3), signed zeros, huge
    and tiny magnitudes, -inf (a split nothing but -inf passes)."""
    decimals = np.round(np.random.default_rng(0).normal(size=40) * 10, 3)
    return np.unique(
        np.concatenate(
            [
                [-np.inf, -3.5, -0.0, 0.5, 1.5, 2.0, 7.0, 1e-30, -1e-30, 1e300],
                [float(F32(0.1)), float(F32(1.1)), 2.3, 3.4e38, -3.4e38],
                decimals,
            ]
        )
    )


def _values(thresholds: np.ndarray) -> np.ndarray:
    """Every threshold, its float64 neighbours, its float32 floor and that floor's neighbours,
    the midpoints between them, special values, and random rows."""
    finite = thresholds[np.isfinite(thresholds)]
    near = [finite]
    for k in (1, 2, 3):
        near += [finite + k * np.spacing(finite), finite - k * np.spacing(finite)]
    floors = float32_floor(finite)
    with np.errstate(over="ignore"):
        up = np.nextafter(floors, F32(np.inf))
        down = np.nextafter(floors, F32(-np.inf))
        near += [floors, up, down, np.nextafter(up, F32(np.inf))]
    near += [(floors.astype(np.float64) + up) / 2, (finite + up) / 2]
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, 1e-40, -1e-40, 1e-45, 3.5e38]
    rng = np.random.default_rng(1)
    return np.concatenate([*near, special, rng.normal(size=2000) * 10, rng.integers(-5, 9, 500)])


def _assert_decides(values: np.ndarray, codes: np.ndarray, thresholds: np.ndarray) -> None:
    real = ~np.isnan(values)
    assert np.isnan(codes[~real]).all()
    floors = float32_floor(thresholds)
    for t, f in zip(thresholds, floors, strict=True):
        source = values[real] <= t
        coded = codes[real] <= f
        wrong = np.flatnonzero(source != coded)
        assert not wrong.size, (
            f"t={t!r}: x={values[real][wrong[0]]!r} code={codes[real][wrong[0]]!r}"
        )
        # a float64 graph compares the code with t itself
        assert np.array_equal(codes[real].astype(np.float64) <= t, source)


def test_codes_decide_every_threshold_as_the_float64_values() -> None:
    t = _thresholds()
    assert not SplitInputs.conflicting([t])
    values = _values(t)
    codes = encode_column(values, np.nan, t)
    _assert_decides(values, codes, t)
    assert not ((codes != 0) & (np.abs(codes) < np.finfo(F32).tiny)).any(), "a subnormal code"


def test_values_between_a_threshold_and_the_next_float32_move_up() -> None:
    t = np.array([float(F32(1.1)), 2.0])
    x = np.array([np.nextafter(t[0], 2.0), float(F32(1.1)), 2.0, np.nextafter(2.0, 3.0)])
    codes = encode_column(x, np.nan, t)
    assert codes[0] == np.nextafter(F32(1.1), F32(2))  # above t, though it rounds down to it
    assert codes[1] == F32(1.1) and codes[2] == F32(2.0)
    assert codes[3] > F32(2.0)


def test_a_fill_is_encoded_in_place_of_nan() -> None:
    t = np.array([0.25, 0.5])
    fill = np.nextafter(0.5, 1.0)  # above 0.5 by a float64 step: goes right of it
    codes = encode_column(np.array([np.nan, 0.5]), fill, t)
    assert codes[0] > F32(0.5) and codes[1] == F32(0.5)


@pytest.mark.parametrize(
    ("thresholds", "conflicting"),
    [
        ([1.0, 2.0, 2.5], False),
        ([1.0, np.nextafter(1.0, 2.0)], True),  # one float32 step holds both
        ([1.6e9 + 10.5, 1.6e9 + 20.5], True),  # seconds on a timestamp column: 128 s per step
        ([1e-40, 1.0], True),  # a subnormal float32 floor
        ([-np.inf, -1e300], True),  # both floor to -inf
        ([-np.inf, -3e38, 1e300], False),
        ([1.0, 1.0, np.inf, np.nan], False),  # repeats, +inf and NaN decide nothing new
    ],
)
def test_conflicting_columns_stay_float64(thresholds: list[float], conflicting: bool) -> None:
    assert SplitInputs.conflicting([np.asarray(thresholds)]) is conflicting


@pytest.mark.skipif(not native.AVAILABLE, reason="numba is not installed")
def test_the_native_kernel_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    t = _thresholds()
    rng = np.random.default_rng(2)
    other = np.unique(np.round(rng.normal(size=300), 2))
    values = _values(t)
    x = np.stack([values, rng.permutation(values), values[::-1]], axis=1)
    keys = {(0, None): [t], (1, None): [other], (2, 0.5): [t, other]}
    inputs = SplitInputs.of(keys)
    native_codes = inputs.encode(x)
    monkeypatch.setattr(float32_splits.native, "AVAILABLE", False)
    numpy_codes = inputs.encode(x)
    for name, (source, fill), limits in zip(
        inputs.names, inputs.keys, [t, other, np.union1d(t, other)], strict=True
    ):
        assert (
            native_codes[name].view(np.int32).tolist() == numpy_codes[name].view(np.int32).tolist()
        )
        column = (
            x[:, source] if fill is None else np.where(np.isnan(x[:, source]), fill, x[:, source])
        )
        _assert_decides(column, native_codes[name], limits)
