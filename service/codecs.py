"""Request bodies → rows the compiler's schema accepts; outputs → response bytes.

The native scoring API takes four encodings, chosen by Content-Type:

- ``application/json``: a list of row objects, a list of row arrays (schema column order), or an
  object with one of ``rows`` / ``columns`` (``{name: [values]}``) / ``instances``, and optionally
  ``outputs``;
- ``application/vnd.apache.arrow.stream`` (or ``.file``): an Arrow IPC table, columns by name;
- ``application/x-npy``: a 2-D numeric ``.npy`` array (object arrays are refused: they unpickle).

Errors name the problem (position of malformed JSON, the field that is missing or of a wrong type).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from compiler.explain import unused_name
from service.errors import BadRequest, UnsupportedMediaType

JSON = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
ARROW_FILE = "application/vnd.apache.arrow.file"
NPY = "application/x-npy"
ACCEPTED = (JSON, ARROW_STREAM, ARROW_FILE, NPY)
_BODY_KEYS = ("rows", "columns", "instances")


@dataclass(frozen=True)
class DecodedRequest:
    data: Any  # list of dict rows, {column: values}, or a 2-D array: what InputSchema.to_feed takes
    rows: int
    outputs: tuple[str, ...] | None


def media_type(content_type: str | None) -> str:
    return (content_type or JSON).split(";", 1)[0].strip().lower() or JSON


def decode_predict(body: bytes, content_type: str | None) -> DecodedRequest:
    """Decode a native ``/predict`` body; raise :class:`BadRequest` naming what is wrong."""
    kind = media_type(content_type)
    if not body:
        raise BadRequest("empty request body; send rows as JSON, Arrow IPC or .npy")
    if kind in (JSON, "text/json") or kind.endswith("+json"):
        return _decode_json(body)
    if kind in (ARROW_STREAM, ARROW_FILE):
        return _decode_arrow(body, stream=kind == ARROW_STREAM)
    if kind == NPY:
        return _decode_npy(body)
    raise UnsupportedMediaType(f"unsupported Content-Type {kind!r}; use one of {list(ACCEPTED)}")


def parse_json(body: bytes) -> Any:
    try:
        return loads(body)
    except ValueError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


def _json_problem(exc: orjson.JSONDecodeError) -> str:
    """orjson's complaint; where it stopped at NaN or Infinity (Python's json writes them), which
    of them, said plainly. Reads only where parsing stopped: no second parse of the body."""
    doc, pos = exc.doc, exc.pos
    for word in ("NaN", "Infinity"):
        if isinstance(doc, str) and doc.startswith(word, pos):
            sign = "-" if doc[pos - 1 : pos] == "-" else ""
            return (
                f"{sign}{word} is not allowed at line {exc.lineno} column "
                f"{exc.colno - len(sign)} (JSON has "
                "no NaN or Infinity; null is a missing value)"
            )
    return str(exc)


def parse_json_field(text: str, field: str, *, allow_nan: bool = False) -> Any:
    """A form field's JSON value; else a 400 naming the field and where its text stops being
    JSON. ``allow_nan``: ``NaN``, ``Infinity`` and ``-Infinity`` are numbers too, as Python's
    json reads them (a sample of real rows has missing values)."""
    try:
        return loads(text, allow_nan=allow_nan)
    except ValueError as exc:
        raise BadRequest(f"field {field!r}: not valid JSON: {exc}") from None


def loads(data: bytes | str, *, allow_nan: bool = False) -> Any:
    """JSON, by orjson; ValueError saying where and why it is not. ``allow_nan``: ``NaN``,
    ``Infinity`` and ``-Infinity`` are numbers too (Python's json and tritonclient write them;
    orjson refuses them): only a text orjson refused that holds one is read again, by the
    standard library, so every other keeps orjson's speed and its error message."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        words = (b"NaN", b"Infinity") if isinstance(data, bytes) else ("NaN", "Infinity")
        if not allow_nan or not any(word in data for word in words):  # type: ignore[operator]
            raise ValueError(_json_problem(exc)) from None
    try:
        doc = json.loads(data.decode() if isinstance(data, bytes) else data)
        # What Python's json takes beyond those tokens and orjson refuses: escaped lone
        # surrogates, which no answer or error message quoting them could encode.
        orjson.dumps(doc)
    except (ValueError, RecursionError, orjson.JSONEncodeError) as exc:
        raise ValueError(str(exc)) from None
    return doc


def dumps_keeping_nan(doc: Any) -> bytes:
    """JSON with NaN and ±Infinity kept as Python's json writes them (orjson writes ``null``):
    a stored sample reads back (:func:`loads` with ``allow_nan``) as it was uploaded."""
    return json.dumps(doc, allow_nan=True, default=_default, separators=(",", ":")).encode()


def _decode_json(body: bytes) -> DecodedRequest:
    doc = parse_json(body)
    outputs = None
    if isinstance(doc, dict):
        outputs = parse_outputs(doc.get("outputs"), field="outputs")
        present = [k for k in _BODY_KEYS if k in doc]
        if len(present) != 1:
            raise BadRequest(
                f"a JSON object body needs exactly one of {list(_BODY_KEYS)}; got keys {sorted(doc)}"
            )
        key = present[0]
        data = doc[key]
        if key == "columns":
            return DecodedRequest(_columns(data), _column_rows(data), outputs)
    elif isinstance(doc, list):
        key, data = "body", doc
    else:
        raise BadRequest(
            f"expected a JSON list of rows or an object with {list(_BODY_KEYS)}, "
            f"got {type(doc).__name__}"
        )
    if not isinstance(data, list):
        raise BadRequest(f"{key!r} must be a list of rows, got {type(data).__name__}")
    if not data:
        raise BadRequest(f"{key!r} is an empty batch: send at least one row")
    first = type(data[0])
    if first not in (dict, list):
        raise BadRequest(f"{key!r}[0] must be a row (object or array), got {first.__name__}")
    for i, row in enumerate(data):
        if type(row) is not first:
            raise BadRequest(
                f"{key!r}[{i}] is a {type(row).__name__}; every row must be a {first.__name__}"
            )
    if first is list:
        matrix = _float_matrix(data)
        if matrix is not None:
            return DecodedRequest(matrix, len(data), outputs)
        widths = {len(r) for r in data}
        if len(widths) > 1:
            bad = next(i for i, r in enumerate(data) if len(r) != len(data[0]))
            raise BadRequest(
                f"{key!r}[{bad}] has {len(data[bad])} values; row 0 has {len(data[0])}"
            )
        _reject_nested(data, key)
    return DecodedRequest(data, len(data), outputs)


def _float_matrix(rows: list[list[Any]]) -> np.ndarray | None:
    """Rows of numbers with at least one float as a float64 matrix, in one C conversion.

    The common body (numeric features) skips the per-value Python checks and the per-column
    conversion of the schema; anything else (strings, nulls, integers only, ragged or nested rows)
    returns None and takes the general path, which names the offending value. A float64 matrix is
    what that path would build for such rows too, so the model sees the same numbers.
    """
    try:
        matrix = np.array(rows)
    except (ValueError, TypeError):
        return None
    return matrix if matrix.ndim == 2 and matrix.dtype == np.float64 else None


def _reject_nested(rows: list[list[Any]], key: str) -> None:
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if isinstance(value, (list, dict)):
                raise BadRequest(
                    f"{key!r}[{i}][{j}] is a {type(value).__name__}; values must be scalars"
                )


def _columns(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not data:
        raise BadRequest("'columns' must be a non-empty object {column: [values]}")
    for name, values in data.items():
        if not isinstance(values, list):
            raise BadRequest(f"'columns'.{name} must be a list, got {type(values).__name__}")
    return data


def _column_rows(data: dict[str, list[Any]]) -> int:
    lengths = {len(v) for v in data.values()}
    if len(lengths) > 1:
        detail = {k: len(v) for k, v in data.items()}
        raise BadRequest(f"columns have different lengths: {detail}")
    rows = lengths.pop()
    if rows == 0:
        raise BadRequest("'columns' is an empty batch: send at least one row")
    return rows


def _decode_arrow(body: bytes, *, stream: bool) -> DecodedRequest:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        reader = ipc.open_stream(body) if stream else ipc.open_file(body)
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise BadRequest(f"invalid Arrow IPC body: {exc}") from None
    if table.num_rows == 0:
        raise BadRequest("the Arrow table is an empty batch: send at least one row")
    columns: dict[str, np.ndarray] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_nested(kind) or pa.types.is_binary(kind):
            raise BadRequest(f"column {name!r} has Arrow type {kind}; expected numbers or strings")
        columns[name] = column.to_numpy(zero_copy_only=False)
    return DecodedRequest(columns, table.num_rows, None)


def _decode_npy(body: bytes) -> DecodedRequest:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError as exc:  # object arrays need pickle: refused
        raise BadRequest(f"invalid .npy body: {exc}") from None
    except (OSError, EOFError) as exc:
        raise BadRequest(f"invalid .npy body: {exc}") from None
    if not isinstance(array, np.ndarray) or array.ndim != 2:
        shape = getattr(array, "shape", None)
        raise BadRequest(f"a .npy body must be a 2-D array rows × columns, got shape {shape}")
    if array.dtype.kind not in "fiub":
        raise BadRequest(f"a .npy body must be numeric, got dtype {array.dtype}")
    if array.shape[0] == 0:
        raise BadRequest("the .npy array is an empty batch: send at least one row")
    return DecodedRequest(array, array.shape[0], None)


def parse_top_k(value: str | None) -> int | None:
    """The ``top_k`` query parameter: a positive integer, or None when absent; a 400 naming it
    else."""
    if value is None:
        return None
    try:
        top_k = int(value)
    except ValueError:
        top_k = 0
    if top_k < 1:
        raise BadRequest(f"query parameter 'top_k' must be a positive integer, got {value!r}")
    return top_k


def parse_outputs(value: Any, *, field: str) -> tuple[str, ...] | None:
    """``outputs`` as given in a body (a list) or a query (comma-separated)."""
    if value is None:
        return None
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    # A JSON list first: the same answer as the Sequence check, without its ABC lookup.
    elif (type(value) is list or isinstance(value, Sequence)) and all(
        isinstance(v, str) for v in value
    ):
        names = list(value)
    else:
        raise BadRequest(f"{field!r} must be a list of output names")
    if not names:
        raise BadRequest(f"{field!r} is empty")
    return tuple(dict.fromkeys(names))


IGNORED_COLUMNS_HEADER = "Kestrel-Ignored-Columns"
# A header line stays short whatever a client sends (a row may hold thousands of keys).
_IGNORED_HEADER_MAX_CHARS = 1024
_WARNING_MAX_NAMES = 20


def ignored_columns_header(names: Sequence[str]) -> str:
    """``names`` as the ``Kestrel-Ignored-Columns`` value: comma-separated, each percent-encoded
    (commas and non-ASCII included, so the list splits back unambiguously), as many as fit in
    1024 characters; the ``warnings`` of a JSON answer count them all."""
    quoted, size = [], 0
    for name in names:
        item = quote(name, safe="")
        size += len(item) + (1 if quoted else 0)
        if size > _IGNORED_HEADER_MAX_CHARS:
            break
        quoted.append(item)
    return ",".join(quoted)


def ignored_columns_warning(names: Sequence[str]) -> str:
    """The answer's warning about columns the model does not read (scored past them)."""
    listed = list(names[:_WARNING_MAX_NAMES])
    more = f" and {len(names) - len(listed)} more" if len(names) > len(listed) else ""
    noun = "column" if len(names) == 1 else "columns"
    return (
        f"ignored {len(names)} {noun} the model does not read: {listed}{more} "
        "(strict_columns=true refuses such requests)"
    )


def jsonable(array: np.ndarray | list[np.ndarray]) -> Any:
    """An output as JSON-ready data (numbers natively; labels of any type as lists; a
    per-target list of arrays, as MultiOutputClassifier.predict_proba gives, as a list)."""
    if isinstance(array, list):
        return [jsonable(a) for a in array]
    if array.dtype.kind in "fiub":
        return array
    return array.tolist()


#: The key of the columns a ``top_k`` answer leaves out, summed (:func:`contribution_rows`).
OTHERS = "others"


def contribution_rows(
    values: np.ndarray, columns: Sequence[str], top_k: int | None = None
) -> list[dict[str, Any]]:
    """A ``contributions`` answer as JSON rows: per row, each input column (then the bias, the
    last of ``columns``) to its contribution, or to its list of contributions, one per raw
    output, where there are several ((rows, columns) or (rows, columns, outputs) values).

    ``top_k``: per row, only the ``top_k`` input columns of largest magnitude (the largest over
    the outputs), largest first, then the sum of the others under :data:`OTHERS`, then the
    bias: each row still adds up to its raw output."""
    if top_k is None or top_k >= len(columns) - 1:
        return [dict(zip(columns, row, strict=True)) for row in values.tolist()]
    inputs, bias = list(columns[:-1]), columns[-1]
    others = unused_name(OTHERS, inputs)
    size = np.abs(values[:, :-1])
    if size.ndim == 3:
        size = size.max(axis=2)
    order = np.argsort(-size, axis=1, kind="stable")
    kept, dropped = order[:, :top_k], order[:, top_k:]
    rows = []
    for r in range(values.shape[0]):
        row = {inputs[j]: values[r, j].tolist() for j in kept[r]}
        row[others] = values[r, dropped[r]].sum(axis=0).tolist()
        row[bias] = values[r, -1].tolist()
        rows.append(row)
    return rows


def encode_json(doc: Mapping[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY, default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot render {type(value).__name__} as JSON")


def head(data: Any, n: int) -> Any:
    """The first ``n`` rows of a scoring request's data (rows, columns, an array, a frame or an
    Arrow table, as a frame), or None for a form it cannot cut."""
    if isinstance(data, list):
        return data[:n]
    if isinstance(data, dict):
        return {k: v[:n] for k, v in data.items()}
    if isinstance(data, np.ndarray):
        return data[:n]
    if hasattr(data, "iloc"):
        return data.iloc[:n]
    if hasattr(data, "slice") and hasattr(data, "to_pandas"):
        return data.slice(0, n).to_pandas()
    return None
