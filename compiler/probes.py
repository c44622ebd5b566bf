"""Where a compiled model decides: the raw input values at which its answer may change.

A converter that turns a source's comparison into a test on a raw input column (a tree split
folded onto the raw float64 column, a bin edge, a quantile knot) records the raw value where the
test flips (:meth:`compiler.context.Context.decides_at`). The registration gate probes each of
them and its neighbours on both sides (:func:`neighbourhood`): a boundary the compiler placed one
float64 step off, or rounded through float32, sends one of the probes the other way from the
source, which a few random rows almost never do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .float32_inputs import float32_floor


@dataclass(frozen=True)
class DecisionPoints:
    """Raw values of input column ``column`` at which step ``step`` decides (``kind``: what the
    source compares there, e.g. ``split threshold``).

    Each test is ``x <= t``: ``values`` are the ``t`` of float64 input. Where the source computes
    on float32 input differently (a scaler rounding to float32 before the test), ``cuts`` pairs
    each test's ``t`` for float64 input with its ``t`` for float32 input, and
    ``float32_nan_differs`` says a missing value goes another way on float32 input (see
    :mod:`compiler.float32_inputs`). None: every test flips at the same raw value either way."""

    column: int
    values: np.ndarray  # float64, finite, sorted, unique
    step: str
    kind: str
    cuts: np.ndarray | None = None  # (k, 2) float64: (float64 input's t, float32 input's t)
    float32_nan_differs: bool = False

    @classmethod
    def of(
        cls,
        column: int,
        values: np.ndarray,
        step: str,
        kind: str,
        float32_values: np.ndarray | None = None,
        float32_nan_differs: bool = False,
    ) -> DecisionPoints:
        v = np.asarray(values, np.float64).ravel()
        cuts = None
        if float32_values is not None:
            pairs = np.stack([v, np.asarray(float32_values, np.float64).ravel()], axis=1)
            pairs = np.unique(pairs[~np.isnan(pairs).any(axis=1)], axis=0)
            # Thresholds with no float32 value between them decide float32 values alike.
            lo, hi = pairs.min(axis=1), pairs.max(axis=1)
            cuts = pairs if (float32_floor(hi) > lo).any() else None
        return cls(int(column), np.unique(v[np.isfinite(v)]), step, kind, cuts, float32_nan_differs)


def neighbourhood(values: np.ndarray, steps: int = 2) -> np.ndarray:
    """``values`` with their float64 neighbours (``steps`` each way), and the float32 roundings
    of each value with their float32 neighbours and the float64 values on both sides of the
    midpoints between them (where a float32 cast changes its rounding): every value at which a
    test near a recorded decision could go either way. Finite, sorted, unique float64, never
    subnormal."""
    v = np.asarray(values, np.float64).ravel()
    v = v[np.isfinite(v)]
    out = [v]
    lo = hi = v
    for _ in range(steps):
        lo, hi = np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf)
        out += [lo, hi]
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    f = f[np.isfinite(f)]
    below, above = np.nextafter(f, np.float32(-np.inf)), np.nextafter(f, np.float32(np.inf))
    for a, b in ((below, f), (f, above)):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        mid = a64 + (b64 - a64) / 2  # exact: float32 neighbours' midpoint is a float64
        out += [a64, b64, mid, np.nextafter(mid, -np.inf), np.nextafter(mid, np.inf)]
    return _normal(np.concatenate(out))


def midpoints(values: np.ndarray) -> np.ndarray:
    """The values halfway between consecutive distinct ``values`` (finite, never subnormal)."""
    v = _normal(np.asarray(values, np.float64).ravel())
    with np.errstate(over="ignore"):
        return _normal(v[:-1] + (v[1:] - v[:-1]) / 2)


def _normal(values: np.ndarray) -> np.ndarray:
    """Finite values that are zero or normal, sorted and unique. Subnormal inputs are outside
    what a compiled model promises: XLA flushes them to zero."""
    tiny = np.finfo(np.float64).tiny
    keep = np.isfinite(values) & ((values == 0) | (np.abs(values) >= tiny))
    return np.unique(values[keep])
