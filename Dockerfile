# syntax=docker/dockerfile:1
#
# Kestrel: one `kestrel serve` process (one uvicorn worker) per container; scale with replicas.
#
#   docker build -t kestrel .                                  # CPU (XLA on the host CPU)
#   docker build -t kestrel:cuda --build-arg ACCELERATOR=cuda12 .   # CUDA 12 jax (NVIDIA GPUs)
#   docker run -p 8000:8000 -p 8081:8081 -e KESTREL_ADMIN_TOKEN=change-me kestrel
#
# The server binds 0.0.0.0 and therefore refuses to start without KESTREL_ADMIN_TOKEN (model
# management would be open to anyone who reaches the port); pass it with -e or a secret. Every
# other setting is a KESTREL_* variable (README "Serving"). The model store defaults to the
# /var/lib/kestrel/store volume (set KESTREL_STORE_URL=s3://bucket/prefix and
# KESTREL_STORE_OPTIONS for S3); compiled executables go to the /var/cache/kestrel volume, which
# makes restarts load instead of compile. Only mount a cache directory you trust: loading an
# executable runs code.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --------------------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder

# cpu: jax's CPU wheels; cuda12: jax[cuda12] (CUDA 12 plugin and NVIDIA libraries from PyPI).
ARG ACCELERATOR=cpu

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# Only what the package build reads (see .dockerignore): a test or docs edit keeps the layer.
COPY pyproject.toml README.md ./
COPY lazy ./lazy
COPY compiler ./compiler
COPY service ./service

# The package from /src (version ranges in pyproject.toml) with its boosting and s3 extras: not
# the test extra, and no torch (the service runs on the JAX backend). jax[cuda12] goes into the
# same resolver run, so it pins the jax the CPU build would.
RUN if [ "$ACCELERATOR" = cpu ]; then \
        pip install --no-cache-dir "/src[boosting,s3]"; \
    elif [ "$ACCELERATOR" = cuda12 ]; then \
        pip install --no-cache-dir "/src[boosting,s3]" "jax[cuda12]>=0.10"; \
    else \
        echo "ACCELERATOR must be cpu or cuda12, got '$ACCELERATOR'" >&2; exit 1; \
    fi \
    && kestrel --help >/dev/null

# --------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

# LightGBM's wheel links the system OpenMP runtime (slim images lack it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 kestrel \
    && useradd --system --uid 10001 --gid kestrel --create-home --home-dir /home/kestrel \
        --shell /usr/sbin/nologin kestrel \
    && mkdir -p /var/lib/kestrel/store /var/cache/kestrel \
    && chown -R kestrel:kestrel /var/lib/kestrel /var/cache/kestrel

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KESTREL_PORT=8000 \
    KESTREL_STORE_URL=/var/lib/kestrel/store \
    KESTREL_CACHE_DIR=/var/cache/kestrel \
    KESTREL_LOG_FORMAT=json

VOLUME ["/var/lib/kestrel/store", "/var/cache/kestrel"]

USER 10001:10001
WORKDIR /home/kestrel
# HTTP, and the Open Inference Protocol v2 over gRPC (KESTREL_GRPC_PORT; 0 turns it off).
EXPOSE 8000 8081

# Liveness only (the process answers); readiness is /readyz, for orchestrators that route traffic.
# No curl in the slim image: the standard library does the request.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KESTREL_PORT', '8000'), timeout=2)"]

# Exec form: kestrel is PID 1 and gets SIGTERM directly (graceful drain of queued requests).
CMD ["kestrel", "serve", "--host", "0.0.0.0"]
