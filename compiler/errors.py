"""Errors the compiler raises."""

from __future__ import annotations


class CompilerError(Exception):
    """Base class of the compiler's errors."""


class UnsupportedError(CompilerError, ValueError):
    """An estimator class or hyper-parameter the compiler cannot convert exactly."""


class SchemaError(CompilerError, ValueError):
    """Input rows that do not match the model's input schema (missing column, bad value)."""
