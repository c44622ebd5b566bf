"""lazy.special_values: which nodes may hold NaN, ±inf or ±0 — sound on random graphs, and
precise where it matters (imputed, encoded, scaled features)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import lazy as lz
from lazy.special_values import ANY, ORDINARY, Special, of_values, special_values

F32 = np.finfo(np.float32)
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3e38, -3e38, 1e-45])


def facts(
    build: Callable[[lz.Builder, lz.LazyTensor], lz.LazyTensor], dtype: str = "float32"
) -> Special:
    b = lz.Builder()
    x = b.input("x", (3,), dtype)
    return special_values(build(b, x).node, b.params)


def test_inputs_may_hold_anything_and_integers_nothing_special() -> None:
    assert facts(lambda b, x: x) == ANY
    assert facts(lambda b, x: x > 0.0) == ORDINARY
    assert facts(lambda b, x: lz.cast(x > 0.0, "float32")) == ORDINARY
    assert facts(lambda b, x: lz.ctz(lz.cast(x, "uint32"))) == ORDINARY


def test_what_the_caller_guarantees_of_an_input_is_its_fact() -> None:
    b = lz.Builder()
    x, y = b.input("x", (), "float32"), b.input("y", (), "float32")
    matrix = lz.concat([lz.expand_dims(x, 1), lz.expand_dims(y, 1)], axis=1)
    filled = {"x": Special(nan=False, inf=True, zero=True)}
    assert not special_values(x.node, b.params, filled).nan
    assert special_values(y.node, b.params, filled) == ANY  # not named: anything
    assert lz.may_be_nan(matrix.node, b.params, filled)
    assert not lz.may_be_nan(matrix.node, b.params, {**filled, "y": filled["x"]})


def test_an_imputer_removes_nan_in_either_spelling() -> None:
    fill = np.array([1.0, 2.0, 3.0], np.float32)
    imputed = facts(lambda b, x: lz.where(lz.isnan(x), b.param(fill, "fill"), x))
    assert imputed == Special(nan=False, inf=True, zero=True)
    kept = facts(lambda b, x: lz.where(~lz.isnan(x), x, b.param(fill, "fill")))
    assert not kept.nan
    # The guard must test the branch it keeps: isnan(x) guarding another value proves nothing.
    assert facts(lambda b, x: lz.where(lz.isnan(x), 0.0, lz.exp(x))).nan
    assert facts(lambda b, x: lz.where(lz.isnan(x), b.param(fill * np.nan, "fill"), x)).nan


def _imputed(b: lz.Builder, x: lz.LazyTensor) -> lz.LazyTensor:
    return lz.where(lz.isnan(x), b.param(np.zeros(3, x.dtype), "fill"), x)


@pytest.mark.parametrize(
    ("scale", "nan"),
    [
        ([0.5, 2.0, -4.0], False),  # a scaler: (x - mean) / scale stays NaN-free
        ([0.5, 0.0, 1.0], True),  # 0 / 0
        ([0.5, np.inf, 1.0], True),  # inf / inf
        ([0.5, 1e-50, 1.0], True),  # a zero once the x32 policy runs it in float32
    ],
)
def test_scaling_imputed_values(scale: list[float], nan: bool) -> None:
    def build(b: lz.Builder, x: lz.LazyTensor) -> lz.LazyTensor:
        centered = _imputed(b, x) - b.param(np.array([1.0, -1.0, 0.0]), "mean")
        return centered / b.param(np.array(scale), "scale")

    assert facts(build, "float64").nan is nan


def test_arithmetic_that_can_make_nan() -> None:
    def twice(op: Callable[[lz.LazyTensor, lz.LazyTensor], lz.LazyTensor]) -> Special:
        return facts(lambda b, x: (lambda i: op(i, -i))(_imputed(b, x)))

    assert twice(lambda a, c: a + c).nan  # inf + -inf
    assert twice(lambda a, c: lz.exp(a) - lz.exp(c)).nan
    assert twice(lambda a, c: lz.tanh(a) + lz.tanh(c)) == Special(nan=False, inf=True, zero=True)
    assert facts(lambda b, x: _imputed(b, x) * 0.0).nan  # inf * 0
    assert not facts(lambda b, x: _imputed(b, x) * 2.0).nan
    assert not facts(lambda b, x: _imputed(b, x) + 1.0).nan


def test_bounded_functions_and_layout() -> None:
    bounded = facts(lambda b, x: lz.tanh(_imputed(b, x)))
    assert bounded == Special(nan=False, inf=False, zero=True)
    assert facts(lambda b, x: lz.sigmoid(x)).nan
    assert not facts(
        lambda b, x: (lambda i: lz.concat([i, lz.tanh(i)], axis=1))(_imputed(b, x))
    ).nan
    assert facts(lambda b, x: lz.concat([_imputed(b, x), x], axis=1)).nan
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    one_hot = facts(lambda b, x: lz.take(b.param(table, "t"), lz.cast(x > 0.0, "int32"), 0))
    assert one_hot == Special(nan=False, inf=False, zero=True)


def test_ops_without_a_rule_may_hold_anything() -> None:
    assert facts(lambda b, x: lz.log(lz.tanh(_imputed(b, x)))) == ANY
    assert facts(lambda b, x: lz.sqrt(lz.tanh(_imputed(b, x)))) == ANY
    assert (
        facts(lambda b, x: lz.matmul(_imputed(b, x), b.param(np.eye(3, dtype=np.float32), "w")))
        == ANY
    )


def test_casts_between_floats_may_overflow() -> None:
    wide = facts(lambda b, x: lz.cast(lz.tanh(_imputed(b, x)), "float64"))
    assert wide == Special(nan=False, inf=True, zero=True)


def test_values_are_judged_in_float32_too() -> None:
    assert of_values(np.array([1.0, 1e300])).inf
    assert of_values(np.array([1.0, 1e-50])).zero
    assert of_values(np.array([1.0, -2.0])) == Special(nan=False, inf=False, zero=False)
    assert of_values(np.array([1, 0])) == ORDINARY


def test_a_parameter_it_cannot_see_may_hold_anything() -> None:
    b = lz.Builder()
    w = b.param(np.ones(3, np.float32), "w")
    assert special_values(w.node, {}) == ANY
    assert not lz.may_be_nan(w.node, b.params)


def test_deep_graphs_need_no_recursion() -> None:
    b = lz.Builder()
    y = _imputed(b, b.input("x", (3,)))
    for _ in range(5000):
        y = lz.tanh(y + 1.0)
    assert not lz.may_be_nan(y.node, b.params)


# --- soundness: what the analysis rules out never appears when the graph runs ----------------

UNARY: list[Callable[[lz.LazyTensor], lz.LazyTensor]] = [
    lambda a: -a,
    abs,
    lz.exp,
    lz.tanh,
    lz.sigmoid,
    lz.floor,
    lambda a: lz.cast(lz.cast(a, "float64"), "float32"),
]
BINARY: list[Callable[[lz.LazyTensor, lz.LazyTensor], lz.LazyTensor]] = [
    lambda a, c: a + c,
    lambda a, c: a - c,
    lambda a, c: a * c,
    lambda a, c: a / c,
    lz.maximum,
    lz.minimum,
    lambda a, c: lz.where(a > c, a, c),
    lambda a, c: lz.where(lz.isnan(a), c, a),
    lambda a, c: lz.where(~lz.isnan(c), c, a),
]


def _random_graph(rng: np.random.Generator) -> tuple[lz.Graph, list[str]]:
    b = lz.Builder()
    x = b.input("x", (4,))
    pool = [x]
    for k in range(3):  # parameters: some ordinary, some holding special values
        pool.append(b.param(rng.choice(SPECIALS[k * 3 : k * 3 + 5], 4).astype(np.float32), f"p{k}"))
    for _ in range(30):
        if rng.random() < 0.3:
            pool.append(UNARY[rng.integers(len(UNARY))](pool[rng.integers(len(pool))]))
        else:
            a, c = (pool[i] for i in rng.integers(len(pool), size=2))
            pool.append(BINARY[rng.integers(len(BINARY))](a, c))
    outputs = {f"t{i}": t for i, t in enumerate(pool[4:])}
    return b.graph(outputs), list(outputs)


@pytest.mark.parametrize("seed", range(40))
def test_sound_on_random_graphs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    graph, names = _random_graph(rng)
    x = rng.choice(SPECIALS, (64, 4)).astype(np.float32)
    values = lz.evaluate(graph, {"x": x})
    nodes = dict(graph.outputs)
    for name in names:
        fact = special_values(nodes[name], graph.params)
        v = np.asarray(values[name], np.float64)
        if not fact.nan:
            assert not np.isnan(v).any(), name
        if not fact.inf:
            assert not (np.abs(v) > F32.max).any(), name
        if not fact.zero:
            assert not (np.abs(v) < F32.tiny).any(), name
