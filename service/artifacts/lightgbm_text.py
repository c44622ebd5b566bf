"""Checks on a LightGBM model text (``model_to_string()``) before LightGBM parses it.

LightGBM's parser trusts what the text declares. Found by fuzzing lightgbm 4.x: a truncated file
or a ``tree_sizes`` entry pointing past the end reads past the buffer (segfault); a malformed
number or a missing field inside a tree raises from an OpenMP region (``std::terminate``); an
empty ``objective=`` dereferences null; child indices out of range crash at predict time. So the
text is checked here against the layout LightGBM writes — header, trees, ``end of trees``,
feature importances, parameters, pandas categories — with every number's syntax, every array's
length and every tree's links, features and categorical thresholds checked before LightGBM sees
a byte. Declared sizes are compared with :class:`ArtifactLimits` first.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from .limits import ArtifactError, ArtifactLimits, too_large
from .tree_links import check_feature_indices, check_node_links

_CATEGORICAL = 1  # decision_type bit: a categorical split (threshold = index into cat_boundaries)
_MAX_TREE_LINES = 22  # LightGBM's Tree parser reads at most this many key=value lines
_INT = r"-?\d+"
# The float forms LightGBM writes and reads back (it aborts on others, e.g. "na" or "").
_FLOAT = r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"
_INT_LIST = re.compile(rf"{_INT}(?: {_INT})*")
_FLOAT_LIST = re.compile(rf"{_FLOAT}(?: {_FLOAT})*")
# feature_infos entries: "none", "[min:max]" for numerical, "c1:c2:…" for categorical features.
_FEATURE_INFO = re.compile(rf"none|\[{_FLOAT}:{_FLOAT}\]|{_INT}(?::{_INT})*")
_OBJECTIVE_TOKEN = re.compile(rf"[A-Za-z_][A-Za-z0-9_]*(?::{_FLOAT})?")
_PARAMETER = re.compile(r"\[[A-Za-z0-9_]+: [^\]\n]*\]")
_IMPORTANCE = re.compile(r"[^=]*=\d+")
_TREE_HEADER = re.compile(r"Tree=(\d+)")
_REQUIRED_HEADER = (
    "version",
    "num_class",
    "label_index",
    "max_feature_idx",
    "feature_names",
    "feature_infos",
)
# Per-tree arrays by length (n = num_leaves): required ones, then the statistics LightGBM reads
# when present (a present array of the wrong length makes it read past the end).
_SPLIT_INTS = ("split_feature", "decision_type", "left_child", "right_child")
_OPTIONAL = {
    "split_gain": (_FLOAT_LIST, -1),
    "internal_value": (_FLOAT_LIST, -1),
    "internal_weight": (_FLOAT_LIST, -1),
    "internal_count": (_INT_LIST, -1),
    "leaf_weight": (_FLOAT_LIST, 0),
    "leaf_count": (_INT_LIST, 0),
}


def check_model_text(data: bytes, limits: ArtifactLimits) -> str:
    """Check a LightGBM model text; return it decoded, ready for ``Booster(model_str=...)``."""
    if b"\x00" in data:
        # LightGBM receives a C string: it would stop at the NUL, before what was checked here.
        raise ArtifactError("LightGBM model text contains a NUL byte")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"LightGBM model text is not UTF-8 (byte {exc.start})") from None
    lines = _Lines(data)
    header = _header(lines, limits)
    trees = _trees(lines, limits)
    for index, (_, _, fields) in enumerate(trees):
        _check_tree(fields, header["max_feature_idx"] + 1, limits, f"LightGBM tree {index}")
    sizes = header.get("tree_sizes")
    # LightGBM jumps to each tree by these byte counts: they must land on the trees checked here.
    if sizes is not None and sizes != [end - start for start, end, _ in trees]:
        raise ArtifactError(
            f"LightGBM tree_sizes ({len(sizes)} entries) do not match the {len(trees)} trees "
            "stored: the file is truncated or edited"
        )
    _trailer(lines)
    return text


class _Lines:
    """The text's lines with their byte offsets (``\\r\\n`` accepted)."""

    def __init__(self, data: bytes) -> None:
        self.items: list[tuple[int, str]] = []
        offset = 0
        for raw in data.split(b"\n"):
            self.items.append((offset, raw.rstrip(b"\r").decode("utf-8")))
            offset += len(raw) + 1
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos][1] if self.pos < len(self.items) else None

    def offset(self) -> int:
        return self.items[min(self.pos, len(self.items) - 1)][0]

    def next(self) -> str:
        line = self.items[self.pos][1]
        self.pos += 1
        return line

    def skip_blank(self) -> None:
        while self.peek() == "":
            self.pos += 1


def _header(lines: _Lines, limits: ArtifactLimits) -> dict[str, Any]:
    if lines.peek() != "tree":
        raise ArtifactError("LightGBM model text must start with a 'tree' line")
    lines.next()
    fields: dict[str, str] = {}
    while (line := lines.peek()) is not None and not line.startswith("Tree="):
        if line == "end of trees":
            break
        lines.next()
        if line and line != "average_output":
            key, sep, value = line.partition("=")
            if not sep:
                raise ArtifactError(f"LightGBM header line is not key=value: {line[:80]!r}")
            fields[key] = value
    missing = [key for key in _REQUIRED_HEADER if key not in fields]
    if missing:
        raise ArtifactError(f"LightGBM model text lacks header fields: {', '.join(missing)}")
    if not re.fullmatch(r"v\d+", fields["version"]):
        raise ArtifactError(f"LightGBM model version {fields['version'][:20]!r} is not 'v<number>'")
    header: dict[str, Any] = {
        key: _int(fields[key], f"LightGBM {key}")
        for key in ("num_class", "label_index", "max_feature_idx")
    }
    n_features = header["max_feature_idx"] + 1
    if n_features > limits.max_features:
        raise too_large("LightGBM feature count", n_features, limits.max_features, "max_features")
    if header["label_index"] < 0 or n_features < 1:
        raise ArtifactError("LightGBM label_index / max_feature_idx must not be negative")
    n_class = header["num_class"]
    if not 1 <= n_class <= limits.max_trees:
        raise ArtifactError(f"LightGBM num_class {n_class} is not in [1, max_trees]")
    # Each iteration adds num_tree_per_iteration trees into num_class outputs: they must agree.
    per_iteration = fields.get("num_tree_per_iteration", str(n_class))
    if _int(per_iteration, "LightGBM num_tree_per_iteration") != n_class:
        raise ArtifactError(
            f"LightGBM num_tree_per_iteration {per_iteration} differs from num_class {n_class}"
        )
    for key in ("feature_names", "feature_infos"):
        count = len(fields[key].split(" "))
        if count != n_features:
            raise ArtifactError(f"LightGBM {key} has {count} entries for {n_features} features")
    for info in fields["feature_infos"].split(" "):
        if not _FEATURE_INFO.fullmatch(info):
            raise ArtifactError(f"LightGBM feature_infos entry {info[:40]!r} is malformed")
    if "objective" in fields:
        _check_objective(fields["objective"], n_class)
    if "tree_sizes" in fields:
        sizes = fields["tree_sizes"].split(" ") if fields["tree_sizes"] else []
        if len(sizes) > limits.max_trees:
            raise too_large("LightGBM tree count", len(sizes), limits.max_trees, "max_trees")
        header["tree_sizes"] = [_int(size, "LightGBM tree_sizes") for size in sizes]
    return header


def _check_objective(objective: str, n_class: int) -> None:
    tokens = objective.split(" ")
    if not re.fullmatch(r"[A-Za-z_]+", tokens[0]):
        # LightGBM dereferences a null objective when the name is empty.
        raise ArtifactError(f"LightGBM objective name {tokens[0][:40]!r} is malformed")
    for token in tokens[1:]:
        if not _OBJECTIVE_TOKEN.fullmatch(token):
            raise ArtifactError(f"LightGBM objective token {token[:40]!r} is malformed")
        # A multiclass objective transforms as many outputs as its own num_class says.
        key, _, value = token.partition(":")
        if key == "num_class" and _int(value, "LightGBM objective num_class") != n_class:
            raise ArtifactError(
                f"LightGBM objective num_class {value} differs from the header's {n_class}"
            )


def _trees(lines: _Lines, limits: ArtifactLimits) -> list[tuple[int, int, dict[str, str]]]:
    """Each tree's byte span (its ``Tree=`` line to the next one) and its fields."""
    trees: list[tuple[int, int, dict[str, str]]] = []
    lines.skip_blank()
    while (line := lines.peek()) is not None and line.startswith("Tree="):
        where = f"LightGBM tree {len(trees)}"
        match = _TREE_HEADER.fullmatch(line)
        if match is None or int(match.group(1)) != len(trees):
            raise ArtifactError(f"LightGBM tree header {line[:40]!r} is out of sequence")
        if len(trees) == limits.max_trees:
            raise too_large("LightGBM tree count", len(trees) + 1, limits.max_trees, "max_trees")
        start = lines.offset()
        lines.next()
        fields: dict[str, str] = {}
        while (line := lines.peek()) is not None and line != "":
            lines.next()
            key, sep, value = line.partition("=")
            if not sep:
                raise ArtifactError(f"{where} line is not key=value: {line[:80]!r}")
            if key in fields:
                raise ArtifactError(f"{where} repeats '{key}'")
            fields[key] = value
        if len(fields) > _MAX_TREE_LINES:
            # LightGBM would ignore the lines past its limit, so they could differ from what was
            # checked here.
            raise ArtifactError(f"{where} has {len(fields)} lines, more than {_MAX_TREE_LINES}")
        lines.skip_blank()
        trees.append((start, lines.offset(), fields))
    if lines.peek() != "end of trees":
        raise ArtifactError("LightGBM model text is truncated: no 'end of trees' line")
    lines.next()
    return trees


def _check_tree(
    fields: dict[str, str], n_features: int, limits: ArtifactLimits, where: str
) -> None:
    n = _int(_field(fields, "num_leaves", where), f"{where} num_leaves")
    if n > limits.max_leaves_per_tree:
        raise too_large(f"{where} num_leaves", n, limits.max_leaves_per_tree, "max_leaves_per_tree")
    n_cat = _int(_field(fields, "num_cat", where), f"{where} num_cat")
    if n < 1 or not 0 <= n_cat <= n - 1:
        raise ArtifactError(f"{where}: num_leaves {n} / num_cat {n_cat} are inconsistent")
    if _int(fields.get("is_linear", "0"), f"{where} is_linear"):
        raise ArtifactError(
            "LightGBM linear trees (linear_tree=True) are not supported; supported: constant leaves"
        )
    if "shrinkage" in fields and not re.fullmatch(_FLOAT, fields["shrinkage"]):
        raise ArtifactError(f"{where}: shrinkage {fields['shrinkage'][:40]!r} is malformed")
    _array(fields, "leaf_value", _FLOAT_LIST, n, where)
    if n == 1:
        return  # LightGBM reads nothing else of a single-leaf tree
    for key, (pattern, extra) in _OPTIONAL.items():
        if key in fields:
            _array(fields, key, pattern, n + extra, where)
    feature, decision, left, right = (
        _array(fields, k, _INT_LIST, n - 1, where) for k in _SPLIT_INTS
    )
    threshold = _array(fields, "threshold", _FLOAT_LIST, n - 1, where)
    if ((decision < 0) | (decision > 15)).any():
        raise ArtifactError(f"{where}: decision_type outside [0, 15]")
    # Internal nodes are 0 … n-2 and a negative child c is leaf ~c: as one node array, leaf ~c
    # becomes node (n - 1) + ~c.
    for child in (left, right):
        if ((child >= n - 1) | (child < -n)).any():
            raise ArtifactError(f"{where}: a child index is out of range for {n} leaves")
    as_node = [np.where(c >= 0, c, (n - 1) + ~c) for c in (left, right)]
    padding = np.zeros(n, dtype=np.int64)
    is_leaf = np.r_[np.zeros(n - 1, dtype=bool), np.ones(n, dtype=bool)]
    check_node_links(np.r_[as_node[0], padding], np.r_[as_node[1], padding], is_leaf, where)
    check_feature_indices(feature, n_features, where)
    categorical = (decision & _CATEGORICAL).astype(bool)
    if n_cat == 0:
        if categorical.any():
            raise ArtifactError(f"{where}: a split is categorical but num_cat is 0")
        return
    boundaries = _array(fields, "cat_boundaries", _INT_LIST, n_cat + 1, where)
    if boundaries[0] != 0 or (np.diff(boundaries) < 0).any():
        raise ArtifactError(f"{where}: cat_boundaries must start at 0 and not decrease")
    bitsets = _array(fields, "cat_threshold", _INT_LIST, int(boundaries[-1]), where)
    if ((bitsets < 0) | (bitsets >= 2**32)).any():
        raise ArtifactError(f"{where}: cat_threshold holds a value outside uint32")
    index = threshold[categorical]
    if ((index < 0) | (index >= n_cat) | (index != np.floor(index))).any():
        raise ArtifactError(f"{where}: a categorical threshold is not an index below num_cat")


def _trailer(lines: _Lines) -> None:
    """After ``end of trees``: importances, parameters, pandas categories — nothing else."""
    while (line := lines.peek()) is not None:
        lines.next()
        if line == "":
            continue
        if line.startswith("pandas_categorical:"):
            _check_pandas_categorical(line.removeprefix("pandas_categorical:"))
        elif line in ("feature_importances:", "feature importances:"):
            while (line := lines.peek()) not in (None, ""):
                if not _IMPORTANCE.fullmatch(lines.next()):
                    raise ArtifactError(f"LightGBM feature importance {line[:80]!r} is malformed")
        elif line == "parameters:":
            while (line := lines.peek()) != "end of parameters":
                if line is None:
                    raise ArtifactError("LightGBM model text is truncated: no 'end of parameters'")
                if line and not _PARAMETER.fullmatch(line):
                    raise ArtifactError(f"LightGBM parameter line {line[:80]!r} is malformed")
                lines.next()
            lines.next()
        else:
            raise ArtifactError(f"unexpected line after the LightGBM trees: {line[:80]!r}")


def _check_pandas_categorical(value: str) -> None:
    """The lightgbm Python package json-decodes this line: refuse what it cannot decode."""
    try:
        categories = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ArtifactError(f"LightGBM pandas_categorical is not JSON: {exc}") from None
    if categories is not None and not (
        isinstance(categories, list) and all(isinstance(c, list) for c in categories)
    ):
        raise ArtifactError("LightGBM pandas_categorical must be null or a list of lists")


def _field(fields: dict[str, str], key: str, where: str) -> str:
    if key not in fields:
        raise ArtifactError(f"{where} lacks '{key}'")
    return fields[key]


def _array(
    fields: dict[str, str], key: str, pattern: re.Pattern[str], n: int, where: str
) -> np.ndarray:
    raw = _field(fields, key, where)
    count = raw.count(" ") + 1 if raw else 0
    if count != n:
        raise ArtifactError(f"{where}: '{key}' has {count} entries, expected {n}")
    if n and not pattern.fullmatch(raw):
        raise ArtifactError(f"{where}: '{key}' holds a malformed number")
    dtype = np.float64 if pattern is _FLOAT_LIST else np.int64
    try:
        return np.array(raw.split(" ") if n else [], dtype=dtype)
    except OverflowError:
        raise ArtifactError(f"{where}: '{key}' holds an integer out of range") from None


def _int(value: str, where: str) -> int:
    # Any number of digits parses (absurd values then fail the limits), within Python's own
    # int-from-text bound.
    if not re.fullmatch(r"-?\d{1,4000}", value):
        raise ArtifactError(f"{where}: expected an integer, got {value[:40]!r}")
    return int(value)
