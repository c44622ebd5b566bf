"""``compile``: a fitted estimator → a :class:`CompiledModel` with the source's methods."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

import lazy as lz
from lazy.nan import nan_reaching_columns

from .context import Context, check_fitted
from .errors import SchemaError, UnsupportedError
from .explain import BIAS, Explanation, attribute, centre, unused_name
from .features import Features, Heads
from .float32_inputs import Float32Inputs, arrives_float32
from .float32_splits import SplitInputs
from .options import METHODS, CompileOptions
from .probes import DecisionPoints
from .replayed_columns import ReplayedInputs
from .report import CompileReport
from .schema import InputSchema, schema_for
from .statistics import ColumnStatistics, Recorded, recorded, resolve

#: A decoded head: an array, or a list of per-output arrays (see :class:`Heads`).
Output = np.ndarray | list[np.ndarray]


@dataclass(frozen=True)
class OutputSpec:
    """What a method returns for ``n`` rows: an array of shape ``(n, *shape)`` and ``dtype``
    (a classifier's ``predict``: its labels'). ``parts``: for a head the source returns as a
    list of per-output arrays (MultiOutputClassifier's ``predict_proba``), their widths;
    ``shape`` is then theirs side by side."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    parts: tuple[int, ...] = ()


@dataclass(frozen=True)
class Traced:
    """A conversion before compilation: the lazy program and what the host needs around it."""

    program: lz.Program
    schema: InputSchema
    classes: np.ndarray | None
    methods: tuple[str, ...]
    report: CompileReport
    #: List-valued heads (see :class:`Heads`): method → the widths of its per-output arrays.
    splits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: The dtype the host sends the input table ``x`` in: float64 where decisions read raw
    #: float64 columns (:func:`compiler.trees.folding.exact_splits`), else the options' dtype.
    input_dtype: str = "float32"
    #: Raw input values where a compiled decision flips (:mod:`compiler.probes`).
    decisions: tuple[DecisionPoints, ...] = ()
    #: The raw columns tree splits read as float32 codes the host encodes (None: none).
    split_inputs: SplitInputs | None = None
    #: What the fitted steps recorded of the raw columns, on their own input lines.
    recorded: tuple[Recorded, ...] = field(default=(), compare=False, repr=False)
    #: With ``CompileOptions.explain``: a program of one output, ``contributions`` (B, R + 1, K)
    #: float64, each input column's contribution to each raw output, then the bias
    #: (:mod:`compiler.explain`).
    explanation: lz.Program | None = field(default=None, compare=False, repr=False)
    #: The computed features the host replays for float32-comparing splits (None: none).
    replayed_inputs: ReplayedInputs | None = None

    @cached_property
    def statistics(self) -> tuple[ColumnStatistics, ...]:
        """What the fitted steps recorded of the raw numeric columns' training values (ranges,
        distributions; :mod:`compiler.statistics`), moved onto the raw line when first asked."""
        return resolve(self.recorded, self.schema.vocabularies.keys())


def trace(estimator: Any, *, sample: Any = None, options: CompileOptions | None = None) -> Traced:
    """Convert ``estimator`` into a lazy program (no compilation)."""
    options = options or CompileOptions()
    check_fitted(estimator)
    ctx, heads = _convert(estimator, sample, options, options.dtype)
    # Traced again while a trace asks for more: float64 input (a step decides on raw float64
    # columns) or a float64 segment (compiler.precision). Each retrace only adds, so it settles.
    # Or where float32 split codes cannot decide a column's thresholds (compiler.float32_splits).
    float64: dict[str, str] = {}
    float64_splits: frozenset[int] = frozenset()
    for _ in range(_MAX_TRACES):
        wanted = ctx.float64_segment()
        # A linear model's explanation reads the client's float64 values (see _explained).
        needs_input = ctx.wants_float64_input or ctx.float64_inputs or _additive(heads, options)
        conflicting = ctx.conflicting_splits()
        if (
            wanted.keys() <= float64.keys()
            and not (needs_input and ctx.raw.dtype != "float64")
            and not conflicting
        ):
            break
        float64.update(wanted)
        float64_splits |= conflicting
        input_dtype = "float64" if needs_input or ctx.raw.dtype == "float64" else options.dtype
        ctx, heads = _convert(estimator, sample, options, input_dtype, float64, float64_splits)
    else:
        raise AssertionError("the trace did not settle on an input dtype and float64 segment")
    builder = ctx.builder
    methods = _methods(estimator, heads, options)
    outputs = {m: heads.outputs[m] for m in methods}
    explanation = None
    if options.explain:
        explanation, ctx.report.contributions = _explained(estimator, heads, ctx, sample)
    program = builder.build(outputs)
    split_inputs = SplitInputs.of(
        {key: thresholds for key, (_, thresholds) in ctx.split_columns.items()}
    )
    replayed = ReplayedInputs(tuple(ctx.replayed_blocks))
    read = program.columns_read("x")
    if read is not None:
        ctx.schema.unread = (
            frozenset(range(len(ctx.schema.columns)))
            - read
            - ctx.schema.vocabularies.keys()
            - {source for source, _ in split_inputs.keys}
            - replayed.sources
        )
    # A converter may vouch that the source accepts NaN where probing cannot ask it
    # (xgboost.Booster predicts only on a DMatrix).
    if not heads.extra.get("accepts_nan"):
        ctx.schema.rejects_nan = _columns_rejecting_nan(estimator, ctx.schema, sample)
    report = ctx.report
    report.methods = methods
    report.graph_nodes = sum(len(g.order) for g in program.graphs)
    report.graph_stages = len(program.graphs)
    report.parameters = sum(int(v.size) for g in program.graphs for v in g.params.values())
    splits = {m: tuple(heads.splits[m]) for m in methods if m in heads.splits}
    dtype = ctx.raw.dtype if ctx.raw is not None else options.dtype
    decisions = tuple(ctx.decisions)
    return Traced(
        program, ctx.schema, heads.classes, methods, report, splits, dtype, decisions,
        split_inputs if split_inputs.keys else None, recorded(ctx.steps), explanation,
        replayed if replayed.blocks else None,
    )  # fmt: skip


def _additive(heads: Heads, options: CompileOptions) -> bool:
    """Whether the options ask for explanations and the model's is a linear model's."""
    explanation = heads.extra.get("explanation")
    return options.explain and isinstance(explanation, Explanation) and explanation.linear


def _explained(
    estimator: Any, heads: Heads, ctx: Context, sample: Any
) -> tuple[lz.Program, dict[str, list[int]]]:
    """The explanation program of the final step's explanation, attributed to the input
    columns, and which features each column sums. An additive model's terms are its features'
    values, which a float32 trace rounds: its explanation is traced again in float64 (from the
    float64 input table, which the prediction trace was made to take), then centred on the
    ``sample`` rows."""
    explanation = heads.extra.get("explanation")
    if not isinstance(explanation, Explanation):
        raise UnsupportedError(
            f"{type(estimator).__name__}: contributions are not supported for this model; "
            "supported: tree ensembles (scikit-learn's trees, forests, gradient boosting, "
            "histogram gradient boosting and isolation forests; LightGBM; XGBoost) and linear "
            "models, alone or at the end of a pipeline"
        )
    if explanation.linear and ctx.options.dtype != "float64":
        assert ctx.raw is not None
        float64 = replace(ctx.options, dtype="float64")
        ctx, heads = _convert(estimator, sample, float64, ctx.raw.dtype)
        explanation = heads.extra["explanation"]
        assert isinstance(explanation, Explanation)

    def param(value: np.ndarray, name: str) -> lz.LazyTensor:
        return ctx.param(value, name, dtype="float64")

    table, summed = attribute(
        explanation, ctx.builder.params, ctx.schema, tuple(ctx.split_columns), param
    )
    if explanation.background:
        shift = centre(_on_background(table, ctx, sample, explanation.where))
        table = table + param(shift, "contribution_centre")
    return ctx.builder.build({"contributions": table}), summed


def _on_background(table: lz.LazyTensor, ctx: Context, sample: Any, where: str) -> np.ndarray:
    """``table`` (a traced (B, R + 1, K) value) on the ``sample`` rows, the background of an
    additive model's contributions."""
    if sample is None or len(sample) == 0:
        raise UnsupportedError(
            f"{where}: a linear model's contributions are measured against background rows "
            "(interventional SHAP: each column's part minus its mean over them): the training "
            "rows where every feature's training mean is recorded (a StandardScaler's or a "
            "mean imputer's output), which this model's features are not; give rows as the "
            "sample (compile's sample=, the sample of a registration)"
        )
    assert ctx.raw is not None  # a traced model always has its input table
    feed, _ = ctx.schema.to_feed(sample, ctx.raw.dtype)
    splits = SplitInputs.of({key: t for key, (_, t) in ctx.split_columns.items()})
    if splits.keys:
        feed.update(splits.encode(feed["x"]))
    if ctx.replayed_blocks:
        replayed = ReplayedInputs(tuple(ctx.replayed_blocks))
        numeric = [c.name for c in ctx.schema.columns if c.kind == "numeric"]
        feed.update(replayed.encode(feed["x"], float32_table=arrives_float32(sample, numeric)))
    program = ctx.builder.build({"contributions": table})
    return np.asarray(lz.run_program(program, feed)["contributions"], np.float64)


_FLOAT32 = np.dtype(np.float32)

#: The largest bucket of an explanation program (larger calls are chunked).
EXPLAIN_ROWS = 128

#: Traces of one model at most: the first, float64 input, a float64 segment, float64 splits,
#: and slack.
_MAX_TRACES = 5


def _convert(
    estimator: Any,
    sample: Any,
    options: CompileOptions,
    input_dtype: str,
    float64: Mapping[str, str] | None = None,
    float64_splits: frozenset[int] = frozenset(),
) -> tuple[Context, Heads]:
    """One conversion of ``estimator`` whose input table arrives as ``input_dtype`` (steps see
    it in their dtype: the options', or float64 in the ``float64`` segment)."""
    schema = schema_for(estimator, sample)
    builder = lz.Builder()
    raw = builder.input("x", (len(schema.columns),), input_dtype)
    ctx = Context(builder, options, schema, raw, float64, float64_splits)
    dtype = ctx.dtype_of(_ROOT)
    x = raw if input_dtype == dtype else lz.cast(raw, dtype)
    heads = ctx.convert(estimator, Features(x, tuple(range(len(schema.columns)))), _ROOT)
    return ctx, heads


#: The path of the estimator being compiled (its steps' paths start with it).
_ROOT = "model"


def declares_float64(program: lz.Program) -> bool:
    """Whether any value of ``program`` is declared float64 (it then needs a backend that keeps
    declared dtypes: the x64 policy)."""
    return any(n.dtype == "float64" for g in program.graphs for n in g.order)


_MAX_NAN_PROBES = 512


def _columns_rejecting_nan(estimator: Any, schema: InputSchema, sample: Any) -> frozenset[int]:
    """Columns where the source raises on NaN, found by probing it one row at a time."""
    probe = _probe_row(estimator, schema, sample)
    if probe is None:
        return frozenset()
    method = next(m for m in ("predict", "transform", "score_samples") if hasattr(estimator, m))
    run = getattr(estimator, method)
    numeric = [
        j for j in range(len(schema.columns)) if j not in schema.vocabularies.keys() | schema.unread
    ]

    def rejects(columns: list[int]) -> bool:
        row = probe.copy()
        for j in columns:
            if hasattr(row, "iloc"):
                row.iloc[0, j] = np.nan
            else:
                row[0, j] = np.nan
        try:
            run(row)
        except Exception:
            return True
        return False

    if not numeric or not rejects(numeric):
        return frozenset()
    if len(numeric) > _MAX_NAN_PROBES:
        return frozenset(numeric)
    return frozenset(j for j in numeric if rejects([j]))


def _probe_row(estimator: Any, schema: InputSchema, sample: Any) -> Any:
    row = None if sample is None else _first_row(sample, schema)
    if row is not None:
        if hasattr(row, "iloc"):
            for j, col in enumerate(schema.columns):  # NaN must fit: make numeric columns float
                if j not in schema.vocabularies and row.dtypes.iloc[j].kind in "iub":
                    row[col.name] = row[col.name].astype(float)
        return row
    if schema.vocabularies:
        return None  # a faithful probe of categorical columns needs a sample of the table
    zeros = np.zeros((1, len(schema.columns)))
    if schema.named:  # fitted on a DataFrame, so pandas is installed
        import pandas as pd

        return pd.DataFrame(zeros, columns=schema.names)
    return zeros


def _first_row(sample: Any, schema: InputSchema) -> Any:
    """The sample's first row as the source takes it; None for a sample without rows (then it is
    no probe). A frame stays a frame; dict rows or columns, and any table of a source fitted on a
    frame, become one; an array keeps numbers as floats and other values (strings) as objects."""
    if hasattr(sample, "iloc"):
        return sample.iloc[:1].copy() if len(sample) else None
    dicts = isinstance(sample, Mapping) or (
        isinstance(sample, Sequence) and len(sample) > 0 and isinstance(sample[0], Mapping)
    )
    if dicts or schema.named:
        import pandas as pd  # a core dependency, as for the frame a named source was fitted on

        if dicts:
            frame = pd.DataFrame(sample)
            if schema.named and all(c in frame.columns for c in schema.names):
                frame = frame[schema.names]
        else:
            rows = _sample_rows(sample, schema)
            if rows.size == 0:
                return None
            frame = pd.DataFrame(rows, columns=schema.names)
        return frame.iloc[:1].infer_objects() if len(frame) else None
    row = _sample_rows(sample, schema)[:1]
    if row.size == 0:
        return None
    try:
        return row.astype(np.float64)
    except (TypeError, ValueError):  # strings: the source takes them as they are
        return row


def _sample_rows(sample: Any, schema: InputSchema) -> np.ndarray:
    """An array-like sample as an object array, checked to be a table of the schema's width."""
    rows = np.asarray(sample, dtype=object)
    if rows.size == 0:
        return rows
    ndim = 1 if schema.vector else 2
    if rows.ndim != ndim or (ndim == 2 and rows.shape[1] != len(schema.columns)):
        raise SchemaError(
            f"the sample must be a table of rows × {len(schema.columns)} columns, got an array "
            f"of shape {rows.shape}"
        )
    return rows


def _replay_sources(traced: Traced) -> tuple[tuple[int, ...], frozenset[int]]:
    """The raw columns the host's replay reads (none without a replay in a float64 table), and
    those of them that neither a graph (prediction or explanation), nor the split codes, nor
    the missing-value check reads."""
    replayed = traced.replayed_inputs
    if replayed is None or traced.input_dtype != "float64":
        return (), frozenset()
    programs = (
        [traced.program] if traced.explanation is None else [traced.program, traced.explanation]
    )
    reads = [p.columns_read("x", optimized=True) for p in programs]
    if any(read is None for read in reads):
        return replayed.source_columns, frozenset()
    others = set(traced.schema.rejects_nan).union(*reads)  # type: ignore[arg-type]
    if traced.split_inputs is not None:
        others |= {source for source, _ in traced.split_inputs.keys}
    return replayed.source_columns, replayed.sources - others


def _methods(estimator: Any, heads: Heads, options: CompileOptions) -> tuple[str, ...]:
    available = tuple(m for m in METHODS if m in heads.outputs and hasattr(estimator, m))
    if options.methods is None:
        return available
    missing = [m for m in options.methods if m not in available]
    if missing:
        raise UnsupportedError(
            f"{type(estimator).__name__} has no compiled {missing}; available: {list(available)}"
        )
    return tuple(options.methods)


def compile(
    estimator: Any, *, sample: Any = None, options: CompileOptions | None = None
) -> CompiledModel:
    """Convert and compile ``estimator``; with ``options.warmup`` every bucket is compiled now."""
    options = options or CompileOptions()
    return CompiledModel(trace(estimator, sample=sample, options=options), options)


class CompiledModel:
    """The compiled twin of a fitted estimator: same methods, same outputs (within float32)."""

    def __init__(self, traced: Traced, options: CompileOptions) -> None:
        self.traced = traced
        self.options = options
        self.schema = traced.schema
        self.report = traced.report
        self.classes_ = traced.classes
        self.methods = traced.methods
        #: Each method's answer, as :meth:`decode` gives it.
        self.output_specs = _output_specs(traced)
        #: Where its answers may change, per raw input column (the parity gate probes these).
        self.decisions = traced.decisions
        self._dtype = np.dtype(traced.input_dtype)
        #: The raw columns the replay reads, which a table arriving column by column hands it
        #: apart (contiguous), and those of them nothing else reads (``x`` holds 0 there).
        self._apart, self._omitted = _replay_sources(traced)
        #: How float32 input is moved to decide as the source does on it (None: as it is).
        # (Decisions on raw columns read them as float64, so such a table is float64. Columns
        # only the replay reads need no move: it computes float32 input as the source does.)
        self._float32 = (
            Float32Inputs.of(d for d in traced.decisions if d.column not in self._omitted)
            if self._dtype == np.float64
            else None
        )
        self._numeric = [c.name for c in self.schema.columns if c.kind == "numeric"]
        self._split_inputs = traced.split_inputs
        self._replayed_inputs = traced.replayed_inputs
        #: The explanation program, compiled on first use (:meth:`_explainer`).
        self._explainer_runner: Callable[[Mapping[str, np.ndarray]], Any] | None = None
        self._decoders = _decoders(traced)
        #: Whether a float32 table runs the program narrowed for it (lazy.narrowing) as it is.
        self._narrows = False
        if options.backend == "interpreter":
            self._runner = lambda feed: lz.run_program(traced.program, feed)
            self._run_one: Callable[[Any, str], np.ndarray] = lambda feed, m: self._runner(feed)[m]
            stages: tuple[Any, ...] = traced.program.stages
        else:
            lazy_options = options.lazy_options(float64=declares_float64(traced.program))
            compiled = lz.compile(
                traced.program,
                lazy_options,
                options.cache,
                warmup=options.warmup,
                plan=options.plan,
                narrow_input="x" if self._reads_float32_as_is() else None,
            )
            self._runner = compiled
            self._run_one = compiled.run_one  # one head: a host plan computes only that head
            self.compiled = compiled
            self._narrows = compiled.narrows is not None
            stages = tuple(compiled.stages)
        #: Heads whose output row is NaN whenever its input row has a NaN the model must refuse:
        #: for these the per-request path looks for NaN in the output, not in the whole input.
        self.nan_checked_on_output = _heads_surfacing_nan(traced, stages)

    def _reads_float32_as_is(self) -> bool:
        """Whether a float32 table could be read as it is, widened only in the graph: a float64
        input table that the host neither moves (:mod:`.float32_inputs`) nor encodes from
        (split codes, the replay), so that only the graph reads it."""
        return (
            self._dtype == np.float64
            and self._float32 is None
            and self._split_inputs is None
            and self._replayed_inputs is None
        )

    @property
    def narrows_float32(self) -> bool:
        """Whether a float32 table runs a program narrowed for it (:func:`lazy.narrowed`)
        rather than the float64 one, where that program's formulation narrows: a path of its
        own to check."""
        return self._narrows

    @property
    def formulations(self) -> tuple[str, ...]:
        """Where its graphs may run: the device lowering and the host plan (``lazy.DEVICE``,
        ``lazy.HOST``), the host alone, or none to choose from (the interpreter)."""
        compiled = getattr(self, "compiled", None)
        return () if compiled is None else compiled.formulations

    @contextlib.contextmanager
    def pinned(self, formulation: str) -> Iterator[None]:
        """Within, its graphs run on ``formulation`` whatever their placement
        (:meth:`lazy.CompiledProgram.pinned`): the parity gate checks each formulation."""
        with self.compiled.pinned(formulation):
            yield

    @property
    def statistics(self) -> tuple[ColumnStatistics, ...]:
        """What its fitted steps recorded of the raw numeric columns' training values (ranges,
        distributions; :mod:`compiler.statistics`)."""
        return self.traced.statistics

    @property
    def plan(self) -> lz.ExecutionPlan | None:
        """Where each bucket runs, once warm-up placed them (None on the interpreter)."""
        compiled = getattr(self, "compiled", None)
        return None if compiled is None else compiled.plan

    @property
    def contribution_columns(self) -> tuple[str, ...]:
        """The columns of :meth:`contributions`: the input columns, then the bias."""
        return (*self.schema.names, unused_name(BIAS, self.schema.names))

    def contributions(self, data: Any) -> np.ndarray:
        """Each row's contribution of every input column to the model's raw output (margin,
        log-odds, regression value; a forest classifier's class probabilities), then the bias:
        (n, R + 1), or (n, R + 1, K) for K raw outputs; each row sums to its raw output
        (:attr:`contribution_columns` names the columns). Needs ``CompileOptions.explain``."""
        feed, _ = self.encode(data)
        out = self.explain_encoded(feed)["contributions"]
        return out[:, :, 0] if out.shape[2] == 1 else out

    @property
    def explains(self) -> bool:
        """Whether :meth:`contributions` can answer (compiled with ``explain``)."""
        return self.traced.explanation is not None

    @property
    def explanation_rows(self) -> int:
        """The most rows one run of the explanation takes without chunking: its largest bucket
        (:data:`EXPLAIN_ROWS`, or ``max_batch`` where that is less)."""
        return min(self.options.max_batch, EXPLAIN_ROWS)

    def explain_encoded(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Device phase of :meth:`contributions` on already-encoded inputs (:meth:`encode`):
        ``{"contributions": (B, R + 1, K)}``, the explanation compiled on first use."""
        return dict(self._explainer()(feed))

    def _explainer(self) -> Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]:
        """The explanation program, compiled on first use: float64, in buckets of at most
        :data:`EXPLAIN_ROWS` rows (the device formulation's per-tree values are (rows, leaves,
        path) arrays: small blocks stay in cache), each placed on the host's native kernel or
        the device by warm-up timing, as any graph's buckets are."""
        if self._explainer_runner is not None:
            return self._explainer_runner
        program = self.traced.explanation
        if program is None:
            raise UnsupportedError(
                "this model was compiled without explanations; compile it with "
                "CompileOptions(explain=True)"
            )
        options = self.options
        if options.backend == "interpreter":
            explainer = lambda feed: lz.run_program(program, feed)  # noqa: E731
        else:
            rows = self.explanation_rows
            # Larger calls run in chunks of the top bucket (the model's call_rows is a multiple
            # of its own max_batch, not necessarily of this one).
            scaled = replace(options, max_batch=rows, call_rows=rows)
            lazy_options = scaled.lazy_options(float64=True)
            # Warm-up places each bucket by timing; unwarmed buckets would run on the backend.
            explainer = lz.compile(program, lazy_options, options.cache, warmup=options.warmup)
        self._explainer_runner = explainer
        return explainer

    def warm_explanation(self) -> None:
        """Compile (or load) and place every bucket of :meth:`contributions` now, largest first,
        each on the host kernel or the device by timing (see ``lazy.CompiledGraph.warmup``), so
        that no call compiles later: what a server does before a version is ready."""
        explainer = self._explainer()
        warmup = getattr(explainer, "warmup", None)
        if warmup is not None:
            warmup()

    def run(self, data: Any) -> dict[str, np.ndarray]:
        """Every compiled head on ``data`` (rows: array, DataFrame, dict rows or columns)."""
        feed, _ = self.encode(data)
        return self.run_encoded(feed)

    # The three phases of ``run``, separate so a server can batch the middle one across requests.
    def encode(self, data: Any) -> tuple[dict[str, np.ndarray], int]:
        """Host phase: ``data`` → the graph's input arrays (rows on axis 0) and the row count."""
        return self._to_feed(data, check_nan=True)

    def _to_feed(self, data: Any, *, check_nan: bool) -> tuple[dict[str, np.ndarray], int]:
        replayed, moves = self._replayed_inputs, self._float32
        wanted = replayed is not None or moves is not None or self._narrows
        float32_table = wanted and arrives_float32(data, self._numeric)
        # A float32 table goes to the program narrowed for it as it is, no float64 copy.
        dtype = _FLOAT32 if float32_table and self._narrows else self._dtype
        feed, rows, apart = self.schema.to_feed_with_columns(
            data, dtype, check_nan=check_nan, columns=self._apart, omitted=self._omitted
        )
        if replayed is not None:  # from the values as sent, before any move
            feed.update(replayed.encode(feed["x"], float32_table=float32_table, apart=apart))
        if moves is not None and float32_table:
            moves.apply(feed["x"], self.schema.names)  # a copy: the dtypes differ
        if self._split_inputs is not None:
            feed.update(self._split_inputs.encode(feed["x"]))
        return feed, rows

    def run_encoded(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Device phase: every compiled head on already-encoded inputs (raw class indices)."""
        return dict(self._runner(feed))

    def decode(self, outputs: Mapping[str, np.ndarray]) -> dict[str, Output]:
        """Host phase: raw heads → the source's outputs (``predict`` as class labels, list-valued
        heads such as MultiOutputClassifier's ``predict_proba`` as lists of arrays)."""
        decoders = self._decoders
        return {
            method: decoders[method](raw) if method in decoders else raw
            for method, raw in outputs.items()
        }

    def _head(self, method: str, data: Any) -> Any:
        # The per-request path of predict & co: encode, run, decode one head, with no
        # intermediate dicts beyond the runner's own.
        if method not in self.methods:
            raise AttributeError(
                f"this model was compiled without {method!r}; it has {list(self.methods)}"
            )
        on_output = method in self.nan_checked_on_output
        feed, _ = self._to_feed(data, check_nan=not on_output)
        raw = self._run_one(feed, method)
        # One pass over the output instead of the input. A NaN there without one in the input
        # (inf - inf inside the model) is no error: the input check finds nothing, the output
        # stands, and the input's own inf - inf in that check's sum is no warning either.
        if on_output and np.isnan(raw).any():
            with np.errstate(invalid="ignore"):
                self.schema.check_missing(feed["x"])  # names the row and column
        decoder = self._decoders.get(method)
        return raw if decoder is None else decoder(raw)

    def predict(self, data: Any) -> np.ndarray:
        return self._head("predict", data)

    def predict_proba(self, data: Any) -> np.ndarray | list[np.ndarray]:
        """As the source: one array, or a list of per-output arrays (MultiOutputClassifier)."""
        return self._head("predict_proba", data)

    def decision_function(self, data: Any) -> np.ndarray:
        return self._head("decision_function", data)

    def transform(self, data: Any) -> np.ndarray:
        return self._head("transform", data)

    def score_samples(self, data: Any) -> np.ndarray:
        return self._head("score_samples", data)

    def outputs(self, data: Any) -> Mapping[str, Output]:
        """Every head as the source's method returns it (see :meth:`decode`)."""
        return self.decode(self.run(data))


def _heads_surfacing_nan(traced: Traced, stages: tuple[Any, ...]) -> frozenset[str]:
    """The methods whose raw output row certainly holds a NaN when its input row has one in a
    column that rejects NaN (``stages``: what the runner runs, so that the analysis sees the
    graph after the lazy passes). Only single-graph programs qualify: a host step may drop NaN."""
    schema = traced.schema
    rejected = schema.rejects_nan - schema.vocabularies.keys()
    if not rejected or len(stages) != 1:
        return frozenset()
    stage = stages[0]
    # A GraphStage's graph, or a CompiledGraph's two: the one its backend runs and the one its
    # host placements run (their VARIANTs resolved differently); a head qualifies on both.
    graphs = [getattr(stage, name, None) for name in ("graph", "host_graph")]
    graphs = [g for g in graphs if isinstance(g, lz.Graph)]
    if not graphs or any("x" not in g.input_names for g in graphs):
        return frozenset()
    reaching = [nan_reaching_columns(g, "x") for g in graphs]
    refs = dict(traced.program.outputs)
    return frozenset(
        method
        for method in traced.methods
        if all(rejected <= r.get(refs.get(method, ""), frozenset()) for r in reaching)
    )


def _output_specs(traced: Traced) -> dict[str, OutputSpec]:
    """The compiled heads' types, through the decoders of :func:`_decoders`: class indices
    become labels, and list-valued heads keep their width, split into parts."""
    types = traced.program.output_types()
    specs = {}
    for method in traced.methods:
        shape, dtype = types[method]
        if method == "predict" and traced.classes is not None:
            dtype = traced.classes.dtype
        row = tuple(int(d) for d in shape[1:])
        specs[method] = OutputSpec(row, np.dtype(dtype), traced.splits.get(method, ()))
    return specs


def _decoders(traced: Traced) -> dict[str, Callable[[np.ndarray], Output]]:
    """Per head that needs one, raw device output → the source's output, bound once."""
    decoders: dict[str, Callable[[np.ndarray], Output]] = {}
    classes = traced.classes
    if classes is not None:
        decoders["predict"] = classes.__getitem__  # class indices → labels
    for method, widths in traced.splits.items():
        cuts = np.cumsum(widths)[:-1]
        decoders[method] = lambda raw, cuts=cuts: np.split(raw, cuts, axis=1)
    return decoders
