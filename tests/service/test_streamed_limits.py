"""Bodies without a Content-Length (``Transfer-Encoding: chunked``) over a route's limit: a real
``kestrel serve`` answers 413 as soon as the running total crosses the limit and closes the
connection, so a client streaming far more learns it at once and stored models are untouched.

The clients are raw sockets that stream chunk after chunk until an answer is waiting or the
server stops reading, counting what they managed to send (a body declared by Content-Length is
refused on its headers: tests/service/test_middleware.py)."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import skops.io as sio
from sklearn.linear_model import LogisticRegression

from tests.service.live import ADMIN_TOKEN, LiveServer

UPLOAD_LIMIT = 256 << 10
SCORING_LIMIT = 64 << 10
CHUNK = 16 << 10
WOULD_SEND = 256 << 20  # what each client would stream if nothing stopped it
# Besides the limit and the chunk that crosses it, a client gets ahead of the server by what
# the kernel buffers between them (both sockets' buffers): far below what it would send.
IN_FLIGHT = 1 << 20
X = np.random.default_rng(0).normal(size=(50, 3))
BOUNDARY = "kestrel-boundary"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(
        tmp_path_factory.mktemp("streamed"),
        KESTREL_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        KESTREL_MAX_BODY_BYTES=str(SCORING_LIMIT),
    ).start()
    model = LogisticRegression().fit(X, X[:, 0] > 0)
    r = live.register("m", sio.dumps(model), options='{"max_batch": 4}')
    assert r.status_code == 201, r.text
    yield live
    live.stop()


def stream_chunked(port: int, head: bytes, first: bytes, chunk: bytes) -> tuple[int, bytes]:
    """POST ``head``, then a chunked body: ``first``, then ``chunk`` after ``chunk`` up to
    :data:`WOULD_SEND` bytes, while no answer is waiting. Returns how many body bytes were sent
    and the answer, read until the server closed the connection."""
    sent = 0
    frames = (b"%x\r\n%s\r\n" % (len(part), part) for part in (first, chunk))
    first_frame, frame = next(frames), next(frames)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, len(frame))
        try:
            sock.sendall(head + first_frame)
            sent += len(first)
            while sent < WOULD_SEND and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection: its answer is waiting
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:  # it closed with our unread bytes in its buffer
            pass
    return sent, answer


def parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def stored_files(live: LiveServer) -> dict[str, tuple[int, int]]:
    root = live.workdir / "store"
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def assert_model_serves(live: LiveServer) -> None:
    listed = live.client.get("/models", headers=live.admin).json()["models"]
    assert listed == [
        {"name": "m", "current": "1", "versions": [{"version": "1", "state": "READY"}]}
    ]
    r = live.client.post("/models/m/predict", json=X[:2].tolist())
    assert r.status_code == 200 and r.json()["rows"] == 2, r.text


def test_a_chunked_upload_over_the_limit_is_refused_as_it_crosses_it(server: LiveServer) -> None:
    before = stored_files(server)
    head = (
        "POST /models?wait=true HTTP/1.1\r\nhost: kestrel\r\n"
        f"authorization: Bearer {ADMIN_TOKEN}\r\n"
        f"content-type: multipart/form-data; boundary={BOUNDARY}\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    ).encode()
    # A well-formed start (a name field, then the file part's headers): the parser reads on.
    parts = (
        f'--{BOUNDARY}\r\ncontent-disposition: form-data; name="name"\r\n\r\nbig\r\n'
        f'--{BOUNDARY}\r\ncontent-disposition: form-data; name="file"; filename="big.skops"\r\n'
        "content-type: application/octet-stream\r\n\r\n"
    ).encode()
    sent, answer = stream_chunked(server.port, head, parts, b"\0" * CHUNK)

    status, headers, body = parse(answer)
    assert status == 413, answer[:500]
    assert headers["connection"] == "close"
    assert f"limit of {UPLOAD_LIMIT} bytes" in body.decode()
    assert UPLOAD_LIMIT < sent <= UPLOAD_LIMIT + CHUNK + IN_FLIGHT, sent
    assert stored_files(server) == before
    assert_model_serves(server)
    assert server.metric("kestrel_requests_total", route="/models", status="413") >= 1


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/models/m/predict", "/models/{name}/predict"),
        ("/v2/models/m/infer", "/v2/models/{name}/infer"),
        ("/predict?model=m", "/predict"),
    ],
)
def test_a_chunked_scoring_body_over_the_limit_is_refused_as_it_crosses_it(
    server: LiveServer, path: str, route: str
) -> None:
    rejected = server.metric("kestrel_rejections_total", reason="too_large")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: kestrel\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    ).encode()
    sent, answer = stream_chunked(server.port, head, b"[", b" " * CHUNK)

    status, headers, body = parse(answer)
    assert status == 413, answer[:500]
    assert headers["connection"] == "close"
    assert SCORING_LIMIT < sent <= SCORING_LIMIT + CHUNK + IN_FLIGHT, sent
    message = f"request body exceeds this route's limit of {SCORING_LIMIT} bytes"
    if path.startswith("/v2"):
        assert body == b'{"error":"%s"}' % message.encode()
    else:
        assert f'"message":"{message}"' in body.decode()
    assert server.metric("kestrel_requests_total", route=route, status="413") >= 1
    assert server.metric("kestrel_rejections_total", reason="too_large") == rejected + 1
    assert_model_serves(server)


def test_a_chunked_body_within_the_limit_is_read_whole(server: LiveServer) -> None:
    def rows() -> Iterator[bytes]:
        yield b"["
        for i, row in enumerate(X[:20].tolist()):
            yield (b"," if i else b"") + str(row).encode()
        yield b"]"

    r = server.client.post("/models/m/predict", content=rows())  # no Content-Length
    assert r.status_code == 200 and r.json()["rows"] == 20, r.text


def test_a_refused_stream_is_no_error_in_the_log(server: LiveServer) -> None:
    head = b"POST /models/m/predict HTTP/1.1\r\nhost: k\r\ntransfer-encoding: chunked\r\n\r\n"
    assert parse(stream_chunked(server.port, head, b"[", b" " * CHUNK)[1])[0] == 413
    logs = server.logs()
    assert "Traceback" not in logs and "unhandled" not in logs
