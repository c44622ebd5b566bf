"""Scoring requests straight to their handlers, past FastAPI's per-request machinery.

Profiled under load, the layers FastAPI puts around every request cost a single-row score about
as much CPU as the scoring itself, and CPU per request is what sets the requests/s one core
answers: the router (a regex match per route until one fits, dependency resolution, exit
stacks), Starlette's ``ExceptionMiddleware`` (a ``Request`` and two closures per request, and a
wrapper around every ``send``), and the layers outside the application's own middleware
(``ServerErrorMiddleware``, FastAPI's telemetry and body-limit layers, each another coroutine
and ``send`` wrapper). The scoring routes need none of it: their handlers take the request and
string path parameters and return a ready ``Response``.

:class:`ScoringFastPath` is the outermost layer of the application's middleware stack. It
recognises ``POST`` on the scoring routes' templates by splitting the path and sends those
requests through a second chain: the application's own middleware (``app.user_middleware``,
instantiated a second time with the same arguments, so request ids, limits, tokens, shedding and
metrics all still apply) around the route's endpoint, whose exceptions go to the application's
exception handlers exactly as Starlette's ``ExceptionMiddleware`` would send them (same lookup:
status handlers for ``HTTPException``, then the exception's MRO). Everything else, and anything
it is not certain the router would send to the same route, goes through the ordinary stack. The
routes stay declared in FastAPI, which documents them and answers the rest (405 on another
method, redirects, ...).

Middleware instantiated twice must keep any state it needs across requests outside the instance
(:class:`service.middleware.ServiceMiddleware` takes its shedding counter as an argument).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.middleware.exceptions import ExceptionMiddleware

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request, Exception], Any]

__all__ = ["ScoringFastPath", "install"]

# The scope key carrying the matched route and its parameters from the dispatcher, through the
# application's middleware, to the endpoint.
_MATCH = "kestrel.fastpath"


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


class _Endpoint:
    """The innermost app of the fast chain: the matched route's endpoint, its exceptions answered
    by the application's handlers as Starlette's ``ExceptionMiddleware`` answers them."""

    def __init__(
        self,
        exception_handlers: dict[type[Exception], Handler],
        status_handlers: dict[int, Handler],
    ) -> None:
        self.exception_handlers = exception_handlers
        self.status_handlers = status_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route, params = scope.pop(_MATCH)
        path_params = dict(scope.get("path_params", {}))
        path_params.update(params)
        scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, path_params
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request, **params)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            if _is_async(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
            if response is None:
                return
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Handler | None:
        handler = None
        if isinstance(exc, HTTPException):
            handler = self.status_handlers.get(exc.status_code)
        if handler is None:
            for cls in type(exc).__mro__:
                handler = self.exception_handlers.get(cls)
                if handler is not None:
                    break
        return handler


class ScoringFastPath:
    """ASGI app sending ``POST`` on the given routes through ``fast`` (the application's own
    middleware around the endpoint); ``app``, the ordinary stack, gets the rest."""

    def __init__(self, app: ASGIApp, fast: ASGIApp, routes: Iterable[_FastRoute]) -> None:
        self.app = app
        self.fast = fast
        # Keyed by (number of segments, last segment): at most a couple of candidates each.
        self._table: dict[tuple[int, str | None], list[_FastRoute]] = {}
        for route in routes:
            self._table.setdefault((len(route.segments), route.segments[-1]), []).append(route)

    @property
    def paths(self) -> list[str]:
        """The route templates dispatched here."""
        return [fast.route.path for routes in self._table.values() for fast in routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Native OpenTelemetry records the route the router selects, a root_path changes what the
        # router matches, and a parent's body limit is enforced by FastAPI's stack: all three
        # keep the ordinary path.
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and "fastapi.telemetry" not in scope
            and MAX_BODY_SIZE_SCOPE_KEY not in scope
        ):
            parts = scope["path"].split("/")
            for fast in self._table.get((len(parts), parts[-1]), ()):
                params = fast.match(parts)
                if params is not None:
                    scope[_MATCH] = (fast.route, params)
                    await self.fast(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def install(app: FastAPI, paths: Iterable[str]) -> list[str]:
    """Put a :class:`ScoringFastPath` for the ``POST`` routes at ``paths`` in front of ``app``'s
    middleware stack, built (as FastAPI builds its stack) on the first request.

    A route is taken only if its endpoint is a coroutine function of ``(request, <path
    parameters as str>)`` and no route before it in the router could take a ``POST`` to its
    path (then the router, not this, decides). An application with a body limit of its own
    (``max_body_size``) keeps its ordinary stack. Returns the templates taken.
    """
    if app.middleware_stack is not None:
        raise RuntimeError("install the scoring fast path before the application starts")
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
    if not taken or getattr(app, "max_body_size", None) is not None:
        return []
    build = app.build_middleware_stack

    def build_with_fast_path() -> ASGIApp:
        # Read when the stack is built, like FastAPI's own: every handler and middleware added
        # after install() counts.
        fast: ASGIApp = _Endpoint(*_exception_handlers(app))
        for cls, args, kwargs in reversed(app.user_middleware):
            fast = cls(fast, *args, **kwargs)
        return ScoringFastPath(build(), fast, taken)

    app.build_middleware_stack = build_with_fast_path  # type: ignore[method-assign]
    return [fast.route.path for fast in taken]


def _exception_handlers(app: FastAPI) -> tuple[dict[type[Exception], Handler], dict[int, Handler]]:
    """The handlers FastAPI gives its ``ExceptionMiddleware`` (those for 500 / ``Exception`` go
    to ``ServerErrorMiddleware``, outside the application's middleware), with that middleware's
    own default for ``HTTPException``."""
    exception_handlers: dict[type[Exception], Handler] = {
        HTTPException: ExceptionMiddleware(app.router, debug=app.debug).http_exception
    }
    status_handlers: dict[int, Handler] = {}
    for key, handler in app.exception_handlers.items():
        if key in (500, Exception):
            continue
        if isinstance(key, int):
            status_handlers[key] = handler
        else:
            exception_handlers[key] = handler
    return exception_handlers, status_handlers


def _is_async(handler: Any) -> bool:
    """Whether calling ``handler`` returns an awaitable (Starlette's test: a coroutine function,
    possibly behind ``functools.partial`` or as an object's ``__call__``)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or (
        callable(handler) and inspect.iscoroutinefunction(handler.__call__)
    )


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
