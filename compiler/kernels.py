"""The native kernels compiled models run, built before a model needs them: lazy's
(:func:`lazy.warm_kernels`: the forest walks, the coupling) and the compiler's own host
encodings (:mod:`compiler.replay_kernel`, :mod:`compiler.float32_splits`,
:mod:`compiler.float32_inputs`). On a cold numba cache each takes seconds, which the
first model that runs it would otherwise spend between its upload and READY."""

from __future__ import annotations

import lazy as lz

from . import float32_inputs, float32_splits, replay_kernel


def warm_kernels() -> float:
    """Build (or load from numba's disk cache) every native kernel; the seconds it took."""
    built = (replay_kernel.build(), float32_splits.build(), float32_inputs.build())
    return lz.warm_kernels() + sum(built)
