"""Raw float64 columns that only tree splits read, sent to the graph as float32 codes that
decide every split exactly as the float64 value does.

Folded tree splits (:mod:`compiler.trees.folding`) test the raw float64 column, ``x <= t``.
Comparing in float64 costs: twice the bytes per value, half the compares per vector
instruction. But a split's outcome needs only *which side* of each threshold a value lies on,
and a float32 value ``y`` can carry that. With ``T = floor32(t)`` (the largest float32 at most
``t``) and ``y = floor32(x)``:

- ``x <= t`` implies ``y <= T`` (floor32 is non-decreasing);
- ``x > t`` implies ``y >= T``, and ``y > T`` unless ``y == T``: only values ``x`` in
  ``(t, next32(T))``, less than one float32 step above ``t``, and never a float32 value itself
  (``x == y`` is then at most ``T`` only if it is at most ``t``).

So each column's thresholds are looked up only for values that are not float32 values, and a
value whose floor is some ``T`` and which lies above its ``t`` moves one float32 step up, to
``next32(T)``, which is still at most every larger threshold's ``T``. This needs the column's
thresholds to have distinct floors (two thresholds within one float32 step of each other, as on
a timestamp column, leave no float32 value between them): such a column stays float64
(:meth:`SplitInputs.conflicting`, and the compiler traces again). The graph compares ``y``
with ``T``, as it compares any float32 feature (:func:`compiler.trees.splits.thresholds_in`), or
as float64 with ``t``, where the same matrix holds a float64 column: for float32 ``y`` the two
agree. A NaN stays NaN (every split sends it where the source does), an imputed column's NaN is
its fill before the encoding, and a subnormal code goes to the nearest zero or normal value on
its side of every threshold (XLA on CPU flushes subnormals to zero; thresholds that are
subnormal in float32 keep their column in float64).

The look-up: a bitmap of the columns' hashed ``T`` (small enough to stay in a core's cache)
flags the few candidates, and an open-addressed table of (column, ``T``) → ``t`` confirms them;
numba compiles it, numpy runs a searchsorted form of it where numba is missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lazy import native

from .float32_inputs import float32_floor

#: The graph input holding split column ``i`` (``split:0``, ``split:1``, …).
INPUT_PREFIX = "split:"

#: A split column: (raw input column, the imputer's fill read in place of NaN, or None).
Key = tuple[int, float | None]

_TINY = np.finfo(np.float32).tiny
#: Float32 values as int32 keys in the values' order (-0.0 just below +0.0).
_SIGN = np.int32(0x7FFFFFFF)
#: Ordered keys of the subnormal ranges and of the values they go to.
_SUBNORMAL_HIGH = np.int32(0x007FFFFF)  # the largest positive subnormal
_SMALLEST_NORMAL = np.int32(0x00800000)
_NEGATIVE_SUBNORMAL_LOW = np.int32(-0x00800000)  # the key of the most negative subnormal
_MINUS_ZERO = np.int32(-1)
#: The hash of (column, T) pairs: 2**16 flags, packed 8 to a byte (they stay in a core's
#: cache), indexed by the top half of a 32-bit multiplicative hash of the key XOR a per-column
#: salt (vector units multiply 32-bit lanes; decimal data's low mantissa bits are not random).
_HASH_MULTIPLIER = np.uint64(0x9E3779B1)  # Knuth's, 32-bit
_LOW_32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(16)
_SALT = np.uint64(0x85EBCA6B)
#: The same hash in 32-bit lanes, as the native kernel computes it.
_MULTIPLIER_32, _SHIFT_32 = np.uint32(_HASH_MULTIPLIER), np.uint32(_SHIFT)


def _ordered(bits: np.ndarray) -> np.ndarray:
    """int32 float32 bits → int32 keys in the values' order (and back: it is an involution)."""
    bits = np.asarray(bits, np.int32)
    return bits ^ (_SIGN & (bits >> np.int32(31)))


def _hash(keys: np.ndarray, salt: np.uint64) -> np.ndarray:
    h = np.asarray(keys, np.int32).view(np.uint32).astype(np.uint64) ^ salt
    return ((h * _HASH_MULTIPLIER) & _LOW_32) >> _SHIFT


def _slot(column: int, key: int) -> int:
    return (column << 32) | (key & 0xFFFFFFFF)


def _floors(thresholds: np.ndarray) -> np.ndarray:
    """The thresholds a column's codes are compared with: floor32, -0.0 as +0.0."""
    return float32_floor(thresholds) + np.float32(0.0)


def _decided(thresholds: Iterable[np.ndarray]) -> np.ndarray:
    """The distinct thresholds that decide something: not NaN, not +inf (nothing but NaN is
    above +inf, and NaN is not encoded)."""
    t = np.concatenate([np.asarray(v, np.float64).ravel() for v in thresholds] or [np.zeros(0)])
    return np.unique(t[~np.isnan(t) & (t != np.inf)])


@dataclass(frozen=True)
class SplitInputs:
    """The split columns of a compiled model and how the host encodes them.

    Column ``i`` (graph input ``split:i``) is raw column ``keys[i][0]``, NaN replaced by
    ``keys[i][1]`` where that is set; its thresholds are ``limits[starts[i]:starts[i + 1]]``
    (float64, ascending)."""

    keys: tuple[Key, ...]
    starts: np.ndarray  # (D + 1,) int64
    limits: np.ndarray  # (S,) float64
    sources: np.ndarray  # (D,) int64: keys[i][0]
    fills: np.ndarray  # (D,) float64: keys[i][1], NaN for none
    salts: np.ndarray  # (D,) uint64, below 2**32
    bitmap: np.ndarray  # (2**16 / 8,) uint8
    #: Open addressing of every (column, floor): slot → ``column << 32 | floor`` (-1: empty)
    #: and its threshold; probed from the floor's hash, one slot on.
    slots: np.ndarray  # (P,) int64, P a power of two
    slot_limits: np.ndarray  # (P,) float64

    @classmethod
    def of(cls, thresholds: Mapping[Key, Sequence[np.ndarray]]) -> SplitInputs:
        """From each split column's thresholds (tests ``x <= t``), in the inputs' order; see
        :meth:`conflicting` for those that cannot be encoded."""
        keys = tuple(thresholds)
        limits = [_decided(thresholds[k]) for k in keys]
        floors = [_ordered(_floors(t).view(np.int32)) for t in limits]
        salts = (np.arange(len(keys), dtype=np.uint64) * _SALT) & _LOW_32
        flags = np.zeros(1 << 16, bool)
        size = 1 << max(4, int(4 * sum(map(len, limits))).bit_length())
        slots, slot_limits = np.full(size, -1, np.int64), np.zeros(size)
        for d, (f, t, salt) in enumerate(zip(floors, limits, salts, strict=True)):
            h = _hash(f, salt)
            flags[h] = True
            for key, limit, at in zip(f.tolist(), t.tolist(), h.tolist(), strict=True):
                at &= size - 1
                while slots[at] != -1:
                    at = (at + 1) & (size - 1)
                slots[at], slot_limits[at] = _slot(d, key), limit
        return cls(
            keys=keys,
            starts=np.cumsum([0, *map(len, limits)]).astype(np.int64),
            limits=np.concatenate([np.zeros(0), *limits]),
            sources=np.asarray([s for s, _ in keys], np.int64),
            fills=np.asarray([np.nan if f is None else f for _, f in keys], np.float64),
            salts=salts,
            bitmap=np.packbits(flags, bitorder="little"),
            slots=slots,
            slot_limits=slot_limits,
        )

    @staticmethod
    def conflicting(thresholds: Iterable[np.ndarray]) -> bool:
        """Whether no float32 code decides these thresholds of one column: two of them share a
        float32 floor, or a floor is subnormal."""
        t = _decided(thresholds)
        floors = _floors(t)
        subnormal = (floors != 0) & (np.abs(floors) < _TINY)
        return bool(len(np.unique(floors)) < len(t) or subnormal.any())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{INPUT_PREFIX}{i}" for i in range(len(self.keys)))

    def encode(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The split inputs of the (B, F) float64 input table ``x``: (B,) float32 each."""
        # Row-major, so that the kernel has one layout to be built for (see :func:`build`).
        x = np.ascontiguousarray(x, np.float64)
        sources, fills = self.sources, self.fills
        out = np.empty((len(self.keys), x.shape[0]), np.float32)
        if native.AVAILABLE:
            _kernel()(
                x, sources, fills, self.salts, self.bitmap, self.slots, self.slot_limits,
                out.view(np.int32),
            )  # fmt: skip
        else:
            for i, (source, fill) in enumerate(zip(sources, fills, strict=True)):
                lo, hi = self.starts[i], self.starts[i + 1]
                out[i] = encode_column(x[:, source], fill, self.limits[lo:hi])
        return dict(zip(self.names, out, strict=True))


def build() -> float:
    """Build (or load from numba's cache) the native encoder for every table
    :meth:`SplitInputs.encode` passes it; the seconds it took (0 without numba)."""
    return native.build_on_tables(SplitInputs.of({(0, None): [np.array([0.5])]}).encode)


def encode_column(values: np.ndarray, fill: float, thresholds: np.ndarray) -> np.ndarray:
    """The float32 codes of one column's float64 ``values`` (NaN read as ``fill`` unless that
    is NaN) against its ascending ``thresholds``: for every ``t`` among them, ``code <=
    floor32(t)`` iff ``value <= t``. The reference the native kernel is tested against."""
    v = np.asarray(values, np.float64)
    v = np.where(np.isnan(v), fill, v)
    with np.errstate(over="ignore", invalid="ignore"):
        y = float32_floor(v)  # NaN stays NaN
        floors = _floors(thresholds)
        inexact = y.astype(np.float64) < v
        i = np.minimum(np.searchsorted(floors, y), max(len(floors) - 1, 0))
        if len(floors):
            above = inexact & (floors[i] == y) & (v > thresholds[i])
            y = np.where(above, np.nextafter(y, np.float32(np.inf)), y)
    subnormal = (y != 0) & (np.abs(y) < _TINY)
    return np.where(subnormal, np.where(y > 0, _TINY, np.float32(-0.0)), y).astype(np.float32)


def _encode_kernel(  # type: ignore[no-untyped-def]
    x, sources, fills, salts, bitmap, slots, slot_limits, bits
):
    """:func:`encode_column` of every split column into ``bits`` (the codes' int32 view), a
    column at a time in passes over contiguous arrays: the column gathered from the row-major
    table with its fill; the float32 floor as an ordered int32 key and its hash (no branch, no
    gather: vector units run it); the hash's flag read for the inexact values, and the few
    flagged ones looked up (a step up where a threshold is below); the keys back to float32
    bits, a subnormal code moved to the nearest zero or normal value on its side of every
    threshold."""
    n, width = x.shape[0], sources.shape[0]
    mask = np.int64(slots.shape[0] - 1)
    values = np.empty(n, np.float64)
    hashes = np.empty(n, np.uint32)
    inexact = np.empty(n, np.uint8)
    for d in range(width):
        source, fill, salt, keys = sources[d], fills[d], np.uint32(salts[d]), bits[d]
        for r in range(n):
            v = x[r, source]
            values[r] = fill if v != v else v
        for r in range(n):
            v = values[r]
            rounded = np.float32(v)
            b = _float32_bits(rounded)  # in a register: a second view of ``bits`` would alias
            k = (b ^ (_SIGN & (b >> np.int32(31)))) - np.int32(np.float64(rounded) > v)
            keys[r] = k
            hashes[r] = np.uint32((np.uint32(k) ^ salt) * _MULTIPLIER_32) >> _SHIFT_32
            inexact[r] = (np.float64(rounded) != v) & (v == v)
        for r in range(n):
            h = hashes[r]
            if inexact[r] & (bitmap[h >> np.uint32(3)] >> (h & np.uint32(7))) & np.uint8(1):
                k = keys[r]
                want = (np.int64(d) << np.int64(32)) | (np.int64(k) & np.int64(0xFFFFFFFF))
                at = np.int64(h) & mask
                while slots[at] != -1 and slots[at] != want:
                    at = (at + np.int64(1)) & mask
                if slots[at] == want and values[r] > slot_limits[at]:
                    keys[r] = k + np.int32(1)
        for r in range(n):
            k = keys[r]
            k = _SMALLEST_NORMAL if (k >= np.int32(1)) & (k <= _SUBNORMAL_HIGH) else k
            k = _MINUS_ZERO if (k >= _NEGATIVE_SUBNORMAL_LOW) & (k < _MINUS_ZERO) else k
            keys[r] = k ^ (_SIGN & (k >> np.int32(31)))


_KERNEL: Any = None
#: numba's float32 → int32 bit cast, bound when the kernel is built.
_float32_bits: Any = None


def _kernel() -> Any:
    """The native encoder, built on the first batch a process encodes (numba caches the build
    on disk for the next process)."""
    global _KERNEL, _float32_bits
    if _KERNEL is None:
        _float32_bits = native.float32_bits()
        _KERNEL = native.compile_kernel(_encode_kernel)
    return _KERNEL
