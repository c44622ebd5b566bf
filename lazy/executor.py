"""Running graphs and programs: buckets, padding, chunking, the cache, warm-up.

``CompiledGraph`` is the per-model hot path: validate the inputs, pad to the bucket, dispatch the
cached executable, slice the outputs. After :meth:`CompiledGraph.warmup` every bucket is compiled,
so serving runs with zero compiles; a compile after that is recorded with cause ``after_ready``.

Calls of more than ``max_batch`` rows run in chunks of at most ``call_rows`` rows (see
:func:`call_rows_for`), written into one preallocated result; chunk boundaries are placed so that
each chunk's rows start on a 64-byte boundary where the caller's array allows it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends import Backend, Executable, get_backend
from .buckets import Buckets, pad_rows
from .cache import CacheKey, ExecutableCache
from .dtypes import DTypePolicy
from .errors import InputError
from .graph import Graph
from .node import Node
from .ops import Op
from .passes import inline_params, optimize, prune, specialize
from .program import GraphStage, HostStage, Program
from .shapes import concrete, is_batched, static_size
from .stats import CompileCause, RunStats
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
#: :data:`DENSE_CALL_BYTES` instead, and fewer calls, each of which costs XLA:CPU 15-45 us. One
#: thread, a 50-100-100-1 MLP (12 FLOPs per byte) ran 1.05-1.08x faster at 10k and 100k rows in
#: calls of 4096 rows than of 1024, and slower again at 8192; tree ensembles (no products) were
#: within 3 % from 1024 to 8192 rows, and only paid more warm-up for the extra buckets.
DENSE_FLOPS_PER_BYTE = 8.0
DENSE_CALL_BYTES = 12 << 20
#: The most rows :func:`call_rows_for` gives one call. Beyond it the inputs of a cheap graph
#: outgrow the caches: scaler + logistic regression, 50 features, one thread, ran 13 ns/row at
#: 16384 rows per call, 19 at 65536 (and 90 at 1024, dispatch-bound).
MAX_CALL_ROWS = 16384
#: XLA:CPU reads a host array in place (zero-copy) only when it starts on this boundary; it
#: copies any other, at a fraction of memory bandwidth (100k rows × 50 float32: 14 ms).
ALIGNMENT = 64
#: The most large buckets a graph gets (call_rows <= 2**MAX_LARGE_BUCKETS * max_batch): each is
#: one more executable to compile at warm-up.
MAX_LARGE_BUCKETS = 4


#: Buckets of at most this many rows (by default every bucket a graph can have) are timed at
#: warm-up on the numpy backend too (straight-line host code, :mod:`lazy.backends.numpy_backend`)
#: and run there where that is faster. A device call has a fixed cost (XLA:CPU ~15 µs, ~45 µs
#: with a dot) that numpy does not pay. One thread, side by side: scaler + logistic regression
#: (50 features) ran 1.5-1.7x faster at 10k rows with every bucket on the host than with none,
#: 2.8x at 100 rows; a 50-100-100-1 MLP's host plan 1.7x at 64 rows, 1.2x at 256, 0.85x at 1024
#: (where the device then keeps the bucket and every larger one).
HOST_ROWS = 1 << 20
#: Graphs that would make more numpy calls than this per run (loop bodies count once per trip)
#: are not even timed on the host: at ~1 µs a call they cannot beat a device call.
HOST_MAX_CALLS = 256
#: Once the host takes this many times the device's time on a bucket, larger buckets are not
#: timed: a device call's fixed cost, the host's edge, only shrinks as buckets grow. Nearer than
#: that they still are, as a host kernel may change algorithm with the rows (FOREST_SUM scores
#: batches of 16 rows or more by bit-vectors: XGBoost 100 × depth 6 ran 78 µs walked at 64 rows,
#: 27 µs by bits, where the device took 82).
HOST_GIVE_UP = 2.0
#: Interleaved rounds (each of :data:`HOST_TIMING_CALLS` calls per candidate) that decide a
#: bucket's placement: the median round wins.
HOST_TIMING_ROUNDS = 5
HOST_TIMING_CALLS = 3


@dataclass(frozen=True)
class Placement:
    """Where a bucket runs (``"host"``: the numpy backend; ``"device"``: the graph's backend), and
    the warm-up timings (µs per call, median rounds) that decided it."""

    bucket: int
    runs_on: str
    host_us: float
    device_us: float


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
    calls = 0
    for node in order:
        if node.op is Op.LOOP:
            calls += node.attr("trip_count") * host_calls(node.attr("body").order)
        elif node.op not in (Op.INPUT, Op.PARAM, Op.CONST):
            calls += 1
    return calls


def _time_round(fn: Callable[[], Any], rounds: list[float]) -> None:
    """Append one round's µs per call of ``fn`` to ``rounds``."""
    t0 = time.perf_counter()
    for _ in range(HOST_TIMING_CALLS):
        fn()
    rounds.append((time.perf_counter() - t0) / HOST_TIMING_CALLS * 1e6)


def row_bytes(graph: Graph, policy: DTypePolicy) -> int:
    """Bytes per row of every batched intermediate of ``graph`` (loop bodies included, once):
    an upper bound of what one row keeps live when nothing is fused or freed early."""
    total = 0
    pending: list[Node] = list(graph.order)
    while pending:
        node = pending.pop()
        if node.op is Op.LOOP:
            pending.extend(node.attr("body").order)
        if node.op is not Op.INPUT and is_batched(node.shape):
            total += static_size(node.shape) * np.dtype(policy.lower(node.dtype)).itemsize
    return total


def matmul_flops(graph: Graph) -> int:
    """Matrix-product FLOPs per row of ``graph``: 2·k per element of each batched product's row
    (a loop body's once per trip)."""

    def walk(order: Sequence[Node], trips: int) -> int:
        total = 0
        for node in order:
            if node.op is Op.LOOP:
                total += walk(node.attr("body").order, trips * node.attr("trip_count"))
            elif node.op is Op.MATMUL and is_batched(node.shape):
                total += trips * 2 * node.inputs[0].shape[-1] * static_size(node.shape)
        return total

    return walk(graph.order, 1)


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
    instead (see :data:`HOST_ROWS`; 0: never).
    """

    backend: str | Backend = "jax"
    max_batch: int = 1024
    dtype_policy: DTypePolicy = DTypePolicy.X32
    param_mode: ParamMode = ParamMode()
    optimize: bool = True
    call_rows: int | None = None
    host_rows: int = HOST_ROWS


class CompiledGraph:
    """A verified graph bound to a backend, with one executable per bucket."""

    def __init__(
        self, graph: Graph, options: Options = Options(), cache: ExecutableCache | None = None
    ) -> None:
        self.source = graph
        self.options = options
        self.backend = (
            get_backend(options.backend) if isinstance(options.backend, str) else options.backend
        )
        if options.optimize:
            graph = optimize(graph)
        both = verify(inline_params(graph, options.param_mode.inline_max_elements))
        #: What the backend compiles, and what host placement runs: each keeps its own
        #: formulation of every VARIANT (the same graph where there is none).
        self.graph = graph = specialize(both, self.backend.target)
        self.host_graph = specialize(both, "host")
        self.cache = cache if cache is not None else default_cache()
        policy = options.dtype_policy
        self._policy = policy
        call_rows = options.call_rows
        if call_rows is None:
            call_rows = call_rows_for(graph, policy, options.max_batch, self.backend.dense_calls)
        self.buckets = Buckets(options.max_batch, call_rows)
        self.stats = RunStats()
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
        self._exes: list[Executable | None] = [None] * len(self.buckets)
        # What each bucket's calls run: its executable and the parameters it takes (the host's
        # own copies where warm-up placed the bucket on the host); None until first needed.
        self._routes: list[tuple[Executable, Any] | None] = [None] * len(self.buckets)
        #: Buckets warm-up timed on the host too, by bucket size.
        self.placements: dict[int, Placement] = {}
        # Whether the next bucket warmed is worth timing on the host: not once the device has
        # won a bucket by HOST_GIVE_UP or more.
        self._host: tuple[Backend, Any] | None = None  # the numpy backend and its parameters
        #: Which buckets' calls run a host plan (numpy: warm-up placed them there, or the graph's
        #: backend is numpy), and their plans of one output each (see :meth:`run_one`).
        self._on_host = [self.backend.target == "host"] * len(self.buckets)
        self._single: dict[tuple[int, int], tuple[Executable, Any]] = {}
        self._host_may_win = (
            options.host_rows > 0
            and self.backend.target != "host"
            and host_calls(self.host_graph.order) <= HOST_MAX_CALLS
        )

    # -- compilation -------------------------------------------------------------------------
    def key(self, bucket: int) -> CacheKey:
        return CacheKey(
            self.graph.digest,
            bucket,
            self._policy.value,
            self.options.param_mode.label,
            self._fingerprint,
        )

    def _executable(self, index: int, cause: CompileCause) -> Executable:
        bucket = self.buckets.sizes[index]
        if self.ready and cause is CompileCause.ON_DEMAND:
            cause = CompileCause.AFTER_READY
        key = self.key(bucket)
        known = key in self.cache
        exe = self.cache.get(
            key, self.backend, lambda: self.backend.compile(self.graph, bucket, self._policy), cause
        )
        if not known:
            self.compiles[cause.value] += 1
        self._exes[index] = exe
        if self._routes[index] is None:
            self._routes[index] = (exe, self._params)
        return exe

    def warmup(self, on_bucket: Callable[[int, float], None] | None = None) -> None:
        """Compile (or load) and run every bucket once; then the graph is ready. ``on_bucket``
        is called after each with the bucket's rows and the seconds it took."""
        for index, rows in enumerate(self.buckets.sizes):
            t0 = time.perf_counter()
            self.warm_bucket(index)
            if on_bucket is not None:
                on_bucket(rows, time.perf_counter() - t0)
        self.ready = True

    def warm_bucket(self, index: int) -> None:
        """Compile (or load) bucket ``index`` and run it once on zeros; a bucket of at most
        ``host_rows`` rows is then timed against the numpy backend, and the faster one kept."""
        bucket = self.buckets.sizes[index]
        exe = self._executable(index, CompileCause.WARMUP)
        # Zeros written out, not np.zeros: a large np.zeros maps every page to the one zero page,
        # which reads from L1 and would flatter whatever the timing below measures on it.
        dummy = [np.full((bucket, *shape), 0, dtype) for _, shape, dtype, _ in self._inputs]
        exe(dummy, self._params)
        if self._host_may_win and bucket <= self.options.host_rows:
            self._place(index, exe, dummy)

    def _place(self, index: int, exe: Executable, dummy: list[np.ndarray]) -> None:
        """Time bucket ``index`` on the backend and on the host, in interleaved rounds, and route
        its calls to the faster. Both compute the same graph in the same dtypes (each with its
        own formulation of any VARIANT); which is faster depends on the graph and the machine,
        so it is measured, not guessed."""
        if self._host is None:
            backend = get_backend("numpy")
            values = self.host_graph.param_values()
            self._host = (backend, backend.prepare_params(values, self._policy))
        host, host_params = self._host
        host_exe, _ = host.compile(self.host_graph, self.buckets.sizes[index], self._policy)
        host_exe(dummy, host_params)
        host_us: list[float] = []
        device_us: list[float] = []
        for _ in range(HOST_TIMING_ROUNDS):
            _time_round(lambda: exe(dummy, self._params), device_us)
            _time_round(lambda: host_exe(dummy, host_params), host_us)
        placement = Placement(
            self.buckets.sizes[index],
            "host" if statistics.median(host_us) < statistics.median(device_us) else "device",
            statistics.median(host_us),
            statistics.median(device_us),
        )
        self.placements[placement.bucket] = placement
        if placement.runs_on == "host":
            self._routes[index] = (host_exe, host_params)
            self._on_host[index] = True
        elif placement.host_us > HOST_GIVE_UP * placement.device_us:
            self._host_may_win = False

    # -- running -----------------------------------------------------------------------------
    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self.run_list(inputs), strict=True))

    def run_list(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The outputs in :attr:`output_names` order: the per-request hot path (``__call__``
        and :class:`CompiledProgram` build their dicts from it)."""
        arrays, rows = self._validate(inputs)
        return self._run_rows(arrays, rows)

    def run_one(self, inputs: Mapping[str, Any], output: int) -> np.ndarray:
        """Output number ``output`` alone. Where the bucket runs a host plan, a plan of that
        output only (built on first use): each numpy call is ~1-2 µs whatever its size, so a
        one-row ``predict_proba`` of a logistic regression skips the ``predict`` head's calls. A
        device executable computes every output in one call anyway: its results are picked."""
        arrays, rows = self._validate(inputs)
        if 0 < rows <= self.buckets.max_batch:
            index = self.buckets.index(rows)
            if self._on_host[index]:
                route = self._single.get((index, output)) or self._single_route(index, output)
                return self._run_rows(arrays, rows, route)[0]
        return self._run_rows(arrays, rows)[output]

    def _single_route(self, index: int, output: int) -> tuple[Executable, Any]:
        host = get_backend("numpy")
        graph = prune(self.host_graph, [self._outputs[output]])
        exe, _ = host.compile(graph, self._sizes[index], self._policy)
        route = (exe, host.prepare_params(graph.param_values(), self._policy))
        self._single[(index, output)] = route
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
        for spans in calls:
            if len(spans) == 1:
                inputs = [a[spans[0][0] : spans[0][1]] for a in arrays]
            else:
                inputs = [np.concatenate([a[i:j] for i, j in spans]) for a in arrays]
            parts = self._run(inputs, sum(j - i for i, j in spans))
            if not results:
                results = [np.empty((rows, *p.shape[1:]), p.dtype) for p in parts]
            offset = 0
            for i, j in spans:
                for result, part in zip(results, parts, strict=True):
                    result[i:j] = part[offset : offset + j - i]
                offset += j - i
        return results

    def _run(
        self, arrays: list[np.ndarray], rows: int, route: tuple[Executable, Any] | None = None
    ) -> list[np.ndarray]:
        index = self.buckets.index(rows)
        self.stats.chunks += 1
        route = route or self._routes[index] or self._route_on_demand(index)
        return self._call(route, index, arrays, rows)

    def _call(
        self, route: tuple[Executable, Any], index: int, arrays: list[np.ndarray], rows: int
    ) -> list[np.ndarray]:
        """``route`` (an executable and its parameters) on ``rows`` rows in bucket ``index``."""
        exe, params = route
        bucket = self._sizes[index]
        # An exact bucket, or a host plan that takes any rows: no padded copy, no output slice.
        if bucket == rows or getattr(exe, "any_rows", False):
            return exe(arrays, params)
        self.stats.padded_rows += bucket - rows
        outs = exe([pad_rows(a, bucket) for a in arrays], params)
        return [o[:rows] for o in outs]

    def _route_on_demand(self, index: int) -> tuple[Executable, Any]:
        self._executable(index, CompileCause.ON_DEMAND)  # routes the bucket to it
        route = self._routes[index]
        assert route is not None
        return route

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
        index = self.buckets.index(rows)
        return self._exes[index] or self._executable(index, CompileCause.ON_DEMAND)

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
        """How many buckets have an executable bound."""
        return sum(e is not None for e in self._exes)


class CompiledProgram:
    """Graph segments and host steps run in order over an environment of named arrays."""

    def __init__(
        self, program: Program, options: Options = Options(), cache: ExecutableCache | None = None
    ) -> None:
        self.program = program
        self.stages: list[CompiledGraph | HostStage] = [
            CompiledGraph(s.graph, options, cache) if isinstance(s, GraphStage) else s
            for s in program.stages
        ]
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

    @property
    def graphs(self) -> list[CompiledGraph]:
        return [s for s in self.stages if isinstance(s, CompiledGraph)]

    @property
    def ready(self) -> bool:
        return all(g.ready for g in self.graphs)

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

    def run_one(self, inputs: Mapping[str, Any], name: str) -> np.ndarray:
        """The output ``name`` alone (see :meth:`CompiledGraph.run_one`)."""
        if self._only is not None:
            position = self._names.index(name)
            picked = position if self._picks is None else self._picks[position]
            return self._only.run_one(inputs, picked)
        return self(inputs)[name]

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if self._only is not None:
            outs = self._only.run_list(inputs)
            if self._picks is not None:
                outs = [outs[i] for i in self._picks]
            return dict(zip(self._names, outs, strict=True))
        return run_stages(self.program, self.stages, inputs)


GraphRunner = Callable[[Mapping[str, Any]], Mapping[str, np.ndarray]]


def run_stages(
    program: Program, stages: Sequence[GraphRunner | HostStage], inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Run a program: each graph stage by its runner, each host stage on numpy arrays."""
    env: dict[str, Any] = {name: inputs[name] for name in program.input_names if name in inputs}
    missing = [n for n in program.input_names if n not in env]
    if missing:
        raise InputError(f"missing inputs {missing}; expected {list(program.input_names)}")
    rows = len(np.asarray(env[program.input_names[0]])) if program.input_names else 0
    for stage in stages:
        if isinstance(stage, HostStage):
            results = stage.fn(*(np.asarray(env[name]) for name in stage.inputs))
            results = results if isinstance(results, (tuple, list)) else (results,)
            if len(results) != len(stage.outputs):
                raise InputError(
                    f"host step {stage.name!r} returned {len(results)} values, "
                    f"declared {len(stage.outputs)}"
                )
            for (name, t), value in zip(stage.outputs, results, strict=True):
                array = np.asarray(value, dtype=t.dtype)
                if array.shape != concrete(t.shape, rows):
                    raise InputError(
                        f"host step {stage.name!r} returned shape {array.shape} for {name!r}, "
                        f"declared {concrete(t.shape, rows)}"
                    )
                env[name] = array
        else:
            env.update(stage(env))
    return {name: env[ref] for name, ref in program.outputs}


def compile(
    program: Program | Graph,
    options: Options = Options(),
    cache: ExecutableCache | None = None,
    *,
    warmup: bool = True,
) -> CompiledProgram:
    """Compile a program (or a single graph) for ``options.backend``; warm every bucket."""
    if isinstance(program, Graph):
        program = Program(
            program.inputs, (GraphStage(program),), tuple((n, n) for n in program.output_names)
        )
    compiled = CompiledProgram(program, options, cache)
    if warmup:
        compiled.warmup()
    return compiled
