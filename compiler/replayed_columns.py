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

from lazy import native

from . import replay_kernel
from .features import ColumnMap

#: The graph input holding replayed block ``i`` (``replay:0``, ``replay:1``, …): one (B, k)
#: float32 matrix per ensemble, so that a device call takes one argument for all its columns.
INPUT_PREFIX = "replay:"


@dataclass(frozen=True)
class _Group:
    """Replayed columns of one block whose steps are of the same kinds, in the same order:
    replayed together, each step once with its parameters stacked per column."""

    columns: np.ndarray  # (k,) int64: the members' columns in the block
    sources: np.ndarray  # (k,) int64
    source_rows: np.ndarray  # (k,) int64: the sources' rows in an ``apart`` matrix
    steps: tuple[Any, ...]  # the first member's steps (their kinds are everyone's)
    params: np.ndarray  # (steps, k, 2) float64: each step's parameters per column (0: unused)
    codes: np.ndarray | None  # the native kernel's opcodes (None: numpy replays the group)


@dataclass(frozen=True)
class ReplayedInputs:
    """The replayed columns of a compiled model: graph input ``replay:i`` is the (B, k) float32
    matrix of ``blocks[i]``, column j being ``blocks[i][j]`` of its raw column."""

    blocks: tuple[tuple[ColumnMap, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"{INPUT_PREFIX}{i}" for i in range(len(self.blocks)))

    @property
    def sources(self) -> frozenset[int]:
        """The raw input columns the host reads for them."""
        return frozenset(m.source for block in self.blocks for m in block)

    @cached_property
    def _plan(self) -> tuple[tuple[tuple[_Group, ...], tuple[int, ...]], ...]:
        """Per block: the groups of its maps made only of stackable steps
        (:class:`~compiler.features.Fill`, :class:`~compiler.features.Arithmetic`,
        :class:`~compiler.features.Clip`), and its maps replayed one column at a time."""
        return tuple(_block_plan(block, self._source_rows) for block in self.blocks)

    @cached_property
    def source_columns(self) -> tuple[int, ...]:
        """:attr:`sources` in order: the rows of :meth:`encode`'s ``apart`` matrix."""
        return tuple(sorted(self.sources))

    @cached_property
    def _source_rows(self) -> dict[int, int]:
        return {j: r for r, j in enumerate(self.source_columns)}

    def encode(
        self, x: np.ndarray, *, float32_table: bool, apart: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """The replayed inputs of the (B, F) float64 input table ``x``: (B, k) float32 each.
        ``float32_table``: the client sent float32 values (exact in ``x``), which the source
        transforms in float32. ``apart``: the raw columns :attr:`source_columns` as the rows of
        a (k, B) float64 matrix (:meth:`~compiler.schema.InputSchema.to_feed_with_columns`),
        read instead of ``x``, whose columns may then hold 0."""
        dtype = np.float32 if float32_table else np.float64
        rows = self._source_rows
        out: dict[str, np.ndarray] = {}
        for name, block, (groups, alone) in zip(self.names, self.blocks, self._plan, strict=True):
            values = np.empty((x.shape[0], len(block)), np.float32)
            for group in groups:
                if apart is not None:
                    if group.codes is not None:
                        replay_kernel.replay(
                            apart, group.source_rows, group.codes, group.params, float32_table,
                            values, group.columns, by_rows=True,
                        )  # fmt: skip
                        continue
                    part = apart[group.source_rows].astype(dtype)  # (k, B), a copy
                elif group.codes is not None and x.dtype == np.float64:
                    replay_kernel.replay(
                        x, group.sources, group.codes, group.params, float32_table,
                        values, group.columns,
                    )  # fmt: skip
                    continue
                else:
                    part = np.ascontiguousarray(x[:, group.sources].T, dtype=dtype)  # (k, B)
                # Elementwise steps on a block compute every element as its column's own step.
                for step, params in zip(group.steps, group.params, strict=True):
                    part = step.apply(part, *(params[:, p, None] for p in range(len(step.params))))
                values[:, group.columns] = part.T
            for j in alone:
                m = block[j]
                raw = x[:, m.source] if apart is None else apart[rows[m.source]]
                values[:, j] = m.source_values(raw, dtype)
            out[name] = values
        return out


def _block_plan(
    block: tuple[ColumnMap, ...], source_rows: dict[int, int]
) -> tuple[tuple[_Group, ...], tuple[int, ...]]:
    by_kinds: dict[tuple[Any, ...], list[int]] = {}
    alone = []
    for j, m in enumerate(block):
        if all(hasattr(step, "kind") for step in m.steps):
            by_kinds.setdefault(tuple(step.kind for step in m.steps), []).append(j)
        else:
            alone.append(j)
    groups = []
    for members in by_kinds.values():
        steps = block[members[0]].steps
        params = np.zeros((len(steps), len(members), 2), np.float64)
        for s, step in enumerate(steps):
            for p in range(len(step.params)):
                params[s, :, p] = [block[j].steps[s].params[p] for j in members]
        codes = replay_kernel.opcodes(steps) if native.AVAILABLE else None
        groups.append(
            _Group(
                np.asarray(members, np.int64),
                np.asarray([block[j].source for j in members], np.int64),
                np.asarray([source_rows[block[j].source] for j in members], np.int64),
                steps,
                params,
                codes,
            )
        )
    return tuple(groups), tuple(alone)
