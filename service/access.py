"""Who may call what: the admin token for management, optionally a token for scoring.

Checked by the middleware on the raw path and headers, before routing and before a byte of the
body is read: an anonymous client can neither learn a route's validation rules (a 422 instead of
a 401) nor which models exist (a 404), nor make the server read a 1 GB upload.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Literal

from service.errors import Forbidden, ServiceError, Unauthorized

AccessKind = Literal["management", "scoring", "public"]
Headers = Iterable[tuple[bytes, bytes]]


def access_kind(path: str) -> AccessKind:
    """Management (``/models…`` and ``/v2/repository…``, except scoring), scoring (native
    predict, v2 infer, v2 model metadata and readiness) or public (probes, metrics, docs)."""
    if path.endswith(("/predict", "/infer")) or path.startswith("/v2/models/"):
        return "scoring"
    if path.startswith(("/models", "/v2/repository")):
        return "management"
    return "public"


def presented_token(headers: Headers) -> str | None:
    """The bearer token of ``Authorization``, else ``X-Kestrel-Token`` (first of each)."""
    fallback = None
    for key, value in headers:
        if key == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
        elif key == b"x-kestrel-token" and fallback is None:
            fallback = value.decode("latin-1")
    return fallback


class Auth:
    """The tokens of this server: ``admin`` for management (none: open), ``scoring`` for
    scoring routes (none: public). The admin token is accepted for scoring too."""

    def __init__(self, admin: str | None, scoring: str | None) -> None:
        self.admin = admin
        self.scoring = scoring
        self._scoring_accepted = [t.encode() for t in (scoring, admin) if t]

    def refusal(self, path: str, headers: Headers) -> ServiceError | None:
        """Why a request for ``path`` with ``headers`` is refused (401 / 403), or None."""
        kind = access_kind(path)
        if kind == "management" and self.admin is not None:
            return _check(headers, [self.admin.encode()], "model management")
        if kind == "scoring" and self.scoring is not None:
            return _check(headers, self._scoring_accepted, "scoring")
        return None

    def is_admin(self, headers: Headers) -> bool:
        """Whether the request presents the admin token (pickle uploads need it)."""
        token = presented_token(headers)
        return bool(
            self.admin and token and hmac.compare_digest(token.encode(), self.admin.encode())
        )


def _check(headers: Headers, accepted: list[bytes], what: str) -> ServiceError | None:
    token = presented_token(headers)
    if token is None:
        return Unauthorized(f"{what} needs a token: send 'Authorization: Bearer <token>'")
    # Compare with every accepted token (no early exit): the time does not tell which matched.
    matches = [hmac.compare_digest(token.encode(), t) for t in accepted]
    return None if any(matches) else Forbidden(f"the token presented is not valid for {what}")
