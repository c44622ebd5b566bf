"""The machine's limits, measured in the benchmark's own run: float32 GEMM and memory read speed.

They bound what any scorer can reach: a linear model at large batch is bound by reading its input,
an MLP by its matrix products. Each figure is the best of a few repetitions (the machine is shared:
the best is the least disturbed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _best_s(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm: page faults, jit compilation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(quick: bool = False) -> dict[str, Any]:
    """GEMM GFLOP/s for numpy and jax (float32, n×n @ n×n) and read/copy GB/s.

    ``gemm_gflops`` and ``read_gbs`` are the best of the measured ways: the limits targets use.
    """
    import jax
    import jax.numpy as jnp

    sizes = (256, 512) if quick else (2048, 3072, 4096)
    repeats = 2 if quick else 3
    rng = np.random.default_rng(0)
    gemm: dict[str, dict[str, float]] = {"numpy": {}, "jax": {}}
    matmul = jax.jit(jnp.matmul)
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        flops = 2.0 * n**3
        gemm["numpy"][str(n)] = flops / _best_s(lambda a=a, b=b: a @ b, repeats) / 1e9
        da, db = jax.device_put(a), jax.device_put(b)
        seconds = _best_s(lambda da=da, db=db: matmul(da, db).block_until_ready(), repeats)
        gemm["jax"][str(n)] = flops / seconds / 1e9
        del a, b, da, db

    elements = (1 << 22) if quick else (1 << 26)  # 16 MiB / 256 MiB: far beyond the caches
    x = rng.standard_normal(elements, dtype=np.float32)
    nbytes = x.nbytes
    out = np.empty_like(x)
    memory = {
        "numpy_sum_gbs": nbytes / _best_s(lambda: x.sum(), repeats) / 1e9,
        "numpy_copy_gbs": 2 * nbytes / _best_s(lambda: np.copyto(out, x), repeats) / 1e9,
    }
    total = jax.jit(jnp.sum)
    dx = jax.device_put(x)
    memory["jax_sum_gbs"] = nbytes / _best_s(lambda: total(dx).block_until_ready(), repeats) / 1e9
    return {
        "gemm": gemm,
        "gemm_gflops": max(max(v.values()) for v in gemm.values()),
        "memory": memory,
        "read_gbs": max(memory["numpy_sum_gbs"], memory["jax_sum_gbs"]),
        "platform": jax.devices()[0].platform,
    }


#: Rows per block of the products floor: the call size Kestrel's XLA backend gives an MLP; the
#: whole of 100k rows at once spills every product to memory (numpy 44 ms, XLA 85; in blocks 34-36).
FLOOR_BLOCK = 4096


def products_floor(coefs: Sequence[np.ndarray]) -> dict[str, Callable[[np.ndarray], Any]]:
    """The bare float32 matrix products of an MLP's layers (``coefs``: scikit-learn's
    ``coefs_``), one after another on blocks of :data:`FLOOR_BLOCK` rows, without bias,
    activation or output function: what any float32 scorer of that MLP must at least compute.
    numpy's (BLAS) and XLA's, timed as scorers are; the faster is the pipeline's floor."""
    import jax

    weights = [np.ascontiguousarray(w, dtype=np.float32) for w in coefs]
    device = [jax.device_put(w) for w in weights]

    def chain(x: Any, ws: Sequence[Any]) -> Any:
        for w in ws:
            x = x @ w
        return x

    xla = jax.jit(lambda x: chain(x, device))

    def blocks(products: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
        def run(x: np.ndarray) -> np.ndarray:
            out = np.empty((len(x), weights[-1].shape[1]), np.float32)
            for start in range(0, len(x), FLOOR_BLOCK):
                out[start : start + FLOOR_BLOCK] = products(x[start : start + FLOOR_BLOCK])
            return out

        return run

    return {"numpy": blocks(lambda x: chain(x, weights)), "xla": blocks(xla)}


def best_of(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's best over several :func:`measure` runs (the least disturbed one)."""
    first = runs[0]
    gemm = {
        lib: {n: max(r["gemm"][lib][n] for r in runs) for n in sizes}
        for lib, sizes in first["gemm"].items()
    }
    memory = {k: max(r["memory"][k] for r in runs) for k in first["memory"]}
    return {
        "gemm": gemm,
        "gemm_gflops": max(max(v.values()) for v in gemm.values()),
        "memory": memory,
        "read_gbs": max(memory["numpy_sum_gbs"], memory["jax_sum_gbs"]),
        "platform": first["platform"],
    }


def describe(limits: dict[str, Any]) -> str:
    """One line: the limits as measured."""
    gemm = limits["gemm"]
    parts = [
        f"{lib} " + ", ".join(f"n={n}: {v:.0f}" for n, v in sizes.items())
        for lib, sizes in gemm.items()
    ]
    mem = limits["memory"]
    return (
        f"float32 GEMM GFLOP/s: {'; '.join(parts)} (limit {limits['gemm_gflops']:.0f}); "
        f"memory GB/s: numpy sum {mem['numpy_sum_gbs']:.1f} (read), jax sum "
        f"{mem['jax_sum_gbs']:.1f} (read), numpy copy {mem['numpy_copy_gbs']:.1f} (read+write) "
        f"(read limit {limits['read_gbs']:.1f}); jax platform {limits['platform']}"
    )
