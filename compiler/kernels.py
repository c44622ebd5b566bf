"""The native kernels compiled models run, built before a model needs them: lazy's
(:func:`lazy.warm_kernels`: the forest walks, the coupling) and the compiler's own host
encodings (:mod:`compiler.replay_kernel`, :mod:`compiler.float32_splits`,
:mod:`compiler.float32_inputs`). On a cold numba cache each takes seconds, which the
first model that runs it would otherwise spend between its upload and READY."""

from __future__ import annotations

from collections.abc import Callable

import lazy as lz

from . import float32_inputs, float32_splits, replay_kernel

#: Each family's build (or load from numba's disk cache), returning the seconds it took: a
#: server builds them one at a time, so that it can stop between two.
KERNEL_BUILDS: tuple[Callable[[], float], ...] = (
    replay_kernel.build,
    float32_splits.build,
    float32_inputs.build,
    lz.warm_kernels,
)


def warm_kernels() -> float:
    """Build (or load from numba's disk cache) every native kernel; the seconds it took."""
    return sum(build() for build in KERNEL_BUILDS)
