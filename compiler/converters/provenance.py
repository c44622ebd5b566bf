"""Raw input columns passed on with a host-side fill of their missing values.

An imputer in front of an encoder is the common case: on a string column the imputer's fill value
cannot live on the device, but the encoder reads host-made codes of the raw column anyway. So the
imputer keeps the column's provenance as a :class:`Filled` source — an ``int``, the raw column's
index, so every other consumer sees plain provenance — that also records the fill value; the
encoder's vocabulary then gives missing values the fill value's code (``Vocabulary.missing``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SchemaError, UnsupportedError
from ..schema import Vocabulary


class Filled(int):
    """Raw input column ``int(self)`` whose missing values (None, NaN) an imputer set to ``fill``."""

    fill: Any

    def __new__(cls, source: int, fill: Any) -> Filled:
        out = super().__new__(cls, source)
        out.fill = fill
        return out

    def __repr__(self) -> str:
        return f"Filled({int(self)}, {self.fill!r})"


def filled(source: int | None, fill: Any) -> int | None:
    """Provenance of ``source`` after its missing values become ``fill`` (an earlier fill wins:
    nothing is missing any more)."""
    if source is None or isinstance(source, Filled):
        return source
    return Filled(source, fill)


def with_fill(vocabulary: Vocabulary, source: int | None, where: str) -> Vocabulary:
    """``vocabulary`` for a column whose missing values were filled (a :class:`Filled` source):
    missing values get the fill value's code, or stay unknown when the fill is not a category."""
    if not isinstance(source, Filled):
        return vocabulary
    try:
        (code,) = vocabulary.encode("fill", np.array([source.fill], dtype=object)).tolist()
    except SchemaError:  # the fill is an unknown category, an error like any other
        if any(_missing(c) for c in vocabulary.categories):
            raise UnsupportedError(
                f"{where}: the imputed fill value {source.fill!r} is not a category, but a missing "
                "value is; the host cannot tell them apart"
            ) from None
        return vocabulary
    return Vocabulary(vocabulary.categories, vocabulary.unknown, missing=code)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))
