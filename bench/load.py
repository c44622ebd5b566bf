"""Kestrel over HTTP against a plain FastAPI + scikit-learn server and a FastAPI hello world.

Every server runs in its own process (uvicorn, one worker) pinned to one core; the load generator,
``wrk``, runs in another process pinned to another core. For each model, row count and concurrency
the table gives requests/s, p50 and p99 latency and the count of non-2xx/3xx answers, all three
servers measured in the same run. Before any load, one request to each server is checked against
the estimator's own ``predict_proba``, so the numbers are for correct answers.

Target (issue 6): single-row requests at concurrency 64, on every model, Kestrel reaches at least
80 % of the hello world's requests/s with p99 <= 40 ms, and at least 40x the plain server's
requests/s for the random forest, 5x for the logistic regression.

Needs ``wrk`` (Debian package ``wrk``; ``bash .ci/install-tools wrk`` or ``make bench-http`` installs
it) and ``taskset``. Usage::

    python bench/load.py [--models lr,rf,hgb,mlp] [--rows 1,100] [--concurrency 1,16,64]
                         [--duration 10] [--out results.json] [--doc docs/performance-http.md]
    python bench/load.py --tiny          # seconds: one model, two small concurrencies
    python bench/load.py --servers kestrel-quiet,kestrel,kestrel-shadow,kestrel-capture,kestrel-all
                         [--shadow-share 0.1] [--capture-share 0.1]
                                         # what live parity, drift metrics, a shadow and
                                         # payload capture cost, apart and all at once
                                         # (docs/rollouts.md)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "bench-admin-token"
N_FEATURES = 50
SERVERS = (
    "hello",
    "plain",
    "kestrel-before",
    "kestrel-quiet",
    "kestrel",
    "kestrel-shadow",
    "kestrel-capture",
    "kestrel-all",
    "kestrel-v2",
)
#: Kestrel with live parity and drift metrics off; Kestrel mirroring a share of requests
#: (``--shadow-share``) to a shadow version (a second copy of each model, stored only); Kestrel
#: capturing a share (``--capture-share``) to Parquet; Kestrel doing all of it at once: what
#: those cost against "kestrel" (the defaults: live parity and drift metrics sampling) and
#: against "kestrel-quiet", each in a server of its own, same run.
KESTREL_ENV = {
    "kestrel-quiet": {"KESTREL_LIVE_PARITY_SHARE": "0", "KESTREL_DRIFT_SHARE": "0"},
    "kestrel-capture": {"KESTREL_CAPTURE_SHARE": "0.1"},  # --capture-share overrides it
}
#: The servers that mirror to a shadow (``--shadow-share``) and capture (``--capture-share``).
SHADOWING = frozenset({"kestrel-shadow", "kestrel-all"})
CAPTURING = frozenset({"kestrel-capture", "kestrel-all"})
#: Pairs of servers compared in the table: requests/s and p99, the first over the second.
COMPARED = (
    ("kestrel", "kestrel-before"),
    ("kestrel", "kestrel-quiet"),
    ("kestrel-shadow", "kestrel-quiet"),
    ("kestrel-capture", "kestrel-quiet"),
    ("kestrel-all", "kestrel-quiet"),
)
MODELS = ("lr", "rf", "hgb", "mlp")

# The issue-6 target, checked on single-row requests at TARGET_CONCURRENCY.
TARGET_CONCURRENCY = 64
MIN_HELLO_SHARE = 0.8
MAX_P99_MS = 40.0
MIN_SPEEDUP = {"lr": 5.0, "rf": 40.0}

# Largest |Δ| in predict_proba accepted between a server's answer and scikit-learn's.
CHECK_ATOL = 1e-5

WRK_MARK = "WRK_RESULT "
# wrk calls done() once at the end; the JSON line is parsed from its stdout.
LUA_TEMPLATE = """\
local f = assert(io.open({body_path}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests": %d, "duration_us": %d, "status_errors": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "mean_us": %.1f}}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
"""


class BenchError(RuntimeError):
    """The bench cannot run (missing tool, a server that does not start or answers wrongly)."""


# -- models --------------------------------------------------------------------------------------
def build_models(names: Sequence[str], seed: int = 0) -> tuple[dict[str, Any], np.ndarray]:
    """Fitted estimators by short name, and held-out rows (float32-exact, 6 decimals) to send."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = make_classification(
        3000 + 1000, N_FEATURES, n_informative=20, random_state=seed, shuffle=True
    )
    # Values a JSON client would send: a few decimals. (Tree models compare in float32 on both
    # sides: scikit-learn casts X to float32 too.)
    x = np.round(x, 4)
    train, test = slice(0, 3000), slice(3000, None)
    factories: dict[str, Callable[[], Any]] = {
        "lr": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
        "rf": lambda: RandomForestClassifier(100, max_depth=8, random_state=seed, n_jobs=1),
        "hgb": lambda: HistGradientBoostingClassifier(max_iter=100, random_state=seed),
        "mlp": lambda: MLPClassifier((100, 100), max_iter=60, random_state=seed),
    }
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise BenchError(f"unknown models {unknown}; choose from {list(factories)}")
    fitted = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for name in names:
            fitted[name] = factories[name]().fit(x[train], y[train])
    return fitted, x[test]


def write_artifacts(models: dict[str, Any], directory: Path) -> None:
    """``<name>.joblib`` for the plain server and ``<name>.skops`` for Kestrel's upload."""
    import joblib
    import skops.io as sio

    directory.mkdir(parents=True, exist_ok=True)
    for name, estimator in models.items():
        joblib.dump(estimator, directory / f"{name}.joblib")
        sio.dump(estimator, directory / f"{name}.skops")


# -- requests ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """One endpoint under load: which server, the URL, the body, and how to read its answer."""

    server: str
    model: str
    rows: int
    url: str
    body: bytes
    proba: Callable[[dict[str, Any]], np.ndarray] | None  # None: hello world, nothing to check


def native_body(x: np.ndarray) -> bytes:
    return json.dumps({"rows": x.tolist(), "outputs": ["predict_proba"]}).encode()


def v2_body(x: np.ndarray) -> bytes:
    tensor = {
        "name": "input",
        "datatype": "FP32",
        "shape": list(x.shape),
        "data": x.ravel().tolist(),
    }
    return json.dumps({"inputs": [tensor], "outputs": [{"name": "predict_proba"}]}).encode()


def _v2_proba(doc: dict[str, Any]) -> np.ndarray:
    out = doc["outputs"][0]
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


def make_target(server: str, base_url: str, model: str, x: np.ndarray) -> Target:
    rows = x.shape[0]
    if server == "hello":
        return Target(server, model, rows, f"{base_url}/hello", native_body(x), None)
    if server == "plain":
        return Target(
            server,
            model,
            rows,
            f"{base_url}/models/{model}/predict",
            native_body(x),
            lambda d: np.asarray(d["predict_proba"]),
        )
    if server in (
        "kestrel",
        "kestrel-before",
        "kestrel-quiet",
        "kestrel-shadow",
        "kestrel-capture",
        "kestrel-all",
    ):
        return Target(
            server,
            model,
            rows,
            f"{base_url}/models/{model}/predict",
            native_body(x),
            lambda d: np.asarray(d["outputs"]["predict_proba"]),
        )
    if server == "kestrel-v2":
        url = f"{base_url}/v2/models/{model}/infer"
        return Target(server, model, rows, url, v2_body(x), _v2_proba)
    raise BenchError(f"unknown server {server!r}; choose from {list(SERVERS)}")


def check_answer(target: Target, reference: np.ndarray) -> None:
    """One request before the load: the server must answer 200 with the estimator's outputs."""
    import httpx

    response = httpx.post(
        target.url, content=target.body, headers={"Content-Type": "application/json"}, timeout=60
    )
    if response.status_code != 200:
        raise BenchError(
            f"{target.server} {target.url} answered {response.status_code}: {response.text[:500]}"
        )
    if target.proba is None:
        return
    got = target.proba(response.json())
    # A sanity check (right model, right rows), not a parity test: Kestrel computes in float32,
    # where sums drift ~1e-7 (tree decisions are exact on these rows: float64 inputs of
    # float64-comparing trees are rounded down, see compiler/context.py).
    if got.shape != reference.shape or not np.allclose(got, reference, rtol=0, atol=CHECK_ATOL):
        worst = np.max(np.abs(got - reference)) if got.shape == reference.shape else got.shape
        raise BenchError(f"{target.server} {target.model}: wrong predict_proba (max |Δ| {worst})")


# -- processes -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpu: int | None, argv: list[str]) -> list[str]:
    return argv if cpu is None else ["taskset", "-c", str(cpu), *argv]


@contextlib.contextmanager
def server_process(
    name: str,
    argv: list[str],
    port: int,
    log_path: Path,
    env: dict[str, str],
    timeout: float,
    cwd: Path = ROOT,
) -> Iterator[tuple[str, int]]:
    """Start a server, wait until ``/healthz`` answers, yield its base URL and process id (taskset
    execs the server, so the id is the server's); stop it after."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(f"{name} server exited {proc.returncode}:\n{_tail(log_path)}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"{name} server not up in {timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:]


def register_kestrel(
    url: str,
    artifacts: Path,
    models: dict[str, Any],
    x: np.ndarray,
    max_batch: int,
    *,
    promote: bool = True,
) -> None:
    """Upload each model as .skops and wait until it is READY (compiled, warmed, parity-checked);
    ``promote`` False: stored only, the version serving stays."""
    import httpx

    sample = json.dumps(x[:64].tolist())
    for name in models:
        with (artifacts / f"{name}.skops").open("rb") as fh:
            response = httpx.post(
                f"{url}/models",
                params={"wait": "true", "promote": str(promote).lower()},
                data={
                    "name": name,
                    "sample": sample,
                    "options": json.dumps({"max_batch": max_batch}),
                },
                files={"file": (f"{name}.skops", fh)},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=900,
            )
        if response.status_code != 201:
            raise BenchError(f"registering {name} answered {response.status_code}: {response.text}")


def shadow_everything(url: str, models: dict[str, Any], share: float) -> None:
    """Mirror ``share`` of each model's requests to its version 2 (see :func:`register_kestrel`)."""
    import httpx

    for name in models:
        response = httpx.put(
            f"{url}/models/{name}/shadow",
            json={"version": "2", "share": share},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=300,
        )
        if response.status_code != 200:
            raise BenchError(f"shadowing {name} answered {response.status_code}: {response.text}")


# -- wrk -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_us: int
    status_errors: int
    connect_errors: int
    read_errors: int
    write_errors: int
    timeouts: int
    p50_us: int
    p90_us: int
    p99_us: int
    max_us: int
    mean_us: float

    @property
    def rps(self) -> float:
        return self.requests / (self.duration_us / 1e6) if self.duration_us else 0.0

    @property
    def socket_errors(self) -> int:
        return self.connect_errors + self.read_errors + self.write_errors + self.timeouts


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise BenchError(
            "wrk is not installed: install the Debian package with `apt-get install wrk` "
            "(or run `bash .ci/install-tools wrk`, or `make bench-http`, which installs it)"
        )
    return path


def run_wrk(
    wrk: str,
    target: Target,
    *,
    connections: int,
    duration_s: float,
    cpu: int | None,
    workdir: Path,
) -> WrkResult:
    """``wrk`` with one thread and ``connections`` connections, POSTing the target's body."""
    body_path = workdir / f"body-{target.server}-{target.model}-{target.rows}.json"
    body_path.write_bytes(target.body)
    script = workdir / f"post-{target.server}-{target.model}-{target.rows}.lua"
    script.write_text(LUA_TEMPLATE.format(body_path=json.dumps(str(body_path)), mark=WRK_MARK))
    argv = pinned(
        cpu,
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration_s))}s",  # wrk takes whole seconds
            "--timeout",
            "10s",
            "--latency",
            "-s",
            str(script),
            target.url,
        ],
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    for line in done.stdout.splitlines():
        if line.startswith(WRK_MARK):
            return WrkResult(**json.loads(line[len(WRK_MARK) :]))
    raise BenchError(f"wrk gave no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


# -- the run -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    server: str
    model: str
    rows: int
    concurrency: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    requests: int
    non_2xx: int
    socket_errors: int
    # Server CPU time per answered request: robust to a busy machine, unlike requests/s.
    cpu_us_per_request: float

    @classmethod
    def of(cls, target: Target, concurrency: int, r: WrkResult, cpu_s: float) -> Measurement:
        return cls(
            target.server,
            target.model,
            target.rows,
            concurrency,
            round(r.rps, 1),
            r.p50_us / 1e3,
            r.p90_us / 1e3,
            r.p99_us / 1e3,
            r.max_us / 1e3,
            r.requests,
            r.status_errors,
            r.socket_errors,
            round(cpu_s / max(r.requests, 1) * 1e6, 1),
        )


@dataclass
class Config:
    models: tuple[str, ...] = MODELS
    rows: tuple[int, ...] = (1, 100)
    concurrency: tuple[int, ...] = (1, 16, 64)
    servers: tuple[str, ...] = ("hello", "plain", "kestrel")
    duration_s: float = 10.0
    warmup_s: float = 3.0
    max_batch: int = 1024
    server_cpu: int | None = None
    client_cpu: int | None = None
    tiny: bool = False
    shadow_share: float = 0.1
    capture_share: float = 0.1
    workdir: Path | None = None
    # Where `python -m service.cli serve` runs from: another checkout compares two versions.
    kestrel_src: Path = ROOT
    # The checkout "kestrel-before" runs from: an older commit, measured in the same run.
    before_src: Path | None = None
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))


def default_cpus() -> tuple[int | None, int | None]:
    """The first two CPUs this process may use: server on one, load generator on the other."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return None, None
    return cpus[0], cpus[1]


def run(config: Config) -> list[Measurement]:
    """Train the models, start the servers one at a time, load each endpoint, return the cells."""
    wrk = require_wrk()
    for server in config.servers:
        if server not in SERVERS:
            raise BenchError(f"unknown server {server!r}; choose from {list(SERVERS)}")
    config.log(f"training {', '.join(config.models)} ...")
    models, x = build_models(config.models)
    with contextlib.ExitStack() as stack:
        workdir = config.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        artifacts = workdir / "models"
        write_artifacts(models, artifacts)
        base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        results: list[Measurement] = []
        # One process per server kind; both Kestrel APIs share one Kestrel process.
        groups: dict[str, list[str]] = {}
        for server in config.servers:
            kind = "kestrel" if server in ("kestrel", "kestrel-v2") else server
            groups.setdefault(kind, []).append(server)
        sources = {"kestrel": config.kestrel_src, "kestrel-before": config.before_src}
        for kind, servers in groups.items():
            port = free_port()
            argv, env = server_command(kind, port, artifacts, workdir / kind, base_env)
            if kind in CAPTURING:
                env["KESTREL_CAPTURE_SHARE"] = str(config.capture_share)
            cwd = sources.get(kind) or ROOT
            log_path = workdir / f"{kind}.log"
            config.log(f"starting {kind} server on port {port} ...")
            with server_process(
                kind, pinned(config.server_cpu, argv), port, log_path, env, timeout=300, cwd=cwd
            ) as (url, pid):
                if kind.startswith("kestrel"):
                    config.log("registering models with Kestrel (compile, warm-up, parity) ...")
                    register_kestrel(url, artifacts, models, x, config.max_batch)
                if kind in SHADOWING:
                    config.log(
                        f"staging a shadow copy of each model ({config.shadow_share:.0%}) ..."
                    )
                    register_kestrel(url, artifacts, models, x, config.max_batch, promote=False)
                    shadow_everything(url, models, config.shadow_share)
                model_names = ("-",) if kind == "hello" else config.models
                for server in servers:
                    for model in model_names:
                        for rows in config.rows:
                            if rows > len(x):
                                raise BenchError(f"--rows {rows}: only {len(x)} held-out rows")
                            rows_x = x[:rows]
                            target = make_target(server, url, model, rows_x)
                            if target.proba is not None:
                                check_answer(target, models[model].predict_proba(rows_x))
                            results.extend(_load(wrk, target, config, workdir, pid))
    return results


def server_command(
    kind: str, port: int, artifacts: Path, workdir: Path, env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    python = sys.executable
    if kind == "hello":
        return [python, str(ROOT / "bench" / "plain_server.py"), "hello", "--port", str(port)], env
    if kind == "plain":
        argv = [python, str(ROOT / "bench" / "plain_server.py"), "plain", "--port", str(port)]
        return [*argv, "--models", str(artifacts)], env
    kestrel_env = {
        **env,
        "KESTREL_STORE_URL": str(workdir / "store"),
        "KESTREL_CACHE_DIR": str(workdir / "cache"),
        "KESTREL_ADMIN_TOKEN": ADMIN_TOKEN,
        "KESTREL_POLL_INTERVAL_S": "0",
        # One core for the whole server: XLA must not spread a batch over threads.
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
        # HTTP is measured: no gRPC server (nor a clash with one on its default port).
        "KESTREL_GRPC_PORT": "0",
        # One process, pinned to one core like the servers it is compared with
        # (bench/workers.py sets more).
        "KESTREL_WORKERS": "1",
        **KESTREL_ENV.get(kind, {}),
    }
    return [python, "-m", "service.cli", "serve", "--port", str(port)], kestrel_env


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(wrk: str, target: Target, config: Config, workdir: Path, pid: int) -> list[Measurement]:
    top = max(config.concurrency)
    if config.warmup_s > 0:  # fills caches, JIT paths and connection pools at full load
        run_wrk(
            wrk,
            target,
            connections=top,
            duration_s=config.warmup_s,
            cpu=config.client_cpu,
            workdir=workdir,
        )
    out = []
    for concurrency in config.concurrency:
        cpu0 = cpu_seconds(pid)
        result = run_wrk(
            wrk,
            target,
            connections=concurrency,
            duration_s=config.duration_s,
            cpu=config.client_cpu,
            workdir=workdir,
        )
        m = Measurement.of(target, concurrency, result, cpu_seconds(pid) - cpu0)
        config.log(
            f"  {m.server:<10} {m.model:<4} rows {m.rows:<4} c {m.concurrency:<3} "
            f"{m.rps:8.0f} req/s  p50 {m.p50_ms:7.2f} ms  p99 {m.p99_ms:7.2f} ms  "
            f"CPU {m.cpu_us_per_request:6.0f} µs/req  non-2xx {m.non_2xx}  "
            f"socket errors {m.socket_errors}"
        )
        out.append(m)
    return out


# -- verdicts and reports ------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    model: str
    server: str
    rps: float
    hello_rps: float
    p99_ms: float
    plain_rps: float | None
    min_speedup: float | None
    passed: bool
    reasons: tuple[str, ...]


def verdicts(results: Sequence[Measurement]) -> list[Verdict]:
    """The target on every Kestrel endpoint measured with single rows at TARGET_CONCURRENCY."""
    cell = {(m.server, m.model, m.rows, m.concurrency): m for m in results}
    out = []
    for m in results:
        if not (m.server in ("kestrel", "kestrel-v2") and m.rows == 1):
            continue
        if m.concurrency != TARGET_CONCURRENCY:
            continue
        hello = cell.get(("hello", "-", 1, TARGET_CONCURRENCY))
        plain = cell.get(("plain", m.model, 1, TARGET_CONCURRENCY))
        reasons = []
        if hello is None:
            reasons.append("no hello-world measurement to compare with")
        elif m.rps < MIN_HELLO_SHARE * hello.rps:
            reasons.append(f"{m.rps / hello.rps:.0%} of hello world < {MIN_HELLO_SHARE:.0%}")
        if m.p99_ms > MAX_P99_MS:
            reasons.append(f"p99 {m.p99_ms:.1f} ms > {MAX_P99_MS:.0f} ms")
        need = MIN_SPEEDUP.get(m.model)
        if need is not None:
            if plain is None:
                reasons.append("no plain-server measurement to compare with")
            elif m.rps < need * plain.rps:
                reasons.append(f"{m.rps / plain.rps:.1f}x the plain server < {need:.0f}x")
        if m.non_2xx or m.socket_errors:
            reasons.append(f"{m.non_2xx} non-2xx answers, {m.socket_errors} socket errors")
        out.append(
            Verdict(
                m.model,
                m.server,
                m.rps,
                hello.rps if hello else float("nan"),
                m.p99_ms,
                plain.rps if plain else None,
                need,
                not reasons,
                tuple(reasons),
            )
        )
    return out


def _cell(m: Measurement | None) -> str:
    if m is None:
        return "–"
    errors = f" ({m.non_2xx + m.socket_errors} err)" if m.non_2xx or m.socket_errors else ""
    return f"{m.rps:,.0f} / {m.p50_ms:.1f} / {m.p99_ms:.1f}{errors}"


def table_rows(results: Sequence[Measurement]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (model, rows, concurrency), one column per server."""
    cell = {(m.server, m.model, m.rows, m.concurrency): m for m in results}
    servers = [s for s in SERVERS if any(m.server == s for m in results)]
    kestrels = [s for s in servers if s.startswith("kestrel")]
    header = ["model", "rows", "conc."]
    header += [f"{_LABELS[s]} req/s / p50 / p99 ms" for s in servers]
    for s in kestrels:
        header += [f"{_LABELS[s]} / hello", f"{_LABELS[s]} / plain"]
    compared = [(a, b) for a, b in COMPARED if a in servers and b in servers]
    header += [f"{_LABELS[a]} / {_LABELS[b]}: req/s, p99" for a, b in compared]
    header.append("target")
    keys = sorted(
        {(m.model, m.rows, m.concurrency) for m in results if m.server != "hello"},
        key=lambda k: (MODELS.index(k[0]) if k[0] in MODELS else 99, k[1], k[2]),
    )
    verdict = {(v.server, v.model): v for v in verdicts(results)}
    rows = []
    for model, n, c in keys:
        line = [model, str(n), str(c)]
        for s in servers:
            line.append(_cell(cell.get((s, "-" if s == "hello" else model, n, c))))
        marks = []
        for s in kestrels:
            k, h, p = (
                cell.get(key)
                for key in ((s, model, n, c), ("hello", "-", n, c), ("plain", model, n, c))
            )
            line.append(f"{k.rps / h.rps:.0%}" if k and h and h.rps else "–")
            line.append(f"{k.rps / p.rps:.1f}x" if k and p and p.rps else "–")
            v = verdict.get((s, model)) if n == 1 and c == TARGET_CONCURRENCY else None
            if v is not None:
                marks.append("PASS" if v.passed else "FAIL: " + "; ".join(v.reasons))
        for a, b in compared:
            now, base = cell.get((a, model, n, c)), cell.get((b, model, n, c))
            ok = now and base and base.rps and base.p99_ms
            line.append(
                f"{now.rps / base.rps:.2f}x, {now.p99_ms / base.p99_ms:.2f}x" if ok else "–"
            )
        line.append(" | ".join(marks) if marks else "")
        rows.append(line)
    return header, rows


def cpu_table(results: Sequence[Measurement]) -> tuple[list[str], list[list[str]]]:
    """Server CPU µs per request: one row per (model, rows, concurrency), a column per server."""
    cell = {(m.server, m.model, m.rows, m.concurrency): m for m in results}
    servers = [s for s in SERVERS if any(m.server == s for m in results)]
    header = ["model", "rows", "conc.", *(_LABELS[s] for s in servers)]
    keys = sorted(
        {(m.model, m.rows, m.concurrency) for m in results if m.server != "hello"},
        key=lambda k: (MODELS.index(k[0]) if k[0] in MODELS else 99, k[1], k[2]),
    )
    rows = []
    for model, n, c in keys:
        line = [model, str(n), str(c)]
        for s in servers:
            m = cell.get((s, "-" if s == "hello" else model, n, c))
            line.append(f"{m.cpu_us_per_request:,.0f}" if m else "–")
        rows.append(line)
    return header, rows


_LABELS = {
    "hello": "hello world",
    "plain": "plain",
    "kestrel-before": "Kestrel before",
    "kestrel-quiet": "Kestrel, live parity and drift off",
    "kestrel": "Kestrel",
    "kestrel-shadow": "Kestrel + shadow",
    "kestrel-capture": "Kestrel + capture",
    "kestrel-all": "Kestrel + shadow + capture",
    "kestrel-v2": "Kestrel v2",
}


def print_table(results: Sequence[Measurement], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    header, rows = table_rows(results)
    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 or column == "target" else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=250).print(table)
    for v in verdicts(results):
        status = "PASS" if v.passed else "FAIL"
        detail = "" if v.passed else ": " + "; ".join(v.reasons)
        print(f"{status} {v.server} {v.model} (1 row, c={TARGET_CONCURRENCY}){detail}")


def environment() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, load, versions."""
    import fastapi
    import sklearn
    import uvicorn

    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[
        0
    ]
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "scikit-learn": sklearn.__version__,
        "wrk": wrk_version.strip(),
    }


def markdown(
    results: Sequence[Measurement], config: Config, env: dict[str, Any], argv: Sequence[str]
) -> str:
    """The "Over HTTP" section of docs/performance.md."""
    header, rows = table_rows(results)
    out = io.StringIO()
    w = out.write
    w("## Over HTTP\n\n")
    w(
        "Generated by `python bench/load.py"
        + ("" if not argv else " " + " ".join(argv))
        + "` (`make bench-http`).\n\n"
    )
    w(
        "Three servers, each in its own process (uvicorn, one worker, uvloop + httptools, access "
        "log off), pinned to one core with `taskset`; the load generator `wrk` (one thread, closed "
        "loop: each connection sends its next request when the answer arrives) pinned to another "
        f"core. Every cell is one {config.duration_s:g} s run after a {config.warmup_s:g} s "
        "warm-up at the highest concurrency, in the same bench run:\n\n"
        "- **hello world**: FastAPI's hello world (`POST /hello` answering a constant object, "
        "sent the same body), the ceiling of the Python front end;\n"
        "- **plain**: the server people run today (`bench/plain_server.py`): `joblib.load` at "
        'start, a pydantic body `{"rows": [[...]]}`, `model.predict_proba` per request in a '
        "`def` route, FastAPI's default JSON response;\n"
        '- **Kestrel**: `kestrel serve`, the same body plus `"outputs": ["predict_proba"]` to '
        "`POST /models/{name}/predict`"
        + (
            "; **Kestrel v2**: the same rows as an Open Inference Protocol v2 JSON tensor to "
            "`POST /v2/models/{name}/infer`"
            if "kestrel-v2" in config.servers
            else ""
        )
        + ".\n\n"
        "Before the load, one answer of every endpoint is checked against the estimator's own "
        "`predict_proba`.\n\n"
    )
    w(
        f"Models ({N_FEATURES} features): lr = StandardScaler + LogisticRegression; rf = "
        "RandomForest 100 trees, depth 8; hgb = HistGradientBoosting 100 iterations; mlp = "
        "MLP (100, 100).\n\n"
    )
    load = env.get("load_average")
    w(
        f"Machine: {env['cpu']}, {env['cpus']} cores"
        + (f", load average {load[0]:.2f} at the start" if load else "")
        + f"; Python {env['python']}, FastAPI {env['fastapi']}, uvicorn {env['uvicorn']}, "
        f"scikit-learn {env['scikit-learn']}, {env['wrk']}.\n\n"
    )
    if config.kestrel_src != ROOT:
        w(f"Kestrel ran from `{config.kestrel_src}`, not this checkout.\n\n")
    w("Cells: requests/s / p50 ms / p99 ms (non-2xx answers and socket errors, if any).\n\n")
    w("| " + " | ".join(header) + " |\n")
    w("|" + "|".join("---" if i < 1 else "---:" for i in range(len(header) - 1)) + "|---|\n")
    for row in rows:
        w("| " + " | ".join(c.replace("|", "/") for c in row) + " |\n")
    w(
        "\nServer CPU time per answered request, µs (all threads of the server process; less "
        "sensitive than requests/s to other jobs sharing the machine):\n\n"
    )
    cpu_header, cpu_rows = cpu_table(results)
    w("| " + " | ".join(cpu_header) + " |\n")
    w("|---|---:|---:|" + "---:|" * (len(cpu_header) - 3) + "\n")
    for row in cpu_rows:
        w("| " + " | ".join(row) + " |\n")
    w(
        f"\nTarget (issue 6): single-row requests at concurrency {TARGET_CONCURRENCY}, every "
        f"model: at least {MIN_HELLO_SHARE:.0%} of the hello world's requests/s with p99 <= "
        f"{MAX_P99_MS:.0f} ms, and at least "
        + ", ".join(f"{v:.0f}x the plain server for {k}" for k, v in MIN_SPEEDUP.items())
        + ".\n\n"
    )
    for v in verdicts(results):
        status = "**pass**" if v.passed else "**fail** (" + "; ".join(v.reasons) + ")"
        w(
            f"- {_LABELS[v.server]} {v.model}: {v.rps:,.0f} req/s = {v.rps / v.hello_rps:.0%} of "
            f"hello world, p99 {v.p99_ms:.1f} ms"
            + (f", {v.rps / v.plain_rps:.0f}x plain" if v.plain_rps else "")
            + f": {status}\n"
        )
    return out.getvalue()


# -- CLI -----------------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(
                f"unknown {bad or text!r}; choose from {list(choices)}"
            )
        return values

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_names(MODELS), default=MODELS)
    parser.add_argument("--rows", type=_ints, default=(1, 100), help="rows per request")
    parser.add_argument("--concurrency", type=_ints, default=(1, 16, 64), help="open connections")
    parser.add_argument(
        "--servers",
        type=_names(SERVERS),
        default=("hello", "plain", "kestrel"),
        help=f"which of {list(SERVERS)}",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each endpoint")
    parser.add_argument("--max-batch", type=int, default=1024, help="Kestrel's largest bucket")
    parser.add_argument("--server-cpu", type=int, default=None)
    parser.add_argument("--client-cpu", type=int, default=None)
    parser.add_argument(
        "--tiny", action="store_true", help="seconds: lr only, 1 row, concurrency 1 and 4"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep models, logs here")
    parser.add_argument(
        "--shadow-share",
        type=float,
        default=0.1,
        help="share kestrel-shadow and kestrel-all mirror (0, 1]",
    )
    parser.add_argument(
        "--capture-share",
        type=float,
        default=0.1,
        help="share kestrel-capture and kestrel-all capture (0, 1]",
    )
    parser.add_argument(
        "--kestrel-src",
        type=Path,
        default=ROOT,
        help="run Kestrel from this checkout (e.g. an export of an older commit, to compare)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="also run Kestrel from this checkout (an older commit) in the same run: before/after",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--doc", type=Path, default=None, help="write the markdown section")
    args = parser.parse_args(argv)
    server_cpu, client_cpu = default_cpus()
    config = Config(
        models=args.models,
        rows=args.rows,
        concurrency=args.concurrency,
        servers=args.servers,
        duration_s=args.duration,
        warmup_s=args.warmup,
        max_batch=args.max_batch,
        server_cpu=args.server_cpu if args.server_cpu is not None else server_cpu,
        client_cpu=args.client_cpu if args.client_cpu is not None else client_cpu,
        tiny=args.tiny,
        shadow_share=args.shadow_share,
        capture_share=args.capture_share,
        workdir=args.workdir,
        kestrel_src=args.kestrel_src.resolve(),
        before_src=args.before.resolve() if args.before is not None else None,
    )
    if config.before_src is not None and "kestrel-before" not in config.servers:
        # Run first, as listed in SERVERS, so the two are measured back to back.
        config.servers = ("kestrel-before", *config.servers)
    if "kestrel-before" in config.servers and config.before_src is None:
        parser.error("the kestrel-before server needs --before CHECKOUT")
    if args.tiny:
        config.models, config.rows, config.concurrency = ("lr",), (1,), (1, 4)
        config.duration_s, config.warmup_s, config.max_batch = 1.0, 0.0, 4
    return config, args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config, args = parse_args(argv)
    try:
        env = environment() if shutil.which("wrk") else {}
        results = run(config)
    except BenchError as exc:
        print(f"bench/load.py: {exc}", file=sys.stderr)
        return 2
    print_table(results, "Over HTTP: requests/s / p50 ms / p99 ms")
    if args.out is not None:
        doc = {
            "environment": env,
            "config": {k: v for k, v in asdict(config).items() if k not in ("log", "workdir")},
            "results": [asdict(m) for m in results],
            "verdicts": [asdict(v) for v in verdicts(results)],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    if args.doc is not None:
        args.doc.parent.mkdir(parents=True, exist_ok=True)
        args.doc.write_text(markdown(results, config, env, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
