"""Per-column contributions: what an explainable converter hands over, and their attribution
to the raw input columns a client sent.

A converter that can explain its raw output (a tree ensemble's margin, say) puts an
:class:`Explanation` in its heads' ``extra``: per column of the feature matrix it reads, each
row's contribution to each raw output, and the expected value they add to. The compiled model
answers in terms of the *input* columns instead: a one-hot column's contribution is its string
column's, a scaled or imputed column's the raw one's. :func:`attribute` finds each feature
column's input column by reading the graph (:func:`lazy.column_sources`), so every converter
that keeps columns apart is attributed without knowing about it; a feature computed from two
input columns (a PCA component, a product) cannot be split between them and is refused, naming
it. The contributions of the input columns and the bias then sum to the raw output of each row.

Trees explain themselves against their own training covers (path-dependent TreeSHAP). An additive
model (a linear one: a sum of terms, each of one feature) is explained interventionally instead:
for ``f(x) = b + sum_c h_c(x_c)``, input column c's Shapley value against background rows is
``h_c(x_c) - mean(h_c)`` over them, whatever ``h_c`` is. Its converter hands over the terms
(:func:`additive`), centred on the training rows where its features' training means are known,
else uncentred; the compiled model sums them by input column, so one-hot and scaled columns
become the column's ``h_c``, and centres uncentred ones on the sample's rows (:func:`centre`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

import lazy as lz

from .errors import UnsupportedError
from .float32_splits import INPUT_PREFIX as SPLIT_INPUT_PREFIX
from .float32_splits import Key
from .schema import InputSchema

#: The name of the bias column, after the input columns (see :func:`unused_name`).
BIAS = "bias"


def unused_name(name: str, taken: Sequence[str]) -> str:
    """``name``, or with underscores in front until no input column is called so (a column
    named ``bias`` keeps its own contribution)."""
    while name in taken:
        name = f"_{name}"
    return name


@dataclass(frozen=True)
class Explanation:
    """Contributions (B, F, K) float64 of the first F columns of ``features`` to each of K raw
    outputs, which with ``expected`` (K,) sum to the outputs; ``where``: the step."""

    contributions: lz.LazyTensor
    expected: np.ndarray
    features: lz.LazyTensor
    where: str
    #: The contributions are an additive model's terms, not centred: the compiled model centres
    #: them by input column on background rows (:func:`centre`).
    background: bool = False
    #: The contributions are a linear model's terms, products of the features' values: a float32
    #: graph rounds them, so the compiled model traces them in float64.
    linear: bool = False
    #: (F, K): a linear model's coefficients, its terms ``features[:, j] * weights[j, k]``; then
    #: the terms may be read through a projection before the features (:func:`attribute`).
    weights: np.ndarray | None = None

    def scaled(self, factor: float) -> Explanation:
        """The same for outputs ``factor`` times these (a mean over trees, say)."""
        return replace(
            self,
            contributions=self.contributions * factor,
            expected=self.expected * factor,
            weights=None if self.weights is None else self.weights * factor,
        )

    def shifted(self, offset: np.ndarray | float) -> Explanation:
        """The same for outputs ``offset`` higher (an initial score, a baseline)."""
        shift = np.broadcast_to(np.asarray(offset, np.float64), self.expected.shape)
        return replace(self, expected=self.expected + shift)


def additive(
    features: lz.LazyTensor,
    coef: np.ndarray,
    intercept: np.ndarray | float,
    where: str,
    param: Callable[[np.ndarray, str], lz.LazyTensor],
    means: Sequence[float | None] = (),
) -> Explanation:
    """The raw outputs ``features @ coef.T + intercept`` (scikit-learn's ``coef`` (K, F) or
    (F,)) as an additive model's terms ``coef[k, j] * x_j``. Where every feature's training
    mean is known (``means``: a StandardScaler's or a mean imputer's output), the terms are
    centred on those: the training rows are the background. Otherwise they are to be centred on
    background rows (the sample), and may be read through a projection before the features."""
    w = np.atleast_2d(np.asarray(coef, np.float64))
    expected = np.broadcast_to(np.asarray(intercept, np.float64), (w.shape[0],)).copy()
    if len(means) and all(m is not None for m in means):
        centre = np.asarray(means, np.float64)
        x = features if features.dtype == "float64" else lz.cast(features, "float64")
        x = x - param(centre, "contribution_means")
        terms = lz.expand_dims(x, 2) * param(w.T[np.newaxis], "contribution_coef")
        return Explanation(terms, expected + centre @ w.T, features, where, linear=True)
    return _linear_terms(features, w.T, expected, where, param)


def _linear_terms(
    features: lz.LazyTensor,
    weights: np.ndarray,
    expected: np.ndarray,
    where: str,
    param: Callable[[np.ndarray, str], lz.LazyTensor],
) -> Explanation:
    """The terms ``features[:, j] * weights[j, k]`` (B, F, K), in float64."""
    x = features if features.dtype == "float64" else lz.cast(features, "float64")
    terms = lz.expand_dims(x, 2) * param(weights[np.newaxis], "contribution_coef")
    return Explanation(
        terms, expected, features, where, background=True, linear=True, weights=weights
    )


def centre(background: np.ndarray) -> np.ndarray:
    """The shift (R + 1, K) that centres :func:`attribute`'s table (R input columns, then the
    bias) on background rows, given their table (n, R + 1, K): each column's mean over them
    moves into the bias, so every row still sums to its output."""
    if background.shape[0] == 0:
        raise ValueError("no background rows")
    means = background[:, :-1].mean(axis=0)
    return np.concatenate([-means, means.sum(axis=0, keepdims=True)])


def _placement(
    explanation: Explanation,
    params: Mapping[str, np.ndarray],
    schema: InputSchema,
    split_keys: Sequence[Key],
) -> np.ndarray:
    """(F, R + 1): each feature's input column (one-hot), the bias for features computed from
    none; refused for a feature computed from several."""
    width = int(explanation.contributions.shape[1])
    sources = lz.column_sources(explanation.features.node, params)[:width]
    codes = {schema.code_input(j): j for j in schema.vocabularies}
    n_columns = len(schema.columns)
    placement = np.zeros((width, n_columns + 1))
    for j, found in enumerate(sources):
        columns = set()
        for name, column in found:
            if name == "x":
                columns.add(column)
            elif name in codes:
                columns.add(codes[name])
            elif name.startswith(SPLIT_INPUT_PREFIX):
                columns.add(split_keys[int(name[len(SPLIT_INPUT_PREFIX) :])][0])
            else:
                raise UnsupportedError(
                    f"{explanation.where}: feature {j} is computed from the graph input "
                    f"{name!r}, which is no input column"
                )
        if len(columns) > 1:
            names = [schema.columns[c].name for c in sorted(columns)]
            raise UnsupportedError(
                f"{explanation.where}: contributions are given per input column, but feature "
                f"{j} is computed from several ({names}); supported: features each computed "
                "from one input column (scalers, imputers, encoders, binning, one-hot)"
                + (
                    ", or a linear model's features projected from such (PCA)"
                    if explanation.weights is not None
                    else ""
                )
            )
        placement[j, columns.pop() if columns else n_columns] = 1.0
    return placement


def _through_projections(
    explanation: Explanation,
    params: Mapping[str, np.ndarray],
    schema: InputSchema,
    split_keys: Sequence[Key],
    param: Callable[[np.ndarray, str], lz.LazyTensor],
) -> tuple[Explanation, np.ndarray]:
    """A linear model's explanation, and its :func:`_placement`, on the shallowest values its
    features are an affine map of (``features = z @ W + c``: a PCA of scaled columns) whose
    columns each come from one input column: the model is additive in those, with terms ``z_i
    (W @ weights)_i`` and ``c @ weights`` in the expected value. Refused, naming the features'
    first mixed column, where no such values precede them."""
    assert explanation.weights is not None
    refused: UnsupportedError | None = None
    for inner, w, c in lz.affine_inputs(explanation.features.node, params):
        candidate = explanation
        if inner is not explanation.features.node:
            candidate = _linear_terms(
                lz.LazyTensor(inner),
                w @ explanation.weights,
                explanation.expected + c @ explanation.weights,
                explanation.where,
                param,
            )
        try:
            return candidate, _placement(candidate, params, schema, split_keys)
        except UnsupportedError as error:
            refused = refused or error
    assert refused is not None
    raise refused


def attribute(
    explanation: Explanation,
    params: Mapping[str, np.ndarray],
    schema: InputSchema,
    split_keys: Sequence[Key],
    param: Callable[[np.ndarray, str], lz.LazyTensor],
) -> tuple[lz.LazyTensor, dict[str, list[int]]]:
    """(B, R + 1, K) float64: each row's contributions by input column (the schema's R, in its
    order), then the bias (the expected value, and any feature computed from no input); and
    each of those columns → the features summed into it (for the compile report). ``param``:
    makes a float64 graph parameter of a value and a name."""
    if explanation.weights is not None:
        explanation, placement = _through_projections(
            explanation, params, schema, split_keys, param
        )
    else:
        placement = _placement(explanation, params, schema, split_keys)
    contributions = explanation.contributions
    n_columns = len(schema.columns)
    place = param(placement, "contribution_columns")
    bias = np.zeros((len(explanation.expected), n_columns + 1))
    bias[:, n_columns] = explanation.expected
    per_output = [
        lz.expand_dims(
            lz.matmul(contributions[:, :, k], place) + param(bias[k], f"contribution_bias_{k}"),
            2,
        )
        for k in range(int(contributions.shape[2]))
    ]
    names = [c.name for c in schema.columns]
    names.append(unused_name(BIAS, names))
    summed = {
        names[c]: [int(j) for j in np.flatnonzero(placement[:, c])]
        for c in range(n_columns + 1)
        if placement[:, c].any()
    }
    table = per_output[0] if len(per_output) == 1 else lz.concat(per_output, axis=2)
    return table, summed
