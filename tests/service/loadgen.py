"""HTTP load generator for overload tests: closed-loop (to find capacity) and open-loop (a fixed
arrival rate, so offered load does not drop when the server slows down).

Raw asyncio sockets speaking HTTP/1.1 keep-alive, not an HTTP client library: on a small
machine the generator shares the CPUs with the server, and a per-request cost of a few tens of
microseconds (instead of hundreds) is what lets it offer several times the server's capacity.

Open loop follows wrk2: arrival ``i`` is due at ``start + i / rate`` and its latency is measured
from that due time, not from when a connection was free to send it, so a server that falls
behind is charged for the wait (no coordinated omission). A fixed pool of connections serves
the arrivals; an arrival waits in the generator only while every connection is busy.

Run as a separate process (``python -m tests.service.loadgen ...``); it prints one JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

__all__ = ["Result", "closed_loop", "main", "open_loop", "run_process", "summarize"]


@dataclass
class Result:
    """Every answered request's status and latency (seconds), plus transport failures."""

    duration_s: float
    elapsed_s: float = 0.0  # until the last answer: longer than duration_s if the server lagged
    statuses: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)  # send time - due time (open loop)
    errors: list[str] = field(default_factory=list)
    offered: int = 0  # arrivals due during the run (open loop)

    def record(self, status: int, latency: float) -> None:
        self.statuses.append(status)
        self.latencies.append(latency)


class _Connection:
    """One keep-alive HTTP/1.1 connection that sends a fixed request and reads whole answers."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def exchange(self) -> int:
        """Send the request and return the answer's status (reconnecting when needed)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        try:
            status, close = await _read_response(self.reader)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    status = int(line.split(None, 2)[1])
    length, close = 0, False
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b""):
            break
        key, _, value = header.partition(b":")
        key = key.strip().lower()
        if key == b"content-length":
            length = int(value)
        elif key == b"connection":
            close = value.strip().lower() == b"close"
    if length:
        await reader.readexactly(length)
    return status, close


def _request_bytes(url: str, path: str, body: bytes, content_type: str) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return host, port, head.encode("latin-1") + body


async def closed_loop(
    url: str, path: str, body: bytes, *, connections: int, duration_s: float, timeout_s: float = 30
) -> Result:
    """``connections`` clients, each sending its next request as soon as the last one answered."""
    host, port, request = _request_bytes(url, path, body, "application/json")
    result = Result(duration_s)
    stop = time.perf_counter() + duration_s

    async def client() -> None:
        conn = _Connection(host, port, request)
        try:
            while time.perf_counter() < stop:
                await _exchange(conn, result, timeout_s, since=time.perf_counter())
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    result.elapsed_s = time.perf_counter() - t0
    return result


async def open_loop(
    url: str,
    path: str,
    body: bytes,
    *,
    rate: float,
    duration_s: float,
    connections: int,
    timeout_s: float = 30,
) -> Result:
    """Arrivals at a fixed ``rate`` per second for ``duration_s``, on ``connections`` sockets;
    latency counts from each arrival's due time."""
    host, port, request = _request_bytes(url, path, body, "application/json")
    result = Result(duration_s)
    due: asyncio.Queue[float | None] = asyncio.Queue()
    start = time.perf_counter() + 0.05
    total = int(rate * duration_s)
    result.offered = total

    async def dispatch() -> None:
        # Release every arrival whose due time has come; sleeping per arrival would cap the
        # rate at the event loop's timer resolution.
        released = 0
        while released < total:
            now = time.perf_counter()
            while released < total and start + released / rate <= now:
                due.put_nowait(start + released / rate)
                released += 1
            await asyncio.sleep(min(0.001, max(0.0, start + released / rate - now)))
        for _ in range(connections):
            due.put_nowait(None)

    async def client() -> None:
        conn = _Connection(host, port, request)
        try:
            while (when := await due.get()) is not None:
                result.lateness.append(time.perf_counter() - when)
                await _exchange(conn, result, timeout_s, since=when)
        finally:
            conn.close()

    await asyncio.gather(dispatch(), *(client() for _ in range(connections)))
    result.elapsed_s = time.perf_counter() - start
    return result


async def _exchange(conn: _Connection, result: Result, timeout_s: float, *, since: float) -> None:
    """One request on ``conn``: its status and latency from ``since`` recorded, or the transport
    failure (the connection is then closed and reopened by the next exchange)."""
    try:
        status = await asyncio.wait_for(conn.exchange(), timeout_s)
    except (OSError, ConnectionError, TimeoutError, ValueError) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
        conn.close()
        return
    result.record(status, time.perf_counter() - since)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    a = np.asarray(values) * 1e3
    return {
        "count": int(a.size),
        "mean_ms": float(a.mean()),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


def summarize(result: Result) -> dict[str, Any]:
    """Counts and latency percentiles per status, overall throughput, generator lateness."""
    statuses = np.asarray(result.statuses, dtype=int)
    latencies = np.asarray(result.latencies)
    by_status = {
        str(code): _percentiles(latencies[statuses == code].tolist())
        for code in sorted(set(result.statuses))
    }
    return {
        "duration_s": result.duration_s,
        "elapsed_s": result.elapsed_s,
        "offered": result.offered,
        "offered_per_s": result.offered / result.duration_s,
        "answered": len(result.statuses),
        "answered_per_s": len(result.statuses) / result.duration_s,
        "ok_per_s": int((statuses == 200).sum()) / result.duration_s,
        "by_status": by_status,
        "errors": len(result.errors),
        "error_examples": sorted(set(result.errors))[:5],
        "lateness": _percentiles(result.lateness),
    }


def run_process(url: str, path: str, body: str, *args: str) -> dict[str, Any]:
    """One run of this generator in its own process (``args``: its command-line options, e.g.
    ``--closed --connections 8 --duration 2``); its JSON summary."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.service.loadgen", url, path, "--body", body, *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("path")
    parser.add_argument("--body", required=True, help="JSON request body")
    parser.add_argument("--duration", type=float, required=True, help="seconds")
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--rate", type=float, help="arrivals per second (open loop)")
    parser.add_argument("--closed", action="store_true", help="closed loop instead")
    args = parser.parse_args(argv)
    if args.closed == (args.rate is not None):
        parser.error("give exactly one of --rate (open loop) or --closed")
    body = args.body.encode()
    if args.closed:
        run = closed_loop(
            args.url, args.path, body, connections=args.connections, duration_s=args.duration
        )
    else:
        run = open_loop(
            args.url,
            args.path,
            body,
            rate=args.rate,
            duration_s=args.duration,
            connections=args.connections,
        )
    try:
        import uvloop

        result = uvloop.run(run)
    except ImportError:
        result = asyncio.run(run)
    json.dump(summarize(result), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
