"""The built-in converters. Importing this package registers them all."""

from __future__ import annotations

from .. import containers  # noqa: F401
from . import linear, preprocessing  # noqa: F401
