"""Backends lower a verified graph to something that runs: JAX (XLA, the production path), torch
(a second lowering of the same graph) and numpy (straight-line host code for buckets of a few
rows, where a device call's fixed cost dominates). Each is an Op → rule table, like the
interpreter.

Backend modules are imported on first use, so ``lazy`` works without torch installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Backend, CompileTimes, Executable

_MODULES = {
    "jax": "lazy.backends.jax_backend",
    "torch": "lazy.backends.torch_backend",
    "numpy": "lazy.backends.numpy_backend",
}


def get_backend(name: str = "jax", **options: Any) -> Backend:
    """A backend by name (``"jax"``, ``"torch"`` or ``"numpy"``); options go to its constructor."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(_MODULES)}")
    module = importlib.import_module(_MODULES[name])
    return module.BACKEND_CLASS(**options)


__all__ = ["Backend", "CompileTimes", "Executable", "get_backend"]
