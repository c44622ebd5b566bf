"""The graph digest: portable across processes, sensitive to structure, blind to parameter values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import lazy as lz

ROOT = Path(__file__).resolve().parents[2]

# Builds a graph touching every kind of node and attribute the digest serializes: inputs of two
# dtypes, parameters, constants, scopes, string/int/tuple/bool/dtype attributes, several outputs.
BUILD = textwrap.dedent(
    """
    import numpy as np
    import lazy as lz

    def build():
        b = lz.Builder()
        x = b.input("x", (4,))
        codes = b.input("codes", (2,), "int32")
        mean = b.param(np.linspace(-1, 1, 4).astype(np.float32), "mean")
        w = b.param(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
        table = b.param(np.ones((5, 3), np.float32), "table")
        with lz.scope("scaler"):
            z = (x - mean) / 2.5
        with lz.scope("model"):
            logits = z @ w + lz.sum(lz.take(table, codes), axis=1)
            logits = lz.where(lz.isnan(logits), 0.0, logits)
            proba = lz.softmax(logits)
            label = lz.argmax(lz.reshape(proba, (lz.B, 1, 3))[:, 0, :], axis=-1)
        names = {"proba": proba, "label": lz.cast(label, "int64"), "flag": codes > {"a": 1}["a"]}
        return b.graph(names)

    graph = build()
    """
)


def _in_process() -> lz.Graph:
    scope: dict[str, object] = {}
    exec(BUILD, scope)
    return scope["graph"]  # type: ignore[return-value]


def _in_subprocess(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    result = subprocess.run(
        [sys.executable, "-c", BUILD + "\nprint(graph.digest)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_digest_is_identical_across_processes_and_hash_seeds() -> None:
    here = _in_process().digest
    others = {seed: _in_subprocess(seed) for seed in ("0", "4242")}
    assert len(here) == 64 and int(here, 16) >= 0
    assert others == dict.fromkeys(others, here)


def test_digest_is_lz_graph_digest_and_repeatable() -> None:
    g1, g2 = _in_process(), _in_process()
    assert g1.digest == g2.digest == lz.graph_digest(g1)


# --- what changes the digest --------------------------------------------------------------------


def _graph(
    *,
    op: Callable[[lz.LazyTensor, lz.LazyTensor], lz.LazyTensor] = lambda a, c: a + c,
    width: int = 3,
    dtype: str = "float32",
    constant: float = 1.0,
    output: str = "y",
    name: str = "x",
    cast: str = "float64",
    unused_width: int | None = None,
    param: np.ndarray | None = None,
    param_name: str = "p",
) -> lz.Graph:
    b = lz.Builder()
    x = b.input(name, (width,), dtype)
    if unused_width is not None:
        b.input("unused", (unused_width,), dtype)
    p = b.param(np.ones(width, dtype) if param is None else param.astype(dtype), param_name)
    y = lz.softmax(op(x, p) * constant)
    return b.graph({output: lz.cast(y, cast)})


BASE = _graph()


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(_graph(op=lambda a, c: a - c), id="op"),
        pytest.param(_graph(cast="float32"), id="attr-dtype"),
        pytest.param(_graph(width=4), id="shape"),
        pytest.param(_graph(dtype="float64"), id="dtype"),
        pytest.param(_graph(constant=2.0), id="const-value"),
        pytest.param(_graph(output="z"), id="output-name"),
        pytest.param(_graph(name="features"), id="input-name"),
        pytest.param(_graph(param_name="q"), id="param-name"),
        pytest.param(_graph(unused_width=2), id="extra-input"),
    ],
)
def test_digest_changes_with_structure(changed: lz.Graph) -> None:
    assert changed.digest != BASE.digest


def test_digest_changes_with_an_attribute_alone() -> None:
    def graph(axis: int) -> lz.Graph:
        b = lz.Builder()
        x = b.input("x", (3, 3))
        return b.graph({"y": lz.sum(x, axis=axis)})

    assert [n.type for n in graph(1).order] == [n.type for n in graph(2).order]
    assert graph(1).digest != graph(2).digest


def test_digest_covers_the_type_of_an_input_the_outputs_do_not_use() -> None:
    # An unused input is still an argument of every executable compiled from the graph.
    a, b = _graph(unused_width=2), _graph(unused_width=5)
    assert a.digest != b.digest
    assert _graph(unused_width=2, dtype="float64").digest != _graph(unused_width=2).digest


def test_digest_ignores_parameter_values() -> None:
    retrained = _graph(param=np.array([0.5, -2.0, 7.0]))
    assert not np.array_equal(retrained.params["p"], BASE.params["p"])
    assert retrained.digest == BASE.digest


def test_digest_distinguishes_constant_dtypes_with_equal_bytes() -> None:
    def graph(value: np.ndarray) -> lz.Graph:
        b = lz.Builder()
        x = b.input("x", (2,), "int32")
        return b.graph({"y": lz.where(x > 0, lz.const(value), lz.const(value))})

    zeros32 = np.zeros(2, np.int32)
    assert graph(zeros32).digest != graph(zeros32.view(np.uint32)).digest
    assert graph(zeros32).digest != graph(np.zeros((1, 2), np.int32)).digest


# --- hash-consing -------------------------------------------------------------------------------


def test_equal_graphs_built_twice_share_node_objects() -> None:
    g1, g2 = _in_process(), _in_process()
    assert g1.output_nodes == g2.output_nodes
    assert all(a is b for a, b in zip(g1.output_nodes, g2.output_nodes, strict=True))
    assert all(a is b for a, b in zip(g1.order, g2.order, strict=True))


def test_equal_subexpressions_are_one_node() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    y = (x + 1.0) * (x + 1.0)
    left, right = y.node.inputs
    assert left is right
    graph = b.graph({"y": y})
    assert [n.op for n in graph.order].count(lz.Op.ADD) == 1


def test_different_attributes_make_different_nodes() -> None:
    b = lz.Builder()
    x = b.input("x", (3, 3))
    assert lz.sum(x, axis=1).node is lz.sum(x, axis=(1,)).node
    assert lz.sum(x, axis=1).node is not lz.sum(x, axis=2).node
    assert lz.sum(x, axis=1).node is not lz.sum(x, axis=1, keepdims=True).node


def test_nodes_are_immutable_and_process_local() -> None:
    import pickle

    node = _in_process().output_nodes[0]
    with pytest.raises(AttributeError):
        node.op = lz.Op.NEG  # type: ignore[misc]
    with pytest.raises(TypeError):
        pickle.dumps(node)


def test_axes_counted_from_the_end_are_the_same_node() -> None:
    b = lz.Builder()
    x = b.input("x", (3, 4))
    assert lz.softmax(x, -1).node is lz.softmax(x, 2).node
    assert lz.sum(x, (-1, 1)).node is lz.sum(x, (2, 1, 1)).node
    assert lz.sum(x, -1).node.attr("axes") == (2,)
    with pytest.raises(lz.ShapeError):
        lz.sum(x, 3)
