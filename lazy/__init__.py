"""Kestrel's lazy layer: trace once, compile per bucket, cache XLA executables.

Operations on :class:`LazyTensor` values record nodes of a small IR; a :class:`Builder` turns a
trace into a :class:`Graph` (or a :class:`Program` with host steps between compiled segments);
:func:`compile` lowers it to a backend per batch-size bucket through an executable cache.
"""

from __future__ import annotations

from .backends import Backend, get_backend
from .buckets import Buckets
from .cache import CacheKey, ExecutableCache
from .cache_tiers import DirectoryTier, ExecutableTier
from .coupling import couple, couple_loop
from .digest import IR_VERSION, graph_digest
from .dtypes import DTypePolicy
from .errors import (
    BackendError,
    ConcretizationError,
    GraphError,
    InputError,
    LazyError,
    RowMixingError,
    ShapeError,
)
from .executor import (
    HOST_ROWS,
    CompiledGraph,
    CompiledProgram,
    Options,
    ParamMode,
    WarmedBucket,
    compile,
    default_cache,
)
from .graph import Graph
from .interpreter import evaluate, run_program
from .loop import LoopBody, fori_loop
from .narrowing import narrowed
from .node import Node
from .ops import HOST_ONLY, SPECS, Op
from .plan import DEVICE, HOST, ExecutionPlan, GraphPlan, Placement, PlanError
from .program import Builder, GraphStage, HostStage, Program
from .provenance import affine_inputs, column_sources
from .shapes import B
from .special_values import Special, may_be_nan, special_values
from .stats import CacheStats, CompileCause, RunStats
from .tensor import (
    LazyTensor,
    argmax,
    broadcast_to,
    cast,
    concat,
    const,
    ctz,
    erf,
    exp,
    expand_dims,
    expm1,
    floor,
    forest_sum,
    isnan,
    log,
    log1p,
    logsumexp,
    matmul,
    max,
    maximum,
    min,
    minimum,
    ndtri,
    reduce_and,
    remainder,
    reshape,
    scope,
    sigmoid,
    slice_axis,
    softmax,
    sqrt,
    sum,
    take,
    take_along,
    tanh,
    transpose,
    update,
    variant,
    where,
)
from .treeshap import forest_shap
from .verify import verify
from .warm import warm_kernels

__all__ = [
    "DEVICE",
    "HOST",
    "HOST_ONLY",
    "HOST_ROWS",
    "IR_VERSION",
    "SPECS",
    "B",
    "Backend",
    "BackendError",
    "Buckets",
    "Builder",
    "CacheKey",
    "CacheStats",
    "CompileCause",
    "CompiledGraph",
    "CompiledProgram",
    "ConcretizationError",
    "DTypePolicy",
    "DirectoryTier",
    "ExecutableCache",
    "ExecutableTier",
    "ExecutionPlan",
    "Graph",
    "GraphError",
    "GraphPlan",
    "GraphStage",
    "HostStage",
    "InputError",
    "LazyError",
    "LazyTensor",
    "LoopBody",
    "Node",
    "Op",
    "Options",
    "ParamMode",
    "Placement",
    "PlanError",
    "Program",
    "RowMixingError",
    "RunStats",
    "ShapeError",
    "Special",
    "WarmedBucket",
    "affine_inputs",
    "argmax",
    "broadcast_to",
    "cast",
    "column_sources",
    "compile",
    "concat",
    "const",
    "couple",
    "couple_loop",
    "ctz",
    "default_cache",
    "erf",
    "evaluate",
    "exp",
    "expand_dims",
    "expm1",
    "floor",
    "forest_shap",
    "forest_sum",
    "fori_loop",
    "get_backend",
    "graph_digest",
    "isnan",
    "log",
    "log1p",
    "logsumexp",
    "matmul",
    "max",
    "maximum",
    "may_be_nan",
    "min",
    "minimum",
    "narrowed",
    "ndtri",
    "reduce_and",
    "remainder",
    "reshape",
    "run_program",
    "scope",
    "sigmoid",
    "slice_axis",
    "softmax",
    "special_values",
    "sqrt",
    "sum",
    "take",
    "take_along",
    "tanh",
    "transpose",
    "update",
    "variant",
    "verify",
    "warm_kernels",
    "where",
]
