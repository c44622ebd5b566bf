"""Running graphs and programs: buckets, padding, chunking, the cache, warm-up.

``CompiledGraph`` is the per-model hot path: validate the inputs, pad to the bucket, dispatch the
cached executable, slice the outputs. After :meth:`CompiledGraph.warmup` every bucket is compiled,
so serving runs with zero compiles; a compile after that is recorded with cause ``after_ready``.

Calls of more than ``max_batch`` rows run in chunks of at most ``call_rows`` rows (see
:func:`call_rows_for`), written into one preallocated result; chunk boundaries are placed so that
each chunk's rows start on a 64-byte boundary where the caller's array allows it.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import subnormals
from .backends import Backend, Executable, get_backend
from .buckets import Buckets, pad_rows
from .cache import CacheKey, ExecutableCache
from .dtypes import DTypePolicy
from .errors import BackendError, InputError
from .graph import Graph
from .loop import within
from .narrowing import narrowed
from .node import Node
from .ops import Op
from .passes import inline_params, optimize, prune, specialize
from .plan import DEVICE, HOST, ExecutionPlan, GraphPlan, Placement
from .program import GraphStage, HostStage, Program, run_stages
from .shapes import concrete, is_batched, static_size
from .stats import CompileCause, RunStats
from .threads import SpreadChoice, available_cores, spread
from .verify import verify

_DEFAULT_CACHE: ExecutableCache | None = None
_DEFAULT_CACHE_LOCK = threading.Lock()


def default_cache() -> ExecutableCache:
    """The process-wide in-memory cache used when none is passed."""
    global _DEFAULT_CACHE
    with _DEFAULT_CACHE_LOCK:
        if _DEFAULT_CACHE is None:
            _DEFAULT_CACHE = ExecutableCache()
        return _DEFAULT_CACHE


@dataclass(frozen=True)
class ParamMode:
    """Parameters are executable arguments; those of at most ``inline_max_elements`` elements are
    baked into the code as constants instead (0: none)."""

    inline_max_elements: int = 0

    @property
    def label(self) -> str:
        return "args" if self.inline_max_elements <= 0 else f"inline<={self.inline_max_elements}"


#: Row intermediates one call may hold (bytes): a graph whose rows need little gets buckets
#: above ``max_batch``, up to as many rows as fit this (a logistic regression: 16384; tree
#: ensembles stay at max_batch, where their working set already fills L2).
CALL_BYTES = 2 << 20
#: Graphs doing at least this many matrix-product FLOPs per byte of row intermediates are
#: compute-bound: their intermediates may spill from L2 to L3, as moving a byte there and back
#: costs less than the products made from it. On backends with ``dense_calls`` they get
#: :data:`DENSE_CALL_BYTES` instead, and fewer calls, each of which has XLA:CPU's fixed cost. An
#: MLP ran a little faster in 4096-row calls than in 1024-row ones, and slower again at 8192;
#: tree ensembles (no products) gained nothing, and only paid more warm-up for the extra buckets
#: (docs/design-figures.md).
DENSE_FLOPS_PER_BYTE = 8.0
DENSE_CALL_BYTES = 12 << 20
#: The most rows :func:`call_rows_for` gives one call. Beyond it the inputs of a cheap graph
#: outgrow the caches, and the time per row rises again.
MAX_CALL_ROWS = 16384
#: XLA:CPU reads a host array in place (zero-copy) only when it starts on this boundary; it
#: copies any other, at a fraction of memory bandwidth.
ALIGNMENT = 64
#: The most large buckets a graph gets (call_rows <= 2**MAX_LARGE_BUCKETS * max_batch): each is
#: one more executable to compile at warm-up.
MAX_LARGE_BUCKETS = 4


#: Buckets of at most this many rows (by default every bucket a graph can have) may run on the
#: host (straight-line numpy, :mod:`lazy.backends.numpy_backend`) where warm-up measures that to
#: be faster: a device call has a fixed cost that numpy does not pay (docs/design-figures.md).
HOST_ROWS = 1 << 20
_FLOAT32 = np.dtype(np.float32)

#: Graphs whose host plan would make more numpy calls than this per run (loop bodies count once
#: per trip) are not timed on the host: with every numpy call's fixed cost they cannot win.
HOST_MAX_CALLS = 256
#: Interleaved rounds (each of :data:`HOST_TIMING_CALLS` calls per lowering) that decide a
#: bucket's placement: the median round wins.
HOST_TIMING_ROUNDS = 5
HOST_TIMING_CALLS = 3


@dataclass(slots=True)
class _Bucket:
    """Everything one bucket of a :class:`CompiledGraph` holds."""

    rows: int
    placement: Placement | None = None  # decided (measured, by rule, or from a plan)
    device: Executable | None = None  # the graph backend's executable, once compiled
    route: tuple[Executable, Any] | None = None  # what its calls run, and with which params
    # Plans of one output each, where the bucket runs on the host (see run_one).
    single: dict[int, tuple[Executable, Any]] = field(default_factory=dict)

    @property
    def on_host(self) -> bool:
        return self.placement is not None and self.placement.runs_on == HOST


@dataclass(frozen=True)
class WarmedBucket:
    """A bucket warm-up just compiled (or loaded from the cache) and ran: what a caller of
    :meth:`CompiledProgram.warmup` hears after each one, to show progress."""

    graph: int  # the graph's position in :attr:`CompiledProgram.graphs`
    bucket: int  # its rows
    seconds: float
    done: int  # buckets warmed so far, over every graph
    total: int


def host_calls(order: Sequence[Node]) -> int:
    """How many numpy calls one run of ``order`` makes on the numpy backend (leaves make none;
    a loop makes its body's calls once per trip)."""
    free = (Op.INPUT, Op.PARAM, Op.CONST, Op.LOOP)
    return sum(trips for node, trips in within(order) if node.op not in free)


def _time_round(fn: Callable[[], Any], rounds: list[float]) -> None:
    """Append one round's µs per call of ``fn`` to ``rounds``."""
    t0 = time.perf_counter()
    for _ in range(HOST_TIMING_CALLS):
        fn()
    rounds.append((time.perf_counter() - t0) / HOST_TIMING_CALLS * 1e6)


def row_bytes(graph: Graph, policy: DTypePolicy) -> int:
    """Bytes per row of every batched intermediate of ``graph`` (loop bodies included, once):
    an upper bound of what one row keeps live when nothing is fused or freed early."""
    return sum(
        static_size(node.shape) * np.dtype(policy.lower(node.dtype)).itemsize
        for node, _ in within(graph.order)
        if node.op is not Op.INPUT and is_batched(node.shape)
    )


def matmul_flops(graph: Graph) -> int:
    """Matrix-product FLOPs per row of ``graph``: 2·k per element of each batched product's row
    (a loop body's once per trip)."""

    return sum(
        trips * 2 * node.inputs[0].shape[-1] * static_size(node.shape)
        for node, trips in within(graph.order)
        if node.op is Op.MATMUL and is_batched(node.shape)
    )


def call_rows_for(
    graph: Graph, policy: DTypePolicy, max_batch: int, dense_calls: bool = False
) -> int:
    """Rows per call for ``graph``: ``max_batch`` times the largest power of two (at most
    ``2**MAX_LARGE_BUCKETS``) that keeps the call's intermediates within :data:`CALL_BYTES`
    (:data:`DENSE_CALL_BYTES` for a compute-bound graph on a backend with ``dense_calls``) and
    its rows within :data:`MAX_CALL_ROWS` (``max_batch`` itself when even twice as many would
    not)."""
    per_row = max(row_bytes(graph, policy), 1)
    dense = dense_calls and matmul_flops(graph) >= DENSE_FLOPS_PER_BYTE * per_row
    limit = min(
        MAX_CALL_ROWS,
        max_batch << MAX_LARGE_BUCKETS,
        (DENSE_CALL_BYTES if dense else CALL_BYTES) // per_row,
    )
    rows = max_batch
    while rows * 2 <= limit:
        rows *= 2
    return rows


def aligned_start(arrays: Sequence[np.ndarray], limit: int) -> int:
    """The first row (at most ``limit``) at which the rows of every C-contiguous array in
    ``arrays`` start on an :data:`ALIGNMENT` boundary; 0 where no row does."""
    layouts = [
        (a.ctypes.data, a.strides[0])
        for a in arrays
        if a.flags.c_contiguous and a.size and a.strides[0] > 0
    ]
    for row in range(min(ALIGNMENT, limit + 1)):
        if all((address + row * stride) % ALIGNMENT == 0 for address, stride in layouts):
            return row
    return 0


@dataclass(frozen=True)
class Options:
    """How to compile and run a graph.

    ``max_batch`` is the largest small bucket; ``call_rows`` the most rows one call runs (a power
    of two times ``max_batch``; None: :func:`call_rows_for` the graph; ``max_batch``: chunk every
    larger call at ``max_batch``). Buckets of at most ``host_rows`` rows may run on the host
    instead (see :data:`HOST_ROWS`; 0: never). ``threads``: a call of several chunks runs them
    on up to this many threads (:mod:`lazy.threads`; None: the cores the process may use).
    """

    backend: str | Backend = "jax"
    max_batch: int = 1024
    dtype_policy: DTypePolicy = DTypePolicy.X32
    param_mode: ParamMode = ParamMode()
    optimize: bool = True
    call_rows: int | None = None
    host_rows: int = HOST_ROWS
    threads: int | None = None


class CompiledGraph:
    """A verified graph bound to a backend, with one executable per bucket.

    Where each bucket runs — the backend (``"device"``) or a numpy plan on the host — is its
    placement (:mod:`lazy.plan`). Given a ``plan`` decided for this graph on these backends,
    warm-up follows it and compiles only what runs; otherwise warm-up decides (see
    :meth:`warmup`) and :attr:`plan` is the result, for the caller to persist.
    """

    def __init__(
        self,
        graph: Graph,
        options: Options = Options(),
        cache: ExecutableCache | None = None,
        plan: GraphPlan | None = None,
        follow: CompiledGraph | None = None,
    ) -> None:
        self.source = graph
        self.options = options
        #: A graph whose placements this one's buckets take (by rows) instead of measuring:
        #: a program narrowed for float32 input runs where its float64 program runs.
        self._follow = follow
        self.backend = (
            get_backend(options.backend) if isinstance(options.backend, str) else options.backend
        )
        if options.optimize:
            graph = optimize(graph)
        policy = options.dtype_policy
        inline = options.param_mode.inline_max_elements
        #: What the backend compiles, and what host placement runs: each keeps its own
        #: formulation of every VARIANT (the same graph where there is none). Where the backend
        #: reads subnormals as zero, its comparisons read subnormal parameters moved off them.
        device = specialize(graph, self.backend.target)
        if self.backend.target != "host":
            device = subnormals.for_flushing(device, self.backend, policy)
        self.host_graph = verify(inline_params(specialize(graph, "host"), inline))
        self.graph = graph = verify(inline_params(device, inline))
        unlowered = {n.op for n, _ in within(graph.order)} - self.backend.rules.keys()
        if unlowered:
            names = ", ".join(sorted(op.name for op in unlowered))
            raise BackendError(
                f"the {self.backend.name} backend has no lowering for {names}: "
                "these run on the host only (backend='numpy', or as the host formulation of "
                "lz.variant)"
            )
        self.cache = cache if cache is not None else default_cache()
        self._policy = policy
        call_rows = options.call_rows
        if call_rows is None:
            call_rows = call_rows_for(graph, policy, options.max_batch, self.backend.dense_calls)
        self.buckets = Buckets(options.max_batch, call_rows)
        self.stats = RunStats()
        self._stats_lock = threading.Lock()
        self._threads = options.threads or available_cores()
        self._spread = SpreadChoice()  # whether this graph's chunks run faster spread
        self.compiles: Counter[str] = Counter()
        self.ready = False
        # Everything the hot path needs that does not change between calls, computed once:
        # (name, row shape, dtype, ndim) per input, bucket sizes, parameters on the device.
        self._inputs = [
            (n.attr("name"), n.shape[1:], np.dtype(policy.lower(n.dtype)), len(n.shape))
            for n in graph.inputs
        ]
        self._outputs = graph.output_names
        self._sizes = self.buckets.sizes
        self._params = self.backend.prepare_params(graph.param_values(), policy)
        self._fingerprint = self.backend.fingerprint()
        self._numpy = get_backend("numpy")
        self._host_params: Any = None  # the host plans' own parameters, prepared once
        # Per host graph digest: the largest bucket an any-rows plan was built at, and the plan.
        self._host_shared: dict[str, tuple[int, Executable]] = {}
        self._buckets = [_Bucket(rows) for rows in self._sizes]
        #: Why a given plan was not followed (None: followed, or none given).
        self.plan_refused: str | None = None
        if plan is not None:
            self.plan_refused = plan.matches(self.graph.digest, self.backends, self._sizes)
            if self.plan_refused is None:
                for bucket, placement in zip(self._buckets, plan.placements, strict=True):
                    bucket.placement = placement
        # Why no bucket may run on the host, if none may (checked once; None: some may).
        self._host_excluded = self._host_exclusion()
        # Where device executables read subnormals as zero, the inputs whose subnormal values
        # could change a decision: rows holding one run on the host plan (lazy.subnormals).
        decisive = subnormals.decision_inputs(graph) if self.backend.target != "host" else ()
        self._subnormal_inputs = [
            i for i, (name, *_) in enumerate(self._inputs) if name in decisive
        ]
        self._flushes = bool(self._subnormal_inputs) and subnormals.flushes(self.backend, policy)
        self._pinned: str | None = None  # see :meth:`pinned`

    @property
    def formulations(self) -> tuple[str, ...]:
        """Where this graph's buckets may run: the device lowering and the host plan, or the
        host alone (a host backend)."""
        return (HOST,) if self.backend.target == "host" else (DEVICE, HOST)

    @contextlib.contextmanager
    def pinned(self, formulation: str) -> Iterator[None]:
        """Within, every call runs on ``formulation`` (:attr:`formulations`), whatever each
        bucket's placement: a registration gate checks each, since a plan made on another
        machine, or another measurement, may place the buckets otherwise. The device runs every
        chunk padded into its largest bucket: warm-up compiled that one wherever it placed or timed
        it on the device. For a graph that does not serve meanwhile."""
        if formulation not in self.formulations:
            raise ValueError(f"no {formulation!r} formulation; this graph has {self.formulations}")
        self._pinned = formulation
        try:
            yield
        finally:
            self._pinned = None

    @property
    def backends(self) -> str:
        """The fingerprints a placement depends on: the graph's backend's and the host's."""
        return f"{self._fingerprint} | {self._numpy.fingerprint()}"

    @property
    def plan(self) -> GraphPlan | None:
        """Every bucket's placement, once each is decided (after :meth:`warmup`)."""
        placements = [b.placement for b in self._buckets]
        if any(p is None for p in placements):
            return None
        return GraphPlan(self.graph.digest, self.backends, tuple(placements))  # type: ignore[arg-type]

    @property
    def placements(self) -> dict[int, Placement]:
        """The placements decided so far, by bucket rows."""
        return {b.rows: b.placement for b in self._buckets if b.placement is not None}

    def _host_exclusion(self) -> str | None:
        if self.backend.target == "host":
            return None
        if self.options.host_rows <= 0:
            return "host placement is off (host_rows 0)"
        calls = host_calls(self.host_graph.order)
        if calls > HOST_MAX_CALLS:
            return f"its host plan makes {calls} numpy calls a run, over {HOST_MAX_CALLS}"
        return None

    # -- compilation -------------------------------------------------------------------------
    def key(self, bucket: int) -> CacheKey:
        return CacheKey(
            self.graph.digest,
            bucket,
            self._policy.value,
            self.options.param_mode.label,
            self._fingerprint,
        )

    def _host_key(self, bucket: int, graph: Graph) -> CacheKey:
        return CacheKey(graph.digest, bucket, self._policy.value, "args", self._numpy.fingerprint())

    def _cause(self, cause: CompileCause) -> CompileCause:
        return CompileCause.AFTER_READY if self.ready and cause is CompileCause.ON_DEMAND else cause

    def _device(self, index: int, cause: CompileCause) -> Executable:
        """Bucket ``index``'s executable on the graph's backend, compiled or from the cache."""
        bucket = self._buckets[index]
        if bucket.device is not None:
            return bucket.device
        key = self.key(bucket.rows)
        known = key in self.cache
        compile = lambda: self.backend.compile(self.graph, bucket.rows, self._policy)  # noqa: E731
        exe = self.cache.get(key, self.backend, compile, self._cause(cause))
        if not known:
            self.compiles[self._cause(cause).value] += 1
        bucket.device = exe
        return exe

    def _host(self, rows: int, cause: CompileCause, graph: Graph | None = None) -> Executable:
        """A host plan of ``graph`` (the host graph) for ``rows`` rows, through the cache.

        A plan that takes any rows (``any_rows``) runs every smaller bucket as it is, so one
        plan per graph serves them all: the first one built at a bucket at least this large
        (warm-up goes largest bucket first, so usually the only one built)."""
        graph = self.host_graph if graph is None else graph
        shared = self._host_shared.get(graph.digest)
        if shared is not None and shared[0] >= rows:
            return shared[1]
        numpy = self._numpy
        compile = lambda: numpy.compile(graph, rows, self._policy)  # noqa: E731
        exe = self.cache.get(self._host_key(rows, graph), numpy, compile, cause)
        if getattr(exe, "any_rows", False):
            self._host_shared[graph.digest] = (rows, exe)
        return exe

    def _host_route(self, rows: int, cause: CompileCause) -> tuple[Executable, Any]:
        if self._host_params is None:
            values = self.host_graph.param_values()
            self._host_params = self._numpy.prepare_params(values, self._policy)
        return self._host(rows, cause), self._host_params

    def _bind(self, index: int, cause: CompileCause) -> tuple[Executable, Any]:
        """Route bucket ``index`` where it is placed (the graph's backend if not yet placed)."""
        bucket = self._buckets[index]
        if bucket.on_host and self.backend.target != "host":
            bucket.route = self._host_route(bucket.rows, self._cause(cause))
        else:
            bucket.route = (self._device(index, cause), self._params)
        return bucket.route

    def warmup(self, on_bucket: Callable[[int, float], None] | None = None) -> None:
        """Place, compile (or load) and run every bucket once; then the graph is ready.
        ``on_bucket`` is called after each with the bucket's rows and the seconds it took.

        Without a plan, each bucket is placed by one rule and one measurement. A device call's
        fixed cost is the host's edge, and it only grows as buckets shrink. So buckets are warmed
        largest first: those of at most ``host_rows`` rows are timed on both lowerings until the
        host wins one, and that bucket and every smaller one run on the host, which compiles no
        device executable for them. Buckets above ``host_rows``, and every bucket of a graph the
        host cannot run cheaply, stay on the device without timing.
        """
        for index in reversed(range(len(self._buckets))):
            t0 = time.perf_counter()
            self.warm_bucket(index)
            if on_bucket is not None:
                on_bucket(self._buckets[index].rows, time.perf_counter() - t0)
        self.ready = True

    def warm_bucket(self, index: int) -> None:
        """Place bucket ``index`` (if no plan did), compile (or load) what it runs, and run it
        once on zeros."""
        bucket = self._buckets[index]
        # Zeros written out, not np.zeros: a large np.zeros maps every page to the one zero page,
        # which reads from L1 and would flatter whatever the timing below measures on it.
        dummy = [np.full((bucket.rows, *shape), 0, dtype) for _, shape, dtype, _ in self._inputs]
        if bucket.placement is None:
            bucket.placement = self._place(index, dummy)
        exe, params = self._bind(index, CompileCause.WARMUP)
        exe(dummy, params)

    def _place(self, index: int, dummy: list[np.ndarray]) -> Placement:
        """Bucket ``index``'s placement by the rule of :meth:`warmup`, timing it if need be."""
        rows = self._buckets[index].rows
        if self.backend.target == "host":
            return Placement(rows, HOST, "the graph's backend runs on the host")
        if self._host_excluded is not None:
            return Placement(rows, DEVICE, self._host_excluded)
        if self._follow is not None:
            runs_on = HOST if self._follow.runs_on_host(rows) else DEVICE
            return Placement(rows, runs_on, "where the float64 program runs these rows")
        if rows > self.options.host_rows:
            return Placement(rows, DEVICE, f"over host_rows ({self.options.host_rows})")
        larger = [b for b in self._buckets[index + 1 :] if b.on_host]
        if larger:
            return Placement(rows, HOST, f"the host won the larger bucket {larger[-1].rows}")
        return self._measure(index, dummy)

    def _measure(self, index: int, dummy: list[np.ndarray]) -> Placement:
        """Time bucket ``index`` on the backend and on the host, in interleaved rounds. Both
        compute the same graph in the same dtypes (each with its own formulation of any
        VARIANT); which is faster depends on the graph and the machine."""
        exe, params = self._device(index, CompileCause.WARMUP), self._params
        host_exe, host_params = self._host_route(self._buckets[index].rows, CompileCause.WARMUP)
        exe(dummy, params)
        host_exe(dummy, host_params)
        host_us: list[float] = []
        device_us: list[float] = []
        for _ in range(HOST_TIMING_ROUNDS):
            _time_round(lambda: exe(dummy, params), device_us)
            _time_round(lambda: host_exe(dummy, host_params), host_us)
        # To 10 ns: what a plan keeps (and a JSON round trip gives back exactly).
        host, device = round(statistics.median(host_us), 2), round(statistics.median(device_us), 2)
        runs_on = HOST if host < device else DEVICE
        return Placement(self._buckets[index].rows, runs_on, "measured", host, device)

    # -- running -----------------------------------------------------------------------------
    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self.run_list(inputs), strict=True))

    def run_list(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The outputs in :attr:`output_names` order: the per-request hot path (``__call__``
        and :class:`CompiledProgram` build their dicts from it)."""
        arrays, rows = self._validate(inputs)
        return self._run_rows(arrays, rows)

    def runs_on_host(self, rows: int) -> bool:
        """Whether a call of ``rows`` rows runs host plans: pinned to them, or its (largest)
        bucket placed there; False for a bucket not placed yet."""
        if self._pinned is not None:
            return self._pinned == HOST
        index = self.buckets.index(min(max(rows, 1), self.buckets.call_rows))
        return self._buckets[index].on_host

    def run_one(self, inputs: Mapping[str, Any], output: int) -> np.ndarray:
        """Output number ``output`` alone. Where the bucket runs a host plan, a plan of that
        output only (built on first use): each numpy call has a fixed cost whatever its size, so a
        one-row ``predict_proba`` of a logistic regression skips the ``predict`` head's calls. A
        device executable computes every output in one call anyway: its results are picked."""
        arrays, rows = self._validate(inputs)
        if 0 < rows <= self.buckets.max_batch and self._pinned is None:
            index = self.buckets.index(rows)
            bucket = self._buckets[index]
            if bucket.on_host:
                route = bucket.single.get(output) or self._single_route(index, output)
                return self._run_rows(arrays, rows, route)[0]
        return self._run_rows(arrays, rows)[output]

    def _single_route(self, index: int, output: int) -> tuple[Executable, Any]:
        bucket = self._buckets[index]
        graph = prune(self.host_graph, [self._outputs[output]])
        exe = self._host(bucket.rows, CompileCause.ON_DEMAND, graph)
        route = (exe, self._numpy.prepare_params(graph.param_values(), self._policy))
        bucket.single[output] = route
        return route

    def _run_rows(
        self, arrays: list[np.ndarray], rows: int, route: tuple[Executable, Any] | None = None
    ) -> list[np.ndarray]:
        """``rows`` rows in one bucket (by ``route`` where given: a small call only) or in
        chunks."""
        stats = self.stats
        stats.calls += 1
        stats.rows += rows
        if 0 < rows <= self.buckets.max_batch:
            return self._run(arrays, rows, route)
        if rows == 0:
            return self._empty()
        return self._run_chunked(arrays, rows)

    def _run_chunked(self, arrays: list[np.ndarray], rows: int) -> list[np.ndarray]:
        # The few rows before the first aligned one do not start a chunk, so that every large
        # chunk after them is read in place rather than copied by the backend. They ride with
        # the last chunk when it is padded into a bucket they also fit (one call fewer), else
        # run on their own. Only graphs with large buckets bother: elsewhere a chunk's compute
        # dwarfs its copy.
        buckets = self.buckets
        large = buckets.call_rows > buckets.max_batch
        skip = aligned_start(arrays, buckets.max_batch) if large else 0
        calls = [[span] for span in buckets.chunks(rows, skip)]  # each call's row spans
        if skip:
            tail = calls[-1][0][1] - calls[-1][0][0]
            if buckets.index(tail + skip) == buckets.index(tail):
                calls[-1].insert(0, (0, skip))
            else:
                calls.insert(0, [(0, skip)])
        results: list[np.ndarray] = []

        def run(spans: list[tuple[int, int]]) -> None:
            if len(spans) == 1:
                inputs = [a[spans[0][0] : spans[0][1]] for a in arrays]
            else:
                inputs = [np.concatenate([a[i:j] for i, j in spans]) for a in arrays]
            parts = self._run(inputs, sum(j - i for i, j in spans))
            if not results:
                results.extend(np.empty((rows, *p.shape[1:]), p.dtype) for p in parts)
            offset = 0
            for i, j in spans:
                for result, part in zip(results, parts, strict=True):
                    result[i:j] = part[offset : offset + j - i]
                offset += j - i

        # A chunk whose bucket is not bound yet runs first, here (binding may compile); the
        # rest, bound, spread over threads, each writing its own rows of the results.
        later = []
        for spans in calls:
            index = buckets.index(sum(j - i for i, j in spans))
            if results and self._buckets[index].route is not None:
                later.append(functools.partial(run, spans))
            else:
                run(spans)
        threads = self._threads
        if threads > 1 and len(later) >= threads:  # wide enough to tell whether spreading pays
            spreading = self._spread.choose()
            t0 = time.perf_counter()
            spread(later, threads if spreading else 1)
            self._spread.record(spreading, (time.perf_counter() - t0) / len(later))
        else:
            spread(later, threads if self._spread.pays is not False else 1)
        return results

    def _run(
        self, arrays: list[np.ndarray], rows: int, route: tuple[Executable, Any] | None = None
    ) -> list[np.ndarray]:
        index = self.buckets.index(rows)
        with self._stats_lock:  # chunks may run on several threads (lazy.threads)
            self.stats.chunks += 1
        bucket = self._buckets[index]
        if route is None and self._pinned is not None:
            on_device = self._pinned == DEVICE and self._flushes
            route, index = self._pinned_route(index)
        else:
            on_device = route is None and self._flushes and not bucket.on_host
            route = route or bucket.route or self._bind(index, CompileCause.ON_DEMAND)
        outs = self._call(route, index, arrays, rows)
        return self._subnormals_on_host(arrays, outs) if on_device else outs

    def _pinned_route(self, index: int) -> tuple[tuple[Executable, Any], int]:
        """The route of :meth:`pinned`'s formulation for bucket ``index``, and the bucket it
        runs in."""
        if self._pinned == HOST:
            return self._host_route(self._sizes[index], CompileCause.ON_DEMAND), index
        largest = len(self._buckets) - 1
        return (self._device(largest, CompileCause.WARMUP), self._params), largest

    def _subnormals_on_host(
        self, arrays: list[np.ndarray], outs: list[np.ndarray]
    ) -> list[np.ndarray]:
        """``outs`` with the rows whose inputs hold a subnormal recomputed on the host plan,
        which reads them as the source does (the device flushes them: lazy.subnormals)."""
        rows = subnormals.subnormal_rows([arrays[i] for i in self._subnormal_inputs])
        if rows is None:
            return outs
        index = self.buckets.index(len(rows))
        host = self._host_route(self._sizes[index], CompileCause.ON_DEMAND)
        fixed = self._call(host, index, [a[rows] for a in arrays], len(rows))
        with self._stats_lock:
            self.stats.subnormal_rows += len(rows)
        outs = [np.array(out) for out in outs]  # the device's may be read-only views
        for out, part in zip(outs, fixed, strict=True):
            out[rows] = part
        return outs

    def _call(
        self, route: tuple[Executable, Any], index: int, arrays: list[np.ndarray], rows: int
    ) -> list[np.ndarray]:
        """``route`` (an executable and its parameters) on ``rows`` rows in bucket ``index``."""
        exe, params = route
        bucket = self._sizes[index]
        # An exact bucket, or a host plan that takes any rows: no padded copy, no output slice.
        if bucket == rows or getattr(exe, "any_rows", False):
            return exe(arrays, params)
        with self._stats_lock:
            self.stats.padded_rows += bucket - rows
        outs = exe([pad_rows(a, bucket) for a in arrays], params)
        return [o[:rows] for o in outs]

    def _validate(self, inputs: Mapping[str, Any]) -> tuple[list[np.ndarray], int]:
        arrays = []
        rows = -1
        for name, shape, dtype, ndim in self._inputs:
            try:
                value = inputs[name]
            except KeyError:
                raise InputError(f"missing input {name!r}; expected {self.input_names}") from None
            # An array already of the declared type passes as is (the common, encoded case;
            # builtin dtypes are singletons, so ``is`` spares numpy's dtype comparison).
            if type(value) is np.ndarray and value.dtype is dtype:
                array = value
            else:
                array = np.asarray(value, dtype=dtype)
            if array.ndim != ndim or array.shape[1:] != shape:
                raise InputError(
                    f"input {name!r} must have shape (rows, {', '.join(map(str, shape))}), "
                    f"got {array.shape}"
                )
            if rows < 0:
                rows = array.shape[0]
            elif array.shape[0] != rows:
                raise InputError(f"input {name!r} has {array.shape[0]} rows, others have {rows}")
            arrays.append(array)
        return arrays, max(rows, 0)

    def _empty(self) -> list[np.ndarray]:
        return [
            np.empty(concrete(node.shape, 0), self._policy.lower(node.dtype))
            for _, node in self.graph.outputs
        ]

    def executable(self, rows: int) -> Executable:
        """The executable a chunk of ``rows`` rows (1..call_rows) runs, compiled on demand as
        such a call would; with :attr:`params` it is everything the call dispatches (benchmarks)."""
        if not 1 <= rows <= self.buckets.call_rows:
            raise InputError(f"rows must be in 1..{self.buckets.call_rows}, got {rows}")
        return self._device(self.buckets.index(rows), CompileCause.ON_DEMAND)

    @property
    def params(self) -> Any:
        """The parameter values as the backend placed them, once (on the device for JAX)."""
        return self._params

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _, _ in self._inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self._outputs)

    @property
    def executables(self) -> int:
        """How many buckets have an executable of the graph's backend compiled."""
        return sum(b.device is not None for b in self._buckets)


class CompiledProgram:
    """Graph segments and host steps run in order over an environment of named arrays.

    ``plan``: the execution plan an earlier compile of the same program decided (its graphs'
    plans in order); each graph follows its own where it still matches (see
    :attr:`plan_refused`).

    ``narrow_input``: a float64 input whose float32 arrays run the program narrowed for them
    (:func:`lazy.narrowing.narrowed`), compiled alongside where some decision narrows, for the
    calls whose formulation (where this program's one graph runs them: the host plan or the
    device) narrows: its buckets are placed as this program's, and its graphs follow this
    program's in :attr:`graphs`, warm-up and the plan. ``follow``: for such a program, the
    graph whose placements its graph takes."""

    def __init__(
        self,
        program: Program,
        options: Options = Options(),
        cache: ExecutableCache | None = None,
        plan: ExecutionPlan | None = None,
        narrow_input: str | None = None,
        *,
        follow: CompiledGraph | None = None,
    ) -> None:
        self.program = program
        graph_plans = iter(plan.graphs if plan is not None else ())
        self.stages: list[CompiledGraph | HostStage] = [
            CompiledGraph(s.graph, options, cache, next(graph_plans, None), follow)
            if isinstance(s, GraphStage)
            else s
            for s in program.stages
        ]
        self._plan_count = None if plan is None else len(plan.graphs)
        # One graph stage and nothing else (the common case): call it directly and name its
        # output list by position, found once here rather than by name on every call.
        only = self.stages[0] if len(self.stages) == 1 else None
        self._only: CompiledGraph | None = only if isinstance(only, CompiledGraph) else None
        self._names = program.output_names
        self._picks: list[int] | None = None  # None: the graph's outputs are in program order
        if self._only is not None:
            position = {ref: i for i, ref in enumerate(self._only.output_names)}
            picks = [position.get(ref, -1) for _, ref in program.outputs]
            if -1 in picks:  # an output no graph computes (an input passed through): general path
                self._only = None
            elif picks != list(range(len(self._only.output_names))):
                self._picks = picks
        #: (input, the program compiled for its float32 arrays, the targets where it narrows
        #: a decision). Where only the host plan narrows, it is compiled as host plans alone:
        #: on the device it would only widen the input, as the backend does anyway.
        self._narrow: tuple[str, CompiledProgram, frozenset[str]] | None = None
        narrow = None
        if narrow_input is not None and self._only is not None:
            narrow = narrowed(program, narrow_input)
        if narrow is not None:
            rest = ExecutionPlan(tuple(graph_plans)) if plan is not None else None
            own = options if DEVICE in narrow.targets else replace(options, backend="numpy")
            compiled = CompiledProgram(narrow.program, own, cache, rest, follow=self._only)
            self._narrow = narrow_input, compiled, narrow.targets  # type: ignore[assignment]

    @property
    def graphs(self) -> list[CompiledGraph]:
        """Every graph it compiles: its stages', then those of its narrowed program."""
        own = [s for s in self.stages if isinstance(s, CompiledGraph)]
        return own if self._narrow is None else own + self._narrow[1].graphs

    @property
    def narrows(self) -> str | None:
        """The input whose float32 arrays run a narrowed program (None: none does)."""
        return None if self._narrow is None else self._narrow[0]

    @property
    def formulations(self) -> tuple[str, ...]:
        """Where its graphs may run (:attr:`CompiledGraph.formulations`, over every graph)."""
        found = {f for g in self.graphs for f in g.formulations}
        return tuple(f for f in (DEVICE, HOST) if f in found)

    @contextlib.contextmanager
    def pinned(self, formulation: str) -> Iterator[None]:
        """Every graph that has ``formulation`` runs on it within (:meth:`CompiledGraph.pinned`);
        the others as placed."""
        if formulation not in self.formulations:
            raise ValueError(
                f"no {formulation!r} formulation; this program has {self.formulations}"
            )
        with contextlib.ExitStack() as stack:
            for graph in self.graphs:
                if formulation in graph.formulations:
                    stack.enter_context(graph.pinned(formulation))
            yield

    @property
    def ready(self) -> bool:
        return all(g.ready for g in self.graphs)

    @property
    def plan(self) -> ExecutionPlan | None:
        """Every graph's placements, once warm-up decided them: what to persist."""
        plans = [g.plan for g in self.graphs]
        if any(p is None for p in plans):
            return None
        return ExecutionPlan(tuple(plans))  # type: ignore[arg-type]

    @property
    def plan_refused(self) -> str | None:
        """Why the plan given was not followed in full (None: it was, or none was given)."""
        graphs = self.graphs
        if self._plan_count is not None and self._plan_count != len(graphs):
            return f"it plans {self._plan_count} graphs, this program has {len(graphs)}"
        reasons = [f"graph {i}: {g.plan_refused}" for i, g in enumerate(graphs) if g.plan_refused]
        return "; ".join(reasons) or None

    @property
    def bucket_count(self) -> int:
        """How many buckets warm-up compiles, over every graph."""
        return sum(len(g.buckets) for g in self.graphs)

    def warmup(self, on_bucket: Callable[[WarmedBucket], None] | None = None) -> None:
        """Warm every graph (:meth:`CompiledGraph.warmup`); ``on_bucket`` hears of each bucket."""
        total, done = self.bucket_count, 0
        for index, graph in enumerate(self.graphs):

            def warmed(rows: int, seconds: float, index: int = index) -> None:
                nonlocal done
                done += 1
                if on_bucket is not None:
                    on_bucket(WarmedBucket(index, rows, seconds, done, total))

            graph.warmup(warmed)

    def _narrowed_for(self, inputs: Mapping[str, Any]) -> CompiledProgram | None:
        """The narrowed program, where ``inputs`` hold a float32 array of its input."""
        if self._narrow is None:
            return None
        name, program, targets = self._narrow
        value = inputs.get(name)
        # ``is``: builtin dtypes are singletons, and this runs on every call.
        if type(value) is not np.ndarray or value.dtype is not _FLOAT32:
            return None
        assert self._only is not None  # a narrowed program is built for one graph only
        target = HOST if self._only.runs_on_host(len(value)) else DEVICE
        return program if target in targets else None

    def run_one(self, inputs: Mapping[str, Any], name: str) -> np.ndarray:
        """The output ``name`` alone (see :meth:`CompiledGraph.run_one`)."""
        narrow = self._narrowed_for(inputs)
        if narrow is not None:
            return narrow.run_one(inputs, name)
        if self._only is not None:
            position = self._names.index(name)
            picked = position if self._picks is None else self._picks[position]
            return self._only.run_one(inputs, picked)
        return self(inputs)[name]

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        narrow = self._narrowed_for(inputs)
        if narrow is not None:
            return narrow(inputs)
        if self._only is not None:
            outs = self._only.run_list(inputs)
            if self._picks is not None:
                outs = [outs[i] for i in self._picks]
            return dict(zip(self._names, outs, strict=True))
        return run_stages(self.program, self.stages, inputs)


def compile(
    program: Program | Graph,
    options: Options = Options(),
    cache: ExecutableCache | None = None,
    *,
    warmup: bool = True,
    plan: ExecutionPlan | None = None,
    narrow_input: str | None = None,
) -> CompiledProgram:
    """Compile a program (or a single graph) for ``options.backend``; warm every bucket, where
    ``plan`` (an earlier compile's :attr:`CompiledProgram.plan`) places them if given; with
    ``narrow_input``, also the program its float32 arrays run (:class:`CompiledProgram`)."""
    if isinstance(program, Graph):
        program = Program(
            program.inputs, (GraphStage(program),), tuple((n, n) for n in program.output_names)
        )
    compiled = CompiledProgram(program, options, cache, plan, narrow_input)
    if warmup:
        compiled.warmup()
    return compiled
