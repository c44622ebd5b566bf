"""The token matrix, on real servers: every route of the app, without, with a wrong and with the
right token, in both scoring configurations (public, and ``KESTREL_SCORING_TOKEN`` set).

Routes are read from the application itself, so a new route is enrolled automatically: it is a
management route (``/models…``, ``/v2/repository…``: admin token), a scoring route (native
predict, v2 infer, metadata and readiness: public unless a scoring token is set) or one of the
few public ones listed here; a route in none of these fails the test until it is classified.
Names in the paths are of models that do not exist: the token check must come before the lookup,
or a 404 would tell an anonymous client which models exist.
"""

from __future__ import annotations

import ast
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.routing import Mount, Route

from service.access import access_kind
from service.app import create_app
from service.settings import Settings
from tests.service.live import ADMIN_TOKEN, ROOT, LiveServer

SCORING_TOKEN = "test-scoring-token"
WRONG = "not-the-token"
# The routes anyone may call whatever the configuration: probes, metrics, server metadata, docs.
PUBLIC = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/docs/static/{path}",
}
ABSENT = {"name": "absent-model", "version": "7", "path": "absent-file.js", "alias": "beta"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    template: str

    @property
    def path(self) -> str:
        return self.template.format(**ABSENT)

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


def endpoints(tmp: Path) -> dict[str, list[Endpoint]]:
    """Every (method, route) of the app by kind: management, scoring, public."""
    app = create_app(Settings(store_url=str(tmp / "store"), cache_dir=None))
    kinds: dict[str, list[Endpoint]] = {"management": [], "scoring": [], "public": []}
    unclassified = []
    for route in app.routes:
        if isinstance(route, Mount):  # static files (the docs' assets): read with GET
            methods, template = {"GET"}, route.path_format
        else:
            assert isinstance(route, Route), route
            methods, template = route.methods or set(), route.path
        for method in sorted(methods - {"HEAD"}):
            endpoint = Endpoint(method, template)
            kind = access_kind(template)
            if kind != "public" or template in PUBLIC:
                kinds[kind].append(endpoint)
            else:
                unclassified.append(endpoint)
    assert not unclassified, f"classify these routes in test_auth.py: {unclassified}"
    return kinds


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Endpoint]]:
    kinds = endpoints(tmp_path_factory.mktemp("routes"))
    # The app as documented today; more routes are fine, fewer means the listing broke.
    assert len(kinds["management"]) >= 9 and len(kinds["scoring"]) >= 9, kinds
    return kinds


@pytest.fixture(scope="module")
def public_scoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("auth-public")).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def guarded_scoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("auth-guarded"), KESTREL_SCORING_TOKEN=SCORING_TOKEN
    ).start()
    yield live
    live.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(live: LiveServer, endpoint: Endpoint, headers: dict[str, str]) -> httpx.Response:
    """The bare request: no body, no query. Auth must answer before any validation does."""
    return live.client.request(endpoint.method, endpoint.path, headers=headers)


def expect_denied(
    live: LiveServer, endpoints: list[Endpoint], wrong_tokens: list[str]
) -> list[str]:
    """Problems with ``endpoints`` refusing no token (401) and each wrong token (403)."""
    problems = []
    for endpoint in endpoints:
        r = call(live, endpoint, {})
        if r.status_code != 401 or r.headers.get("www-authenticate") != "Bearer":
            problems.append(f"{endpoint} without a token: {r.status_code} {r.text[:120]}")
        for token in wrong_tokens:
            for headers in (bearer(token), {"X-Kestrel-Token": token}):
                r = call(live, endpoint, headers)
                if r.status_code != 403:
                    problems.append(f"{endpoint} with {headers}: {r.status_code} {r.text[:120]}")
    return problems


def expect_admitted(
    live: LiveServer, endpoints: list[Endpoint], headers: dict[str, str]
) -> list[str]:
    """Problems with ``endpoints`` letting ``headers`` past auth (any answer but 401/403/5xx)."""
    problems = []
    for endpoint in endpoints:
        r = call(live, endpoint, headers)
        if r.status_code in (401, 403) or r.status_code >= 500:
            problems.append(f"{endpoint} with {headers}: {r.status_code} {r.text[:120]}")
    return problems


def test_management_routes_need_the_admin_token(
    public_scoring: LiveServer, guarded_scoring: LiveServer, routes: dict[str, list[Endpoint]]
) -> None:
    management = routes["management"]
    before = public_scoring.metric("kestrel_rejections_total", reason="unauthorized")
    problems = expect_denied(public_scoring, management, [WRONG, SCORING_TOKEN])
    # The scoring token never opens management, where one is configured either.
    problems += expect_denied(guarded_scoring, management, [SCORING_TOKEN])
    problems += expect_admitted(public_scoring, management, bearer(ADMIN_TOKEN))
    problems += expect_admitted(guarded_scoring, management, {"X-Kestrel-Token": ADMIN_TOKEN})
    assert not problems, "\n".join(problems)
    refused = len(management) * (1 + 2 * 2)  # no token, two wrong tokens in two headers
    after = public_scoring.metric("kestrel_rejections_total", reason="unauthorized")
    assert after - before == refused


def test_scoring_routes_are_public_by_default(
    public_scoring: LiveServer, routes: dict[str, list[Endpoint]]
) -> None:
    scoring, public = routes["scoring"], routes["public"]
    problems = expect_admitted(public_scoring, scoring + public, {})
    problems += expect_admitted(public_scoring, scoring, bearer(WRONG))  # a token is not needed
    assert not problems, "\n".join(problems)


def test_scoring_routes_need_a_token_when_one_is_set(
    guarded_scoring: LiveServer, routes: dict[str, list[Endpoint]]
) -> None:
    scoring = routes["scoring"]
    problems = expect_denied(guarded_scoring, scoring, [WRONG, ADMIN_TOKEN[:-1]])
    problems += expect_admitted(guarded_scoring, scoring, bearer(SCORING_TOKEN))
    problems += expect_admitted(guarded_scoring, scoring, {"X-Kestrel-Token": SCORING_TOKEN})
    problems += expect_admitted(guarded_scoring, scoring, bearer(ADMIN_TOKEN))  # admin may score
    problems += expect_admitted(guarded_scoring, routes["public"], {})  # probes stay open
    assert not problems, "\n".join(problems)
    v2 = next(e for e in scoring if e.template.startswith("/v2/"))
    assert call(guarded_scoring, v2, {}).json() == {
        "error": "scoring needs a token: send 'Authorization: Bearer <token>'"
    }


def test_other_authorization_schemes_are_no_token(guarded_scoring: LiveServer) -> None:
    r = guarded_scoring.client.get("/models", headers={"Authorization": f"Basic {ADMIN_TOKEN}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


def test_an_anonymous_upload_is_refused_before_its_body_is_read(
    public_scoring: LiveServer,
) -> None:
    """The token is checked on the headers: the server answers 401 and closes the connection
    without waiting for the 400 MB it was promised (under the 512 MB upload limit)."""
    declared = 400 * 2**20
    head = (
        f"POST /models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {declared}\r\n"
        "Content-Type: multipart/form-data; boundary=x\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", public_scoring.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"--x\r\n" + b"\0" * 65536)  # a first chunk, no more
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes: it must not wait for more
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 401 Unauthorized", answer[:300]
    headers = rest.lower().split(b"\r\n\r\n")[0]
    assert b"connection: close" in headers and b"www-authenticate: bearer" in headers
    assert b"model management needs a token" in answer


# -- constant-time comparison ---------------------------------------------------------------------
SECRET_WORDS = ("token", "secret", "admin", "scoring")


def _mentions_secret(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and any(w in name.lower() for w in SECRET_WORDS)


def test_tokens_are_compared_in_constant_time() -> None:
    """No ``==``/``!=``/``in`` on a token anywhere in service/, and Auth uses compare_digest."""
    offenders = []
    digest_calls = 0
    for path in sorted((ROOT / "service").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                timing_ops = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
                if any(isinstance(op, timing_ops) for op in node.ops) and any(
                    _mentions_secret(o) for o in operands
                ):
                    offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "hmac.compare_digest",
                "secrets.compare_digest",
            ):
                digest_calls += 1
    assert not offenders, offenders
    assert digest_calls >= 2, "Auth must compare tokens with hmac/secrets.compare_digest"
