"""Safe loading of uploaded model files: the service's upload trust boundary.

Accepted formats (:data:`FORMATS`): skops archives loaded against a server-owned allow-list of
types, LightGBM model text, XGBoost JSON / UBJSON models — and pickle / joblib only when the
operator enables it. Everything an upload declares is checked before a parser allocates or
follows it: sizes against :class:`ArtifactLimits`, and for the native boosters the whole model
structure, since LightGBM's and XGBoost's own loaders crash the process on crafted files. The
loaded object must be something the compiler accepts.

Pure library code: every refusal is an :class:`ArtifactError` naming the problem, which the HTTP
layer maps to a 4xx (too large → 413, pickle refused → 403, the rest → 422).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import compiler

from . import lightgbm_text, skops_archive, skops_trust, xgboost_model
from .limits import (
    ArtifactError,
    ArtifactLimits,
    ArtifactTooLargeError,
    PickleNotAllowedError,
    UntrustedTypeError,
    too_large,
)
from .skops_trust import trusted_types

__all__ = [
    "DEFAULT_LIMITS",
    "FORMATS",
    "ArtifactError",
    "ArtifactLimits",
    "ArtifactTooLargeError",
    "LoadedArtifact",
    "PickleNotAllowedError",
    "UntrustedTypeError",
    "detect_format",
    "load_artifact",
    "trusted_types",
]

log = logging.getLogger(__name__)

FORMATS = ("skops", "lightgbm", "xgboost-json", "xgboost-ubj", "pickle")
DEFAULT_LIMITS = ArtifactLimits()

_EXTENSIONS = {
    ".skops": "skops",
    ".txt": "lightgbm",
    ".lgb": "lightgbm",
    ".json": "xgboost-json",
    ".ubj": "xgboost-ubj",
    ".pkl": "pickle",
    ".pickle": "pickle",
    ".joblib": "pickle",
}
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header, or an empty archive
_UBJ_KEY_MARKERS = b"iUIlL$#}"  # what may follow "{" in UBJSON (never in JSON text)
_SHOWN_SUPPORTED = 12  # names listed in an "unsupported model type" message


@dataclass
class LoadedArtifact:
    """A loaded estimator, the format it came in, and the library versions that loaded it."""

    estimator: Any
    format: str
    framework: dict[str, str]


def detect_format(filename: str, data: bytes) -> str:
    """The upload's format: by content first, the filename extension as a fallback hint."""
    by_content = _format_from_content(data)
    if by_content is not None:
        return by_content
    by_name = _EXTENSIONS.get(PurePosixPath(filename).suffix.lower()) if filename else None
    if by_name is not None:
        return by_name
    raise ArtifactError(
        f"unrecognized model file {filename or '(unnamed)'!r}: accepted formats are "
        f"{', '.join(FORMATS)} (extensions {', '.join(_EXTENSIONS)})"
    )


def _format_from_content(data: bytes) -> str | None:
    if data[:4] in _ZIP_MAGIC:
        return "skops"
    if data.startswith((b"tree\n", b"tree\r\n")) and b"\nversion=v" in data[:256]:
        return "lightgbm"
    if data[:1] == b"{" and data[1:2] and data[1] in _UBJ_KEY_MARKERS:
        return "xgboost-ubj"
    text = data.lstrip(b" \t\r\n\xef\xbb\xbf")  # whitespace, UTF-8 byte-order mark
    if text[:1] == b"{" and b'"learner"' in text:
        return "xgboost-json"
    if data[:1] == b"\x80" and data[1:2] and 2 <= data[1] <= 5:  # pickle protocol 2-5 header
        return "pickle"
    return None


def load_artifact(
    data: bytes,
    *,
    filename: str = "",
    format: str | None = None,
    allow_pickle: bool = False,
    limits: ArtifactLimits = DEFAULT_LIMITS,
    host_step_modules: Sequence[str] = (),
) -> LoadedArtifact:
    """Load an uploaded model file, refusing anything unsafe with an :class:`ArtifactError`.

    ``format`` (one of :data:`FORMATS`) overrides detection. Pickle / joblib files are loaded
    only with ``allow_pickle=True`` — they can run arbitrary code — and are otherwise refused
    without being unpickled. ``host_step_modules``: modules the operator trusts, whose functions
    and classes a skops file may reference (they run as host steps; see
    :func:`skops_trust.host_step_types`).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ArtifactError(f"model file must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ArtifactError("empty model file")
    if len(data) > limits.max_uncompressed_bytes:
        raise too_large(
            "model file size", len(data), limits.max_uncompressed_bytes, "max_uncompressed_bytes"
        )
    if format is None:
        format = detect_format(filename, data)
    elif format not in FORMATS:
        raise ArtifactError(f"unknown model format {format!r}; accepted: {', '.join(FORMATS)}")
    if format == "pickle" and not allow_pickle:
        raise PickleNotAllowedError(
            "pickle / joblib model files are disabled on this server (they can run arbitrary "
            "code); upload skops, LightGBM text or XGBoost JSON / UBJSON instead"
        )
    if format == "skops":
        estimator = _load_skops(data, limits, host_step_modules)
    else:
        estimator = _LOADERS[format](data, limits)
    _check_supported(estimator)
    return LoadedArtifact(estimator, format, _framework_versions(estimator, format))


def _load_skops(data: bytes, limits: ArtifactLimits, host_step_modules: Sequence[str] = ()) -> Any:
    import skops.io as sio
    from skops.io.exceptions import UntrustedTypesFoundException

    skops_archive.check_archive(data, limits)
    trusted = trusted_types()
    try:
        untrusted = sorted(set(sio.get_untrusted_types(data=data)) - set(trusted))
    except Exception as exc:  # skops parses the schema: any failure means a corrupt file
        raise ArtifactError(f"invalid skops file: {type(exc).__name__}: {exc}") from None
    if untrusted and host_step_modules:
        operator_trusted = skops_trust.host_step_types(untrusted, host_step_modules)
        trusted = [*trusted, *operator_trusted]
        untrusted = [t for t in untrusted if t not in operator_trusted]
    if untrusted:
        notes = skops_trust.refusal_notes(untrusted, host_step_modules)
        raise UntrustedTypeError(untrusted, notes)
    try:
        estimator = sio.loads(data, trusted=trusted)
    except UntrustedTypesFoundException as exc:
        raise UntrustedTypeError([str(exc)]) from None
    except Exception as exc:  # constructing the objects failed: corrupt or inconsistent state
        raise ArtifactError(f"invalid skops file: {type(exc).__name__}: {exc}") from None
    skops_trust.check_loaded(estimator)
    return estimator


def _load_lightgbm(data: bytes, limits: ArtifactLimits) -> Any:
    lightgbm = _import("lightgbm", "LightGBM")
    text = lightgbm_text.check_model_text(data, limits)
    try:
        return lightgbm.Booster(model_str=text)
    except Exception as exc:  # LightGBMError and the package's own ValueErrors
        raise ArtifactError(f"LightGBM cannot load the model: {_first_line(exc)}") from None


def _load_xgboost(data: bytes, limits: ArtifactLimits, *, ubj: bool) -> Any:
    xgboost = _import("xgboost", "XGBoost")
    doc = xgboost_model.parse_ubj(data) if ubj else xgboost_model.parse_json(data)
    xgboost_model.check_model(doc, limits)
    booster = xgboost.Booster()
    try:
        booster.load_model(bytearray(data))
    except Exception as exc:  # XGBoostError
        raise ArtifactError(f"XGBoost cannot load the model: {_first_line(exc)}") from None
    return booster


def _load_pickle(data: bytes, limits: ArtifactLimits) -> Any:
    import joblib

    log.warning(
        "unpickling a model file (sha256=%s, %d bytes): pickle can run arbitrary code",
        hashlib.sha256(data).hexdigest(),
        len(data),
    )
    try:
        return joblib.load(io.BytesIO(data))
    except Exception as exc:
        raise ArtifactError(
            f"cannot unpickle the model file: {type(exc).__name__}: {exc}"
        ) from None


_LOADERS: dict[str, Callable[[bytes, ArtifactLimits], Any]] = {
    "skops": _load_skops,
    "lightgbm": _load_lightgbm,
    "xgboost-json": lambda data, limits: _load_xgboost(data, limits, ubj=False),
    "xgboost-ubj": lambda data, limits: _load_xgboost(data, limits, ubj=True),
    "pickle": _load_pickle,
}


def _import(module: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ArtifactError(
            f"{name} models need the '{module}' package, which is not installed on this server"
        ) from None


def _first_line(exc: BaseException) -> str:
    # XGBoost appends a native stack trace after the first line.
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _check_supported(estimator: Any) -> None:
    """The top-level object must be a class the compiler registers (containers included)."""
    supported = compiler.supported()
    if any(type(estimator) is registration.cls for registration in supported):
        return
    names = sorted({registration.name for registration in supported})
    shown = ", ".join(names[:_SHOWN_SUPPORTED])
    more = f", … ({len(names) - _SHOWN_SUPPORTED} more)" if len(names) > _SHOWN_SUPPORTED else ""
    raise ArtifactError(
        f"unsupported model type {type(estimator).__module__}.{type(estimator).__qualname__}; "
        f"supported: {shown}{more}"
    )


def _framework_versions(estimator: Any, format: str) -> dict[str, str]:
    """Versions of the libraries that loaded the model (and that the model's classes come from),
    recorded in the model's metadata."""
    packages = {"sklearn": "scikit-learn", "numpy": "numpy"}
    packages.update({"skops": "skops"} if format == "skops" else {})
    packages.update({"joblib": "joblib"} if format == "pickle" else {})
    roots = {type(obj).__module__.split(".")[0] for obj in skops_trust.iter_objects(estimator)}
    for root in ("lightgbm", "xgboost"):
        if root in roots:
            packages[root] = root
    versions = {}
    for key, distribution in packages.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions
