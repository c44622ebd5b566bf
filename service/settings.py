"""Service settings: one place, one environment prefix (``KESTREL_``).

Only the service reads settings; ``compiler`` and ``lazy`` take options as arguments.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1 << 20
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class Settings(BaseSettings):
    """Every knob of a Kestrel process; environment variables ``KESTREL_<NAME>`` override."""

    model_config = SettingsConfigDict(env_prefix="KESTREL_", extra="ignore")

    # -- network -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int | None = Field(
        None,
        ge=1,
        description="worker processes of `kestrel serve`, all on its one port, sharing the "
        "store, the compile cache, the in-flight limit and the metrics (empty: the cores the "
        "process may use; 1: a single process)",
    )
    grpc_port: int | None = Field(
        8081,
        ge=1,
        le=65535,
        description="port of the Open Inference Protocol v2 over gRPC, on the same host, in the "
        "same process (0 or empty: no gRPC server)",
    )

    # -- storage -------------------------------------------------------------------------------
    store_url: str = Field(".kestrel/store", description="fsspec URL or path of the model store")
    store_options: dict[str, object] = Field(
        default_factory=dict, description="fsspec storage options (e.g. an S3 endpoint)"
    )
    cache_dir: Path | None = Field(
        Path(".kestrel/cache"),
        description="trusted directory of compiled executables; empty disables the disk layer",
    )
    shared_cache: bool = Field(
        True,
        description="share compiled executables through the store: the first replica to "
        "compile a version writes them under executables/, the others and restarts load them "
        "(anyone who can write the store can then run code in the server: only servers may)",
    )
    cache_signing_key: SecretStr | None = Field(
        None,
        description="seal every cached executable (disk and store) with an HMAC under this "
        "key, and refuse unsigned or foreign ones: the same secret on every replica",
    )
    poll_interval_s: float = Field(
        2.0, ge=0, description="how often to re-read the store's manifest (0: never)"
    )

    # -- security ------------------------------------------------------------------------------
    admin_token: SecretStr | None = None
    scoring_token: SecretStr | None = Field(
        None, description="when set, scoring routes require this token (or the admin token)"
    )
    allow_pickle: bool = Field(
        False, description="accept pickle/joblib uploads (admin token required; code can run)"
    )
    allow_unauthenticated_management: bool = Field(
        False, description="serve management routes without a token on a non-loopback address"
    )
    host_step_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="modules whose functions and classes skops uploads may reference, run as "
        "host steps between compiled segments (code of these modules runs on the server: list "
        "only modules you trust); a JSON list or comma-separated names, e.g. "
        "'my_features,my_pkg.transforms'; empty: no host steps",
    )
    max_body_bytes: int = Field(64 * MiB, gt=0, description="largest scoring request body")
    max_upload_bytes: int = Field(512 * MiB, gt=0, description="largest model upload")

    # -- models and batching -------------------------------------------------------------------
    max_batch: int = Field(1024, ge=1, le=1 << 20, description="default top bucket per model")
    host_rows: int | None = Field(
        None,
        ge=0,
        description="largest bucket timed on the host against the device when a version is "
        "first compiled; larger buckets run on the device untimed, which shortens loads where "
        "the device clearly wins (an accelerator). 0: every bucket on the device; empty: "
        "every bucket timed",
    )
    max_loaded_models: int | None = Field(
        None,
        ge=1,
        description="versions loaded at once on this replica: beyond it, the versions idle the "
        "longest are unloaded and loaded again on their next request (empty: no budget)",
    )
    pinned_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="models whose versions are never unloaded for the budget (a JSON list or "
        "comma-separated names)",
    )
    max_queue_rows: int = Field(65536, ge=1, description="rows queued per model before 429")
    max_in_flight: int | None = Field(
        2048,
        ge=1,
        description="scoring requests in progress in the server (all its workers together) "
        "before 429, refused before their body is read: a bound on the bodies held in memory, "
        "not a latency budget (empty: no limit)",
    )
    queue_delay_target_ms: float = Field(
        10.0,
        gt=0,
        description="load shedding: a model whose freshest queued request has waited longer "
        "than this for a batch, for a whole queue_delay_interval_ms, refuses new requests (429, "
        "before their body is read) while two batches' worth are in progress, until an interval "
        "passes with nothing to refuse (see docs/reliability.md)",
    )
    queue_delay_interval_ms: float = Field(
        100.0,
        gt=0,
        description="load shedding: how long the queueing delay must stay above its target "
        "before a model sheds (a burst shorter than this is absorbed)",
    )
    batch_wait_ms: float = Field(0.0, ge=0, description="extra wait for a batch to fill")
    request_timeout_s: float | None = Field(
        None, gt=0, description="default per-request deadline (a request may set a shorter one)"
    )
    strict_columns: bool = Field(
        False,
        description="refuse (422) scoring requests with columns the model does not read, naming "
        "them; off, they are scored and the answer names what was ignored (a request's "
        "strict_columns query parameter decides for itself)",
    )
    register_wait_s: float = Field(
        600.0, gt=0, description="longest a registering client may wait for READY"
    )
    parity_rows: int = Field(64, ge=1, le=100_000, description="rows synthesised for parity")
    parity_probe_rows: int = Field(
        8192,
        ge=0,
        le=1_000_000,
        description="about how many rows probe the model's own decision values for parity",
    )
    parity_rtol: float = Field(1e-4, gt=0, description="relative tolerance of the parity check")
    parity_atol: float = Field(1e-5, ge=0, description="absolute tolerance of the parity check")
    live_parity_share: float = Field(
        0.01,
        ge=0,
        le=1,
        description="live parity: the share of scored requests whose rows are rescored by the "
        "source estimator in the background and compared with the answer served (0: off)",
    )
    live_parity_rows: int = Field(
        16, ge=1, le=4096, description="live parity: rows rescored per sampled request, at most"
    )
    capture_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="payload capture: the share of scored requests whose rows and answers are "
        "written to the store as Parquet, by model, version and hour (0: off)",
    )
    capture_flush_s: float = Field(
        30.0, gt=0, description="payload capture: seconds between two writes of what was captured"
    )
    capture_retention_hours: float = Field(
        168.0, gt=0, description="payload capture: hours a captured partition is kept"
    )
    capture_max_rows: int = Field(
        100_000,
        ge=1,
        description="payload capture: rows held in memory between two writes, at most (more are "
        "dropped and counted)",
    )
    live_parity_cpu: float = Field(
        0.05,
        gt=0,
        le=1,
        description="live parity: the share of one core its background worker may use",
    )
    drift_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="data-quality and drift metrics: the share of scored requests whose rows and "
        "answers are read in the background (0: off)",
    )
    drift_rows: int = Field(
        256, ge=1, le=65_536, description="drift metrics: rows read per sampled request, at most"
    )
    drift_cpu: float = Field(
        0.05,
        gt=0,
        le=1,
        description="drift metrics: the share of one core their background worker may use",
    )
    drift_window_s: float = Field(
        900.0, gt=0, description="drift metrics: seconds of rows the PSI is computed over"
    )
    drift_min_rows: int = Field(
        200, ge=1, description="drift metrics: values a window needs before a column has a PSI"
    )
    drift_columns: int = Field(
        20,
        ge=0,
        le=1000,
        description="drift metrics: input columns labelled by name (the schema's first); the "
        "rest are counted together as '(other)'",
    )
    demo_model: bool = Field(False, description="register a demo model at start if absent")
    # KServe's storage initializer puts an InferenceService's model under /mnt/models.
    preload: Path | None = Field(
        None, description="model file, or directory holding one, registered at start (see readyz)"
    )
    preload_name: str | None = Field(
        None, description="name of the preloaded model (default: the directory's or file's name)"
    )

    # -- logging -------------------------------------------------------------------------------
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry (traces, metrics, logs to the globally "
        "configured providers); off, metrics are Prometheus's only and no request pays the "
        "provider lookups",
    )

    @field_validator(
        "cache_dir",
        "cache_signing_key",
        "host_rows",
        "max_loaded_models",
        "preload",
        "preload_name",
        "max_in_flight",
        "workers",
        mode="before",
    )
    @classmethod
    def _empty_disables(cls, value: object) -> object:
        return None if value in ("", None) else value

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _zero_disables(cls, value: object) -> object:
        # Not "any free port" as 0 is for `port`: a client could not learn which one it was.
        return None if value in ("", None, 0, "0") else value

    @field_validator("pinned_models", mode="before")
    @classmethod
    def _name_list(cls, value: object) -> object:
        return _listed(value)

    @field_validator("host_step_modules", mode="before")
    @classmethod
    def _module_list(cls, value: object) -> object:
        value = _listed(value)
        if isinstance(value, list):
            names = value
            for name in names:
                if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
                    raise ValueError(f"{name!r} is not a module name (dotted identifiers)")
            return names
        return value

    def worker_count(self) -> int:
        """``workers``, or the cores this process may use (its CPU affinity) when unset."""
        if self.workers is not None:
            return self.workers
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    def management_exposed_without_token(self) -> bool:
        """True when management would be reachable from outside with no token."""
        return self.admin_token is None and not self.is_loopback


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listed(value: object) -> object:
    """A JSON list or comma-separated names as a list of names (blanks dropped)."""
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else text.split(",")
    if isinstance(value, list | tuple):
        names = [v.strip() if isinstance(v, str) else v for v in value]
        return [v for v in names if v != ""]
    return value
