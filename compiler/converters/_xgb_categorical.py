"""XGBoost categorical splits: the trained categories and the membership columns they read.

XGBoost decides a categorical node (``GetNextNode`` and ``common::Decision`` in
``src/common/categorical.h``) on the float32 feature value ``v``: NaN takes the node's default
child; otherwise ``v`` goes RIGHT iff it is a valid category (``0 <= v < 2**24``) whose truncation
``int(v)`` is in the node's set, and LEFT in every other case — negative, too large, or simply not
in the set. (One-hot splits, ``max_cat_to_onehot``, are stored the same way with a one-element set.)

Where the values come from:

- A model trained on a DataFrame stores each categorical column's categories (the model JSON's
  ``gradient_booster.model.cats``), and XGBoost re-codes the categories of the frames it predicts
  on into those training codes. The compiled model reads such a column through a host vocabulary
  of the same categories (missing → NaN). An unknown category is a schema error naming the
  column: XGBoost 3.x raises for one that sorts after every known category but, by a binary-search
  quirk in its re-coder, silently re-codes any other unknown category to the next known one.
- A model trained on numbers (``feature_types`` ``"c"``) reads the values themselves as codes.

In the normalized ensemble each distinct (feature, set) pair is a derived column — 1 inside the
set, 0 outside, NaN when missing — split at 0.5 with the node's default direction, as LightGBM's
categorical splits are (:mod:`.lgbm`), so every tree strategy evaluates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import Features
from ..schema import Vocabulary

#: A feature's membership table may hold at most this many entries.
MAX_CATEGORY_TABLE = 1 << 22


def trained_categories(model: Mapping[str, Any]) -> dict[int, tuple[Any, ...]]:
    """Feature index → the categories it was trained on (their position is the code), for the
    features XGBoost re-codes (those of a DataFrame's categorical columns)."""
    encodings = (model.get("cats") or {}).get("enc") or []
    out: dict[int, tuple[Any, ...]] = {}
    for f, enc in enumerate(encodings):
        if "offsets" in enc:  # strings: Arrow offsets into UTF-8 bytes stored as int8
            offsets = [int(o) for o in enc["offsets"]]
            raw = bytes(int(b) & 0xFF for b in enc["values"])
            names = tuple(raw[a:b].decode("utf-8") for a, b in pairwise(offsets))
        else:  # integers (XGBoost refuses float categories)
            names = tuple(int(v) for v in enc["values"])
        if names:
            out[f] = names
    return out


def vocabulary(categories: Sequence[Any]) -> Vocabulary:
    """The host encoding of a re-coded column: a category's training code; missing values get
    the code after the last (read as NaN); unknown categories are refused."""
    return Vocabulary(tuple(categories), unknown=None, missing=len(categories))


def category_values(
    features: Features, f: int, categories: Sequence[Any] | None, ctx: Context
) -> lz.LazyTensor:
    """(B,) feature ``f`` as XGBoost's categorical nodes read it: the training code of the
    row's category (NaN when missing) if the model re-codes the column, else the value itself
    rounded to float32 as XGBoost stores it."""
    if categories is None:
        v = features.values[:, f]
        return v if v.dtype == "float32" else lz.cast(v, "float32")
    code = ctx.codes(features, f, vocabulary(categories))
    return lz.where(code == len(categories), float("nan"), lz.cast(code, "float32"))


def membership(
    v: lz.LazyTensor, sets: Sequence[tuple[int, ...]], ctx: Context, name: str
) -> lz.LazyTensor:
    """(B, len(sets)): 1 where ``v`` is a valid category in the set, 0 where it is not (or is
    invalid), NaN where it is missing."""
    sentinel = max((max(s) + 1 for s in sets if s), default=0)  # a code in no set
    if (sentinel + 1) * len(sets) > MAX_CATEGORY_TABLE:
        raise UnsupportedError(
            f"XGBoost categorical splits of {name} reach category {sentinel - 1}: the membership "
            f"table would exceed {MAX_CATEGORY_TABLE} entries"
        )
    table = np.zeros((sentinel + 1, len(sets)))
    for j, s in enumerate(sets):
        table[list(s), j] = 1.0
    valid = (v >= 0.0) & (v < float(sentinel))  # False for NaN
    code = lz.cast(lz.floor(lz.where(valid, v, float(sentinel))), "int32")
    inside = lz.take(ctx.param(table, f"category_table_{name}"), code, axis=0)
    missing = lz.reshape(lz.isnan(v), (lz.B, 1))
    return lz.where(missing, float("nan"), inside)
