"""Synthetic graphs with the shapes of real models, for benchmarks of the lazy layer alone."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

import lazy as lz


def mlp_graph(
    rng: np.random.Generator, n_features: int, hidden: tuple[int, ...], n_classes: int
) -> tuple[lz.Graph, list[np.ndarray]]:
    """A ReLU MLP with a softmax head; also returns its weights for a bare-JAX twin."""
    b = lz.Builder()
    h = b.input("x", (n_features,))
    weights: list[np.ndarray] = []
    sizes = (n_features, *hidden, n_classes)
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        c = rng.standard_normal(n_out).astype(np.float32) * 0.1
        weights += [w, c]
        h = h @ b.param(w, f"w{i}") + b.param(c, f"b{i}")
        if i < len(sizes) - 2:
            h = lz.maximum(h, 0.0)
    return b.graph({"proba": lz.softmax(h)}), weights


def mlp_jax(x: jax.Array, *weights: jax.Array) -> jax.Array:
    """The same MLP written directly in JAX."""
    h = x
    pairs = list(zip(weights[::2], weights[1::2], strict=True))
    for i, (w, c) in enumerate(pairs):
        h = jnp.matmul(h, w, precision=jax.lax.Precision.HIGHEST) + c
        if i < len(pairs) - 1:
            h = jnp.maximum(h, 0.0)
    return jax.nn.softmax(h)


def forest_graph(
    rng: np.random.Generator, n_trees: int, depth: int, n_features: int
) -> tuple[lz.Graph, dict[str, np.ndarray]]:
    """Perfect binary trees evaluated by traversal: one gather chain per level."""
    internal = 2**depth - 1
    nodes = 2 ** (depth + 1) - 1
    feature = np.zeros((n_trees, nodes), np.int32)
    feature[:, :internal] = rng.integers(0, n_features, (n_trees, internal))
    threshold = np.full((n_trees, nodes), np.inf, np.float32)
    threshold[:, :internal] = rng.standard_normal((n_trees, internal))
    node_ids = np.arange(nodes)
    left = np.where(node_ids < internal, 2 * node_ids + 1, node_ids).astype(np.int32)
    right = np.where(node_ids < internal, 2 * node_ids + 2, node_ids).astype(np.int32)
    offsets = (np.arange(n_trees, dtype=np.int32) * nodes)[None, :]
    tables = {
        "feature": feature.reshape(-1),
        "threshold": threshold.reshape(-1),
        "left": (left[None, :] + offsets.T).reshape(-1).astype(np.int32),
        "right": (right[None, :] + offsets.T).reshape(-1).astype(np.int32),
        "value": rng.standard_normal(n_trees * nodes).astype(np.float32),
    }
    b = lz.Builder()
    x = b.input("x", (n_features,))
    p = {k: b.param(v, k) for k, v in tables.items()}
    idx = lz.broadcast_to(lz.const(offsets), (lz.B, n_trees))
    for _ in range(depth):
        value = lz.take_along(x, lz.take(p["feature"], idx), axis=1)
        go_left = value <= lz.take(p["threshold"], idx)
        idx = lz.where(go_left, lz.take(p["left"], idx), lz.take(p["right"], idx))
    score = lz.sum(lz.take(p["value"], idx), axis=1) / float(n_trees)
    return b.graph({"score": score}), tables
