"""Ops whose answers feed decisions are numpy's bit for bit on every backend, where a tolerance
would hide exactly what matters (a value one ulp off a knot lands in another interval).

REMAINDER is numpy's ``%`` on floats: an exact ``fmod``, the divisor added where the signs
differ (rounded once), a zero result signed as the divisor. Periodic features wrap with it.

DIV in float64 divides as IEEE does. XLA's algebraic simplifier rewrites a division by a
broadcast value (a fitted scale, a constant, a per-row norm) into a multiplication by the
reciprocal, which rounds twice; float64 steps compute as their source does, so the jax
lowering keeps the division there.

The same simplifier rewrites other float64 arithmetic into forms that round otherwise:
``a / sqrt(b)`` into a product with ``rsqrt``, ``a / (b / c)`` and ``(a / b) / c`` into one
division by a product, and chains with constants (``(a * c1) * c2``, ``(a - c1) - c2``) into one
op with a folded constant. The jax lowering hides float64 divisors, quotients divided again and
constants behind barriers, so float64 arithmetic is numpy's in the source's order of operations.

MUL by a boolean cast to a number is numpy's product too: XLA's simplifier turns
``convert(mask) * x`` into ``select(mask, x, 0)``, which loses ``0 * NaN = NaN``,
``0 * inf = NaN`` and ``0 * -x = -0``; a spline basis scattered by masks then read 0 where
scikit-learn reads NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz

BACKENDS = ("jax", "torch", "numpy")
POLICIES = {"float32": lz.DTypePolicy.X32, "float64": lz.DTypePolicy.X64}


def _hard_values(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Dividends and divisors where a quotient-based formula (``x - floor(x / y) * y``) or a
    truncating remainder goes wrong: just around multiples of the divisor, far beyond it,
    negatives, signed zeros, infinities, NaN."""
    rng = np.random.default_rng(7)
    divisors = np.array([0.1, 0.7, 1.0, 3.0, 24.0, 1e-3, 2.0**-20, 1e6, -0.7, -3.0], dtype)
    xs, ys = [], []
    for y in divisors:
        m = np.concatenate([np.arange(-6, 7), rng.integers(-(10**6), 10**6, 8)]).astype(dtype)
        around = m * y
        for ulps in range(-2, 3):
            v = around.copy()
            for _ in range(abs(ulps)):
                v = np.nextafter(v, dtype(np.inf) if ulps > 0 else dtype(-np.inf))
            xs.append(v)
            ys.append(np.full(v.shape, y))
        xs.append(rng.normal(0, 50, 16).astype(dtype))
        ys.append(np.full(16, y))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 5.0, -5.0], dtype)
    xs += [special, special, special, np.full(4, 2.5, dtype)]
    ys += [np.full(9, 3.0, dtype), np.full(9, -3.0, dtype), np.full(9, np.inf, dtype)]
    ys += [np.array([0.0, -0.0, np.nan, -np.inf], dtype)]
    return np.concatenate(xs).astype(dtype), np.concatenate(ys).astype(dtype)


@pytest.mark.parametrize("dtype", sorted(POLICIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_remainder_is_numpys_bit_for_bit(backend: str, dtype: str) -> None:
    x_values, y_values = _hard_values(np.dtype(dtype).type)
    builder = lz.Builder()
    x = builder.input("x", (1,), dtype)
    y = builder.input("y", (1,), dtype)
    divisor = builder.param(np.asarray([0.7], dtype), "p")
    graph = builder.graph({"r": x % y, "r_param": lz.remainder(x, divisor)})
    options = lz.Options(backend=backend, max_batch=64, dtype_policy=POLICIES[dtype], host_rows=0)
    model = lz.compile(graph, options)
    with np.errstate(all="ignore"):
        want = np.remainder(x_values, y_values)
        want_param = np.remainder(x_values, np.asarray(0.7, dtype))
    got = model({"x": x_values[:, None], "y": y_values[:, None]})
    for name, expected in (("r", want), ("r_param", want_param)):
        out = np.asarray(got[name]).reshape(-1)
        assert out.dtype == np.dtype(dtype)
        same = (out.view(f"u{out.itemsize}") == expected.view(f"u{out.itemsize}")) | (
            np.isnan(out) & np.isnan(expected)
        )
        bad = np.flatnonzero(~same)
        assert bad.size == 0, [(x_values[i], y_values[i], out[i], expected[i]) for i in bad[:5]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_division_by_a_broadcast_divisor_is_numpys(backend: str) -> None:
    rng = np.random.default_rng(3)
    rows = rng.normal(0.0, 10.0, (500, 4))
    scale = rng.uniform(0.3, 9.0, 4)
    builder = lz.Builder()
    x = builder.input("x", (4,), "float64")
    by_vector = (x - builder.param(scale / 3, "center")) / builder.param(scale, "scale")
    first = lz.slice_axis(x, 1, 0, 1) * 2.5  # (B, 1): one divisor per row
    graph = builder.graph({"vector": by_vector, "constant": x / 3.7, "row": x / first})
    options = lz.Options(
        backend=backend, max_batch=512, dtype_policy=lz.DTypePolicy.X64, host_rows=0
    )
    got = lz.compile(graph, options)({"x": rows})
    want = {
        "vector": (rows - scale / 3) / scale,
        "constant": rows / 3.7,
        "row": rows / (rows[:, :1] * 2.5),
    }
    for name, expected in want.items():
        np.testing.assert_array_equal(np.asarray(got[name]), expected, err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_arithmetic_keeps_the_sources_order_of_operations(backend: str) -> None:
    rng = np.random.default_rng(4)
    # Rounded values (ties between rows), then every pairing of special values: signed zeros,
    # infinities, NaN, the extremes. (Not subnormals, which XLA flushes: rows holding one run
    # on the host, tests/compiler/test_subnormal_inputs.py.)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e-300, 3.0])
    pairs = np.stack(np.meshgrid(special, special, special), axis=-1).reshape(-1, 3)
    a = np.vstack([np.round(rng.normal(0.0, 10.0, (2000, 3)), 2), pairs])
    b = np.vstack([np.round(rng.uniform(0.1, 50.0, (2000, 3)), 1), np.roll(pairs, 1, axis=1)])
    c = np.vstack([rng.uniform(0.1, 50.0, (2000, 3)), np.roll(pairs, 2, axis=1)])
    s1, s2 = rng.uniform(0.1, 9.0, 3), rng.uniform(0.1, 9.0, 3)
    builder = lz.Builder()
    x, y, z = (builder.input(name, (3,), "float64") for name in "abc")
    p1, p2 = builder.param(s1, "s1"), builder.param(s2, "s2")
    graph = builder.graph(
        {
            "twice-scaled": (x / p1) / p2,  # MaxAbsScaler, then a scaler without centring
            "by-a-root": x / lz.sqrt(y),
            "by-a-quotient": x / (y / z),
            "quotient-divided": (x / y) / z,
            "constant-products": (x * 2.5) * 1.7,
            "constant-differences": (x - 2.5) - 1.7,
        }
    )
    options = lz.Options(
        backend=backend, max_batch=512, dtype_policy=lz.DTypePolicy.X64, host_rows=0
    )
    got = lz.compile(graph, options)({"a": a, "b": b, "c": c})
    with np.errstate(all="ignore"):
        want = {
            "twice-scaled": (a / s1) / s2,
            "by-a-root": a / np.sqrt(b),
            "by-a-quotient": a / (b / c),
            "quotient-divided": (a / b) / c,
            "constant-products": (a * 2.5) * 1.7,
            "constant-differences": (a - 2.5) - 1.7,
        }
    for name, expected in want.items():
        out = np.asarray(got[name])
        same = (out.view(np.uint64) == expected.view(np.uint64)) | (
            np.isnan(out) & np.isnan(expected)
        )  # signed zeros and every bit, NaN as NaN
        bad = np.argwhere(~same)
        assert bad.size == 0, (name, [(out[i, j], expected[i, j]) for i, j in bad[:5]])


@pytest.mark.parametrize("dtype", sorted(POLICIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_with_a_mask_is_numpys_bit_for_bit(backend: str, dtype: str) -> None:
    values = np.array([np.nan, np.inf, -np.inf, -3.0, 0.0, -0.0, 2.5, 1e30], dtype)
    rows = np.stack([values, np.roll(values, 3)], axis=1)  # (8, 2)
    builder = lz.Builder()
    x = builder.input("x", (2,), dtype)
    code = builder.input("code", (), "int32")
    columns = lz.const(np.arange(3, dtype=np.int32))
    mask = lz.cast(lz.expand_dims(code, 1) == columns, dtype)  # (B, 3)
    scattered = lz.expand_dims(mask, 2) * lz.expand_dims(x, 1)  # (B, 3, 2), mask moved first
    graph = builder.graph({"left": scattered, "right": x * lz.cast(x > 0, dtype)})
    options = lz.Options(backend=backend, max_batch=8, dtype_policy=POLICIES[dtype], host_rows=0)
    codes = np.arange(8, dtype=np.int32) % 3
    got = lz.compile(graph, options)({"x": rows, "code": codes})
    with np.errstate(all="ignore"):
        mask_np = (codes[:, None] == np.arange(3)).astype(dtype)
        want = {
            "left": mask_np[:, :, None] * rows[:, None, :],
            "right": rows * (rows > 0).astype(dtype),
        }
    for name, expected in want.items():
        out = np.asarray(got[name])
        assert out.dtype == np.dtype(dtype)
        bits = f"u{out.itemsize}"
        same = (out.view(bits) == expected.view(bits)) | (np.isnan(out) & np.isnan(expected))
        assert same.all(), (name, out[~same], expected[~same])
