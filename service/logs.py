"""Logging setup: plain text for a terminal, one JSON object per line for a log pipeline.

Every record carries the request id of the request being handled (from a context variable), and
whatever ``extra`` fields the caller attached (model, version, cause, status, …).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from service.middleware import request_id_var

# Attributes every LogRecord has; anything else was passed as ``extra`` and is worth emitting.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value is not None:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure(level: str = "info", fmt: str = "text") -> None:
    """Route the root logger (and uvicorn's) to stderr in ``fmt``; idempotent."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # The middleware logs each request with its id and latency; uvicorn's access log repeats it.
    logging.getLogger("uvicorn.access").disabled = True
    # Access lines are debug-level chatter at high request rates.
    logging.getLogger("kestrel.access").setLevel(
        logging.DEBUG if level == "debug" else logging.WARNING
    )
    # JAX reports at info level each platform it probes and does not find ("Unable to
    # initialize backend 'tpu'" on every machine without one): noise at the top of every log.
    # Its warnings (a device that fails) still show.
    logging.getLogger("jax").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
