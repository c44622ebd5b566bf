"""The dtypes the IR knows, and how a dtype policy maps them onto a backend."""

from __future__ import annotations

import enum

import numpy as np

#: Canonical dtype names, in the order used for documentation. Anything else is rejected.
SUPPORTED: tuple[str, ...] = (
    "bool",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "float32",
    "float64",
)
FLOATS = frozenset({"float32", "float64"})
INTS = frozenset({"int32", "int64", "uint32", "uint64"})
NUMERIC = FLOATS | INTS
INDEX = frozenset({"int32", "int64"})


def canonical(dtype: object) -> str:
    """The canonical name of a dtype given as a string, numpy dtype or scalar type."""
    name = np.dtype(dtype).name  # type: ignore[call-overload]
    if name not in SUPPORTED:
        raise TypeError(f"dtype {name!r} is not supported; supported: {', '.join(SUPPORTED)}")
    return name


class DTypePolicy(enum.Enum):
    """How declared dtypes are lowered onto a backend.

    ``X32`` lowers 64-bit types to their 32-bit counterparts (the right choice for accelerators and
    for JAX without x64); ``X64`` keeps every dtype as declared.
    """

    X32 = "x32"
    X64 = "x64"

    def lower(self, dtype: str) -> str:
        if self is DTypePolicy.X64:
            return dtype
        return _NARROW.get(dtype, dtype)


_NARROW = {"float64": "float32", "int64": "int32", "uint64": "uint32"}


def oracle(dtype: str) -> np.dtype:
    """The numpy dtype the float64 reference interpreter computes a value of ``dtype`` in."""
    if dtype in FLOATS:
        return np.dtype(np.float64)
    if dtype in {"int32", "int64"}:
        return np.dtype(np.int64)
    return np.dtype(dtype)


def round_down(values: object, dtype: str) -> np.ndarray:
    """The largest ``dtype`` value at most each value (NaN stays NaN; past the largest finite
    value, that value): for every ``x`` of ``dtype``, ``x <= t`` iff ``x <= round_down(t)`` and
    ``x > t`` iff ``x > round_down(t)``."""
    t = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):
        rounded = t.astype(dtype)
    above = rounded.astype(np.float64) > t
    rounded[above] = np.nextafter(rounded[above], rounded.dtype.type(-np.inf))
    return rounded


def round_up(values: object, dtype: str) -> np.ndarray:
    """The smallest ``dtype`` value at least each value: for every ``x`` of ``dtype``, ``x >= t``
    iff ``x >= round_up(t)`` and ``x < t`` iff ``x < round_up(t)``."""
    return -round_down(-np.asarray(values, np.float64), dtype)
