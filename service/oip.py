"""The Open Inference Protocol v2 apart from its transports: datatypes, tensors from values or
bytes, the rows a model reads from named tensors, model metadata, readiness, the model-repository
extension, and one inference on the batcher.

HTTP/JSON (:mod:`service.v2`) and gRPC (:mod:`service.grpc_v2`) are thin around these: they
parse their own framing into names, shapes, datatypes and buffers, and render the answer; every
decision about a request is taken here, once, for both.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from compiler import InputSchema
from compiler.schema import describe_mismatch
from service.errors import BadRequest, InvalidInput, NotFound
from service.models import ModelManager
from service.scoring import CONTRIBUTIONS, Explained
from service.settings import Settings
from service.versions import SERVABLE, ModelVersion, Prediction, State

EMPTY_BATCH = "the input tensors hold an empty batch: send at least one row"
EXTENSIONS = ("binary_tensor_data", "model_repository")

# OIP datatype ↔ numpy dtype (BYTES is variable-length: handled apart).
DTYPES: dict[str, np.dtype[Any]] = {
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
_NAMES = {v: k for k, v in DTYPES.items()}


def datatype_of(array: np.ndarray) -> str:
    return datatype_for(array.dtype)


def datatype_for(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "OUS":
        return "BYTES"
    try:
        return _NAMES[dtype]
    except KeyError:
        raise BadRequest(f"cannot express dtype {dtype} in the v2 protocol") from None


# -- tensors in ----------------------------------------------------------------------------------
def check_tensor(name: Any, shape: Any, datatype: Any) -> int:
    """Refuse an input tensor's header that names no tensor, shape or datatype; its element
    count (Python ints: a hostile shape cannot overflow int64)."""
    if not isinstance(name, str):
        raise BadRequest("every input needs a string 'name'")
    if not isinstance(shape, Sequence) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of non-negative integers")
    if datatype != "BYTES" and datatype not in DTYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    return math.prod(shape)


def tensor_from_bytes(name: str, shape: Sequence[int], datatype: str, buffer: bytes) -> np.ndarray:
    """An input tensor from its raw bytes: little-endian elements, or for BYTES each element
    prefixed by its 4-byte little-endian length; the size must be what shape × datatype says."""
    count = check_tensor(name, shape, datatype)
    if datatype == "BYTES":
        array = np.asarray(unpack_bytes(buffer, name), dtype=object)
    else:
        dtype = DTYPES[datatype].newbyteorder("<")
        if len(buffer) != count * dtype.itemsize:
            raise BadRequest(
                f"input {name!r}: {len(buffer)} bytes of binary data, expected "
                f"{count * dtype.itemsize} for shape {list(shape)} {datatype}"
            )
        array = np.frombuffer(buffer, dtype=dtype)
    return _shaped(array, name, shape, count)


def tensor_from_values(name: str, shape: Sequence[int], datatype: str, values: Any) -> np.ndarray:
    """An input tensor from its elements (a JSON ``data`` list, a gRPC typed contents field)."""
    count = check_tensor(name, shape, datatype)
    flat = np.asarray(values, dtype=object).ravel()
    if datatype == "BYTES":
        array = np.asarray([_text(v, name) for v in flat.tolist()], dtype=object)
    else:
        try:
            array = flat.astype(DTYPES[datatype])
        except (TypeError, ValueError, OverflowError):  # e.g. 2**70 as INT64
            raise BadRequest(f"input {name!r}: 'data' is not all {datatype}") from None
    return _shaped(array, name, shape, count)


def _shaped(array: np.ndarray, name: str, shape: Sequence[int], count: int) -> np.ndarray:
    if array.size != count:
        raise BadRequest(f"input {name!r}: {array.size} values for shape {list(shape)}")
    return array.reshape(tuple(shape))


def _text(value: Any, name: str) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise BadRequest(f"input {name!r}: BYTES data must be strings")


def unpack_bytes(buffer: bytes, name: str) -> list[str]:
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


def pack_bytes(array: np.ndarray) -> bytes:
    parts = []
    for value in array.ravel().tolist():
        data = value if isinstance(value, bytes) else str(value).encode()
        parts.append(struct.pack("<I", len(data)) + data)
    return b"".join(parts)


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """An output tensor's raw bytes, as :func:`tensor_from_bytes` reads them."""
    if datatype == "BYTES":
        return pack_bytes(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def deadline_after(timeout_us: Any) -> float | None:
    """A request's ``parameters.timeout`` (microseconds, as tritonclient sends it) as a
    ``time.monotonic()`` deadline."""
    if timeout_us is None:
        return None
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, (int, float)) or timeout_us <= 0:
        raise BadRequest("'parameters.timeout' must be a positive number of microseconds")
    return time.monotonic() + timeout_us / 1e6


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


def contribution_parameters(explained: Explained) -> dict[str, Any]:
    """The parameters of a ``contributions`` output tensor: what its axes after the rows are
    (``columns``: the input columns, then ``bias``; ``outputs``: the class of each raw output,
    where there are several)."""
    params: dict[str, Any] = {"columns": list(explained.columns)}
    if explained.outputs is not None:
        params["outputs"] = explained.outputs
    return params


# -- one inference -------------------------------------------------------------------------------
async def infer(
    manager: ModelManager,
    name: str,
    version: str | None,
    decode: Callable[[], dict[str, np.ndarray]],
    *,
    outputs: tuple[str, ...] | None,
    deadline: float | None,
    strict_columns: bool,
    route_key: str | None,
) -> Prediction:
    """Score the tensors ``decode`` gives on the version that answers: one version for the whole
    request where traffic is split (the inputs are read by its schema), and the tensors decoded
    only once it is known to serve (an unknown model is a 404 whatever they hold)."""
    version = manager.route(name, version, route_key)
    mv = await manager.ensure_loaded(name, version)
    rows = rows_from_inputs(decode(), mv)
    return await manager.predict(
        name, version, rows, outputs=outputs, deadline=deadline, strict_columns=strict_columns
    )


def record_encode(manager: ModelManager, result: Prediction, started: float) -> None:
    """The answer's host time (the outputs' decode and the rendering begun at ``started``)."""
    metrics = manager.metrics
    metrics.child(
        metrics.codec_seconds, result.version.name, result.version.version, "encode"
    ).observe(result.decode_s + time.perf_counter() - started)


# -- metadata, readiness, repository -------------------------------------------------------------
def server_metadata(version: str) -> dict[str, Any]:
    return {"name": "kestrel", "version": version, "extensions": list(EXTENSIONS)}


async def model_metadata(manager: ModelManager, name: str, version: str | None) -> dict[str, Any]:
    mv = manager.answering(name, version)
    if mv.state is State.FAILED:  # as infer answers (a version that failed has no inputs)
        raise manager.not_serving(mv)
    if mv.state is State.UNLOADED:  # its inputs are its compiled model's: load it again
        mv = await manager.ensure_loaded(name, version)
    return metadata(mv, [v.version for v in manager.versions(mv.name)])


def readiness(manager: ModelManager, name: str, version: str | None) -> int:
    """Whether the version a request names serves, as the status infer would answer: 200 READY,
    404 no such model or version, 409 FAILED (it will not become READY), 503 not yet."""
    try:
        mv = manager.answering(name, version)
    except NotFound:
        return 404
    # UNLOADED serves too: its next request loads it again (service.residency).
    return 200 if mv.state in SERVABLE else manager.not_serving(mv).status


def repository_index(manager: ModelManager) -> list[dict[str, str]]:
    """This process's loaded versions and their states (and why one FAILED)."""
    entries = []
    for name in manager.names():
        for v in manager.versions(name):
            entry = {"name": name, "version": v.version, "state": v.state.value}
            if v.error:
                entry["reason"] = v.error
            entries.append(entry)
    return entries


async def load(manager: ModelManager, settings: Settings, name: str) -> None:
    """Load ``name`` from the store and wait until it is READY (else a 422 with why)."""
    await manager.sync(force=True)
    mv = manager.lookup(name)
    await manager.wait(mv, settings.register_wait_s)
    if mv.state is not State.READY:
        raise InvalidInput(f"model {name!r} is {mv.state.value}: {mv.error or ''}")


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
    # As the answers are written: a list-valued head side by side, as one tensor.
    outputs = [
        {"name": method, "datatype": datatype_for(spec.dtype), "shape": [-1, *spec.shape]}
        for method, spec in model.output_specs.items()
    ]
    explanation = model.traced.explanation
    if model.explains and explanation is not None:  # registered with options {"explain": true}
        shape, _ = explanation.output_types()[CONTRIBUTIONS]  # (B, columns + bias, outputs)
        columns, classes = (int(d) for d in shape[1:])
        row = [columns] if classes == 1 else [columns, classes]  # as answered: one output squeezed
        outputs.append({"name": CONTRIBUTIONS, "datatype": "FP64", "shape": [-1, *row]})
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
