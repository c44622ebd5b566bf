"""The converter registry: estimator class → converter.

``@register(StandardScaler, MinMaxScaler, methods=("transform",))`` on a converter function enrolls
those classes; :func:`supported` lists them (documentation and the conformance suite are generated
from it). Lookup is by exact class: a subclass may change behaviour, so it is not assumed to convert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import UnsupportedError
from .precision import Precision

if TYPE_CHECKING:
    from .context import Context
    from .features import Features, Heads

Converter = Callable[[Any, "Features", "Context"], "Heads"]


@dataclass(frozen=True)
class Registration:
    cls: type
    converter: Converter
    methods: tuple[str, ...]
    limits: str
    #: Where its decisions are made exact and in what precision it computes (docs/operators.md).
    exactness: str = ""
    #: Whether (and why) its heads compute in float64 in a float32 graph (docs/operators.md).
    precision: Precision | None = None

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def module(self) -> str:
        return self.cls.__module__.split(".")[0]


_REGISTRY: dict[type, Registration] = {}


def register(
    *classes: type,
    methods: Sequence[str],
    limits: str = "",
    exactness: str = "",
    precision: Precision | str | None = None,
) -> Callable[[Converter], Converter]:
    """Register ``converter`` for ``classes``; ``methods`` are the heads it can produce,
    ``limits`` what it supports, ``exactness`` how its decisions match the source's,
    ``precision`` why its heads need float64 (a reason alone: always, with its inputs)."""
    if isinstance(precision, str):
        precision = Precision(precision)

    def decorate(converter: Converter) -> Converter:
        for cls in classes:
            if cls in _REGISTRY:
                raise ValueError(f"{cls.__name__} is already registered")
            _REGISTRY[cls] = Registration(
                cls, converter, tuple(methods), limits, exactness, precision
            )
        return converter

    return decorate


def _load_builtin() -> None:
    from . import converters  # noqa: F401 - importing registers the built-in converters


def lookup(estimator: Any) -> Registration:
    _load_builtin()
    registration = _REGISTRY.get(type(estimator))
    if registration is None:
        names = ", ".join(r.name for r in supported())
        raise UnsupportedError(f"{type(estimator).__name__} is not supported. Supported: {names}")
    return registration


def supported() -> list[Registration]:
    """Every registered class, sorted by name."""
    _load_builtin()

    return sorted(_REGISTRY.values(), key=lambda r: (r.name, r.cls.__module__))


def unsupported_param(estimator: Any, name: str, value: Any, allowed: str) -> UnsupportedError:
    """The error for a hyper-parameter value a converter does not handle exactly."""
    return UnsupportedError(
        f"{type(estimator).__name__}({name}={value!r}) is not supported; supported: {allowed}"
    )
