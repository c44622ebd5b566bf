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

    @property
    def dtype(self) -> str:
        return self.options.dtype

    @property
    def path(self) -> str:
        return "/".join(self._path)

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
