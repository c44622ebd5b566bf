"""``kestrel promote NAME VERSION`` and ``kestrel rollback NAME``: move a running service's
traffic between stored versions (``POST /models/{name}/promote`` and ``/rollback``) and say what
serves now."""

from __future__ import annotations

from urllib.parse import quote

from service.register import http_request, service_client


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
    change. Raises :class:`~service.terminal.CommandError` for anything the user can fix."""
    client = service_client(
        url.rstrip("/"), token, timeout, {"x-kestrel-actor": actor} if actor else None
    )
    path = f"/models/{quote(name, safe='')}/" + ("rollback" if version is None else "promote")
    with client:
        body = None if version is None else {"version": version}
        doc = http_request(client, "POST", path, json=body).json()
    if doc["previous"] == doc["current"]:
        print(f"model {name!r}: version {doc['current']} serves already; nothing changed")
    else:
        print(f"model {name!r}: version {doc['current']} serves now (was {doc['previous']})")
    return 0
