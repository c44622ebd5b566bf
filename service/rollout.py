"""``kestrel promote NAME VERSION`` and ``kestrel rollback NAME``: move a running service's
traffic between stored versions (``POST /models/{name}/promote`` and ``/rollback``) and say what
serves now."""

from __future__ import annotations

from urllib.parse import quote

import httpx

from service.register import CONNECT_TIMEOUT_S, http_request
from service.terminal import CommandError


def change_current(
    url: str,
    name: str,
    *,
    version: str | None,
    token: str | None,
    actor: str | None,
    timeout: float,
) -> int:
    """Promote ``version`` of ``name`` (None: roll back) at the server at ``url``; print the
    change. Raises :class:`CommandError` for anything the user can fix."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if actor:
        headers["x-kestrel-actor"] = actor
    try:
        client = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
        )
    except httpx.InvalidURL as exc:
        raise CommandError(f"--url {url!r} is not a valid URL: {exc}") from None
    path = f"/models/{quote(name, safe='')}/" + ("rollback" if version is None else "promote")
    with client:
        body = None if version is None else {"version": version}
        doc = http_request(client, "POST", path, json=body).json()
    if doc["previous"] == doc["current"]:
        print(f"model {name!r}: version {doc['current']} serves already; nothing changed")
    else:
        print(f"model {name!r}: version {doc['current']} serves now (was {doc['previous']})")
    return 0
