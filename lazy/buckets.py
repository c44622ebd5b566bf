"""Batch-size buckets: compile a few sizes, pad to the next one, chunk what is larger.

Sizes are the powers of two below ``max_batch`` plus ``max_batch`` itself, so a graph needs at most
``ceil(log2(max_batch)) + 1`` executables. Padding repeats the last real row (always a valid input,
unlike zeros: no division by zero or NaN in padded rows); padded outputs are sliced away.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class Buckets:
    __slots__ = ("_pow2_top", "max_batch", "sizes")

    def __init__(self, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = int(max_batch)
        sizes = [1 << k for k in range(max_batch.bit_length()) if (1 << k) < max_batch]
        self.sizes: tuple[int, ...] = (*sizes, self.max_batch)
        self._pow2_top = sizes[-1] if sizes else 0

    def __len__(self) -> int:
        return len(self.sizes)

    def index(self, rows: int) -> int:
        """Index of the smallest bucket holding ``rows`` (1 <= rows <= max_batch)."""
        if rows <= self._pow2_top:
            return (rows - 1).bit_length()
        return len(self.sizes) - 1

    def chunks(self, rows: int) -> Iterator[tuple[int, int]]:
        """(start, stop) ranges of at most ``max_batch`` rows covering ``rows``."""
        for start in range(0, rows, self.max_batch):
            yield start, min(start + self.max_batch, rows)

    def __repr__(self) -> str:
        return f"Buckets({list(self.sizes)})"


def pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` extended to ``rows`` rows by repeating its last row."""
    n = array.shape[0]
    if n == rows:
        return array
    out = np.empty((rows, *array.shape[1:]), dtype=array.dtype)
    out[:n] = array
    out[n:] = array[n - 1]
    return out
