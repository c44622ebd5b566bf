"""The JAX backend's per-executable XLA ``compiler_options``: they reach every executable it
compiles (seen in the optimised HLO), keep results equal to the interpreter's, key the cache, and
a name or value XLA does not know fails when the backend is created, naming it."""

from __future__ import annotations

import numpy as np
import pytest

import lazy as lz
from lazy.backends.jax_backend import CPU_COMPILER_OPTIONS, JaxBackend
from lazy.errors import BackendError

_YNN = "xla_cpu_experimental_ynn_fusion_type"
ROWS = 64


def mlp() -> lz.Program:
    """Two dense layers: a dot chain with bias and relu epilogues, what YNNPACK fuses."""
    rng = np.random.default_rng(0)
    b = lz.Builder()
    x = b.input("x", (8,))
    w1 = b.param(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = b.param(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    bias = b.param(rng.standard_normal(16).astype(np.float32), "bias")
    return b.build({"y": lz.maximum(x @ w1 + bias, 0.0) @ w2})


def optimised_hlo(backend: JaxBackend) -> tuple[str, np.ndarray, np.ndarray]:
    prog = mlp()
    options = lz.Options(backend=backend, max_batch=ROWS)
    compiled = lz.compile(prog, options, cache=lz.ExecutableCache(), warmup=False)
    x = np.random.default_rng(1).standard_normal((ROWS, 8)).astype(np.float32)
    got = compiled({"x": x})["y"]
    expected = lz.run_program(prog, {"x": x})["y"]
    return compiled.graphs[0].executable(ROWS).compiled.as_text(), got, expected


@pytest.mark.parametrize(
    ("options", "fused"),
    [({_YNN: ""}, False), ({_YNN: "LIBRARY_FUSION_TYPE_DOT"}, True)],
)
def test_options_reach_the_executable(options: dict[str, str], fused: bool) -> None:
    backend = JaxBackend(compiler_options=options)
    assert backend.compiler_options == options
    hlo, got, expected = optimised_hlo(backend)
    assert ("__ynn_fusion" in hlo) is fused
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_default_options_and_cache_keys() -> None:
    default = JaxBackend()
    assert default.compiler_options == CPU_COMPILER_OPTIONS
    tuned = JaxBackend(compiler_options={_YNN: ""})
    # Executables compiled under other options must not be served from the cache.
    assert "compiler_options=" in tuned.fingerprint()
    assert (
        tuned.fingerprint()
        != JaxBackend(compiler_options={_YNN: "LIBRARY_FUSION_TYPE_DOT"}).fingerprint()
    )
    if not CPU_COMPILER_OPTIONS:
        assert "compiler_options=" not in default.fingerprint()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"xla_cpu_no_such_option": True}, "xla_cpu_no_such_option"),
        ({_YNN: "not-a-fusion-type"}, "not-a-fusion-type"),
        ({_YNN: 1.5}, "values str, bool or int"),
    ],
)
def test_bad_options_fail_at_creation(options: dict[str, object], message: str) -> None:
    with pytest.raises(BackendError, match=message):
        JaxBackend(compiler_options=options)  # type: ignore[arg-type]
