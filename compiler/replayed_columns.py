"""Computed features that float32-comparing tree splits read, computed by the host as the
source computes them.

scikit-learn's trees and XGBoost compare ``float32(v) <= t``, where ``v`` may be a scaler's or
an imputer's output ``g(x)`` of one raw column (a :class:`~compiler.features.ColumnMap`).
Folding (:mod:`compiler.trees.folding`) moves such a split onto the raw float64 column: exact,
but the graph then compares float64 values (half the lanes of float32) or pays for split codes
(:mod:`compiler.float32_splits`). The host can instead hand the graph ``float32(g(x))`` itself:
the map replays the fitted steps in the source's own order of operations and precision (float64
for a float64 table; float32 arithmetic for a float32 table, which scikit-learn's transformers
keep), so its float32 rounding is exactly the value the source compares. The splits then
compare float32 features with ``floor32(t)``, the source's thresholds unchanged: exact for
every input, and nothing of the steps left in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .features import ColumnMap

#: The graph input holding replayed column ``i`` (``replay:0``, ``replay:1``, …).
INPUT_PREFIX = "replay:"


@dataclass(frozen=True)
class _Group:
    """Replayed columns whose steps are of the same kinds, in the same order: replayed together
    as one (columns, rows) block, each step once with its parameters stacked per column."""

    members: tuple[int, ...]  # indices into ReplayedInputs.maps
    sources: np.ndarray  # (k,) int64
    steps: tuple[Any, ...]  # the first member's steps (their kinds are everyone's)
    params: tuple[tuple[np.ndarray, ...], ...]  # per step, each parameter as (k, 1) float64


@dataclass(frozen=True)
class ReplayedInputs:
    """The replayed columns of a compiled model: graph input ``replay:i`` is ``maps[i]`` of
    its raw column, as float32."""

    maps: tuple[ColumnMap, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{INPUT_PREFIX}{i}" for i in range(len(self.maps)))

    @property
    def sources(self) -> frozenset[int]:
        """The raw input columns the host reads for them."""
        return frozenset(m.source for m in self.maps)

    @cached_property
    def _plan(self) -> tuple[tuple[_Group, ...], tuple[int, ...]]:
        """The groups of maps made only of stackable steps (:class:`~compiler.features.Fill`,
        :class:`~compiler.features.Arithmetic`, :class:`~compiler.features.Clip`), and the
        maps replayed one column at a time."""
        by_kinds: dict[tuple[Any, ...], list[int]] = {}
        alone = []
        for i, m in enumerate(self.maps):
            if all(hasattr(step, "kind") for step in m.steps):
                by_kinds.setdefault(tuple(step.kind for step in m.steps), []).append(i)
            else:
                alone.append(i)
        groups = []
        for members in by_kinds.values():
            steps = self.maps[members[0]].steps
            params = tuple(
                tuple(
                    np.asarray([self.maps[i].steps[s].params[p] for i in members], np.float64)[
                        :, None
                    ]
                    for p in range(len(step.params))
                )
                for s, step in enumerate(steps)
            )
            sources = np.asarray([self.maps[i].source for i in members], np.int64)
            groups.append(_Group(tuple(members), sources, steps, params))
        return tuple(groups), tuple(alone)

    def encode(self, x: np.ndarray, *, float32_table: bool) -> dict[str, np.ndarray]:
        """The replayed inputs of the (B, F) float64 input table ``x``: (B,) float32 each.
        ``float32_table``: the client sent float32 values (exact in ``x``), which the source
        transforms in float32."""
        dtype = np.float32 if float32_table else np.float64
        names = self.names
        out: dict[str, np.ndarray] = {}
        groups, alone = self._plan
        for group in groups:
            # Elementwise steps on a block compute every element as the column's own step.
            block = np.ascontiguousarray(x[:, group.sources].T, dtype=dtype)  # (k, B)
            for step, params in zip(group.steps, group.params, strict=True):
                block = step.apply(block, *params)
            block = block.astype(np.float32, copy=False)
            for row, i in enumerate(group.members):
                out[names[i]] = block[row]
        for i in alone:
            m = self.maps[i]
            out[names[i]] = np.asarray(m.source_values(x[:, m.source], dtype), np.float32)
        return {name: out[name] for name in names}
