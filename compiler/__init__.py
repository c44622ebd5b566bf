"""scikit-learn / LightGBM / XGBoost objects → lazy graphs (+ host steps).

``compiler.compile(estimator)`` converts a fitted estimator — the whole pipeline, featurizers and
model together — into one lazy program and compiles it; the result has the source's methods.
Converters are registered by class (:func:`register`); :func:`supported` lists them.
"""

from __future__ import annotations

from .errors import CompilerError, SchemaError, UnsupportedError
from .features import Features, Heads
from .kernels import warm_kernels
from .model import CompiledModel, OutputSpec, Traced, compile, trace
from .options import CompileOptions
from .precision import Precision
from .registry import Registration, register, supported
from .report import CompileReport, StepReport
from .schema import Column, InputSchema, Vocabulary, schema_for

__all__ = [
    "Column",
    "CompileOptions",
    "CompileReport",
    "CompiledModel",
    "CompilerError",
    "Features",
    "Heads",
    "InputSchema",
    "OutputSpec",
    "Precision",
    "Registration",
    "SchemaError",
    "StepReport",
    "Traced",
    "UnsupportedError",
    "Vocabulary",
    "compile",
    "register",
    "schema_for",
    "supported",
    "trace",
    "warm_kernels",
]
