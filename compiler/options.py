"""Options of a compilation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import lazy as lz

TreeStrategy = Literal["auto", "traversal", "bitvector", "hybrid", "treewise"]
METHODS = ("predict", "predict_proba", "decision_function", "transform", "score_samples")


@dataclass(frozen=True)
class CompileOptions:
    """How to compile: graph dtype, tree strategy, host steps, and where to run.

    ``backend`` is ``"jax"`` (XLA, the production path), ``"torch"``, or ``"interpreter"`` (the
    float64 reference, no compilation). ``methods`` limits the compiled heads (None: all the source
    estimator has). ``max_batch`` is the largest small bucket; ``call_rows`` the most rows one
    executable call runs (None: derived from the graph's per-row intermediates, see
    ``lazy.executor.call_rows_for``; ``max_batch``: chunk larger calls at ``max_batch``).
    ``host_rows``: buckets of at most this many rows (default: all) are timed at warm-up on
    numpy on the host too, and run there where that is faster (0: always on ``backend``; see
    ``lazy.executor.HOST_ROWS``). ``promote``: in a float32 graph, the numerically sensitive
    steps (and those feeding them) compute in float64 so that every head meets the float32
    tolerance; False keeps every step in ``dtype`` (faster; such heads may then miss it).
    ``plan``: the execution plan an earlier compile of the same estimator with the same options
    decided (:attr:`CompiledModel.plan`): warm-up follows it where it still matches, so that
    every process serving a version runs each bucket on the same lowering. ``split_codes``: in a
    float32 graph, tree splits folded onto raw columns read them as float32 codes the host
    encodes (:mod:`compiler.float32_splits`), deciding exactly as float64; None (the default)
    where the ensemble compares each encoded value often enough to pay for its encoding
    (:func:`compiler.trees.cost.split_codes_pay`, docs/exactness.md), True or False always.
    With the default, splits that compare ``float32(v)`` (scikit-learn's trees, XGBoost) on a
    scaled or imputed feature read the host's float32 replay of its steps instead
    (:mod:`compiler.replayed_columns`) where the ensemble compares each such feature often
    enough (:func:`compiler.trees.cost.replay_pays`).
    ``explain``: trace the model's per-column contributions too (:mod:`compiler.explain`;
    :meth:`CompiledModel.contributions` traces them on first use where this is False).
    """

    dtype: Literal["float32", "float64"] = "float32"
    tree_strategy: TreeStrategy = "auto"
    allow_host_steps: bool = False
    methods: tuple[str, ...] | None = None
    backend: str = "jax"
    max_batch: int = 1024
    call_rows: int | None = None
    host_rows: int = lz.HOST_ROWS
    #: A call of several chunks runs them on up to this many threads (None: the cores the
    #: process may use; lazy.threads). The chunks, and so the answers, are the same.
    threads: int | None = None
    warmup: bool = True
    promote: bool = True
    split_codes: bool | None = None
    explain: bool = False
    cache: Any = None  # a lazy.ExecutableCache; None: the process-wide default
    plan: lz.ExecutionPlan | None = None

    def lazy_options(self, *, float64: bool = False) -> lz.Options:
        """The lazy options; ``float64``: the graph declares float64 values that must stay so
        (decisions exact for float64 inputs in an otherwise float32 graph)."""
        keep = self.dtype == "float64" or float64
        policy = lz.DTypePolicy.X64 if keep else lz.DTypePolicy.X32
        return lz.Options(
            backend=self.backend,
            max_batch=self.max_batch,
            dtype_policy=policy,
            call_rows=self.call_rows,
            host_rows=self.host_rows,
            threads=self.threads,
        )
