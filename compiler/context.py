"""The state a conversion threads through converters: builder, options, schema, report, path."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

import lazy as lz

from .errors import UnsupportedError
from .features import Features, Heads
from .options import CompileOptions
from .registry import lookup
from .report import CompileReport, StepReport
from .schema import Column, InputSchema, Vocabulary


class Context:
    def __init__(self, builder: lz.Builder, options: CompileOptions, schema: InputSchema) -> None:
        self.builder = builder
        self.options = options
        self.schema = schema
        self.report = CompileReport()
        self._path: list[str] = []
        self._names: set[str] = set()
        self._step: StepReport | None = None
        self._code_inputs: dict[int, lz.LazyTensor] = {}
        # Raw input columns that tree splits read verbatim, by the precision the source compares
        # them in (see :meth:`tree_decisions_on`).
        self._compared_float64: set[int] = set()
        self._compared_float32: set[int] = set()

    @property
    def dtype(self) -> str:
        return self.options.dtype

    @property
    def path(self) -> str:
        return "/".join(self._path)

    # -- input rounding ------------------------------------------------------------------------
    def tree_decisions_on(self, features: Features, *, float64: bool) -> None:
        """Record that tree splits compare ``features`` (``float64``: the source compares the
        float64 value, as HistGradientBoosting and LightGBM do; else ``float32(x)``, as
        scikit-learn's ``tree_`` and XGBoost do). See :meth:`round_down_columns`."""
        verbatim = {s for s in features.sources if s is not None}
        (self._compared_float64 if float64 else self._compared_float32).update(verbatim)

    def round_down_columns(self) -> frozenset[int]:
        """Raw columns the host should round toward -inf when it narrows them to float32.

        A float32 graph compares ``float32(x) <= t32``, ``t32`` the largest float32 not above
        ``t`` (exact for float32 inputs). For a source comparing the float64 ``x <= t``, rounding
        ``x`` to nearest puts an ``x`` equal to ``t`` — common: thresholds are data values —
        above ``t32`` when it rounds up, on the wrong side; rounding down keeps every ``x <= t``
        on its side and leaves only ``x`` strictly inside ``(t, next float32)`` misjudged.
        Columns also read by float32-comparing splits keep round-to-nearest (what those sources
        do themselves); a float64 graph needs no rounding.
        """
        if self.dtype != "float32":
            return frozenset()
        return frozenset(self._compared_float64 - self._compared_float32)

    # -- converting ----------------------------------------------------------------------------
    def convert(self, estimator: Any, features: Features, name: str) -> Heads:
        """Convert ``estimator`` applied to ``features`` (the one entry point for every step)."""
        check_fitted(estimator)
        self._path.append(name)
        try:
            try:
                registration = lookup(estimator)
            except UnsupportedError:
                if not (self.options.allow_host_steps and hasattr(estimator, "transform")):
                    raise
                return self._host_transform(estimator, features)
            step = StepReport(self.path, type(estimator).__name__, "device")
            outer, self._step = self._step, step
            self.report.steps.append(step)
            try:
                with lz.scope(f"{self.path} ({type(estimator).__name__})"):
                    return registration.converter(estimator, features, self)
            finally:
                self._step = outer
        finally:
            self._path.pop()

    def note(self, detail: str) -> None:
        """Add a detail (e.g. the tree strategy) to the current step's report line."""
        if self._step is not None:
            self._step.detail = "; ".join(filter(None, [self._step.detail, detail]))

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
        return lz.may_be_nan(x.node, self.builder.params)

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
    def _host_transform(self, estimator: Any, features: Features) -> Heads:
        width = _output_width(estimator, features.width)
        dtype = self.dtype
        (out,) = self.builder.host(
            lambda x: np.asarray(estimator.transform(x), dtype=dtype),
            [features.values],
            [((width,), dtype)],
            name=self.path,
        )
        self.report.steps.append(StepReport(self.path, type(estimator).__name__, "host"))
        return Heads({"transform": out})


def check_fitted(estimator: Any) -> None:
    """scikit-learn's fitted check, for estimators. LightGBM / XGBoost Boosters have no ``fit``:
    they exist trained, and their converters check the rest."""
    if hasattr(estimator, "fit"):
        check_is_fitted(estimator)


def _output_width(estimator: Any, width: int) -> int:
    probe = np.zeros((1, width))
    try:
        return int(np.asarray(estimator.transform(probe)).shape[1])
    except Exception as exc:  # the step cannot even run on a probe row
        raise UnsupportedError(
            f"{type(estimator).__name__} cannot run as a host step: {exc}"
        ) from exc
