"""Checks on a skops archive (a zip of ``schema.json`` plus array files) before skops reads it.

* Zip bombs: member count (read from the end-of-central-directory record, before ``zipfile``
  builds an entry per member), total uncompressed size and compression ratio. ``zipfile`` stops
  each member at its declared size, so the declared sizes bound what decompression produces.
* Boosters: LightGBM and XGBoost parse their native model from the pickled state while skops
  constructs them, before any post-load check could run. Their state is found in the schema and
  checked like an uploaded model file (:mod:`service.lightgbm_text`, :mod:`service.xgboost_model`);
  a booster in any other form than skops writes is refused.
* Object identity: skops resolves every ``__id__`` to the first node that declared it, so
  another node with a booster's (or its model's) id could stand in for the checked one: those
  ids must be unique. (skops itself repeats ids for other objects, so this is not general.)
* ``ConstructorFromReduceNode`` calls a type with arguments taken from the file (for a booster:
  a model path or unchecked model text); skops never writes it for fitted models: refused.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson

from . import lightgbm_text, xgboost_model
from .limits import ArtifactError, ArtifactLimits, MiB, too_large

# Below this total the compression ratio is not checked: a small, highly compressible archive
# (arrays of zeros) is harmless however well it compresses.
_RATIO_FLOOR_BYTES = 1 * MiB
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_BOOSTER_HANDLES = {
    ("lightgbm.basic", "Booster"): ("_handle", "handle"),
    ("xgboost.core", "Booster"): ("handle",),
}


def check_archive(data: bytes, limits: ArtifactLimits) -> None:
    """Raise ArtifactError (or ArtifactTooLargeError) unless skops may open ``data``."""
    declared = _declared_member_count(data)
    if declared > limits.max_members:
        raise too_large("skops archive member count", declared, limits.max_members, "max_members")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise ArtifactError(
            f"corrupt or truncated skops file (not a readable zip): {exc}"
        ) from None
    with archive:
        _check_members(archive.infolist(), limits)
        try:
            schema = orjson.loads(_read(archive, "schema.json"))
        except orjson.JSONDecodeError as exc:
            raise ArtifactError(f"corrupt skops file: schema.json is not JSON ({exc})") from None
        _check_nodes(schema, archive, limits)


def _declared_member_count(data: bytes) -> int:
    """The entry count of the end-of-central-directory record (zip64 aware)."""
    start = data.rfind(_EOCD, max(0, len(data) - 22 - 0xFFFF))
    if start < 0 or start + 22 > len(data):
        raise ArtifactError("corrupt or truncated skops file: no zip end-of-directory record")
    (count,) = struct.unpack_from("<H", data, start + 10)
    locator = start - 20
    if count == 0xFFFF and locator >= 0 and data[locator : locator + 4] == _EOCD64_LOCATOR:
        (offset,) = struct.unpack_from("<Q", data, locator + 8)
        if offset + 40 > len(data) or data[offset : offset + 4] != _EOCD64:
            raise ArtifactError("corrupt skops file: bad zip64 end-of-directory record")
        (count,) = struct.unpack_from("<Q", data, offset + 32)
    return count


def _check_members(infos: list[zipfile.ZipInfo], limits: ArtifactLimits) -> None:
    if len(infos) > limits.max_members:
        raise too_large("skops archive member count", len(infos), limits.max_members, "max_members")
    total = sum(info.file_size for info in infos)
    if total > limits.max_uncompressed_bytes:
        raise too_large(
            "skops archive uncompressed size", total, limits.max_uncompressed_bytes,
            "max_uncompressed_bytes",
        )  # fmt: skip
    packed = max(1, sum(info.compress_size for info in infos))
    if total > _RATIO_FLOOR_BYTES and total / packed > limits.max_ratio:
        raise too_large(
            "skops archive compression ratio", round(total / packed), limits.max_ratio, "max_ratio"
        )
    if any(info.flag_bits & 0x1 for info in infos):
        raise ArtifactError("skops archive has encrypted members")
    if "schema.json" not in {info.filename for info in infos}:
        raise ArtifactError("not a skops file: the zip archive has no schema.json")


def _read(archive: zipfile.ZipFile, name: str) -> bytes:
    try:
        return archive.read(name)
    except KeyError:
        raise ArtifactError(f"corrupt skops file: member {name!r} is missing") from None
    except (zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError) as exc:
        raise ArtifactError(f"corrupt skops file: cannot read member {name!r}: {exc}") from None


def _nodes(doc: Any) -> Iterator[dict[str, Any]]:
    """Every schema node (a dict with a ``__loader__``), depth-first, without recursion."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "__loader__" in item:
                yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _check_nodes(schema: Any, archive: zipfile.ZipFile, limits: ArtifactLimits) -> None:
    nodes = list(_nodes(schema))
    declared = Counter(
        node["__id__"] for node in nodes if "__id__" in node and node["__loader__"] != "CachedNode"
    )
    for node in nodes:
        kind = (node.get("__module__"), node.get("__class__"))
        if node["__loader__"] == "ConstructorFromReduceNode":
            raise ArtifactError(
                f"skops file builds {kind[0]}.{kind[1]} by calling it with arguments from the "
                "file (ConstructorFromReduceNode); refused"
            )
        if kind in _BOOSTER_HANDLES:
            _check_booster(node, kind, archive, limits, declared)


def _check_booster(
    node: dict[str, Any],
    kind: tuple[Any, Any],
    archive: zipfile.ZipFile,
    limits: ArtifactLimits,
    declared: Counter[Any],
) -> None:
    name = f"{kind[0]}.{kind[1]}"
    _check_unique_id(node, declared, name)
    if node["__loader__"] != "ObjectNode":
        raise ArtifactError(f"skops file stores {name} with {node['__loader__']}, not its state")
    state = node.get("content")
    if state is None:
        return  # an empty booster: nothing for the native library to parse
    if (
        not isinstance(state, dict)
        or state.get("__loader__") != "DictNode"
        or not isinstance(state.get("content"), dict)
    ):
        raise ArtifactError(f"skops file stores {name} state in an unexpected form")
    for key in _BOOSTER_HANDLES[kind]:
        if key in state["content"]:
            _check_unique_id(state["content"][key], declared, f"{name}.{key}")
            _check_handle(state["content"][key], kind, archive, limits, f"{name}.{key}")


def _check_unique_id(node: Any, declared: Counter[Any], where: str) -> None:
    """skops resolves an ``__id__`` to the first node declaring it: a booster or its model must
    be the only node with its id, or another (unchecked) node could stand in for it."""
    if (
        isinstance(node, dict)
        and node.get("__loader__") != "CachedNode"
        and declared[node.get("__id__")] > 1
    ):
        raise ArtifactError(f"skops file: {where} shares its object id with another object")


def _check_handle(
    node: Any, kind: tuple[Any, Any], archive: zipfile.ZipFile, limits: ArtifactLimits, where: str
) -> None:
    loader = node.get("__loader__") if isinstance(node, dict) else None
    if loader == "JsonNode":
        try:  # decoded exactly as skops will decode it (the stdlib json module)
            value = json.loads(node.get("content", ""))
        except (TypeError, ValueError):
            raise ArtifactError(f"skops file: {where} is not valid JSON") from None
        if value is None:
            return
        if kind[0] == "lightgbm.basic" and isinstance(value, str):
            try:
                text = value.encode("utf-8")  # what lightgbm hands to its parser
            except UnicodeEncodeError:
                raise ArtifactError(f"skops file: {where} is not encodable text") from None
            lightgbm_text.check_model_text(text, limits)
            return
    elif (
        loader == "BytearrayNode"
        and kind[0] == "xgboost.core"
        and isinstance(node.get("file"), str)
    ):
        # XGBoost serializes a booster's state as UBJSON {"Config": …, "Model": …}.
        doc = xgboost_model.parse_ubj(_read(archive, node["file"]))
        xgboost_model.check_model(doc, limits, where=f"skops {where}")
        return
    raise ArtifactError(f"skops file: {where} is stored as {loader}, not as the booster writes it")
