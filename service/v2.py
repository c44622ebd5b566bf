"""Open Inference Protocol v2 (KServe / Triton HTTP), with Triton's binary tensor extension.

Inputs map to the model's schema in one of two ways: a single 2-D tensor ``[rows, columns]``
(numeric models; any input name), or one tensor per schema column named after it (``[rows]`` or
``[rows, 1]``; BYTES for string categories). Outputs are the model's methods (``predict``,
``predict_proba``, …); the model metadata states each one's shape and datatype from the compiled
model (:attr:`compiler.CompiledModel.output_specs`). A version registered with
``{"explain": true}`` also answers ``contributions`` when asked: FP64 ``[rows, columns + 1]``
(or ``[rows, columns + 1, classes]``), its ``parameters`` naming the columns (then ``bias``).
In JSON tensors, a float's NaN and ±inf are the bare tokens ``NaN``, ``Infinity`` and
``-Infinity``, both ways, as tritonclient and Triton write them. A request's
``parameters.timeout`` (microseconds, as tritonclient sends it) is its deadline. The
model-repository extension's index / load / unload act on this process's loaded versions; the store is changed only by the management API. What is not JSON or HTTP
(tensors, metadata, readiness, one inference) is :mod:`service.oip`'s, shared with gRPC.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from service import codecs, oip, openapi
from service.errors import BadRequest
from service.models import ModelManager
from service.parity import side_by_side
from service.scoring import CONTRIBUTIONS, Explained
from service.settings import Settings
from service.versions import ModelVersion
from service.web import ROUTE_KEY_HEADER, json_response, query_flag, read_body

HEADER_LENGTH = "inference-header-content-length"


# -- JSON as tritonclient writes and reads it ----------------------------------------------------
def parse_json(data: bytes) -> Any:
    """An inference request's JSON: tritonclient writes a float tensor's NaN and ±inf as the
    bare tokens ``NaN``, ``Infinity`` and ``-Infinity``."""
    try:
        return codecs.loads(data, allow_nan=True)
    except ValueError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


def _json_floats(values: np.ndarray) -> Any:
    """A flat float tensor's ``data``, with NaN and ±inf written as the tokens ``NaN``,
    ``Infinity`` and ``-Infinity``, as Triton writes them and tritonclient (rapidjson) reads
    them; orjson writes them as ``null``, which a client reads back as NaN, losing an
    infinity."""
    if math.isfinite(values.sum()):  # any NaN or inf makes the sum NaN or inf
        return values
    special = values[~np.isfinite(values)]
    if not special.size:  # the sum overflowed: every value is finite
        return values
    # orjson writes nothing else in a float array as null: its nulls are these, in order.
    pieces = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).split(b"null")
    tokens = np.where(np.isnan(special), b"NaN", np.where(special > 0, b"Infinity", b"-Infinity"))
    joined: list[bytes] = [b""] * (2 * len(pieces) - 1)
    joined[::2], joined[1::2] = pieces, tokens.tolist()
    return orjson.Fragment(b"".join(joined))


# -- tensors in ----------------------------------------------------------------------------------
def _tensor(spec: dict[str, Any], binary: bytes | None) -> np.ndarray:
    name, shape, datatype = spec.get("name"), spec.get("shape"), spec.get("datatype")
    if binary is not None:
        return oip.tensor_from_bytes(name, shape, datatype, binary)  # type: ignore[arg-type]
    oip.check_tensor(name, shape, datatype)
    data = spec.get("data")
    if data is None:
        raise BadRequest(f"input {name!r} has neither 'data' nor binary data")
    return oip.tensor_from_values(name, shape, datatype, data)


_HEADER_LENGTH = HEADER_LENGTH.encode()
_ROUTE_KEY = ROUTE_KEY_HEADER.encode()


def _header(scope: Any, key: bytes) -> str | None:
    """The first value of header ``key`` (lower-case bytes), as ``request.headers.get`` gives it,
    without building Starlette's ``Headers`` for the one header an inference request reads."""
    for name, value in scope["headers"]:
        if name == key:
            return value.decode("latin-1")
    return None


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        doc = parse_json(body)
        tail = b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} must be an integer") from None
        if not 0 < n <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} {n} is outside the body of {len(body)} bytes")
        doc, tail = parse_json(body[:n]), body[n:]
    if not isinstance(doc, dict):
        raise BadRequest("the inference request must be a JSON object")
    if doc.get("id") is not None and not isinstance(doc["id"], str):  # echoed in the response
        raise BadRequest(f"'id' must be a string, got {type(doc['id']).__name__}")
    return doc, tail


def parse_inputs(doc: dict[str, Any], tail: bytes) -> dict[str, np.ndarray]:
    specs = doc.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        if not isinstance(spec, dict):
            raise BadRequest("each input must be an object")
        size = _object(spec, "parameters", f"input {spec.get('name')!r}").get("binary_data_size")
        binary = None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(tail):
                raise BadRequest(f"input {spec.get('name')!r}: bad binary_data_size {size!r}")
            binary, offset = tail[offset : offset + size], offset + size
        array = _tensor(spec, binary)
        if spec["name"] in inputs:
            raise BadRequest(f"input {spec['name']!r} appears twice")
        inputs[spec["name"]] = array
    if offset != len(tail):
        raise BadRequest(f"{len(tail) - offset} bytes of binary data belong to no input")
    return inputs


def _object(holder: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``holder[key]`` when it is a JSON object ({} when absent or null), else a 400."""
    value = holder.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: {key!r} must be an object, got {type(value).__name__}")
    return value


def parse_deadline(doc: dict[str, Any]) -> float | None:
    return oip.deadline_after(_object(doc, "parameters", "the request").get("timeout"))


def _outputs_requested(doc: dict[str, Any]) -> tuple[tuple[str, ...] | None, set[str], bool]:
    """The outputs asked for (None: every one), those asked for as binary data, and whether
    every output is binary unless it says otherwise (``parameters.binary_data_output``)."""
    params = _object(doc, "parameters", "the request")
    binary_all = bool(params.get("binary_data_output", False))
    requested = doc.get("outputs")
    if requested is None:
        return None, set(), binary_all
    if not isinstance(requested, list):
        raise BadRequest("'outputs' must be a list")
    names, binary = [], set()
    for spec in requested:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest("each requested output needs a 'name'")
        names.append(spec["name"])
        if _object(spec, "parameters", f"output {spec['name']!r}").get("binary_data", binary_all):
            binary.add(spec["name"])
    return tuple(names), binary, binary_all


def render_outputs(
    doc: dict[str, Any],
    mv: ModelVersion,
    outputs: dict[str, np.ndarray],
    binary: set[str],
    explained: Explained | None = None,
) -> Response:
    """The inference response; ``explained`` names the axes of a ``contributions`` output, in
    its ``parameters``."""
    tensors, blobs = [], []
    for name, value in outputs.items():
        array = side_by_side(value)  # a per-target list becomes one [rows, Σk] tensor
        datatype = oip.datatype_of(array)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if explained is not None and name == CONTRIBUTIONS:
            tensor["parameters"] = oip.contribution_parameters(explained)
        if name in binary:
            data = oip.raw_bytes(array, datatype)
            tensor["parameters"] = {**tensor.get("parameters", {}), "binary_data_size": len(data)}
            blobs.append(data)
        elif datatype == "BYTES":
            tensor["data"] = array.ravel().tolist()
        elif array.dtype.kind == "f":
            tensor["data"] = _json_floats(array.ravel())
        else:
            tensor["data"] = array.ravel()
        tensors.append(tensor)
    head: dict[str, Any] = {"model_name": mv.name, "model_version": mv.version, "outputs": tensors}
    if "id" in doc:
        head["id"] = doc["id"]
    header = codecs.encode_json(head)
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def add_v2_routes(app: FastAPI, manager: ModelManager, settings: Settings) -> None:
    @app.get(
        "/v2", tags=["v2"], summary="Server metadata", responses=openapi.ok(openapi.ServerMetadata)
    )
    async def server_metadata() -> Response:
        return json_response(oip.server_metadata(app.version))

    @app.get(
        "/v2/health/live", tags=["v2"], summary="Server live", responses=openapi.ok(openapi.Live)
    )
    async def live() -> Response:
        return json_response({"live": True})

    @app.get(
        "/v2/health/ready",
        tags=["v2"],
        summary="Server ready",
        responses={
            **openapi.ok(openapi.Ready),
            503: {"model": openapi.Ready, "description": "Not ready"},
        },
    )
    async def ready(request: Request) -> Response:
        ok = request.app.state.is_ready()
        return json_response({"ready": ok}, 200 if ok else 503)

    async def model_metadata(request: Request, name: str, version: str | None) -> Response:
        return json_response(await oip.model_metadata(manager, name, version))

    async def model_ready(request: Request, name: str, version: str | None) -> Response:
        status = oip.readiness(manager, name, version)
        return json_response({"name": name, "ready": status == 200}, status)

    async def infer(request: Request, name: str, version: str | None) -> Response:
        body = await read_body(request)
        doc, tail = split_body(body, _header(request.scope, _HEADER_LENGTH))
        names, binary, binary_all = _outputs_requested(doc)
        strict = settings.strict_columns
        if request.scope["query_string"]:
            strict = query_flag(request.query_params, "strict_columns", strict)
        result = await oip.infer(
            manager,
            name,
            version,
            lambda: parse_inputs(doc, tail),
            outputs=names,
            deadline=parse_deadline(doc),
            strict_columns=strict,
            route_key=_header(request.scope, _ROUTE_KEY),
        )
        t0 = time.perf_counter()
        if names is None and binary_all:
            binary = set(result.outputs)
        response = render_outputs(doc, result.version, result.outputs, binary, result.explained)
        if result.ignored:
            header = codecs.ignored_columns_header(result.ignored)
            response.headers[codecs.IGNORED_COLUMNS_HEADER] = header
        oip.record_encode(manager, result, t0)
        return response

    metadata_doc: dict[str, Any] = {
        "tags": ["v2"],
        "responses": {
            **openapi.ok(openapi.ModelMetadata),
            **openapi.errors(*openapi.AUTH, 404, 409, 503, v2=True),
        },
    }
    ready_doc: dict[str, Any] = {
        "tags": ["v2"],
        "responses": {
            **openapi.ok(openapi.ModelReady, "READY"),
            404: {"model": openapi.ModelReady, "description": "No such model or version"},
            409: {"model": openapi.ModelReady, "description": "FAILED: it will not become READY"},
            503: {"model": openapi.ModelReady, "description": "Not READY (yet)"},
            **openapi.errors(*openapi.AUTH, v2=True),
        },
    }
    infer_doc: dict[str, Any] = {
        "tags": ["v2"],
        "responses": {**openapi.INFER_OK, **openapi.errors(*openapi.V2_INFER, v2=True)},
        "openapi_extra": openapi.INFER_EXTRA,
    }

    @app.get("/v2/models/{name}", summary="Model metadata", **metadata_doc)
    async def meta(request: Request, name: str) -> Response:
        return await model_metadata(request, name, None)

    @app.get("/v2/models/{name}/versions/{version}", summary="Version metadata", **metadata_doc)
    async def meta_version(request: Request, name: str, version: str) -> Response:
        return await model_metadata(request, name, version)

    @app.get("/v2/models/{name}/ready", summary="Model ready", **ready_doc)
    async def is_ready(request: Request, name: str) -> Response:
        return await model_ready(request, name, None)

    @app.get("/v2/models/{name}/versions/{version}/ready", summary="Version ready", **ready_doc)
    async def is_ready_version(request: Request, name: str, version: str) -> Response:
        return await model_ready(request, name, version)

    @app.post("/v2/models/{name}/infer", summary="Infer", **infer_doc)
    async def infer_current(request: Request, name: str) -> Response:
        return await infer(request, name, None)

    @app.post("/v2/models/{name}/versions/{version}/infer", summary="Infer (version)", **infer_doc)
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await infer(request, name, version)

    # -- model repository extension (this process's loaded versions) ---------------------------
    @app.post(
        "/v2/repository/index",
        tags=["v2"],
        summary="Repository index",
        responses={
            200: {"model": list[openapi.RepositoryEntry], "description": "Loaded versions"},
            **openapi.errors(*openapi.AUTH, v2=True),
        },
    )
    async def index(request: Request) -> Response:
        return json_response(oip.repository_index(manager))

    @app.post(
        "/v2/repository/models/{name}/load",
        tags=["v2"],
        summary="Load from the store",
        responses={
            **openapi.ok(openapi.Empty, "Loaded and READY"),
            **openapi.errors(*openapi.AUTH, 404, 422, v2=True),
        },
    )
    async def load(request: Request, name: str) -> Response:
        await oip.load(manager, settings, name)
        return json_response({})

    @app.post(
        "/v2/repository/models/{name}/unload",
        tags=["v2"],
        summary="Stop serving",
        responses={
            **openapi.ok(openapi.Empty, "Unloaded"),
            **openapi.errors(*openapi.AUTH, 404, v2=True),
        },
    )
    async def unload(request: Request, name: str) -> Response:
        await manager.unload(name)
        return json_response({})
