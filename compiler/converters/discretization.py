"""KBinsDiscretizer: bin indices from the fitted edges, as ordinals or one-hot columns."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import KBinsDiscretizer

import lazy as lz

from ..context import Context
from ..features import Features, Heads
from ..registry import register, unsupported_param
from ._sorted import count_at_most, padded


@register(
    KBinsDiscretizer,
    methods=("transform",),
    limits="every strategy; encode 'ordinal', 'onehot-dense', and 'onehot' (compiled as dense "
    "output); bin edges exact for every float32 input",
)
def kbins_discretizer(est: Any, features: Features, ctx: Context) -> Heads:
    if est.encode not in ("ordinal", "onehot", "onehot-dense"):
        raise unsupported_param(est, "encode", est.encode, "'ordinal', 'onehot', 'onehot-dense'")
    # searchsorted(bin_edges[1:-1], x, side='right'): the outer edges only clip
    inner = padded([np.asarray(e, np.float64)[1:-1] for e in est.bin_edges_])
    bins = count_at_most(features.values, inner, ctx, "bin_edges_")  # (B, F) int32
    if est.encode == "ordinal":
        return Heads({"transform": lz.cast(bins, ctx.dtype)})
    # one-hot over categories arange(n_bins_[j]) per column: output column o is
    # ``bins[:, column[o]] == value[o]``
    n_bins = np.asarray(est.n_bins_, np.int64)
    column = np.repeat(np.arange(len(n_bins)), n_bins)
    value = np.concatenate([np.arange(n) for n in n_bins])
    picked = lz.take(bins, ctx.param(column, "onehot_column", dtype="int32"), axis=1)
    hot = picked == ctx.param(value, "onehot_value", dtype="int32")
    return Heads({"transform": lz.cast(hot, ctx.dtype)})
