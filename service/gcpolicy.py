"""Garbage-collector policy of a serving process: a frozen heap and rare young collections.

A serving process holds hundreds of thousands of long-lived objects (jax, scikit-learn, the
compiled models). Under load, the objects of in-flight requests outlive a few young collections,
are promoted, and trigger frequent full collections; each walks the whole heap, a pause long
enough to set the p99 latency over HTTP. Two measures:

- :func:`settle` once the model loads under way are done: one full collection (with the
  previous freeze undone, so cycles of earlier loads, e.g. a version retired since, are
  reclaimed), then ``gc.freeze()``: every object alive now is skipped by later collections
  (reference counting still frees them). A burst of loads (a restart's stored versions) thus
  costs one full collection instead of one per model, or a steady stream of them.
- A young-generation threshold of :data:`GEN0_THRESHOLD` container allocations instead of 700:
  request objects are freed by reference counting long before, so young collections become rare
  instead of running every few requests.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("kestrel.gc")

GEN0_THRESHOLD = 20_000

__all__ = ["GEN0_THRESHOLD", "settle"]


def settle() -> None:
    """Collect everything collectable, freeze what is left, and make young collections rare."""
    t0 = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GEN0_THRESHOLD:  # 0: collection disabled by the operator; keep it so
        gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    log.debug(
        "heap settled in %.1f ms: %d objects frozen",
        (time.perf_counter() - t0) * 1e3,
        gc.get_freeze_count(),
    )
