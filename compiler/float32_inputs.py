"""Raw values that arrive as float32, decided as the source decides them on float32 input.

scikit-learn's scalers and imputers keep float32 input in float32 and round after every
operation, so a split or a bin edge behind them can flip at a raw value one float32 step away
from where it flips on float64 input. The compiled decisions compare the raw float64 column with
thresholds folded for float64 input (:mod:`compiler.monotone`), and each converter records both
thresholds of every such test, ``x <= t64`` and ``x <= t32``
(:class:`~compiler.probes.DecisionPoints`). For input that arrives as float32 the host then moves
each raw value, before the graph reads it, to a value on the same side of every ``t64`` as the
float32 value is of the matching ``t32``. Only values between the two thresholds of some test
move (a few float32 values per test, typically none of a batch), to the nearest float32 value
that decides as the source, so steps reading the raw column as a number see at most that step.

What arrives as float32: a float32 array, or a table whose numeric columns are all float32 (a
table mixing float32 with other numeric columns reaches each scikit-learn step in the dtype its
own columns share, so it is decided as float64 input). A test no single raw value can satisfy
on float32 input, and a missing value decided otherwise on float32 input, are refused with
:class:`~compiler.errors.SchemaError`, never answered differently from the source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lazy import native
from lazy.dtypes import round_down, round_up

from .errors import SchemaError

if TYPE_CHECKING:
    from .probes import DecisionPoints


def float32_floor(threshold: Any) -> np.ndarray:
    """The largest float32 ``t32 <= t``: for every float32 x, ``x <= t`` iff ``x <= t32``."""
    return round_down(threshold, "float32")


def _ceil32(x: np.ndarray) -> np.ndarray:
    """The smallest float32 value at least each float64 ``x``, as float64."""
    return round_up(x, "float32").astype(np.float64)


def _key32(v: np.ndarray) -> np.ndarray:
    """float32 values in order as int64 keys (consecutive float32 values: consecutive keys)."""
    b = np.asarray(v, np.float64).astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(b < 0, b ^ 0x7FFFFFFF, b)


def _from_key32(k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, np.int64)
    return np.where(k < 0, k ^ 0x7FFFFFFF, k).astype(np.int32).view(np.float32)


#: Past this many float32 values between the two thresholds of a column's tests, the column is
#: moved by looking up every value (else only values a hash of these few flags as candidates).
MAX_LISTED = 1 << 16


@dataclass(frozen=True)
class ColumnShift:
    """The moves of one raw column's float32 values.

    A float32 value ``x`` with ``i`` of the sorted float32 thresholds ``cuts`` below it is in
    interval ``i``; there, every test with its float32 threshold below ``x`` fails and every
    other holds, which a float64 value decides alike exactly within ``[low[i], high[i]]``
    (empty where ``feasible[i]`` is False)."""

    column: int
    cuts: np.ndarray  # (m,) float64, sorted
    low: np.ndarray  # (m + 1,)
    high: np.ndarray  # (m + 1,)
    feasible: np.ndarray  # (m + 1,) bool
    #: Every float32 value some test decides otherwise than float64 input (the only values
    #: that may move), as float32; None where there are more than :data:`MAX_LISTED`.
    listed: np.ndarray | None

    @classmethod
    def of(cls, column: int, pairs: np.ndarray) -> ColumnShift:
        """From (k, 2) pairs ``(t64, t32)`` of the tests ``x <= t`` on this column."""
        order = np.lexsort((pairs[:, 0], pairs[:, 1]))
        t64, t32 = pairs[order, 0], pairs[order, 1]
        # Interval i: the tests before i fail (x > t64 needed), those from i on hold (x <= t64).
        below = np.concatenate([[-np.inf], np.maximum.accumulate(t64)])
        above = np.concatenate([np.minimum.accumulate(t64[::-1])[::-1], [np.inf]])
        feasible = below < above
        with np.errstate(over="ignore"):
            low = np.nextafter(below, np.inf)
        low[0] = -np.inf  # nothing to stay above: -inf stays -inf
        # A float32 value in the range where there is one, so that a step reading the column
        # as float32 sees a float32 value of the source's decision too.
        low32, high32 = _ceil32(low), float32_floor(above).astype(np.float64)
        snap = low32 <= high32
        low = np.where(snap, low32, low)
        high = np.where(snap, high32, above)
        return cls(column, t32, low, high, feasible, _between(pairs))

    def apply(self, values: np.ndarray) -> np.ndarray | None:
        """The moved values (NaN stays NaN), or None where some value cannot be decided as the
        source decides it."""
        i = np.searchsorted(self.cuts, values, side="left")
        if not self.feasible.all() and (~self.feasible[i] & ~np.isnan(values)).any():
            return None
        return np.clip(values, self.low[i], self.high[i])


def _bits(values: np.ndarray) -> np.ndarray:
    """Sorted float64 bits of float32 ``values``."""
    return np.sort(np.asarray(values, np.float32).astype(np.float64).view(np.uint64))


def _between(pairs: np.ndarray) -> np.ndarray | None:
    """The float32 values in ``(min, max]`` of each pair of thresholds (unique), or None if
    there are more than :data:`MAX_LISTED`."""
    lo, hi = pairs.min(axis=1), pairs.max(axis=1)
    with np.errstate(over="ignore"):
        first, last = _key32(_ceil32(np.nextafter(lo, np.inf))), _key32(float32_floor(hi))
    count = np.maximum(last - first + 1, 0)
    if count.sum() > MAX_LISTED:
        return None
    starts = np.repeat(first, count)
    offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.unique(_from_key32(starts + offsets))


#: The hash of listed (column, value) pairs, on the value's float64 bits (a float32 value's are
#: those of its exact float64): a table of 2**_HASH_BITS flags, packed 8 to a byte (small enough
#: to stay in a core's cache: most values are rejected by one look-up).
_HASH_BITS = 21
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Knuth's multiplicative hash, 64-bit
_HASH_SHIFT = np.uint64(64 - _HASH_BITS)


def _hash(bits: np.ndarray, salt: np.ndarray) -> np.ndarray:
    h = bits ^ salt
    h *= _HASH_MULTIPLIER  # modulo 2**64
    h >>= _HASH_SHIFT
    return h


def _listed_hits(
    bits: np.ndarray,
    columns: np.ndarray,
    salts: np.ndarray,
    table: np.ndarray,
    starts: np.ndarray,
    listed: np.ndarray,
    rows: np.ndarray,
    which: np.ndarray,
) -> int:
    """The native form of :meth:`Float32Inputs._hits` over the float64 bits of the input table:
    one pass, each value's hash looked up and, where flagged, the value searched for among its
    column's listed values (float64 bits, sorted); the hits' rows and column indices written to
    ``rows`` and ``which``, their count returned. NaN is never listed."""
    n = 0
    for r in range(bits.shape[0]):
        for c in range(columns.shape[0]):
            b = bits[r, columns[c]]
            h = ((b ^ salts[c]) * _HASH_MULTIPLIER) >> _HASH_SHIFT
            if (table[h >> np.uint64(3)] >> (h & np.uint64(7))) & np.uint64(1):
                lo, hi = starts[c], starts[c + 1]
                k = lo + np.searchsorted(listed[lo:hi], b)
                if k < hi and listed[k] == b:
                    rows[n] = r
                    which[n] = c
                    n += 1
    return n


_KERNEL: Any = None


def _kernel() -> Any:
    """The native look-up, built on the first float32 input a process scores (most scoring
    input is float64: JSON rows); numba caches the build on disk for the next process."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = native.compile_kernel(_listed_hits)
    return _KERNEL


def build() -> float:
    """Build (or load from numba's cache) the native look-up for every table a float32 input
    reaches it as; the seconds it took (0 without numba)."""
    threshold = 0.1  # float32 input decides it otherwise than float64: its float32 is listed
    shift = ColumnShift.of(0, np.array([[threshold, float(np.float32(threshold))]]))
    return native.build_on_tables(Float32Inputs([shift], frozenset())._hits)


class Float32Inputs:
    """The shifts of a model's raw columns for float32 input, and the columns whose missing
    values float32 input decides otherwise; with the hash of the listed columns' values."""

    def __init__(self, shifts: Sequence[ColumnShift], nan_differs: frozenset[int]) -> None:
        self.shifts, self.nan_differs = tuple(shifts), nan_differs
        self._listed = [s for s in self.shifts if s.listed is not None]
        self._columns = np.asarray([s.column for s in self._listed], np.intp)
        self._salts = np.arange(len(self._listed), dtype=np.uint64)[None, :]
        self._salts *= np.uint64(0xC2B2AE3D27D4EB4F)
        values = [_bits(s.listed) for s in self._listed]  # type: ignore[arg-type]
        flags = np.zeros(1 << _HASH_BITS, bool)
        for i, v in enumerate(values):
            flags[_hash(v, self._salts[0, i])] = True
        self._table = np.packbits(flags, bitorder="little")
        self._starts = np.cumsum([0, *map(len, values)]).astype(np.int64)
        self._values = np.concatenate(values) if values else np.zeros(0, np.uint64)

    def _hits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows and indices into the listed columns of the values of ``x`` that are listed."""
        bits = np.ascontiguousarray(x).view(np.uint64)
        if native.AVAILABLE:
            size = x.shape[0] * len(self._columns)
            rows, which = np.empty(size, np.int64), np.empty(size, np.int64)
            n = _kernel()(
                bits, self._columns, self._salts[0], self._table, self._starts, self._values,
                rows, which,
            )  # fmt: skip
            return rows[:n], which[:n]
        h = _hash(bits[:, self._columns], self._salts)
        flagged = (self._table[h >> np.uint64(3)] >> (h & np.uint64(7)).astype(np.uint8)) & 1
        flagged = flagged.astype(bool)
        if not flagged.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.nonzero(flagged)  # candidates: moving a value that is not listed is a no-op

    @classmethod
    def of(cls, decisions: Iterable[DecisionPoints]) -> Float32Inputs | None:
        """None where float32 input decides every test where float64 input does."""
        decisions = list(decisions)
        pairs: dict[int, list[np.ndarray]] = defaultdict(list)
        differ: set[int] = set()
        for p in decisions:
            if p.cuts is not None:
                differ.add(p.column)
        for p in decisions:
            if p.column in differ:
                same = np.stack([p.values, p.values], axis=1)
                pairs[p.column].append(same if p.cuts is None else p.cuts)
        nan_differs = frozenset(p.column for p in decisions if p.float32_nan_differs)
        if not differ and not nan_differs:
            return None
        shifts = tuple(ColumnShift.of(j, np.concatenate(pairs[j])) for j in sorted(differ))
        return cls(shifts, nan_differs)

    @staticmethod
    def _move(x: np.ndarray, shift: ColumnShift, rows: Any, names: Sequence[str]) -> None:
        moved = shift.apply(x[rows, shift.column])
        if moved is None:
            raise SchemaError(
                f"column {names[shift.column]!r}: a float32 value here is decided by the "
                "source in a way no float64 value is; send the column as float64"
            )
        x[rows, shift.column] = moved

    def apply(self, x: np.ndarray, names: Sequence[str]) -> None:
        """Move the float32 values of the (B, F) float64 input table ``x`` in place."""
        # Listed columns: a hash flags the few candidate values, which are then moved exactly
        # (a value no test decides otherwise stays where it is).
        if self._columns.size:
            rows, which = self._hits(x)
            for i in np.unique(which):
                self._move(x, self._listed[i], rows[which == i], names)
        for shift in self.shifts:
            if shift.listed is None:
                self._move(x, shift, slice(None), names)
        for j in sorted(self.nan_differs):
            if np.isnan(x[:, j]).any():
                raise SchemaError(
                    f"column {names[j]!r}: the source decides a missing value arriving as "
                    "float32 differently from one arriving as float64; send the column as "
                    "float64"
                )


def arrives_float32(data: Any, numeric: Sequence[str]) -> bool:
    """Whether ``data`` reaches the source's steps as float32: a float32 array, or a table whose
    ``numeric`` columns are all float32 (pandas or Arrow)."""
    if isinstance(data, np.ndarray):
        return data.dtype == np.float32
    # On the type: an instance's ``dtypes`` is a property that builds a Series.
    if hasattr(type(data), "dtypes") and hasattr(data, "columns"):  # a pandas DataFrame
        try:  # column by column: a float64 table answers at its first column
            return bool(numeric) and all(data[name].dtype == np.float32 for name in numeric)
        except KeyError:
            return False
    schema = getattr(data, "schema", None)
    if schema is not None and hasattr(schema, "field"):  # an Arrow table or record batch
        try:
            return bool(numeric) and all(str(schema.field(n).type) == "float" for n in numeric)
        except KeyError:
            return False
    return False
