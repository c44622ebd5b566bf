"""What flows between converters: feature matrices with provenance, and output heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import lazy as lz


@dataclass(frozen=True)
class Features:
    """A (B, k) float matrix a step consumes.

    ``sources[j]`` is the index of the input-table column that column j is verbatim, or None if it
    was computed. Categorical encoders use it to read the host-made integer codes of a raw column.
    """

    values: lz.LazyTensor
    sources: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[1] != len(self.sources):
            raise ValueError(f"features {self.values.shape} vs {len(self.sources)} sources")

    @property
    def width(self) -> int:
        return len(self.sources)

    @classmethod
    def derived(cls, values: lz.LazyTensor) -> Features:
        return cls(values, (None,) * int(values.shape[1]))

    def select(self, indices: Sequence[int]) -> Features:
        """Columns ``indices`` in that order (a slice when contiguous, else a gather)."""
        idx = [int(i) for i in indices]
        if idx == list(range(self.width)):
            return self
        sources = tuple(self.sources[i] for i in idx)
        if idx and idx == list(range(idx[0], idx[0] + len(idx))):
            return Features(lz.slice_axis(self.values, 1, idx[0], idx[0] + len(idx)), sources)
        table = lz.const(np.asarray(idx, np.int32))
        return Features(lz.take(self.values, table, axis=1), sources)

    @staticmethod
    def concat(parts: Sequence[Features]) -> Features:
        parts = [p for p in parts if p.width]
        if len(parts) == 1:
            return parts[0]
        values = lz.concat([p.values for p in parts], axis=1)
        return Features(values, tuple(s for p in parts for s in p.sources))


@dataclass(frozen=True)
class Heads:
    """A converter's outputs, by method name (``predict``, ``predict_proba``, ``transform``…).

    For classifiers ``predict`` holds int32 indices into ``classes``; the compiled model maps them
    back to the labels on the host, so labels of any type come back exactly.

    ``splits``: heads the source returns as a list of per-output arrays (MultiOutputClassifier's
    ``predict_proba``) are one (B, sum of widths) output side by side; the compiled model splits
    it into the list on the host.
    """

    outputs: Mapping[str, lz.LazyTensor]
    classes: np.ndarray | None = None
    sources: tuple[int | None, ...] | None = None  # provenance of the transform head's columns
    extra: Mapping[str, object] = field(default_factory=dict)
    splits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def features(self) -> Features:
        values = self.outputs["transform"]
        if values.ndim == 1:
            values = lz.reshape(values, (lz.B, 1))
        return Features(values, self.sources or (None,) * int(values.shape[1]))

    @classmethod
    def transformed(cls, features: Features) -> Heads:
        return cls({"transform": features.values}, sources=features.sources)
