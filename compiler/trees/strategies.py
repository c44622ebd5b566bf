"""Strategies that turn an :class:`Ensemble` into lazy IR: (B, F) features → (B, K) leaf sums,
one module each; this one chooses among them.

- ``traversal`` (:mod:`.traversal`, on :mod:`.linked`'s numbering): all trees at once, one
  level per iteration of a loop — gather each row's node (column, threshold, children) by node
  id, compare, step to a child. Nodes are renumbered level by level across all trees so a node's
  children are adjacent (``right == left + 1``) and leaves loop to themselves, so a step is
  ``left[node] + go_right``.
- ``bitvector`` (:mod:`.quickscorer`) and ``hybrid`` (:mod:`.hybrid`): QuickScorer bit-vectors
  a tree per iteration, and bit-vectors for the top levels with traversal below.
- ``treewise`` (:mod:`.treewise`): one tree at a time, each walked to its own depth.

``auto`` asks :mod:`.cost`. Each of these is the fastest somewhere on
``bench/tree_strategies.py --preset grid`` (docs/design-figures.md). Two more were measured and
removed: Hummingbird's GEMM (every split at once, then a matrix product against the leaves' path
signs) was never the fastest, and it does L times the bit-vectors' work per split where an
exact sum forbids the reduced-precision matrix units that would pay for it on a GPU; perfect
traversal (trees padded to the ensemble's depth, children by arithmetic) tied traversal and lost
to the hybrid wherever its 2**depth tables fit.

Level loops are ``lz.fori_loop``s: an unrolled loop makes XLA recompute index chains (slower)
and compile depth copies of the step. Splits compare one column of the widened features
(:mod:`.splits`), which folds in the NaN direction.

Exactness: decisions compare the source's precision. scikit-learn's ``tree_`` compares
``float32(x) <= t`` (t float64), which equals ``float32(x) <= t32`` with ``t32`` the largest
float32 not above t; HistGradientBoosting compares float64, exact in a float64 graph and, in a
float32 graph, exact for every float32 input.
"""

from __future__ import annotations

from collections.abc import Callable

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from .cost import costs, levels, shape
from .host import host_leaf_sum
from .hybrid import hybrid
from .model import Ensemble
from .quickscorer import WORD_BITS, bitvector
from .traversal import traversal
from .treewise import treewise

STRATEGIES = ("auto", "traversal", "bitvector", "hybrid", "treewise")


Strategy = Callable[[Ensemble, lz.LazyTensor, Context], lz.LazyTensor]
IMPLEMENTED: dict[str, Strategy] = {
    "traversal": traversal,
    "bitvector": bitvector,
    "hybrid": hybrid,
    "treewise": treewise,
}


def choose(ensemble: Ensemble, requested: str) -> str:
    """The strategy to use for ``requested`` (``auto``: the cheapest by :mod:`.cost`'s model)."""
    if ensemble.has_categorical:  # categorical splits: only traversal evaluates them
        return "traversal"
    if requested == "auto":
        estimates = costs(ensemble)
        return min(estimates, key=estimates.__getitem__)
    if requested not in IMPLEMENTED:
        raise UnsupportedError(
            f"tree_strategy={requested!r} is not implemented; supported: {['auto', *IMPLEMENTED]}"
        )
    n_leaves = shape(ensemble)[3]
    if requested == "bitvector" and n_leaves > WORD_BITS:
        # One mask word per tree: more words made XLA's compile time explode.
        raise UnsupportedError(
            f"tree_strategy='bitvector' evaluates trees of up to {WORD_BITS} leaves "
            f"(one mask word), this ensemble has trees of {n_leaves}; use 'hybrid' (bit-vectors "
            "for the top 5 levels) or 'traversal'"
        )
    return requested


def leaf_sum(ensemble: Ensemble, x: lz.LazyTensor, ctx: Context) -> lz.LazyTensor:
    """(B, K): the sum over trees of the leaf vector each row reaches, by the options' strategy,
    in the graph's dtype or the ensemble's wider :meth:`~.model.Ensemble.sum_dtype`.

    Under ``auto`` the value has a second formulation for the host (:mod:`.host`), which the
    executor runs where it times faster than the device (the smallest buckets), unless nothing
    would run it (``host_rows=0`` on a device backend); an explicit strategy is that strategy
    everywhere."""
    name = choose(ensemble, ctx.options.tree_strategy)
    # Only where something runs it: host placement is on, or the numpy backend runs every bucket.
    runs_host = ctx.options.host_rows > 0 or ctx.options.backend == "numpy"
    host = (
        runs_host
        and ctx.options.tree_strategy == "auto"
        and ensemble.max_depth > 0
        and not ensemble.has_categorical
    )
    ctx.note(
        f"trees: {name}{' (host: native kernels)' if host else ''} ({len(ensemble.trees)} trees, "
        f"depth {ensemble.max_depth}, {ensemble.n_nodes} nodes, up to {ensemble.max_leaves} "
        f"leaves per tree, {levels(ensemble)} levels in all)"
    )
    device = IMPLEMENTED[name](ensemble, x, ctx)
    if host:
        device = lz.variant(device, host_leaf_sum(ensemble, x, ctx))
    # A float32 sum (XGBoost's) widens to a float64 graph's dtype; a float64 sum in a float32
    # graph (a forest whose predict decides on it) is its caller's to narrow.
    return device if device.dtype in (ctx.dtype, "float64") else lz.cast(device, ctx.dtype)
