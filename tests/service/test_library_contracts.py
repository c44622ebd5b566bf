"""The library internals two mechanisms build on (docs/architecture.md; bench/internals.py
measures what each buys). An upgrade of Starlette or uvicorn that moves any of them fails here
by name, before the behaviour tests (test_fastpath.py, test_shedding.py) fail obscurely; the
pins in pyproject.toml say which releases these were checked on."""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import httptools
import starlette
from fastapi import FastAPI
from packaging.version import Version
from starlette.middleware import Middleware
from starlette.middleware.exceptions import ExceptionMiddleware
from uvicorn.protocols.http import httptools_impl


def _pinned(package: str) -> tuple[Version, Version]:
    """The [low, high) range pyproject.toml allows for ``package``."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith(f"{package}>="))
    low, high = spec.removeprefix(f"{package}>=").split(",<")
    return Version(low), Version(high)


def test_the_installed_releases_are_the_pinned_ones() -> None:
    for package in ("starlette", "uvicorn"):
        low, high = _pinned(package)
        installed = Version(version(package))
        assert low <= installed < high, f"{package} {installed} is outside its pin [{low}, {high})"


def test_starlette_internals_of_the_scoring_fast_path() -> None:
    app = FastAPI()
    # service/fastpath.py wraps build_middleware_stack and rebuilds user_middleware's chain.
    assert callable(app.build_middleware_stack) and app.middleware_stack is None
    app.add_middleware(ExceptionMiddleware)
    (entry,) = app.user_middleware
    assert isinstance(entry, Middleware)
    cls, args, kwargs = entry  # unpacked as (cls, args, kwargs) when the chain is rebuilt
    assert cls is ExceptionMiddleware and args == () and kwargs == {}
    # The default HTTPException handler is ExceptionMiddleware's own bound method.
    assert callable(ExceptionMiddleware(app.router).http_exception)
    assert hasattr(app, "exception_handlers") and isinstance(app.exception_handlers, dict)
    from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY

    assert isinstance(MAX_BODY_SIZE_SCOPE_KEY, str), starlette.__version__


def test_uvicorn_internals_of_shedding_on_the_headers() -> None:
    protocol = httptools_impl.HttpToolsProtocol
    for hook in ("on_headers_complete", "on_body", "on_message_complete"):
        assert callable(getattr(protocol, hook, None)), f"HttpToolsProtocol.{hook} is gone"
    # Attributes set per connection or per request that service/shedding.py reads.
    source = inspect.getsource(protocol)
    for attribute in (
        "self.parser",
        "self.url",
        "self.headers",
        "self.cycle",
        "self.root_path",
        "self.expect_100_continue",
        "self.server_state",
        "self.transport",
    ):
        assert attribute in source, f"HttpToolsProtocol no longer sets {attribute}"
    assert httptools_impl.STATUS_LINE[429].startswith(b"HTTP/1.1 429")
    assert callable(httptools.parse_url)
