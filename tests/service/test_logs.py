import io
import logging

import orjson

from service import logs
from service.middleware import request_id_var


def test_json_lines_carry_request_id_and_extra_fields() -> None:
    logs.configure("info", "json")
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    token = request_id_var.set("req-42")
    try:
        logging.getLogger("kestrel.test").info("compiled %s", "g", extra={"cause": "warmup"})
    finally:
        request_id_var.reset(token)
        logs.configure("warning", "text")
    doc = orjson.loads(stream.getvalue().splitlines()[-1])
    assert doc["message"] == "compiled g" and doc["level"] == "info"
    assert doc["request_id"] == "req-42" and doc["cause"] == "warmup"
    assert doc["ts"].endswith("Z")


def test_text_lines_name_the_request() -> None:
    logs.configure("info", "text")
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    token = request_id_var.set("abc")
    try:
        logging.getLogger("kestrel.test").warning("hello")
    finally:
        request_id_var.reset(token)
        logs.configure("warning", "text")
    assert "[abc] hello" in stream.getvalue()


def test_jax_platform_probing_stays_out_of_the_log() -> None:
    """JAX's info line for each platform it does not find (a TPU, on every machine without one)
    was the first line of every server log."""
    logs.configure("info")
    probe = logging.getLogger("jax._src.xla_bridge")
    assert not probe.isEnabledFor(logging.INFO) and probe.isEnabledFor(logging.WARNING)
    logs.configure("debug")
    assert probe.isEnabledFor(logging.DEBUG)
    logs.configure("info")
