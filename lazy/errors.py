"""Exceptions raised by the lazy layer.

Every error names what went wrong in terms the caller can act on: the op, the shapes involved and,
where known, the pipeline step (scope) and source line that built the offending value.
"""

from __future__ import annotations


class LazyError(Exception):
    """Base class of every error the lazy layer raises."""


class ShapeError(LazyError, ValueError):
    """Operands whose shapes or dtypes an op does not accept."""


class RowMixingError(ShapeError):
    """An op that would combine values of different rows of the batch.

    Graphs must treat rows independently: that is what makes padding a batch (and splitting a large
    one) safe by construction.
    """


class ConcretizationError(LazyError, TypeError):
    """A lazy value was used where a concrete Python or numpy value is required."""


class GraphError(LazyError, ValueError):
    """A malformed graph or program: missing inputs, unbound parameters, duplicate names."""


class InputError(LazyError, ValueError):
    """Arguments passed to a compiled graph that do not match its input signature."""


class BackendError(LazyError, RuntimeError):
    """A backend that is unavailable or cannot run a graph under the requested options."""
