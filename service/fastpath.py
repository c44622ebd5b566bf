"""Scoring requests straight to their handlers, past FastAPI's per-request routing machinery.

Profiled under load, FastAPI's router (a regex match per route until one fits), its dependency
resolution and its per-request exit stacks cost a single-row score about as much CPU as the
scoring itself, and CPU per request is what sets the requests/s one core answers. The scoring
routes need none of it: their handlers take the request and string path parameters and return a
ready ``Response``.

:class:`ScoringFastPath` sits where the router is, inside FastAPI's middleware stack (so errors
still reach the application's exception handlers exactly as before, and every middleware still
runs). It recognises ``POST`` on the scoring routes' templates by splitting the path, sets the
scope keys routing would set (``route``, ``endpoint``, ``path_params``), and awaits the route's
own endpoint. Anything else, or anything it is not certain the router would send to the same
route, goes to the router unchanged. The routes stay declared in FastAPI, which documents them
and answers the rest (405 on another method, redirects, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["ScoringFastPath", "install"]


@dataclass(frozen=True)
class _FastRoute:
    route: APIRoute
    segments: tuple[str | None, ...]  # path split on "/"; None marks a parameter
    params: tuple[str, ...]

    def match(self, parts: list[str]) -> dict[str, str] | None:
        values = {}
        names = iter(self.params)
        for literal, part in zip(self.segments, parts, strict=True):
            if literal is None:
                if not part:  # Starlette's default convertor needs one character at least
                    return None
                values[next(names)] = part
            elif literal != part:
                return None
        return values


class ScoringFastPath:
    """ASGI app dispatching ``POST`` on the given routes directly; the router gets the rest."""

    def __init__(self, router: ASGIApp, routes: Iterable[_FastRoute]) -> None:
        self.router = router
        # Keyed by (number of segments, last segment): at most a couple of candidates each.
        self._table: dict[tuple[int, str | None], list[_FastRoute]] = {}
        for fast in routes:
            self._table.setdefault((len(fast.segments), fast.segments[-1]), []).append(fast)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Native OpenTelemetry records the route the router selects, and a root_path changes
        # what the router matches: both keep the ordinary path.
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and "fastapi.telemetry" not in scope
        ):
            parts = scope["path"].split("/")
            for fast in self._table.get((len(parts), parts[-1]), ()):
                params = fast.match(parts)
                if params is not None:
                    await self._handle(fast.route, params, scope, receive, send)
                    return
        await self.router(scope, receive, send)

    @staticmethod
    async def _handle(
        route: APIRoute, params: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        path_params = dict(scope.get("path_params", {}))
        path_params.update(params)
        scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, path_params
        response = await route.endpoint(Request(scope, receive, send), **params)
        await response(scope, receive, send)


def install(app: FastAPI, paths: Iterable[str]) -> list[str]:
    """Put a :class:`ScoringFastPath` for the ``POST`` routes at ``paths`` in front of the router.

    A route is taken only if its endpoint is a coroutine function of ``(request, <path
    parameters as str>)`` and no route before it in the router could take a ``POST`` to its
    path (then the router, not this, decides). Returns the templates taken.
    """
    wanted = set(paths)
    routes = app.router.routes
    taken: list[_FastRoute] = []
    for index, route in enumerate(routes):
        if not isinstance(route, APIRoute) or route.path not in wanted:
            continue
        if "POST" not in route.methods:
            continue
        fast = _fast_route(route)
        if fast is None:
            continue
        sample = "/".join(s if s is not None else "x" for s in fast.segments)
        if any(_may_take(earlier, sample) for earlier in routes[:index]):
            continue
        taken.append(fast)
    if taken:
        app.router.middleware_stack = ScoringFastPath(app.router.middleware_stack, taken)
    return [fast.route.path for fast in taken]


def _fast_route(route: APIRoute) -> _FastRoute | None:
    segments: list[str | None] = []
    params: list[str] = []
    for part in route.path.split("/"):
        if part.startswith("{") and part.endswith("}"):
            name = part[1:-1]
            if ":" in name:  # a convertor (int, path, ...): leave it to the router
                return None
            segments.append(None)
            params.append(name)
        elif "{" in part or "}" in part:
            return None
        else:
            segments.append(part)
    if not inspect.iscoroutinefunction(route.endpoint):
        return None
    signature = inspect.signature(route.endpoint)
    names = list(signature.parameters)
    if names != ["request", *params]:
        return None
    return _FastRoute(route, tuple(segments), tuple(params))


def _may_take(route: Any, path: str) -> bool:
    """Whether ``route`` could be the router's choice for ``POST path`` (unknown kinds: yes)."""
    regex = getattr(route, "path_regex", None)
    if regex is None:
        return True
    methods = getattr(route, "methods", None)
    if methods is not None and "POST" not in methods:
        return False
    return regex.match(path) is not None
