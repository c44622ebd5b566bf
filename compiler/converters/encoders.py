"""Categorical encoders: one-hot, ordinal and label, on host-made codes of raw input columns.

The host maps each raw value to its index in ``categories_[i]`` (one extra code for unknown values,
or an error with ``handle_unknown='error'``); the device then looks the code up in a small table of
output rows built from the fitted attributes, which is where infrequent grouping, dropped
categories and the missing / unknown encodings live.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import LabelEncoder, OneHotEncoder, OrdinalEncoder

import lazy as lz

from ..context import Context
from ..errors import UnsupportedError
from ..features import CodeTable, Features, Heads
from ..registry import register, unsupported_param
from ..schema import Vocabulary
from .provenance import with_fill


def _codes(
    est: Any, features: Features, ctx: Context, unknown_is_error: bool
) -> list[lz.LazyTensor]:
    """Int32 (B,) codes per input column: ``i`` for ``categories_[i]``, ``len(categories_)`` for an
    unknown value (or an error on the host)."""
    out = []
    for j, categories in enumerate(est.categories_):
        n = len(categories)
        vocabulary = Vocabulary(tuple(categories.tolist()), unknown=None if unknown_is_error else n)
        lookup = features.code_table(j)
        if features.sources[j] is None and lookup is not None:
            out.append(_composed_codes(est, j, vocabulary, lookup, ctx))
            continue
        vocabulary = with_fill(vocabulary, features.sources[j], ctx.path)
        out.append(ctx.codes(features, j, vocabulary))
    return out


def _composed_codes(
    est: Any, j: int, vocabulary: Vocabulary, lookup: CodeTable, ctx: Context
) -> lz.LazyTensor:
    """The codes of column ``j``, which an earlier encoder computed as ``lookup.table[code]``:
    this encoder's code of each value of that table, found at compile time, then one gather of
    the earlier codes (exact: no float is compared on the device)."""
    n = len(vocabulary.categories)
    values = np.asarray(lookup.table, np.float64)
    composed = Vocabulary(vocabulary.categories, unknown=n).encode(f"column {j}", values)
    if vocabulary.unknown is None:  # handle_unknown='error': scikit-learn raises on these
        refused = sorted({float(v) for v in values[(composed == n) & lookup.reachable]})
        if refused:
            instead = "use_encoded_value" if isinstance(est, OrdinalEncoder) else "ignore"
            raise UnsupportedError(
                f"{ctx.path}: {type(est).__name__} (handle_unknown={est.handle_unknown!r}) reads "
                f"column {j}, computed by an earlier encoder, whose values {refused} are not "
                "among its categories; scikit-learn raises on them, the compiled model cannot; "
                f"supported: handle_unknown={instead!r}"
            )
    table = ctx.param(composed.astype(np.int32), f"composed_codes_{j}", dtype="int32")
    return lz.take(table, lookup.code, axis=0)


def _grouped(
    est: Any, j: int, handle_unknown: str, ignore: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For codes ``0..n`` (n: unknown), the category index after infrequent grouping and whether it
    is valid — ``_BaseEncoder._transform`` and ``_map_infrequent_categories`` on one column."""
    n = len(est.categories_[j])
    index = np.append(np.arange(n), 0)  # an unknown value is first set to category 0
    valid = np.append(np.ones(n, bool), False)
    if not est._infrequent_enabled:
        return index, valid
    infrequent = est._infrequent_indices[j]
    if infrequent is not None:
        index[n] = infrequent[0]
        if handle_unknown in ("infrequent_if_exist", "warn"):
            valid[n] = True
    mapping = est._default_to_infrequent_mappings[j]
    if mapping is not None:
        rows = index != ignore if ignore is not None else slice(None)
        index[rows] = np.take(mapping, index[rows])
    return index, valid


@register(
    OneHotEncoder,
    methods=("transform",),
    limits="handle_unknown error / ignore / infrequent_if_exist / warn; drop; infrequent "
    "categories (min_frequency, max_categories); string, numeric and missing categories; raw "
    "input columns (or after a SimpleImputer, or an OrdinalEncoder's output); dense output",
)
def one_hot_encoder(est: Any, features: Features, ctx: Context) -> Heads:
    handle_unknown = est.handle_unknown
    codes = _codes(est, features, ctx, unknown_is_error=handle_unknown == "error")
    drops = est._drop_idx_after_grouping
    parts = []
    for j, code in enumerate(codes):
        index, valid = _grouped(est, j, handle_unknown)
        width = est._n_features_outs[j]
        drop = None if drops is None else drops[j]
        if drop is not None:  # the dropped category is all zeros; later ones shift left
            valid &= index != drop
            index = index - (index > drop)
        table = np.zeros((len(index), width))
        table[np.flatnonzero(valid), index[valid]] = 1.0
        if width:
            parts.append(lz.take(ctx.param(table, f"onehot_{j}"), code, axis=0))
    if not parts:
        raise unsupported_param(est, "drop", est.drop, "a drop leaving at least one column")
    out = lz.concat(parts, axis=1) if len(parts) > 1 else parts[0]
    return Heads({"transform": out}, exact=(True,) * int(out.shape[1]))


@register(
    OrdinalEncoder,
    methods=("transform",),
    limits="handle_unknown error / use_encoded_value; encoded_missing_value; infrequent "
    "categories; string, numeric and missing categories; raw input columns (or after a "
    "SimpleImputer, or another OrdinalEncoder's output)",
)
def ordinal_encoder(est: Any, features: Features, ctx: Context) -> Heads:
    use_unknown = est.handle_unknown == "use_encoded_value"
    codes = _codes(est, features, ctx, unknown_is_error=not use_unknown)
    tables, offsets, lookups = [], [], []
    for j in range(len(est.categories_)):
        missing = est._missing_indices.get(j)
        index, valid = _grouped(est, j, est.handle_unknown, ignore=missing)
        table = index.astype(np.float64)
        if missing is not None:
            table[index == missing] = est.encoded_missing_value
        if use_unknown:
            table[~valid] = est.unknown_value
        offsets.append(sum(len(t) for t in tables))
        tables.append(table)
        # code n (unknown) occurs only where unknown values are not refused on the host
        reachable = np.append(np.ones(len(table) - 1, bool), use_unknown)
        lookups.append(CodeTable(codes[j], table, reachable))
    # one gather for every column: column j's codes index its own slice of the flat table
    stacked = lz.concat([lz.reshape(c, (lz.B, 1)) for c in codes], axis=1)
    index = stacked + ctx.const(np.asarray(offsets, np.int32), "int32")
    flat = ctx.param(np.concatenate(tables), "ordinal_table")
    out = lz.take(flat, index, axis=0)
    return Heads({"transform": out}, codes=tuple(lookups), exact=(True,) * len(lookups))


@register(
    LabelEncoder,
    methods=("transform",),
    limits="a 1-D array of labels (or a one-column table) in, int32 codes out; an unseen label "
    "is an error, as in scikit-learn",
)
def label_encoder(est: Any, features: Features, ctx: Context) -> Heads:
    # transform(y): the label's index in the sorted classes_, one code per row (B,).
    vocabulary = Vocabulary(tuple(np.asarray(est.classes_).tolist()), unknown=None)
    vocabulary = with_fill(vocabulary, features.sources[0], ctx.path)
    return Heads({"transform": ctx.codes(features, 0, vocabulary)})
