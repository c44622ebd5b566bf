"""Service errors: each carries its HTTP status and a stable machine-readable code.

Handlers raise these (or library errors mapped by :func:`http_error_for`); the app renders them
as ``{"error": {"code", "message"}}`` with the request id, so a client always learns what was
wrong and where.
"""

from __future__ import annotations

from typing import Any

import compiler


class ServiceError(Exception):
    status: int = 500
    code: str = "internal"
    reason: str | None = None  # the rejection reason counted in metrics, if any

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def body(self, request_id: str | None = None) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if request_id:
            error["request_id"] = request_id
        return {"error": error}

    def document(self, path: str, request_id: str | None = None) -> dict[str, Any]:
        """The body for a request to ``path``: v2 routes answer in the protocol's own shape,
        ``{"error": "<message>"}``; every other route with :meth:`body`."""
        if path.startswith("/v2"):
            return {"error": self.message}
        return self.body(request_id)


class BadRequest(ServiceError):
    status, code, reason = 400, "bad_request", "bad_input"


class InvalidInput(ServiceError):
    """Well-formed request whose rows don't fit the model's schema."""

    status, code, reason = 422, "invalid_input", "bad_input"


class Unauthorized(ServiceError):
    status, code, reason = 401, "unauthorized", "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    status, code, reason = 403, "forbidden", "unauthorized"


class NotFound(ServiceError):
    status, code, reason = 404, "not_found", "not_found"


class Conflict(ServiceError):
    status, code = 409, "conflict"


class VersionFailed(ServiceError):
    """Scoring a version that FAILED: unlike 503, retrying the request cannot help."""

    status, code, reason = 409, "version_failed", "not_ready"


class VersionRetired(ServiceError):
    """Scoring, by number, a version a newer one replaced: stored, not loaded; retrying cannot
    help (score the current version, or make this one current again)."""

    status, code, reason = 409, "version_retired", "not_ready"


class PayloadTooLarge(ServiceError):
    status, code, reason = 413, "payload_too_large", "too_large"


class UnsupportedMediaType(ServiceError):
    status, code, reason = 415, "unsupported_media_type", "bad_input"


class ModelRejected(ServiceError):
    """An upload that can't become a model: unsupported, untrusted, or failing parity."""

    status, code = 422, "model_rejected"


class TooManyRequests(ServiceError):
    status, code, reason = 429, "queue_full", "queue_full"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after_s)))})


class NotReady(ServiceError):
    status, code, reason = 503, "not_ready", "not_ready"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after_s)))})


class DeadlineExceeded(ServiceError):
    status, code, reason = 504, "deadline_exceeded", "deadline"


class BatchFailed(ServiceError):
    status, code, reason = 500, "batch_failed", "failed_batch"


def http_error_for(exc: BaseException) -> ServiceError | None:
    """The service error for a library exception, or None when it is a bug (→ 500)."""
    from service import artifacts, batcher, parity, store

    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, compiler.SchemaError):
        return InvalidInput(str(exc))
    if isinstance(exc, batcher.RequestTooLargeError):  # retrying can never help: not a 429
        return PayloadTooLarge(str(exc))
    if isinstance(exc, batcher.QueueFullError):
        return TooManyRequests(str(exc), exc.retry_after_s)
    if isinstance(exc, batcher.DeadlineExceededError):
        return DeadlineExceeded(str(exc) or "the request's deadline passed before it was computed")
    if isinstance(exc, batcher.BatcherClosedError):
        return NotReady(str(exc) or "the model version is shutting down")
    if isinstance(exc, artifacts.ArtifactTooLargeError):
        return PayloadTooLarge(str(exc))
    if isinstance(exc, artifacts.PickleNotAllowedError):
        return Forbidden(str(exc))
    if isinstance(exc, artifacts.ArtifactError):
        return ModelRejected(str(exc))
    if isinstance(exc, parity.ParityError):
        return ModelRejected(str(exc))
    if isinstance(exc, compiler.UnsupportedError):
        return ModelRejected(str(exc))
    if isinstance(exc, store.ModelNotFound):
        return NotFound(str(exc))
    if isinstance(exc, store.NoPreviousVersion | store.VersionConflict):
        return Conflict(str(exc))
    if isinstance(exc, store.InvalidName):
        return BadRequest(str(exc))
    return None


def some_of(names: list[str], limit: int = 20) -> str:
    """``names`` for a message: the first ``limit`` of them, and how many more."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"
