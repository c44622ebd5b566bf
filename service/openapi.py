"""What the OpenAPI document says about responses and raw request bodies.

Routes return ready-made ``Response`` objects (the hot path skips FastAPI's serialisation), so
FastAPI cannot infer what they send. The models and tables here document it instead: every status
a route can answer, with the body and content type it carries, and the request bodies the routes
read by hand (scoring rows, v2 tensors). They are documentation only: nothing here runs per
request. ``tests/service/test_fuzz.py`` holds the server to this document.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from service import codecs

# -- error bodies --------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable code, e.g. 'queue_full'")
    message: str = Field(description="what was wrong, naming the field or limit")
    request_id: str | None = Field(None, description="the X-Request-ID of the request")


class ErrorBody(BaseModel):
    """Every native route's error: ``{"error": {"code", "message", "request_id"}}``."""

    error: ErrorDetail


class V2ErrorBody(BaseModel):
    """The Open Inference Protocol's error shape, used by every ``/v2`` route."""

    error: str


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed request: bad JSON, empty body, bad header or field (the message names it)",
    401: "A token is required and none was sent",
    403: "The token sent is not valid for this route, or the upload is not allowed",
    404: "No such model or version, or no such route",
    405: "The route does not accept this method",
    409: "Conflict: the version already exists (registration), or the model version FAILED or, "
    "asked for by number, was replaced (RETIRED), so a retry cannot help (the message says why)",
    413: "The body exceeds the route's limit (one without Content-Length as soon as it crosses "
    "it; the connection is then closed), or the request has more rows than the queue holds",
    415: "Unsupported Content-Type",
    422: "Well-formed request that the model (or the registration) cannot accept",
    429: "Too many requests (model queue full, or server at its in-flight limit): retry after "
    "Retry-After seconds",
    503: "The model version is not ready yet (loading, shutting down, or a stored version this "
    "replica failed to load and retries): retry after Retry-After seconds",
    504: "The request's deadline passed before it was computed",
}
_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "seconds to wait before retrying",
            "required": True,
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    503: {
        "Retry-After": {
            "description": "seconds to wait before retrying",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}

# Status groups shared by routes (each route adds what only it can answer).
AUTH = (401, 403)
SCORING = (400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504)
V2_INFER = (400, 401, 403, 404, 409, 413, 422, 429, 503, 504)


def errors(*statuses: int, v2: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for error statuses, in the native or the v2 error shape."""
    model = V2ErrorBody if v2 else ErrorBody
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": model, "description": ERROR_DESCRIPTIONS[status]}
        if status in _ERROR_HEADERS:
            entry["headers"] = _ERROR_HEADERS[status]
        out[status] = entry
    return out


def ok(model: type[BaseModel], description: str = "Success") -> dict[int | str, dict[str, Any]]:
    """A ``200`` entry whose JSON body is ``model``."""
    return {200: {"model": model, "description": description}}


# -- health and management bodies ----------------------------------------------------------------


class Health(BaseModel):
    status: str = Field(description="ok, ready, recovering, preloading or failed")
    model: str | None = Field(None, description="the model being preloaded")
    error: str | None = Field(None, description="why preloading failed")


VersionState = Literal["LOADING", "READY", "FAILED", "RETIRED"]


class VersionSummary(BaseModel):
    version: str
    state: VersionState


class ModelSummary(BaseModel):
    name: str
    current: str | None = Field(description="the version serving requests, if any")
    versions: list[VersionSummary]


class ModelList(BaseModel):
    models: list[ModelSummary]


class LoadProgress(BaseModel):
    phase: Literal["queued", "compiling", "parity", "storing", "replicating"] = Field(
        description="waiting for the loader, compiling (and warming up) buckets, checking "
        "parity, storing the upload, or (kestrel serve --workers) serving in the worker that "
        "stored it while the other workers load it"
    )
    buckets_done: int = Field(description="buckets compiled (or loaded) and warmed up so far")
    buckets_total: int | None = Field(description="buckets to warm up; null until known")


class VersionDescription(BaseModel):
    """One version: state, options, parity result and, once compiled, its input schema."""

    model_config = ConfigDict(extra="allow")

    name: str
    version: str
    state: VersionState
    format: str
    filename: str
    created: float = Field(description="Unix time of the registration")
    options: dict[str, Any]
    framework: dict[str, str]
    parity: dict[str, Any] | None
    load_seconds: float | None = Field(
        description="registration (or reload) to READY or FAILED, the wait for the loader included"
    )
    load_phases: dict[str, float] = Field(
        description="seconds of each phase on the loader thread: read, trace, buckets, parity, store"
    )
    error: str | None = Field(None, description="why the version FAILED")
    failed_loads: int | None = None
    progress: LoadProgress | None = Field(None, description="while LOADING: how far it has got")
    input_schema: dict[str, Any] | None = Field(None, alias="schema")
    report: dict[str, Any] | None = None
    methods: list[str] | None = None
    buckets: list[int] | None = Field(None, description="the batch sizes compiled")
    classes: list[Any] | None = None


class CurrentChange(BaseModel):
    """One change of a model's current version."""

    action: Literal["register", "promote", "rollback", "delete"]
    from_: str | None = Field(alias="from", description="the version current before")
    to: str = Field(description="the version current after")
    by: str = Field(description="who: the x-kestrel-actor header, else the client's address")
    at: float = Field(description="Unix time")


class ModelDescription(BaseModel):
    name: str
    current: str | None
    versions: list[VersionDescription]
    history: list[CurrentChange] = Field(description="changes of the current version, oldest first")
    aliases: dict[str, str] = Field(description="alias → the version it names")
    traffic: dict[str, float] = Field(
        description="version → weight of unversioned requests ({}: all to the current version)"
    )
    shadow: Shadow | None = Field(description="where live requests are mirrored, if anywhere")


class ShadowRuleDoc(BaseModel):
    after_rows: int = Field(description="rows compared on one replica before promoting, >= 1")
    max_label_disagreement: float = Field(
        0.0, description="the share of rows whose label may differ, at most, in [0, 1]"
    )
    max_abs_diff: float | None = Field(
        None, description="the largest |Δ| of a numeric output allowed (null: not checked)"
    )


class Shadow(BaseModel):
    version: str = Field(description="the version live requests are mirrored to")
    share: float = Field(description="the share of requests mirrored, in (0, 1]")
    rule: ShadowRuleDoc | None = Field(
        None,
        description="promote the shadow once it agreed on after_rows rows; stop mirroring to "
        "it as soon as it cannot",
    )


class ShadowAnswer(BaseModel):
    name: str
    shadow: Shadow | None


class TrafficAnswer(BaseModel):
    name: str
    weights: dict[str, float] = Field(description="version → weight ({}: all to the current one)")


class AliasAnswer(BaseModel):
    name: str
    alias: str
    version: str = Field(description="the version the alias names now")


class CurrentChangeAnswer(BaseModel):
    """The answer of a promotion or rollback: the version serving before and now."""

    name: str
    previous: str | None
    current: str
    change: CurrentChange | None = Field(description="the change recorded (None: none was needed)")


# -- native scoring ------------------------------------------------------------------------------


class Prediction(BaseModel):
    model: str
    version: str = Field(description="the version that computed every row of this response")
    rows: int
    outputs: dict[str, list[Any]] = Field(
        description="one list per output (method), row order; 'contributions': per row, each "
        "input column and 'bias' to its contribution (a list of one per class where the model "
        "has several raw outputs)"
    )
    contribution_outputs: list[Any] | None = Field(
        None,
        description="with 'contributions' of several raw outputs: their class labels, in order",
    )
    warnings: list[str] | None = Field(
        None, description="what was scored past: columns the model does not read"
    )


_ROWS: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "description": "rows: objects keyed by column, or arrays in the schema's column order",
    "items": {"anyOf": [{"type": "object"}, {"type": "array"}]},
}
_OUTPUTS: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string"},
    "description": "the outputs (methods) to return; all by default. 'contributions': each "
    'row\'s per-column contributions (a version registered with options {"explain": true})',
}


_PREDICT_OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "rows": _ROWS,
        "instances": _ROWS,
        "columns": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "array"},
            "description": "{column: [values]}",
        },
        "outputs": _OUTPUTS,
    },
    # Exactly one of the three keys carries the rows.
    "oneOf": [{"required": [key]} for key in ("rows", "columns", "instances")],
}
_BINARY: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}

_STRICT_COLUMNS: dict[str, Any] = {
    "name": "strict_columns",
    "in": "query",
    "required": False,
    "description": "refuse (422) a request with columns the model does not read, naming them; "
    "default: the server's KESTREL_STRICT_COLUMNS (off: scored, and named in the "
    f"{codecs.IGNORED_COLUMNS_HEADER} header)",
    "schema": {"type": "boolean"},
}
_IGNORED_COLUMNS: dict[str, Any] = {
    codecs.IGNORED_COLUMNS_HEADER: {
        "description": "columns of the request the model does not read (scored past them): "
        "comma-separated, each percent-encoded, as many as fit in 1024 characters",
        "schema": {"type": "string"},
    }
}
PREDICTION_OK: dict[int | str, dict[str, Any]] = {
    200: {"model": Prediction, "description": "Success", "headers": _IGNORED_COLUMNS}
}

PREDICT_EXTRA: dict[str, Any] = {
    "parameters": [
        {
            "name": "x-kestrel-timeout-ms",
            "in": "header",
            "required": False,
            "description": "deadline in milliseconds; past it the request is answered 504",
            "schema": {"type": "number", "exclusiveMinimum": 0},
        },
        {
            "name": "outputs",
            "in": "query",
            "required": False,
            "description": "comma-separated outputs (methods, or contributions) to return",
            "schema": {"type": "string"},
        },
        _STRICT_COLUMNS,
    ],
    "requestBody": {
        "required": True,
        "content": {
            codecs.JSON: {"schema": {"anyOf": [_ROWS, _PREDICT_OBJECT]}},
            codecs.ARROW_STREAM: _BINARY,
            codecs.ARROW_FILE: _BINARY,
            codecs.NPY: _BINARY,
        },
    },
}

# -- Open Inference Protocol v2 ------------------------------------------------------------------

V2_DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1: the batch dimension, any number of rows")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = Field(
        None,
        description="absent when sent as binary data; a float tensor's NaN and ±inf are the "
        "tokens NaN, Infinity and -Infinity, as Triton writes them",
    )
    parameters: dict[str, Any] | None = Field(
        None, description="binary_data_size; for contributions, their columns (and outputs)"
    )


class InferResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class RepositoryEntry(BaseModel):
    name: str
    version: str
    state: VersionState
    reason: str | None = None


class Empty(BaseModel):
    """``{}``: the protocol's answer to a repository load or unload."""


_TENSOR_IN: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"enum": V2_DATATYPES},
        "data": {
            "type": "array",
            "description": "the values in row-major order; a float tensor's NaN and ±inf may be "
            "the bare tokens NaN, Infinity and -Infinity, as tritonclient writes them",
        },
        "parameters": {
            "type": "object",
            "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
        },
    },
}
_INFER_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "properties": {
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "deadline in microseconds",
                },
                "binary_data_output": {"type": "boolean"},
            },
        },
        "inputs": {"type": "array", "minItems": 1, "items": _TENSOR_IN},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "parameters": {
                        "type": "object",
                        "properties": {"binary_data": {"type": "boolean"}},
                    },
                },
            },
        },
    },
}
_HEADER_LENGTH_DOC = "bytes of JSON header before the binary tensor data (binary extension)"

INFER_EXTRA: dict[str, Any] = {
    "parameters": [
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "description": _HEADER_LENGTH_DOC,
            "schema": {"type": "integer", "minimum": 1},
        },
        _STRICT_COLUMNS,
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _INFER_REQUEST},
            "application/octet-stream": _BINARY,
        },
    },
}
INFER_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "model": InferResponse,
        "description": "Outputs; binary outputs follow the JSON header (octet-stream)",
        "content": {"application/octet-stream": _BINARY},
        "headers": {
            "Inference-Header-Content-Length": {
                "description": _HEADER_LENGTH_DOC,
                "schema": {"type": "integer"},
            },
            **_IGNORED_COLUMNS,
        },
    }
}


# -- the document as a whole ---------------------------------------------------------------------
_VALIDATION_REF = "#/components/schemas/HTTPValidationError"


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` describe request-validation errors as the service sends them.

    FastAPI documents them as its own ``HTTPValidationError`` (``{"detail": [...]}``), but the
    service's handler answers ``422`` in its error shape (the v2 one under ``/v2``).
    """
    generate = app.openapi

    def document() -> dict[str, Any]:
        schema = generate()  # FastAPI caches it: the rewrite below runs once
        schemas = schema.get("components", {}).get("schemas", {})
        if schemas.pop("HTTPValidationError", None) is None:
            return schema
        schemas.pop("ValidationError", None)
        for path, operations in schema["paths"].items():
            model = V2ErrorBody if path.startswith("/v2") else ErrorBody
            for operation in operations.values():
                response = operation.get("responses", {}).get("422")
                content = (response or {}).get("content", {}).get("application/json", {})
                if content.get("schema", {}).get("$ref") == _VALIDATION_REF:
                    content["schema"] = {"$ref": f"#/components/schemas/{model.__name__}"}
                    response["description"] = ERROR_DESCRIPTIONS[422]
        return schema

    app.openapi = document  # type: ignore[method-assign]
