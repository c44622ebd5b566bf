"""The scoring systems compared: how each converts a fitted pipeline into a ``predict_proba``
callable from host rows (numpy matrix or DataFrame) to a host numpy array.

A system that cannot convert a pipeline raises :class:`Unsupported` with the converter's reason;
any other exception while converting is the system's error. Third-party libraries are imported
only when their system runs, so the benchmark works with only jax, numpy and scikit-learn.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scoring_pipelines import Pipeline

Predict = Callable[[Any], np.ndarray]


class Unsupported(Exception):
    """The system has no conversion for this pipeline; the message says why."""


@dataclass(frozen=True)
class Context:
    """What every conversion needs besides the model."""

    threads: int
    max_batch: int  # Kestrel's largest compiled bucket (larger calls are chunked)


@dataclass(frozen=True)
class System:
    name: str
    family: str  # systems of one family are not each other's "other system"
    title: str
    requires: tuple[str, ...]  # top-level modules; any missing: the system is not installed
    convert: Callable[[Pipeline, Any, Any, Context], Predict]
    # Imported before conversion is timed: a library's import is not its conversion time.
    preload: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


def _final(est: Any) -> Any:
    return est.steps[-1][1] if hasattr(est, "steps") else est


def _sklearn(pipeline: Pipeline, est: Any, sample: Any, ctx: Context) -> Predict:
    return est.predict_proba


# -- ONNX Runtime ---------------------------------------------------------------------------------
def _onnx_model(pipeline: Pipeline, est: Any, sample: Any) -> Any:
    """skl2onnx for scikit-learn pipelines, onnxmltools for LightGBM / XGBoost."""
    if pipeline.key in ("g", "h"):
        if importlib.util.find_spec("onnxmltools") is None:
            raise Unsupported("onnxmltools (the LightGBM/XGBoost converter) is not installed")
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType

        types = [("X", FloatTensorType([None, sample.shape[1]]))]
        if pipeline.key == "g":
            return onnxmltools.convert_lightgbm(est, initial_types=types, zipmap=False)
        return onnxmltools.convert_xgboost(est, initial_types=types)
    from skl2onnx import to_onnx

    try:
        return to_onnx(est, sample, options={id(_final(est)): {"zipmap": False}})
    except Exception as exc:  # skl2onnx raises plain RuntimeError/TypeError for what it lacks
        raise Unsupported(f"skl2onnx: {_first_line(exc)}") from exc


def _ort(pipeline: Pipeline, est: Any, sample: Any, ctx: Context) -> Predict:
    import onnxruntime as ort

    model = _onnx_model(pipeline, est, sample)
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    outputs = [o.name for o in session.get_outputs()]
    proba = next((n for n in outputs if "prob" in n), outputs[-1])
    inputs = session.get_inputs()
    if not pipeline.frame:
        name = inputs[0].name
        return lambda x: session.run([proba], {name: x})[0]
    # One ONNX input per DataFrame column: the feed is built per call, as a server would.
    kinds = [(i.name, np.float32 if i.type == "tensor(float)" else object) for i in inputs]

    def predict(frame: Any) -> np.ndarray:
        feed = {n: frame[n].to_numpy(dtype=t).reshape(-1, 1) for n, t in kinds}
        return session.run([proba], feed)[0]

    return predict


# -- Hummingbird ----------------------------------------------------------------------------------
def _hummingbird(backend: str) -> Callable[[Pipeline, Any, Any, Context], Predict]:
    def convert(pipeline: Pipeline, est: Any, sample: Any, ctx: Context) -> Predict:
        import hummingbird.ml as hb

        try:
            model = hb.convert(
                est,
                backend,
                sample if backend == "torch.jit" else None,
                extra_config={"n_threads": ctx.threads},
            )
        except Exception as exc:  # MissingConverter, RuntimeError: what it cannot convert
            raise Unsupported(f"Hummingbird: {_first_line(exc)}") from exc
        return model.predict_proba

    return convert


# -- Kestrel --------------------------------------------------------------------------------------
def _kestrel(backend: str) -> Callable[[Pipeline, Any, Any, Context], Predict]:
    def convert(pipeline: Pipeline, est: Any, sample: Any, ctx: Context) -> Predict:
        import compiler

        options = compiler.CompileOptions(
            methods=("predict_proba",),
            backend=backend,
            max_batch=ctx.max_batch,
            threads=ctx.threads,  # a large call's chunks: as many threads as the peers get
        )
        try:
            model = compiler.compile(est, sample=sample, options=options)
        except compiler.UnsupportedError as exc:
            raise Unsupported(f"Kestrel: {_first_line(exc)}") from exc
        return model.predict_proba

    return convert


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "sklearn", "sklearn", "scikit-learn (LightGBM/XGBoost: their own predict)", (), _sklearn
        ),
        System(
            "ort",
            "ort",
            "ONNX Runtime (skl2onnx / onnxmltools models)",
            ("onnxruntime", "skl2onnx"),
            _ort,
            ("onnxruntime", "skl2onnx"),
        ),
        System(
            "hb-torch",
            "hummingbird",
            "Hummingbird, torch backend",
            ("hummingbird", "torch"),
            _hummingbird("torch"),
            ("hummingbird.ml",),
        ),
        System(
            "hb-ts",
            "hummingbird",
            "Hummingbird, TorchScript backend",
            ("hummingbird", "torch"),
            _hummingbird("torch.jit"),
            ("hummingbird.ml",),
        ),
        System(
            "kestrel-jax",
            "kestrel",
            "Kestrel, JAX backend (XLA)",
            ("jax",),
            _kestrel("jax"),
            ("compiler", "lazy.backends.jax_backend"),
        ),
        System(
            "kestrel-torch",
            "kestrel",
            "Kestrel, torch backend (eager)",
            ("torch",),
            _kestrel("torch"),
            ("compiler", "lazy.backends.torch_backend"),
        ),
    )
}
