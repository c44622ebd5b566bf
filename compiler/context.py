"""The state a conversion threads through converters: builder, options, schema, report, path."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

import lazy as lz

from .errors import UnsupportedError
from .features import ColumnMap, Features, Heads
from .float32_splits import INPUT_PREFIX as SPLIT_INPUT_PREFIX
from .float32_splits import Key, SplitInputs
from .options import CompileOptions
from .precision import Request, segment
from .probes import DecisionPoints
from .registry import lookup
from .replayed_columns import INPUT_PREFIX as REPLAY_INPUT_PREFIX
from .report import CompileReport, StepReport
from .schema import Column, InputSchema, Vocabulary


class Context:
    def __init__(
        self,
        builder: lz.Builder,
        options: CompileOptions,
        schema: InputSchema,
        raw: lz.LazyTensor | None = None,
        float64: Mapping[str, str] | None = None,
        float64_splits: frozenset[int] = frozenset(),
    ) -> None:
        self.builder = builder
        self.options = options
        self.schema = schema
        #: The input table as the host sends it (float64 where :meth:`raw_float64` asked for it).
        self.raw = raw
        #: Whether a step asked for float64 input columns that ``raw`` does not hold (the trace
        #: is then made again with a float64 input; see ``compiler.model.trace``).
        self.wants_float64_input = False
        self.report = CompileReport()
        #: Raw input values where a compiled decision flips (:mod:`compiler.probes`).
        self.decisions: list[DecisionPoints] = []
        #: The steps converted (path, fitted estimator, its input features), whose fitted
        #: statistics are read once the trace is done (:mod:`compiler.statistics`).
        self.steps: list[tuple[str, Any, Features]] = []
        self._path: list[str] = []
        self._names: set[str] = set()
        self._step: StepReport | None = None
        self._code_inputs: dict[int, lz.LazyTensor] = {}
        #: The float64 segment of this trace: step path → why (see :mod:`compiler.precision`).
        self._float64 = dict(float64 or {})
        #: What the steps of this trace asked for (:meth:`promote`) and what each step output.
        self.requests: list[Request] = []
        self.outputs: dict[str, tuple[lz.Node, ...]] = {}
        self._inputs: dict[str, lz.Node] = {}
        #: Raw columns whose splits must compare float64 (their thresholds conflict in float32;
        #: see :mod:`compiler.float32_splits`), and the split columns this trace made: key →
        #: (graph input, the thresholds of the splits reading it).
        self._float64_splits = float64_splits
        self.split_columns: dict[Key, tuple[lz.LazyTensor, list[np.ndarray]]] = {}
        #: The computed features the host replays for float32-comparing splits, by block of
        #: maps (:mod:`compiler.replayed_columns`).
        self.replayed_blocks: dict[tuple[ColumnMap, ...], lz.LazyTensor] = {}
        #: What the host guarantees of graph inputs (by name): an imputed column's split codes
        #: carry its fill, never NaN.
        self.input_facts: dict[str, lz.Special] = {}

    @property
    def dtype(self) -> str:
        """The dtype the current step computes in: float64 inside the float64 segment."""
        return self.dtype_of(self.path)

    def dtype_of(self, path: str) -> str:
        return "float64" if path in self._float64 else self.options.dtype

    # -- precision -----------------------------------------------------------------------------
    def promote(self, reason: str, *, inputs: bool = True) -> None:
        """Ask for the current step to compute in float64 in a float32 graph, because its heads
        would miss the tolerance (``reason``, one line, goes into the compile report);
        ``inputs``: the steps feeding it too. It takes effect in the next trace (see
        :func:`compiler.model.trace`): in this one the step is still in :attr:`dtype`."""
        path = self.path
        self.requests.append(Request(path, reason, self._inputs[path], inputs))

    def float64_segment(self) -> dict[str, str]:
        """Path → why, for the steps the requests of this trace put in float64 (none where the
        graph is float64 anyway or promotion is off)."""
        if not self._promotes:
            return {}
        return segment(self.requests, self.outputs)

    @property
    def float64_inputs(self) -> bool:
        """Whether a promoted step must read the input table as the client sent it."""
        return self._promotes and any(r.inputs for r in self.requests)

    @property
    def _promotes(self) -> bool:
        return self.options.promote and self.options.dtype != "float64"

    @property
    def path(self) -> str:
        return "/".join(self._path)

    # -- inputs ------------------------------------------------------------------------------
    def raw_float64(self, columns: list[int]) -> lz.LazyTensor:
        """(B, len(columns)) float64: raw input ``columns`` as the client sent them (decisions
        that must be exact for float64 inputs read these)."""
        raw = self.raw
        if raw is None:
            raise ValueError("this context has no raw input")
        if raw.dtype != "float64":
            self.wants_float64_input = True  # this trace is discarded and made again
        values = Features(raw, tuple(range(int(raw.shape[1])))).select(columns).values
        return values if values.dtype == "float64" else lz.cast(values, "float64")

    def splits_in_float32(self, source: int) -> bool:
        """Whether splits on raw input column ``source`` may read it as float32 split codes: not
        refused (``CompileOptions.split_codes``; None leaves it to the ensemble's cost), in a
        float32 graph, and thresholds on it that float32 codes decided in an earlier trace."""
        options = self.options
        return (
            options.split_codes is not False
            and options.dtype == "float32"
            and source not in self._float64_splits
        )

    def split_column(self, source: int, fill: float | None) -> lz.LazyTensor:
        """(B,) float32: raw input column ``source`` (NaN read as ``fill`` where set) as the
        float32 codes the host encodes for tree splits (:mod:`compiler.float32_splits`), where
        :meth:`splits_in_float32`. Every threshold compared with it must be given to
        :meth:`splits_at`."""
        key = (source, fill)
        if key not in self.split_columns:
            name = f"{SPLIT_INPUT_PREFIX}{len(self.split_columns)}"
            self.split_columns[key] = (self.builder.input(name, (), "float32"), [])
            if fill is not None and not np.isnan(fill):
                self.input_facts[name] = lz.Special(nan=False, inf=True, zero=True)
        if self.raw is not None and self.raw.dtype != "float64":
            self.wants_float64_input = True  # the host encodes from the float64 table
        return self.split_columns[key][0]

    def replayed_block(self, maps: tuple[ColumnMap, ...]) -> lz.LazyTensor:
        """(B, k) float32: column j is ``float32(maps[j](x))`` of its raw column, computed by the
        host as the source computes it (:mod:`compiler.replayed_columns`)."""
        if maps not in self.replayed_blocks:
            name = f"{REPLAY_INPUT_PREFIX}{len(self.replayed_blocks)}"
            self.replayed_blocks[maps] = self.builder.input(name, (len(maps),), "float32")
            if all(m.fill is not None and not np.isnan(m.fill) for m in maps):
                self.input_facts[name] = lz.Special(nan=False, inf=True, zero=True)
        if self.raw is not None and self.raw.dtype != "float64":
            self.wants_float64_input = True  # the host replays from the float64 table
        return self.replayed_blocks[maps]

    def splits_at(self, source: int, fill: float | None, thresholds: np.ndarray) -> None:
        """Record split thresholds (tests ``x <= t``) compared with a :meth:`split_column`."""
        column = self.split_columns.get((source, fill))
        if column is not None:
            column[1].append(np.asarray(thresholds, np.float64))

    def conflicting_splits(self) -> frozenset[int]:
        """The raw columns of this trace's split columns that float32 codes cannot decide."""
        return frozenset(
            source
            for (source, _), (_, thresholds) in self.split_columns.items()
            if SplitInputs.conflicting(thresholds)
        )

    # -- converting ----------------------------------------------------------------------------
    def convert(self, estimator: Any, features: Features, name: str) -> Heads:
        """Convert ``estimator`` applied to ``features`` (the one entry point for every step)."""
        check_fitted(estimator)
        outer = self.path
        self._path.append(name)
        try:
            features = _cast_features(features, self._border(outer, self.path))
            self._inputs[self.path] = features.values.node
            heads = self._convert_step(estimator, features)
            self.steps.append((self.path, estimator, features))
            self.outputs[self.path] = tuple(
                v.node for v in heads.outputs.values() if v.dtype in _FLOATS
            )
            # Values leave the float64 segment (or enter it from a float32 step) here.
            return _cast_heads(heads, self._border(self.path, outer) if outer else None)
        finally:
            self._path.pop()

    def _border(self, source: str, target: str) -> str | None:
        """The dtype values from step ``source`` take on entering step ``target``: None (as they
        are) unless exactly one of the two is in the float64 segment."""
        if (source in self._float64) == (target in self._float64):
            return None
        return self.dtype_of(target)

    def _convert_step(self, estimator: Any, features: Features) -> Heads:
        """:meth:`convert`'s work, with the step's path pushed and its features in its dtype."""
        try:
            registration = lookup(estimator)
        except UnsupportedError:
            if not self._may_host(estimator):
                raise
            reason = f"{type(estimator).__name__} has no converter"
            return self._host_transform(estimator, features, reason)
        step = StepReport(self.path, type(estimator).__name__, "device")
        step.precision = self._float64.get(self.path, "")
        outer, self._step = self._step, step
        first = len(self.report.steps)
        self.report.steps.append(step)
        saved = self._schema_state()
        requests = len(self.requests)
        try:
            with lz.scope(f"{self.path} ({type(estimator).__name__})"):
                precision = registration.precision
                if precision is not None and precision.applies_to(estimator):
                    self.promote(precision.reason, inputs=precision.inputs)
                return registration.converter(estimator, features, self)
        except UnsupportedError as exc:
            # A step the converter refuses (arbitrary Python in a FunctionTransformer, a
            # hyper-parameter it does not handle exactly) runs on the host when allowed; not
            # a container whose child refused (that child already had its chance).
            if not self._may_host(estimator) or len(self.report.steps) > first + 1:
                raise
            reason = str(exc)
        finally:
            self._step = outer
        del self.report.steps[first:]
        del self.requests[requests:]
        self._restore_schema_state(saved)
        return self._host_transform(estimator, features, reason)

    def note(self, detail: str) -> None:
        """Add a detail (e.g. the tree strategy) to the current step's report line."""
        if self._step is not None:
            self._step.detail = "; ".join(filter(None, [self._step.detail, detail]))

    def decides_at(
        self,
        column: int,
        values: np.ndarray,
        kind: str,
        *,
        float32_values: np.ndarray | None = None,
        float32_nan_differs: bool = False,
    ) -> None:
        """Record that the current step's answer may change at these raw float64 ``values`` of
        input column ``column`` (the registration gate probes them), each a test ``x <= t``.
        ``float32_values``: each test's ``t`` for raw values arriving as float32, where the
        source computes on those differently; ``float32_nan_differs``: a missing value arriving
        as float32 is decided otherwise (see :class:`~compiler.probes.DecisionPoints`)."""
        step = self._step
        where = f"{step.path} ({step.estimator})" if step is not None else self.path
        points = DecisionPoints.of(column, values, where, kind, float32_values, float32_nan_differs)
        if points.values.size or points.cuts is not None or float32_nan_differs:
            self.decisions.append(points)

    # -- values --------------------------------------------------------------------------------
    def param(self, value: Any, name: str, dtype: str | None = None) -> lz.LazyTensor:
        """A fitted array as a graph parameter; floats become the graph's dtype."""
        array = np.asarray(value)
        if dtype is not None:
            array = array.astype(dtype)
        elif array.dtype.kind in "fc" or array.dtype.kind == "b":
            array = array.astype(self.dtype)
        elif array.dtype.kind in "iu":
            array = array.astype(np.int32) if np.abs(array).max(initial=0) < 2**31 else array
        full = f"{self.path}.{name}" if self.path else name
        base, i = full, 1
        while full in self._names:
            i += 1
            full = f"{base}#{i}"
        self._names.add(full)
        return self.builder.param(array, full)

    def may_be_nan(self, x: lz.LazyTensor) -> bool:
        """Whether ``x`` may hold a NaN, by what the graph and its parameters so far prove
        (False, e.g., for the output of an imputer or a one-hot encoder)."""
        return lz.may_be_nan(x.node, self.builder.params, self.input_facts)

    def const(self, value: Any, dtype: str | None = None) -> lz.LazyTensor:
        return lz.const(np.asarray(value, dtype=dtype or self.dtype))

    def codes(self, features: Features, j: int, vocabulary: Vocabulary) -> lz.LazyTensor:
        """Int32 codes (B,) of column ``j`` of ``features``, looked up on the host.

        The column must be a raw input column; its vocabulary is registered in the schema.
        """
        source = features.sources[j]
        if source is None:
            raise UnsupportedError(
                f"{self.path}: a categorical encoder needs raw input columns, but its column {j} "
                "is computed by an earlier step"
            )
        known = self.schema.vocabularies.get(source)
        if known is not None and known != vocabulary:
            raise UnsupportedError(
                f"{self.path}: column {self.schema.columns[source].name!r} is encoded by two "
                "encoders with different categories"
            )
        if known is None:
            self.schema.vocabularies[source] = vocabulary
            col = self.schema.columns[source]
            columns = list(self.schema.columns)
            columns[source] = Column(col.name, "categorical")
            self.schema.columns = tuple(columns)
            self._code_inputs[source] = self.builder.input(
                self.schema.code_input(source), (), "int32"
            )
        return self._code_inputs[source]

    # -- host steps ----------------------------------------------------------------------------
    def _may_host(self, estimator: Any) -> bool:
        return self.options.allow_host_steps and hasattr(estimator, "transform")

    def _schema_state(self) -> tuple[Any, ...]:
        schema = self.schema
        state = schema.columns, dict(schema.vocabularies), dict(self._code_inputs)
        return (*state, len(self.decisions), len(self.steps), dict(self.split_columns))

    def _restore_schema_state(self, state: tuple[Any, ...]) -> None:
        """Undo what a refused converter registered (categorical columns and their codes, split
        columns)."""
        self.schema.columns, vocabularies, code_inputs, decisions, steps, split_columns = state
        self.split_columns = split_columns
        del self.decisions[decisions:]
        del self.steps[steps:]
        self.schema.vocabularies.clear()
        self.schema.vocabularies.update(vocabularies)
        self._code_inputs = code_inputs

    def _host_transform(self, estimator: Any, features: Features, reason: str) -> Heads:
        """``estimator.transform`` run by numpy on the host between two compiled segments."""
        name = type(estimator).__name__
        categorical = [
            self.schema.columns[s].name for s in features.sources if s in self.schema.vocabularies
        ]
        if categorical:
            raise UnsupportedError(
                f"{self.path}: {name} cannot run as a host step: it reads categorical columns "
                f"{categorical}, which reach the host only as codes"
            )
        run = _host_function(estimator, features.width)
        width = _output_width(estimator, run, features.width)
        dtype = self.dtype
        path = self.path

        def host(x: np.ndarray) -> np.ndarray:
            out = run(x)
            if out.shape[1] != width:
                raise ValueError(
                    f"host step {path} ({name}) returned {out.shape[1]} columns; it returned "
                    f"{width} when compiled"
                )
            return out.astype(dtype, copy=False)

        (out,) = self.builder.host(host, [features.values], [((width,), dtype)], name=path)
        self.report.steps.append(StepReport(path, name, "host", f"host step: {reason}"))
        return Heads({"transform": out})


def check_fitted(estimator: Any) -> None:
    """scikit-learn's fitted check, for estimators. LightGBM / XGBoost Boosters have no ``fit``:
    they exist trained, and their converters check the rest."""
    if hasattr(estimator, "fit"):
        check_is_fitted(estimator)


def _host_function(estimator: Any, width: int) -> Any:
    """``x`` (a numpy batch) → ``estimator.transform`` of it as a 2-D numeric numpy array, given
    float64 (what scikit-learn computes in) and, for a step fitted on a DataFrame, as a frame
    with the fitted column names (a function may select columns by name)."""
    names = getattr(estimator, "feature_names_in_", None)
    columns = list(names) if names is not None and len(names) == width else None

    def run(x: np.ndarray) -> np.ndarray:
        data: Any = np.asarray(x, dtype=np.float64)
        if columns is not None:
            import pandas as pd  # a core dependency; imported only for host steps

            data = pd.DataFrame(data, columns=columns)
        out = estimator.transform(data)
        if hasattr(out, "toarray"):  # a sparse matrix
            out = out.toarray()
        out = np.asarray(out)
        if out.ndim != 2 or out.dtype.kind not in "fiub":
            raise ValueError(
                f"transform returned a {out.ndim}-D {out.dtype} array, not a 2-D numeric table"
            )
        return out

    return run


def _output_width(estimator: Any, run: Any, width: int) -> int:
    """The number of columns ``run`` returns, found by running it on probe rows."""
    errors = []
    for value in (0.0, 1.0):
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return int(run(np.full((2, width), value)).shape[1])
        except Exception as exc:  # the step cannot run on this probe
            errors.append(exc)
    raise UnsupportedError(
        f"{type(estimator).__name__} cannot run as a host step: {errors[-1]}"
    ) from errors[-1]


_FLOATS = ("float32", "float64")


def _cast_features(features: Features, dtype: str | None) -> Features:
    """``features`` with float values in ``dtype`` (None: as they are)."""
    values = features.values
    if dtype is None or values.dtype == dtype or values.dtype not in _FLOATS:
        return features
    return dataclasses.replace(features, values=lz.cast(values, dtype))


def _cast_heads(heads: Heads, dtype: str | None) -> Heads:
    """``heads`` with float outputs in ``dtype`` (None: as they are); indices stay integers."""
    if dtype is None:
        return heads
    outputs = {
        method: lz.cast(v, dtype) if v.dtype in _FLOATS and v.dtype != dtype else v
        for method, v in heads.outputs.items()
    }
    return dataclasses.replace(heads, outputs=outputs)
