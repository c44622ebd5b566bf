"""Prometheus metrics on an injected registry; every duration in seconds; bounded labels only.

Labels are limited to model, version, route (the route template, never the raw path), status,
reason, cause, phase and state, so a hostile client cannot grow the series count. gRPC calls are counted in the same request
families, with the route label ``grpc:`` and the equivalent HTTP route's template and the status
label the HTTP status of the same answer (service/grpc_calls.py). ``version`` is
on the families measured after a request is bound to a model version (codec, queue, compute,
batch), so a rollout can be compared old against new; versions are created only by an admin.
The request families carry it too: the version that answered a scoring request (where a traffic
split, an alias or the request's own version sent it, :class:`ServedVersion`), and ``""`` for
every request that reached none (an unknown model, a refusal, a body refused before routing, a
route that does not score), so a canary's errors and latency can be told from its stable
version's.
The registry also carries prometheus_client's ``process_*`` collector (CPU, memory, fds).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

import lazy as lz

# The buckets span serving latencies, from a cached single row to a 100k-row request.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
ROW_BUCKETS = tuple(float(1 << k) for k in range(0, 18))
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600)
PHASE_BUCKETS = (0.01, 0.025, 0.05, *LOAD_BUCKETS)
#: |Δ| between two versions' answers: 0 (identical) up to a whole probability, by decades.
DIFF_BUCKETS = (0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0)

REJECTION_REASONS = (
    "queue_full",
    "overloaded",
    "deadline",
    "not_ready",
    "not_found",
    "bad_input",
    "too_large",
    "unauthorized",
    "failed_batch",
)


class Metrics:
    """The service's metric families, created on ``registry`` (tests pass a fresh one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kestrel_requests",
            "HTTP requests by model, the version that answered, route template and status code.",
            ("model", "version", "route", "status"),
            registry=r,
        )
        self.request_seconds = Histogram(
            "kestrel_request_duration_seconds",
            "Time from receiving a request to its response, in the server.",
            ("model", "version", "route"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "kestrel_queue_duration_seconds",
            "Time a request's rows waited in the batcher's queue.",
            ("model", "version"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "kestrel_compute_duration_seconds",
            "Time to run one batch through the compiled model.",
            ("model", "version"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.codec_seconds = Histogram(
            "kestrel_codec_duration_seconds",
            "Host time decoding requests into tensors (decode) and rendering responses (encode).",
            ("model", "version", "phase"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "kestrel_batch_rows",
            "Real rows per executed batch.",
            ("model", "version"),
            buckets=ROW_BUCKETS,
            registry=r,
        )
        # Contributions (``explain``) batch apart from predictions: their own batch metrics, so
        # the far costlier explanation batches do not blur the predictions' compute times.
        self.explain_compute_seconds = Histogram(
            "kestrel_explain_compute_duration_seconds",
            "Time to run one batch of contributions (explanations) through the compiled model.",
            ("model", "version"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.explain_batch_rows = Histogram(
            "kestrel_explain_batch_rows",
            "Real rows per executed batch of contributions (explanations).",
            ("model", "version"),
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.rows = Counter(
            "kestrel_batch_rows_processed",
            "Real rows computed.",
            ("model", "version"),
            registry=r,
        )
        self.padded_rows = Counter(
            "kestrel_batch_padded_rows",
            "Rows added to fill a batch to its compiled bucket size.",
            ("model", "version"),
            registry=r,
        )
        self.in_flight = Gauge(
            "kestrel_in_flight_requests",
            "Requests being handled, by kind of route (scoring, management, health, other).",
            ("kind",),
            registry=r,
        )
        self.in_flight_limit = Gauge(
            "kestrel_scoring_in_flight_limit",
            "Scoring requests in progress at once before 429 overloaded (a bound on memory).",
            registry=r,
        )
        self.rejections = Counter(
            "kestrel_rejections",
            "Requests refused, by reason.",
            ("model", "reason"),
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "kestrel_model_load_duration_seconds",
            "Time to load, compile, warm and check a model version.",
            ("result",),
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.model_load_phase_seconds = Histogram(
            "kestrel_model_load_phase_duration_seconds",
            "Time a model version's load spends in each phase (service.versions.LoadPhase).",
            ("phase",),
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.model_loads = Counter(
            "kestrel_model_loads",
            "Model version loads by result (ready, failed).",
            ("result",),
            registry=r,
        )
        # Exported at 0 from the start: Prometheus' increase() cannot see a series' first value,
        # so a "failed" series born at 1 would never fire the failed-load alert.
        for result in ("ready", "failed"):
            self.model_loads.labels(result)
        self.pickle_loads = Counter(
            "kestrel_pickle_loads",
            "Pickle/joblib artifacts unpickled (only with KESTREL_ALLOW_PICKLE and the admin token).",
            registry=r,
        )
        self.model_info = Gauge(
            "kestrel_model_info",
            "1 for every live model version, with its state.",
            ("model", "version", "state", "format"),
            registry=r,
        )
        # Shadow traffic (service/shadow.py): per (model, serving version, shadow version).
        self.shadow_requests = Counter(
            "kestrel_shadow_requests",
            "Live requests mirrored to a shadow version, by result (compared, dropped: too many "
            "in flight, failed: the shadow raised, incomparable: different heads or shapes).",
            ("model", "version", "shadow", "result"),
            registry=r,
        )
        self.shadow_rows = Counter(
            "kestrel_shadow_rows",
            "Rows scored by both a serving version and its shadow.",
            ("model", "version", "shadow"),
            registry=r,
        )
        self.shadow_label_disagreements = Counter(
            "kestrel_shadow_label_disagreements",
            "Rows whose predicted label differs between a serving version and its shadow.",
            ("model", "version", "shadow"),
            registry=r,
        )
        self.shadow_abs_diff = Histogram(
            "kestrel_shadow_max_abs_diff",
            "Per mirrored request, the largest |serving - shadow| of each numeric output.",
            ("model", "version", "shadow", "output"),
            buckets=DIFF_BUCKETS,
            registry=r,
        )
        self.shadow_decisions = Counter(
            "kestrel_shadow_decisions",
            "Shadows ended by their rule, by decision (promote: agreed and made current, "
            "reject: disagreed and no longer mirrored to).",
            ("model", "shadow", "decision"),
            registry=r,
        )
        # Live parity (service/live_parity.py): served answers against the source estimator.
        self.live_parity_samples = Counter(
            "kestrel_live_parity_samples",
            "Sampled requests whose served answers were rescored by the source estimator, by "
            "result (checked, dropped: the worker's queue was full, failed: the source raised).",
            ("model", "version", "result"),
            registry=r,
        )
        self.live_parity_rows = Counter(
            "kestrel_live_parity_rows",
            "Served rows rescored by the source estimator.",
            ("model", "version"),
            registry=r,
        )
        self.live_parity_mismatches = Counter(
            "kestrel_live_parity_mismatched_rows",
            "Served rows whose output differs from the source's (predict: the label; other "
            "outputs: beyond the parity tolerance).",
            ("model", "version", "output"),
            registry=r,
        )
        self.live_parity_abs_diff = Histogram(
            "kestrel_live_parity_max_abs_diff",
            "Per rescored request, the largest |served - source| of each numeric output.",
            ("model", "version", "output"),
            buckets=DIFF_BUCKETS,
            registry=r,
        )
        # Data quality and drift (service/drift.py): sampled rows, per input column.
        self.drift_samples = Counter(
            "kestrel_drift_samples",
            "Sampled requests read for data-quality and drift metrics, by result (observed, "
            "dropped: the worker's queue was full, failed: the rows could not be read).",
            ("model", "version", "result"),
            registry=r,
        )
        self.input_rows = Counter(
            "kestrel_input_rows",
            "Scored rows read for data-quality and drift metrics.",
            ("model", "version"),
            registry=r,
        )
        self.input_missing = Counter(
            "kestrel_input_missing_values",
            "Missing values (None, NaN) of an input column in the rows read.",
            ("model", "version", "column"),
            registry=r,
        )
        self.input_unknown = Counter(
            "kestrel_input_unknown_categories",
            "Values of a categorical input column that are none of the model's categories.",
            ("model", "version", "column"),
            registry=r,
        )
        self.input_out_of_range = Counter(
            "kestrel_input_out_of_range_values",
            "Values of a numeric input column outside the registration sample's range.",
            ("model", "version", "column"),
            registry=r,
        )
        # Payload capture (service/capture.py).
        self.capture_rows = Counter(
            "kestrel_capture_rows",
            "Scored rows captured, by result (written to the store, dropped: over "
            "KESTREL_CAPTURE_MAX_ROWS or a failed write).",
            ("model", "version", "result"),
            registry=r,
        )
        # A caller passing prometheus_client's default registry already has this collector.
        with contextlib.suppress(ValueError):
            ProcessCollector(registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._request_children: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}
        self._in_flight_counts: dict[str, InFlightCount] = {}

    def child(self, family: MetricWrapperBase, *labels: str) -> Any:
        """``family.labels(*labels)``, looked up once: prometheus_client validates the values and
        takes a lock on every ``labels()`` call, and the scoring path needs several
        children per request. Labels are bounded, so is this cache."""
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def observe_request(
        self, model: str, version: str, route: str, status: int, elapsed: float
    ) -> None:
        """Count one answered request and its duration (``version``: the one that answered it,
        ``""`` if none did). The children of both families are looked up once per label set:
        the HTTP middleware and the gRPC calls record every request here."""
        key = (model, version, route, status)
        pair = self._request_children.get(key)
        if pair is None:
            pair = self._request_children[key] = (
                self.requests.labels(model, version, route, str(status)),
                self.request_seconds.labels(model, version, route),
            )
        pair[0].inc()
        pair[1].observe(elapsed)

    def in_flight_count(self, kind: str) -> InFlightCount:
        """The count behind ``kestrel_in_flight_requests{kind}``: the middleware adds and removes
        requests with plain integer arithmetic on the event loop, and the gauge reads it at
        scrape (a Gauge's ``inc``/``dec`` take a lock each, twice per request). The series
        appears with the first request of its kind, as it would with ``inc``."""
        count = self._in_flight_counts.get(kind)
        if count is None:
            count = self._in_flight_counts[kind] = InFlightCount()
            self.in_flight.labels(kind).set_function(count.get)
        return count

    def observe_model_gone(self, model: str, version: str, state: str, fmt: str) -> None:
        with contextlib.suppress(KeyError):
            self.model_info.remove(model, version, state, fmt)

    def add_cache_collector(self, cache: lz.ExecutableCache) -> None:
        """Export the executable cache's plain-data stats (compiles by cause, hits, seconds)."""
        self.registry.register(_CacheCollector(lambda: cache.stats.snapshot()))

    def add_queue_collector(self, queued: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """``kestrel_queue_rows{model}``: rows waiting in each model's batcher, read at scrape."""
        self.registry.register(_QueueCollector(queued))

    def add_model_state_collector(
        self, states: Callable[[], Iterable[str]], known: Iterable[str]
    ) -> None:
        """``kestrel_models{state}``: how many model versions are in each state, now."""
        self.registry.register(_StateCollector(states, tuple(known)))


class ServedVersion:
    """The model version a scoring request reached, for its request metrics' labels.

    Whatever observes a scoring request's metrics (the HTTP middleware, the gRPC calls) sets a
    fresh one in :data:`served_version` for the request's duration; the scoring path records the
    version it resolved (:meth:`service.versions.Versions.serving`: after the traffic split, the
    alias, the request's own version) as it resolves it, so errors after routing (a 422 from the
    version's schema, a failed batch, a deadline) count against it too. ``model`` is that
    version's model: a request naming it ``name@alias`` or by ``?model=`` is counted under it,
    not under the raw name. A holder, not the value: an ASGI layer that runs the application in
    a task of its own gives it a copy of the context, where a value set would be lost, but the
    copy holds the same holder. Both are left ``""`` where no version was reached."""

    __slots__ = ("model", "version")

    def __init__(self) -> None:
        self.model = ""
        self.version = ""


#: The scoring request in progress in this context (None outside one: nothing is recorded).
served_version: contextvars.ContextVar[ServedVersion | None] = contextvars.ContextVar(
    "kestrel_served_version", default=None
)


class InFlightCount:
    """Requests of one kind in progress (``n``), updated by the event loop's thread."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def get(self) -> float:
        return float(self.n)


class _CacheCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, object]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[CounterMetricFamily]:
        s = self._snapshot()
        compiles = CounterMetricFamily(
            "kestrel_compiles",
            "XLA compiles by cause; after_ready is an anomaly (a bucket missed at warm-up).",
            labels=("cause",),
        )
        by_cause = dict(s["compiles"])  # type: ignore[arg-type]
        for cause in lz.CompileCause:
            compiles.add_metric((cause.value,), float(by_cause.get(cause.value, 0)))
        yield compiles
        builds = CounterMetricFamily(
            "kestrel_host_plan_builds",
            "Host plans (numpy code generated from a graph, milliseconds each) built, by cause.",
            labels=("cause",),
        )
        by_cause = dict(s["host_builds"])  # type: ignore[arg-type]
        for cause in lz.CompileCause:
            builds.add_metric((cause.value,), float(by_cause.get(cause.value, 0)))
        yield builds
        seconds = CounterMetricFamily(
            "kestrel_compile_seconds",
            "Seconds spent tracing, lowering, compiling and loading executables from disk.",
            labels=("phase",),
        )
        for phase in ("trace", "lower", "compile", "disk_load"):
            seconds.add_metric((phase,), float(s[f"{phase}_s"]))  # type: ignore[arg-type]
        yield seconds
        lookups = CounterMetricFamily(
            "kestrel_executable_cache_lookups",
            "Executable cache lookups by result.",
            labels=("result",),
        )
        for result in ("hits", "misses", "disk_hits"):
            lookups.add_metric((result,), float(s[result]))  # type: ignore[arg-type]
        yield lookups


class _StateCollector(Collector):
    def __init__(self, states: Callable[[], Iterable[str]], known: tuple[str, ...]) -> None:
        self._states = states
        self._known = known

    def collect(self) -> Iterable[GaugeMetricFamily]:
        counts = dict.fromkeys(self._known, 0)
        for state in self._states():
            counts[state] = counts.get(state, 0) + 1
        family = GaugeMetricFamily("kestrel_models", "Model versions by state.", labels=("state",))
        for state, n in counts.items():
            family.add_metric((state,), float(n))
        yield family


class _QueueCollector(Collector):
    def __init__(self, queued: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._queued = queued

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kestrel_queue_rows", "Rows waiting in the batcher's queue.", labels=("model",)
        )
        for model, rows in self._queued():
            family.add_metric((model,), float(rows))
        yield family
