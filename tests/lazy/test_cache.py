"""The executable cache: what compiles, what doesn't, and what survives a restart."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import lazy as lz


def _options(max_batch: int = 8, **kw) -> lz.Options:
    # Buckets up to max_batch only (no large ones), every one on the device (none placed on the
    # host, which compiles no device executable), unless a test asks: counts stay predictable.
    kw.setdefault("call_rows", max_batch)
    kw.setdefault("host_rows", 0)
    return lz.Options(max_batch=max_batch, **kw)


def test_identical_second_compile_compiles_nothing(graph, cache) -> None:
    first = lz.compile(graph, _options(), cache)
    n_buckets = len(first.graphs[0].buckets)
    assert cache.stats.compiles == {"warmup": n_buckets}
    second = lz.compile(graph, _options(), cache)
    assert cache.stats.total_compiles == n_buckets
    assert second.graphs[0].compiles == {}
    assert cache.stats.hits >= n_buckets


def test_retrained_parameters_reuse_executables(cache) -> None:
    from tests.lazy.conftest import scaler_logreg

    a, b = scaler_logreg(seed=1), scaler_logreg(seed=2)
    assert a.digest == b.digest
    lz.compile(a, _options(), cache)
    compiled_b = lz.compile(b, _options(), cache)
    assert cache.stats.total_compiles == len(compiled_b.graphs[0].buckets)
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose(
        compiled_b({"x": x})["proba"], lz.evaluate(b, {"x": x})["proba"], rtol=1e-5, atol=1e-6
    )


def test_random_batch_sizes_after_warmup_compile_nothing(graph, cache) -> None:
    max_batch = 100
    compiled = lz.compile(graph, _options(max_batch, call_rows=None), cache).graphs[0]
    warm_compiles = cache.stats.total_compiles
    assert compiled.executables == len(compiled.buckets)
    large = (compiled.buckets.call_rows // max_batch).bit_length() - 1  # above max_batch
    assert len(compiled.buckets) <= math.ceil(math.log2(max_batch)) + 1 + large
    rng = np.random.default_rng(0)
    x = rng.standard_normal((max_batch, 6)).astype(np.float32)
    for i, rows in enumerate(rng.integers(1, max_batch + 1, size=10_000)):
        out = compiled({"x": x[:rows]})
        assert out["proba"].shape == (rows, 3)
        if i % 2000 == 0:
            ref = lz.evaluate(graph, {"x": x[:rows]})
            np.testing.assert_allclose(out["proba"], ref["proba"], rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(out["label"], ref["label"])
    assert cache.stats.total_compiles == warm_compiles
    assert compiled.compiles == {"warmup": len(compiled.buckets)}
    assert compiled.stats.calls == 10_000


def test_cache_key_separates_options(graph, cache) -> None:
    compiled = lz.compile(graph, _options(), cache).graphs[0]
    inline = lz.compile(graph, _options(param_mode=lz.ParamMode(64)), cache).graphs[0]
    n = len(compiled.buckets)
    assert cache.stats.total_compiles == 2 * n
    assert compiled.key(8).param_mode == "args"
    assert inline.key(8).param_mode == "inline<=64"
    assert compiled.key(8).graph_digest != inline.key(8).graph_digest  # constants are baked in
    key = compiled.key(8)
    assert key._fields == ("graph_digest", "bucket", "dtype_policy", "param_mode", "backend")
    assert "jax=" in key.backend and "device_kind=" in key.backend and "x64=" in key.backend


def test_compile_after_ready_is_counted_as_an_anomaly(graph, cache) -> None:
    compiled = lz.CompiledGraph(graph, _options(), cache)
    compiled.ready = True  # as if warm-up had run, but the bucket for 3 rows is missing
    compiled({"x": np.zeros((3, 6), np.float32)})
    assert cache.stats.compiles == {"after_ready": 1}
    assert compiled.compiles == {"after_ready": 1}


def test_lazy_first_use_without_warmup_is_on_demand(graph, cache) -> None:
    compiled = lz.compile(graph, _options(), cache, warmup=False).graphs[0]
    compiled({"x": np.zeros((3, 6), np.float32)})
    assert cache.stats.compiles == {"on_demand": 1}
    assert not compiled.ready


def test_lru_evicts_least_recently_used(graph) -> None:
    cache = lz.ExecutableCache(capacity=2)
    lz.compile(graph, _options(max_batch=4), cache)  # 3 buckets
    assert len(cache) == 2
    assert cache.stats.evictions == 1


def test_concurrent_requests_for_one_key_compile_once(graph) -> None:
    cache = lz.ExecutableCache()
    graphs = [lz.CompiledGraph(graph, _options(), cache) for _ in range(8)]
    barrier = threading.Barrier(len(graphs))

    def run(g: lz.CompiledGraph) -> None:
        barrier.wait()
        g({"x": np.zeros((5, 6), np.float32)})

    threads = [threading.Thread(target=run, args=(g,)) for g in graphs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.stats.total_compiles == 1


_PROCESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import lazy as lz

    rng = np.random.default_rng(0)
    b = lz.Builder()
    x = b.input("x", (4,))
    h = lz.tanh(x @ b.param(rng.standard_normal((4, 8)).astype(np.float32), "w1"))
    y = lz.softmax(h @ b.param(rng.standard_normal((8, 3)).astype(np.float32), "w2"))
    cache = lz.ExecutableCache(disk_dir=sys.argv[1])
    # host_rows=0: every bucket runs the (disk-cached) XLA executables, none the numpy host
    # plans that warm-up timing might pick in one process and not the other.
    options = lz.Options(max_batch=16, call_rows=16, host_rows=0)
    compiled = lz.compile(b.graph({"y": y}), options, cache)
    out = compiled({"x": rng.standard_normal((11, 4)).astype(np.float32)})["y"]
    print(json.dumps({"stats": cache.stats.snapshot(), "y": out.tolist()}))
    """
)


def _run_process(cache_dir: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _PROCESS, str(cache_dir)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_fresh_process_with_disk_cache_compiles_nothing(tmp_path: Path) -> None:
    cold = _run_process(tmp_path)
    n_buckets = 5  # 1, 2, 4, 8, 16
    assert cold["stats"]["total_compiles"] == n_buckets
    assert cold["stats"]["disk_writes"] == n_buckets
    warm = _run_process(tmp_path)
    assert warm["stats"]["total_compiles"] == 0
    assert warm["stats"]["disk_hits"] == n_buckets
    assert warm["y"] == cold["y"]


def test_damaged_disk_entry_is_recompiled_and_replaced(graph, tmp_path: Path) -> None:
    lz.compile(graph, _options(max_batch=1), lz.ExecutableCache(disk_dir=tmp_path))
    (entry,) = tmp_path.glob("*.xc")
    data = entry.read_bytes()
    entry.write_bytes(data[:-10] + b"0123456789")  # payload no longer matches its checksum
    cache = lz.ExecutableCache(disk_dir=tmp_path)
    compiled = lz.compile(graph, _options(max_batch=1), cache)
    assert cache.stats.disk_errors == 1
    assert cache.stats.total_compiles == 1
    assert entry.read_bytes() != data[:-10] + b"0123456789"
    assert compiled({"x": np.ones((1, 6), np.float32)})["proba"].shape == (1, 3)
    fresh = lz.ExecutableCache(disk_dir=tmp_path)
    lz.compile(graph, _options(max_batch=1), fresh)
    assert fresh.stats.disk_hits == 1 and fresh.stats.total_compiles == 0


def test_disk_entry_holding_another_key_is_not_used(graph, tmp_path: Path) -> None:
    compiled = lz.compile(graph, _options(max_batch=2), lz.ExecutableCache(disk_dir=tmp_path))
    one, two = (tmp_path / compiled.graphs[0].key(b).filename() for b in (1, 2))
    data_one, data_two = one.read_bytes(), two.read_bytes()
    one.write_bytes(data_two)  # a valid executable, but for the 2-row bucket
    two.write_bytes(data_one)
    fresh = lz.ExecutableCache(disk_dir=tmp_path)
    again = lz.compile(graph, _options(max_batch=2), fresh)
    assert fresh.stats.disk_errors == 2
    assert fresh.stats.total_compiles == 2
    assert again({"x": np.ones((1, 6), np.float32)})["proba"].shape == (1, 3)


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ValueError):
        lz.ExecutableCache(capacity=capacity)
