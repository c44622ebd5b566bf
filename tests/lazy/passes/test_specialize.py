"""lazy.passes.specialize: one formulation per VARIANT, per target, and nothing of the other."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy.passes import specialize


def _graph() -> lz.Graph:
    b = lz.Builder()
    x = b.input("x", (3,))
    dense = b.param(np.ones((3, 2), np.float32), "dense")
    halves = b.param(np.full((1, 2), 0.5, np.float32), "halves")
    device = x @ dense
    host = lz.reshape(lz.sum(x, axis=1), (lz.B, 1)) * (halves + halves)
    return b.graph({"y": lz.variant(device, host) + 1.0})


@pytest.mark.parametrize(
    ("target", "kept", "dropped"), [("device", "dense", "halves"), ("host", "halves", "dense")]
)
def test_each_target_keeps_its_formulation_and_its_parameters_only(target, kept, dropped) -> None:
    graph = specialize(_graph(), target)
    ops = {n.op for n in graph.order}
    assert lz.Op.VARIANT not in ops
    assert (lz.Op.MATMUL in ops) == (target == "device")
    assert set(graph.params) == {kept}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(lz.evaluate(graph, {"x": x})["y"], [[4.0, 4.0], [13.0, 13.0]])


def test_a_graph_without_variants_is_returned_as_is() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    graph = b.graph({"y": x * 2.0})
    assert specialize(graph, "host") is graph


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(lz.GraphError, match="unknown target 'tpu'"):
        specialize(_graph(), "tpu")


def test_formulations_must_agree_in_shape_and_dtype() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    with pytest.raises(lz.ShapeError, match="VARIANT formulations must agree"):
        lz.variant(x, lz.sum(x, axis=1))
    with pytest.raises(lz.ShapeError, match="VARIANT formulations must agree"):
        lz.variant(x, lz.cast(x, "float64"))


def test_a_loop_body_cannot_hold_a_variant() -> None:
    b = lz.Builder()
    x = b.input("x", (3,))
    with pytest.raises(lz.ShapeError, match="LOOP body cannot hold a VARIANT"):
        lz.fori_loop(2, lambda i, c: lz.variant(c * 2.0, c + c), x)
