"""Batch-size buckets: compile a few sizes, pad to the next one, chunk what is larger.

Small sizes are the powers of two below ``max_batch`` plus ``max_batch`` itself. A graph whose rows
are cheap may also have *large* sizes ``2·max_batch, 4·max_batch, …, call_rows``: a call of more
than ``max_batch`` rows then runs in a few large chunks instead of many ``max_batch``-row ones,
each of which pays the executable's fixed dispatch cost. A graph needs at most
``ceil(log2(max_batch)) + 1 + log2(call_rows / max_batch)`` executables. Padding repeats the last
real row (always a valid input, unlike zeros: no division by zero or NaN in padded rows); padded
outputs are sliced away.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class Buckets:
    __slots__ = ("_descending", "_pow2_top", "call_rows", "max_batch", "sizes")

    def __init__(self, max_batch: int, call_rows: int | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        max_batch = int(max_batch)
        call_rows = max_batch if call_rows is None else int(call_rows)
        ratio = call_rows // max_batch
        if call_rows < max_batch or call_rows % max_batch or ratio & (ratio - 1):
            raise ValueError(
                f"call_rows must be max_batch ({max_batch}) times a power of two, got {call_rows}"
            )
        self.max_batch = max_batch
        self.call_rows = call_rows
        small = [1 << k for k in range(max_batch.bit_length()) if (1 << k) < max_batch]
        large = [max_batch << k for k in range(1, ratio.bit_length())]
        self.sizes: tuple[int, ...] = (*small, max_batch, *large)
        self._pow2_top = small[-1] if small else 0
        self._descending = (*reversed(large), max_batch)

    def __len__(self) -> int:
        return len(self.sizes)

    def index(self, rows: int) -> int:
        """Index of the smallest bucket holding ``rows`` (1 <= rows <= call_rows)."""
        if rows <= self._pow2_top:
            return (rows - 1).bit_length()
        small = len(self.sizes) - len(self._descending)  # the index of max_batch
        if rows <= self.max_batch:
            return small
        return small + (-(-rows // self.max_batch) - 1).bit_length()

    def chunks(self, rows: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """(start, stop) ranges covering rows ``start..rows`` in order: while more than
        ``max_batch`` rows are left, the largest bucket that they fill; then the rest (at most
        ``max_batch`` rows, padded by the caller). Every chunk but the last fills its bucket, and
        the last is padded by fewer rows than its bucket's half."""
        left = rows - start
        while left > self.max_batch:
            size = next(s for s in self._descending if s <= left)
            yield start, start + size
            start += size
            left -= size
        if left > 0:
            yield start, rows

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
