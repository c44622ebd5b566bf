"""Shared pieces of the LightGBM and XGBoost converters: building normalized trees node by node
from a parsed model dump, and reading float32 values from decimal text exactly."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

import numpy as np

from ..trees import Tree


class TreeBuilder:
    """One :class:`~compiler.trees.Tree` built in visiting order (node 0 is the root).

    ``split`` allocates the two children of a node and returns their ids; ``leaf`` sets a leaf's
    value in output ``k``. Feature indices may be provisional: :meth:`build` maps them.
    """

    def __init__(self, n_outputs: int) -> None:
        self._k = n_outputs
        self._feature: list[int] = [0]
        self._threshold: list[float] = [np.inf]
        self._left: list[int] = [-1]
        self._right: list[int] = [-1]
        self._missing_left: list[bool] = [True]
        self._value: dict[int, tuple[int, float]] = {}
        self._cover: dict[int, float] = {}

    def _new(self) -> int:
        self._feature.append(0)
        self._threshold.append(np.inf)
        self._left.append(-1)
        self._right.append(-1)
        self._missing_left.append(True)
        return len(self._feature) - 1

    def split(
        self, node: int, feature: int, threshold: float, missing_left: bool
    ) -> tuple[int, int]:
        left, right = self._new(), self._new()
        self._feature[node], self._threshold[node] = feature, threshold
        self._left[node], self._right[node] = left, right
        self._missing_left[node] = missing_left
        return left, right

    def leaf(self, node: int, k: int, value: float) -> None:
        self._value[node] = (k, value)

    def cover(self, node: int, cover: float) -> None:
        """Node ``node``'s training cover (data count or hessian sum), for TreeSHAP."""
        self._cover[node] = cover

    def build(self, columns: np.ndarray | None = None) -> Tree:
        """The tree; ``columns[f]`` is the final column of provisional feature ``f``."""
        feature = np.asarray(self._feature, np.int64)
        value = np.zeros((len(feature), self._k))
        for node, (k, v) in self._value.items():
            value[node, k] = v
        return Tree(
            feature=feature if columns is None else np.asarray(columns, np.int64)[feature],
            threshold=np.asarray(self._threshold, np.float64),
            left=np.asarray(self._left, np.int64),
            right=np.asarray(self._right, np.int64),
            missing_left=np.asarray(self._missing_left, bool),
            value=value,
            cover=self._covers(),
        )

    def _covers(self) -> np.ndarray | None:
        """Every node's cover, where the dump gave one for each (None otherwise)."""
        if len(self._cover) != len(self._feature):
            return None
        return np.asarray([self._cover[n] for n in range(len(self._feature))], np.float64)


def float32_from_text(texts: Iterable[str | float | int]) -> np.ndarray:
    """Decimal texts → the nearest float32 each (ties to even), exactly.

    Parsing to float64 first and rounding again differs from direct rounding only when the
    float64 lands exactly on a midpoint between two float32s (the float64 is the nearest to the
    decimal and every float32 midpoint is a float64); those few are settled with exact fractions.
    """
    texts = [str(t) for t in texts]
    wide = np.array([float(t) for t in texts], np.float64)
    with np.errstate(over="ignore"):
        out = wide.astype(np.float32)
    finite = np.isfinite(out)
    up = np.nextafter(out, np.float32(np.inf)).astype(np.float64)
    down = np.nextafter(out, np.float32(-np.inf)).astype(np.float64)
    centre = out.astype(np.float64)
    on_midpoint = finite & ((wide == (centre + up) / 2) | (wide == (centre + down) / 2))
    for i in np.flatnonzero(on_midpoint):
        exact, mid = Fraction(texts[i]), Fraction(float(wide[i]))
        if exact > mid:
            out[i] = np.float32(up[i]) if mid > Fraction(float(centre[i])) else out[i]
        elif exact < mid:
            out[i] = np.float32(down[i]) if mid < Fraction(float(centre[i])) else out[i]
    return out
