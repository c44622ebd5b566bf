"""Open Inference Protocol v2 (KServe / Triton HTTP), with Triton's binary tensor extension.

Inputs map to the model's schema in one of two ways: a single 2-D tensor ``[rows, columns]``
(numeric models; any input name), or one tensor per schema column named after it (``[rows]`` or
``[rows, 1]``; BYTES for string categories). Outputs are the model's methods (``predict``,
``predict_proba``, …); the model metadata states each one's shape and datatype from the compiled
model (:attr:`compiler.CompiledModel.output_specs`). In JSON tensors, a float's NaN and ±inf are
the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``, both ways, as tritonclient and Triton
write them. A request's ``parameters.timeout`` (microseconds, as tritonclient sends it) is its
deadline. The model-repository extension's index / load / unload act on this process's
loaded versions; the store is changed only by the management API.
"""

from __future__ import annotations

import math
import struct
import time
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from compiler import InputSchema
from compiler.schema import describe_mismatch
from service import codecs, openapi
from service.errors import BadRequest, InvalidInput, NotFound
from service.models import ModelManager
from service.parity import side_by_side
from service.settings import Settings
from service.versions import ModelVersion, State
from service.web import ROUTE_KEY_HEADER, json_response, query_flag, read_body

HEADER_LENGTH = "inference-header-content-length"
EMPTY_BATCH = "the input tensors hold an empty batch: send at least one row"

# OIP datatype ↔ numpy dtype (BYTES is variable-length: handled apart).
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def datatype_of(array: np.ndarray) -> str:
    return datatype_for(array.dtype)


def datatype_for(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "OUS":
        return "BYTES"
    try:
        return _NAMES[dtype]
    except KeyError:
        raise BadRequest(f"cannot express dtype {dtype} in the v2 protocol") from None


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
    name = spec.get("name")
    shape, datatype = spec.get("shape"), spec.get("datatype")
    if not isinstance(name, str):
        raise BadRequest("every input needs a string 'name'")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of non-negative integers")
    if datatype != "BYTES" and datatype not in _DTYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow int64
    if binary is not None:
        if datatype == "BYTES":
            values = _unpack_bytes(binary, name)
            array = np.asarray(values, dtype=object)
        else:
            dtype = _DTYPES[datatype]
            if len(binary) != count * dtype.itemsize:
                raise BadRequest(
                    f"input {name!r}: {len(binary)} bytes of binary data, expected "
                    f"{count * dtype.itemsize} for shape {shape} {datatype}"
                )
            array = np.frombuffer(binary, dtype=dtype)
    else:
        data = spec.get("data")
        if data is None:
            raise BadRequest(f"input {name!r} has neither 'data' nor binary data")
        flat = np.asarray(data, dtype=object).ravel()
        if datatype == "BYTES":
            array = np.asarray([_text(v, name) for v in flat.tolist()], dtype=object)
        else:
            try:
                array = flat.astype(_DTYPES[datatype])
            except (TypeError, ValueError, OverflowError):  # e.g. 2**70 as INT64
                raise BadRequest(f"input {name!r}: 'data' is not all {datatype}") from None
    if array.size != count:
        raise BadRequest(f"input {name!r}: {array.size} values for shape {shape}")
    return array.reshape(shape)


def _text(value: Any, name: str) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise BadRequest(f"input {name!r}: BYTES data must be strings")


def _unpack_bytes(buffer: bytes, name: str) -> list[str]:
    out, offset = [], 0
    while offset < len(buffer):
        if offset + 4 > len(buffer):
            raise BadRequest(f"input {name!r}: truncated BYTES element length")
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + length > len(buffer):
            raise BadRequest(f"input {name!r}: BYTES element longer than the data")
        out.append(buffer[offset : offset + length].decode("utf-8", "replace"))
        offset += length
    return out


def _pack_bytes(array: np.ndarray) -> bytes:
    parts = []
    for value in array.ravel().tolist():
        data = value if isinstance(value, bytes) else str(value).encode()
        parts.append(struct.pack("<I", len(data)) + data)
    return b"".join(parts)


def rows_from_inputs(inputs: dict[str, np.ndarray], mv: ModelVersion) -> Any:
    """v2 input tensors → rows the model's schema accepts (a matrix, or columns by name, then
    any tensors naming no column, which the model does not read)."""
    assert mv.model is not None
    schema_columns = mv.model.schema.columns
    if len(inputs) == 1:  # the common request: one [rows, columns] tensor (no name list built)
        (array,) = inputs.values()
        if (
            array.ndim == 2
            and array.shape[1] == len(schema_columns)
            and not (len(schema_columns) == 1 and next(iter(inputs)) == schema_columns[0].name)
        ):
            if not len(array):
                raise BadRequest(EMPTY_BATCH)
            return array
    names = [c.name for c in schema_columns]
    missing = [n for n in names if n not in inputs]
    if missing:
        known = set(names)
        unknown = [k for k in inputs if k not in known]
        raise InvalidInput(
            f"inputs {sorted(inputs)[:10]} do not match the model: send one [rows, {len(names)}] "
            f"tensor or one tensor per column; {describe_mismatch(missing, unknown)}"
        )
    columns: dict[str, np.ndarray] = {}
    lengths = set()
    for n in names:
        a = inputs[n]
        if a.ndim == 2 and a.shape[1] == 1:
            a = a[:, 0]
        if a.ndim != 1:
            raise InvalidInput(
                f"input {n!r}: expected shape [rows] or [rows, 1], got {list(a.shape)}"
            )
        columns[n] = a
        lengths.add(len(a))
    if len(lengths) > 1:
        raise InvalidInput(f"column inputs have different lengths: {sorted(lengths)}")
    if lengths == {0}:
        raise BadRequest(EMPTY_BATCH)
    if len(inputs) > len(names):  # tensors naming no column: passed on, for scoring to report
        columns.update((k, a) for k, a in inputs.items() if k not in columns)
    return columns


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
    timeout = _object(doc, "parameters", "the request").get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise BadRequest("'parameters.timeout' must be a positive number of microseconds")
    return time.monotonic() + timeout / 1e6


def _outputs_requested(
    doc: dict[str, Any], mv: ModelVersion
) -> tuple[tuple[str, ...], set[str], bool]:
    assert mv.model is not None
    params = _object(doc, "parameters", "the request")
    binary_all = bool(params.get("binary_data_output", False))
    requested = doc.get("outputs")
    if requested is None:
        return tuple(mv.model.methods), set(mv.model.methods) if binary_all else set(), binary_all
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
    doc: dict[str, Any], mv: ModelVersion, outputs: dict[str, np.ndarray], binary: set[str]
) -> Response:
    tensors, blobs = [], []
    for name, value in outputs.items():
        array = side_by_side(value)  # a per-target list becomes one [rows, Σk] tensor
        datatype = datatype_of(array)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in binary:
            data = (
                _pack_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
            )
            tensor["parameters"] = {"binary_data_size": len(data)}
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


def metadata(mv: ModelVersion, versions: list[str]) -> dict[str, Any]:
    if mv.model is None:
        return {
            "name": mv.name,
            "versions": versions,
            "platform": "kestrel",
            "inputs": [],
            "outputs": [],
        }
    model = mv.model
    schema = model.schema
    numeric = datatype_for(np.dtype(model.traced.input_dtype))  # what the model reads
    if schema.vocabularies or schema.named:
        inputs = [
            {"name": c.name, "datatype": _column_datatype(schema, j, numeric), "shape": [-1]}
            for j, c in enumerate(schema.columns)
        ]
    else:
        inputs = [{"name": "input", "datatype": numeric, "shape": [-1, len(schema.columns)]}]
    # As render_outputs writes the answer: a list-valued head side by side, as one tensor.
    outputs = [
        {"name": method, "datatype": datatype_for(spec.dtype), "shape": [-1, *spec.shape]}
        for method, spec in model.output_specs.items()
    ]
    return {
        "name": mv.name,
        "versions": versions,
        "platform": "kestrel",
        "inputs": inputs,
        "outputs": outputs,
    }


def _column_datatype(schema: InputSchema, column: int, numeric: str) -> str:
    """The datatype of one column's tensor: a category column's is its categories' (strings:
    BYTES; numbers as such), any other's the model's numeric input type."""
    vocabulary = schema.vocabularies.get(column)
    if vocabulary is None:
        return numeric
    present = [c for c in vocabulary.categories if not _is_missing(c)]
    kind = np.asarray(present).dtype.kind if present else "U"
    return {"b": "BOOL", "i": "INT64", "u": "INT64", "f": "FP64"}.get(kind, "BYTES")


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def add_v2_routes(app: FastAPI, manager: ModelManager, settings: Settings) -> None:
    @app.get(
        "/v2", tags=["v2"], summary="Server metadata", responses=openapi.ok(openapi.ServerMetadata)
    )
    async def server_metadata() -> Response:
        return json_response(
            {
                "name": "kestrel",
                "version": app.version,
                "extensions": ["binary_tensor_data", "model_repository"],
            }
        )

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
        mv = manager.answering(name, version)
        if mv.state is State.FAILED:  # as infer answers (a version that failed has no inputs)
            raise manager.not_serving(mv)
        versions = [v.version for v in manager.versions(name)]
        return json_response(metadata(mv, versions))

    async def model_ready(request: Request, name: str, version: str | None) -> Response:
        try:
            mv = manager.answering(name, version)
        except NotFound:
            return json_response({"name": name, "ready": False}, 404)
        ok = mv.state is State.READY
        status = 200 if ok else manager.not_serving(mv).status  # FAILED: 409, as infer answers
        return json_response({"name": name, "ready": ok}, status)

    async def infer(request: Request, name: str, version: str | None) -> Response:
        body = await read_body(request)
        doc, tail = split_body(body, _header(request.scope, _HEADER_LENGTH))
        deadline = parse_deadline(doc)
        # One version for the whole request where traffic is split (the inputs are read by its
        # schema).
        version = manager.route(name, version, _header(request.scope, _ROUTE_KEY))
        mv = manager.serving(name, version)
        inputs = parse_inputs(doc, tail)
        names, binary, _ = _outputs_requested(doc, mv)
        rows = rows_from_inputs(inputs, mv)
        strict = settings.strict_columns
        if request.scope["query_string"]:
            strict = query_flag(request.query_params, "strict_columns", strict)
        result = await manager.predict(
            name, version, rows, outputs=names, deadline=deadline, strict_columns=strict
        )
        t0 = time.perf_counter()
        response = render_outputs(doc, result.version, result.outputs, binary)
        if result.ignored:
            header = codecs.ignored_columns_header(result.ignored)
            response.headers[codecs.IGNORED_COLUMNS_HEADER] = header
        metrics = manager.metrics
        metrics.child(metrics.codec_seconds, name, result.version.version, "encode").observe(
            result.decode_s + time.perf_counter() - t0
        )
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
        entries = []
        for name in manager.names():
            for v in manager.versions(name):
                entry = {"name": name, "version": v.version, "state": v.state.value}
                if v.error:
                    entry["reason"] = v.error
                entries.append(entry)
        return json_response(entries)

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
        await manager.sync(force=True)
        mv = manager.lookup(name)
        await manager.wait(mv, settings.register_wait_s)
        if mv.state is not State.READY:
            raise InvalidInput(f"model {name!r} is {mv.state.value}: {mv.error or ''}")
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
