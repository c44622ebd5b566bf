"""Static shapes with one symbolic dimension: the batch.

A shape is a tuple of ints, except that axis 0 may be :data:`B`, the batch dimension, whose size is
only known when the graph runs. ``B`` never appears at another axis; ops that would move it, or
combine rows along it, are rejected (see :mod:`lazy.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .errors import ShapeError


class BatchDim:
    """The symbolic batch dimension. A singleton: compare with ``is``."""

    _instance: BatchDim | None = None

    def __new__(cls) -> BatchDim:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "B"

    def __reduce__(self) -> str:
        return "B"


B: Final = BatchDim()

Dim = int | BatchDim
Shape = tuple[Dim, ...]


def normalize(shape: Sequence[Dim]) -> Shape:
    """Validate a user-given shape: ints ≥ 0, with ``B`` allowed only at axis 0."""
    out: list[Dim] = []
    for axis, dim in enumerate(shape):
        if dim is B:
            if axis != 0:
                raise ShapeError(f"the batch dimension B may only be axis 0, got shape {shape}")
            out.append(B)
        else:
            size = int(dim)  # type: ignore[arg-type]
            if size < 0 or size != dim:
                raise ShapeError(f"dimensions must be non-negative ints, got {dim!r} in {shape}")
            out.append(size)
    return tuple(out)


def is_batched(shape: Shape) -> bool:
    return bool(shape) and shape[0] is B


def static_size(shape: Shape) -> int:
    """Number of elements of one row (batched) or of the whole tensor (unbatched)."""
    size = 1
    for dim in shape[1:] if is_batched(shape) else shape:
        size *= dim  # type: ignore[operator]
    return size


def concrete(shape: Shape, batch: int) -> tuple[int, ...]:
    """The concrete shape for a given batch size."""
    return tuple(batch if d is B else d for d in shape)  # type: ignore[misc]


def broadcast(*shapes: Shape) -> Shape:
    """Numpy broadcasting extended with ``B``: B broadcasts with B and 1 only.

    A batched operand must have the full result rank, so that B lands on axis 0.
    """
    rank = max(len(s) for s in shapes)
    for s in shapes:
        if is_batched(s) and len(s) != rank:
            raise ShapeError(
                f"a batched operand of shape {s} must have the result's rank {rank}: "
                f"broadcasting it would move the batch dimension off axis 0 (shapes {shapes})"
            )
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        if any(d is B for d in dims):
            if any(d is not B and d != 1 for d in dims):
                raise ShapeError(f"cannot broadcast the batch dimension against {dims}: {shapes}")
            out.append(B)
            continue
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {shapes} do not broadcast (axis {axis}: {sorted(sizes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank
