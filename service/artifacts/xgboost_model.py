"""Checks on an XGBoost model document (``save_raw("json")`` / ``"ubj"``) before XGBoost loads it.

XGBoost loads models whose trees point outside their node arrays, share nodes or index features
past ``num_feature``, then crashes when it predicts. So the document is decoded here (orjson for
JSON, :mod:`service.ubjson` for UBJSON) and every tree is checked; declared sizes are compared
with :class:`ArtifactLimits` before anything is allocated for them. Only what Kestrel compiles is
accepted (``gbtree``, scalar leaves, numerical splits): the rest would carry index arrays that are
not checked here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from . import ubjson
from .limits import ArtifactError, ArtifactLimits, too_large
from .tree_links import check_feature_indices, check_node_links

# Arrays of one entry per node that XGBoost reads for every tree.
_NODE_ARRAYS = (
    "left_children",
    "right_children",
    "parents",
    "split_indices",
    "split_conditions",
    "default_left",
    "split_type",
)
# XGBoost treats category values at or above 2**24 as invalid (float32 precision) and allocates
# a bitfield of max(category) + 1 bits per categorical node.
_MAX_CATEGORY = 2**24
_ROOT_PARENT = (-1, 2**31 - 1)  # kInvalidNodeId, as written with the left-child bit masked off


def parse_json(data: bytes) -> Any:
    """orjson-decode an XGBoost JSON model; malformed JSON → ArtifactError with its position."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ArtifactError(
            f"malformed XGBoost JSON at line {exc.lineno}, column {exc.colno} "
            f"(byte {exc.pos}): {exc.msg}"
        ) from None


def parse_ubj(data: bytes) -> Any:
    """Decode an XGBoost UBJSON model; malformed UBJSON → ArtifactError with its offset."""
    try:
        return ubjson.decode(data)
    except ubjson.UBJSONError as exc:
        raise ArtifactError(f"malformed XGBoost UBJSON: {exc}") from None


def check_model(doc: Any, limits: ArtifactLimits, where: str = "XGBoost model") -> None:
    """Check a decoded model: ``{"learner": …}``, or a pickled booster's ``{"Config", "Model"}``."""
    if isinstance(doc, dict) and "Model" in doc:
        model_learner = _learner(_get(doc, "Model", dict, where), f"{where}.Model")
        _check_learner(model_learner, limits, f"{where}.Model.learner")
        config = _get(doc, "Config", dict, where)
        _check_config(_get(config, "learner", dict, f"{where}.Config"), model_learner, where)
        return
    _check_learner(_learner(doc, where), limits, f"{where}.learner")


def _learner(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("learner"), dict):
        raise ArtifactError(f"{where} has no 'learner' object: not an XGBoost model")
    return doc["learner"]


def _check_learner(learner: dict[str, Any], limits: ArtifactLimits, where: str) -> None:
    param = _get(learner, "learner_model_param", dict, where)
    n_features = _int(_get(param, "num_feature", (str, int), where), f"{where} num_feature")
    if n_features > limits.max_features:
        raise too_large(f"{where} num_feature", n_features, limits.max_features, "max_features")
    n_class = _int(param.get("num_class", "0"), f"{where} num_class")
    n_target = _int(param.get("num_target", "1"), f"{where} num_target")
    if n_features < 0 or n_class < 0 or n_target < 1:
        raise ArtifactError(f"{where}: negative num_feature / num_class or num_target < 1")
    for key in ("feature_names", "feature_types"):
        names = learner.get(key, [])
        if not isinstance(names, list) or len(names) not in (0, n_features):
            raise ArtifactError(f"{where}: {key} must list the {n_features} features or be empty")
    _check_objective(learner.get("objective"), n_class, where)
    booster = _get(learner, "gradient_booster", dict, where)
    if booster.get("name") != "gbtree":
        raise ArtifactError(
            f"XGBoost booster {booster.get('name')!r} is not supported; supported: 'gbtree'"
        )
    model = _get(booster, "model", dict, f"{where}.gradient_booster")
    _check_trees(model, n_features, max(n_class, n_target, 1), limits, f"{where} gbtree")


def _check_objective(objective: Any, n_class: int, where: str) -> None:
    # softmax writes as many outputs as its own num_class: it must match the model's.
    if isinstance(objective, dict) and isinstance(objective.get("softmax_multiclass_param"), dict):
        declared = objective["softmax_multiclass_param"].get("num_class", n_class)
        if _int(declared, f"{where} objective num_class") != n_class:
            raise ArtifactError(
                f"{where}: the objective's num_class {declared} differs from the model's {n_class}"
            )


def _check_trees(
    model: dict[str, Any], n_features: int, n_groups: int, limits: ArtifactLimits, where: str
) -> None:
    param = _get(model, "gbtree_model_param", dict, where)
    n_trees = _int(_get(param, "num_trees", (str, int), where), f"{where} num_trees")
    if n_trees > limits.max_trees:
        raise too_large(f"{where} num_trees", n_trees, limits.max_trees, "max_trees")
    if _int(param.get("num_parallel_tree", "1"), f"{where} num_parallel_tree") < 1:
        raise ArtifactError(f"{where}: num_parallel_tree must be at least 1")
    trees = _get(model, "trees", list, where)
    if len(trees) != n_trees:
        raise ArtifactError(f"{where}: num_trees is {n_trees} but {len(trees)} trees are stored")
    if n_groups > max(n_trees, 1):
        # Every output needs trees; XGBoost sizes per-output buffers by the declared count.
        raise ArtifactError(f"{where}: {n_groups} outputs declared for {n_trees} trees")
    info = _ints(model, "tree_info", n_trees, where)
    if ((info < 0) | (info >= n_groups)).any():
        raise ArtifactError(f"{where}: tree_info names an output outside [0, {n_groups})")
    if "iteration_indptr" in model:
        indptr = _ints(model, "iteration_indptr", None, where)
        if (
            len(indptr) < 1
            or indptr[0] != 0
            or indptr[-1] != n_trees
            or (np.diff(indptr) < 0).any()
        ):
            raise ArtifactError(f"{where}: iteration_indptr does not partition the {n_trees} trees")
    if "cats" in model:
        _check_recoder(model["cats"], n_features, f"{where} cats")
    max_nodes = 2 * limits.max_leaves_per_tree - 1
    bitfield_bytes = 0
    for i, tree in enumerate(trees):
        # XGBoost stores each tree at the position its "id" names.
        if not isinstance(tree, dict) or _int(tree.get("id"), f"{where} tree {i} id") != i:
            raise ArtifactError(f"{where}: tree {i} does not carry id {i}")
        bitfield_bytes += _check_tree(tree, n_features, max_nodes, f"{where} tree {i}")
        if bitfield_bytes > limits.max_uncompressed_bytes:
            raise too_large(
                f"{where} category bitfields (bytes)", bitfield_bytes,
                limits.max_uncompressed_bytes, "max_uncompressed_bytes",
            )  # fmt: skip


def _check_recoder(cats: Any, n_features: int, where: str) -> None:
    """The category re-coder of a model trained on a DataFrame (XGBoost ≥ 3): per feature, its
    training categories and their sort order, which XGBoost binary-searches when predicting."""
    if not isinstance(cats, dict):
        raise ArtifactError(f"{where} is not an object")
    encoders = cats.get("enc", [])
    segments = _ints(cats, "feature_segments", None, where) if "feature_segments" in cats else None
    sorted_idx = _ints(cats, "sorted_idx", None, where) if "sorted_idx" in cats else None
    if not isinstance(encoders, list) or segments is None or sorted_idx is None:
        raise ArtifactError(f"{where}: enc / feature_segments / sorted_idx are missing")
    if not encoders and not len(segments) and not len(sorted_idx):
        return  # no categorical features
    if len(encoders) != n_features or len(segments) != n_features + 1:
        raise ArtifactError(f"{where}: enc / feature_segments do not have one entry per feature")
    if segments[0] != 0 or (np.diff(segments) < 0).any() or segments[-1] != len(sorted_idx):
        raise ArtifactError(f"{where}: feature_segments do not partition sorted_idx")
    for f, encoder in enumerate(encoders):
        size = int(segments[f + 1] - segments[f])
        order = np.sort(sorted_idx[segments[f] : segments[f + 1]])
        if (order != np.arange(size)).any():
            raise ArtifactError(f"{where}: sorted_idx of feature {f} is not a permutation")
        _check_encoder(encoder, size, f"{where} feature {f}")


def _check_encoder(encoder: Any, size: int, where: str) -> None:
    if not isinstance(encoder, dict):
        raise ArtifactError(f"{where} is not an object")
    values = _ints(encoder, "values", None, where)
    if "offsets" in encoder:  # strings: UTF-8 bytes, one slice per category
        offsets = _ints(encoder, "offsets", None, where)
        expected = size + 1 if size else 0
        if len(offsets) != expected or (
            size and (offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != len(values))
        ):
            raise ArtifactError(f"{where}: string offsets do not partition the {size} categories")
        if ((values < -128) | (values > 255)).any():
            raise ArtifactError(f"{where}: string bytes out of range")
    elif "type" in encoder:  # numbers of an array-interface type code
        if not 0 <= _int(encoder["type"], f"{where} type") < 32 or len(values) != size:
            raise ArtifactError(f"{where}: numeric categories do not match their count {size}")
    elif size:
        raise ArtifactError(f"{where}: categories have neither offsets nor a type")


def _check_tree(tree: Any, n_features: int, max_nodes: int, where: str) -> int:
    """Check one tree; return the bytes XGBoost allocates for its category bitfields."""
    if not isinstance(tree, dict):
        raise ArtifactError(f"{where} is not an object")
    param = _get(tree, "tree_param", dict, where)
    n = _int(_get(param, "num_nodes", (str, int), where), f"{where} num_nodes")
    if n > max_nodes:
        raise too_large(f"{where} num_nodes", n, max_nodes, "2 × max_leaves_per_tree − 1")
    leaf_size = _int(param.get("size_leaf_vector", "1"), f"{where} size_leaf_vector")
    if leaf_size > 1:
        raise ArtifactError(
            "XGBoost vector-leaf trees (multi_strategy='multi_output_tree') are not supported; "
            "supported: one output per tree"
        )
    if leaf_size < 0:
        raise ArtifactError(f"{where}: size_leaf_vector {leaf_size} is negative")
    if "num_feature" in param and _int(param["num_feature"], f"{where} num_feature") != n_features:
        raise ArtifactError(f"{where}: num_feature differs from the model's {n_features}")
    if _int(param.get("num_deleted", "0"), f"{where} num_deleted") < 0:
        raise ArtifactError(f"{where}: num_deleted is negative")
    arrays = {key: _ints(tree, key, n, where) for key in _NODE_ARRAYS if key != "split_conditions"}
    _floats(tree, "split_conditions", n, where)
    left, right = arrays["left_children"], arrays["right_children"]
    is_leaf = left == -1
    check_node_links(left, right, is_leaf, where)
    internal = np.flatnonzero(~is_leaf)
    check_feature_indices(arrays["split_indices"][internal], n_features, where)
    parents = arrays["parents"]
    if parents[0] not in _ROOT_PARENT:
        raise ArtifactError(f"{where}: the root's parent is {int(parents[0])}, not 'none'")
    for children in (left, right):
        if (parents[children[internal]] != internal).any():
            raise ArtifactError(f"{where}: parents disagree with the child links")
    split_type = arrays["split_type"]
    if ((split_type != 0) & (split_type != 1)).any():
        raise ArtifactError(f"{where}: split_type must be 0 (numerical) or 1 (categorical)")
    return _check_categories(tree, split_type == 1, is_leaf, where)


def _check_categories(
    tree: dict[str, Any], categorical: np.ndarray, is_leaf: np.ndarray, where: str
) -> int:
    """Each recorded categorical node (ascending, as XGBoost reads them) owns a non-empty slice
    of ``categories`` of valid category values; return the bitfield bytes XGBoost allocates."""
    nodes = _ints(tree, "categories_nodes", None, where)
    starts = _ints(tree, "categories_segments", len(nodes), where)
    sizes = _ints(tree, "categories_sizes", len(nodes), where)
    values = _ints(tree, "categories", None, where)
    if len(nodes) and (
        (np.diff(nodes) <= 0).any() or nodes[0] < 0 or nodes[-1] >= len(categorical)
    ):
        raise ArtifactError(f"{where}: categories_nodes must be increasing node indices")
    # XGBoost aborts on a categorical flag without categories (or on a leaf): the recorded
    # nodes must be exactly the internal nodes flagged categorical.
    if (categorical & is_leaf).any() or not np.array_equal(nodes, np.flatnonzero(categorical)):
        raise ArtifactError(
            f"{where}: categories_nodes differs from the nodes flagged categorical in split_type"
        )
    if ((sizes < 1) | (starts < 0) | (starts + sizes > len(values))).any():
        raise ArtifactError(f"{where}: a category segment lies outside 'categories'")
    if ((values < 0) | (values >= _MAX_CATEGORY)).any():
        raise ArtifactError(f"{where}: a category is outside [0, 2**24)")
    total = 0
    for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
        total += (int(values[start : start + size].max()) // 32 + 1) * 4
    return total


def _check_config(config: dict[str, Any], model: dict[str, Any], where: str) -> None:
    """A pickled booster's configuration must describe the model it carries."""
    for key in ("learner_model_param",):
        if key in config and config[key] != model.get(key):
            raise ArtifactError(f"{where}: Config.{key} differs from the model's")
    train = config.get("learner_train_param", {})
    if isinstance(train, dict) and train.get("booster", "gbtree") != "gbtree":
        raise ArtifactError(
            f"XGBoost booster {train.get('booster')!r} is not supported; supported: 'gbtree'"
        )
    booster = config.get("gradient_booster", {})
    if isinstance(booster, dict):
        if booster.get("name", "gbtree") != "gbtree":
            raise ArtifactError(
                f"XGBoost booster {booster.get('name')!r} is not supported; supported: 'gbtree'"
            )
        declared = booster.get("gbtree_model_param")
        stored = model["gradient_booster"]["model"].get("gbtree_model_param")
        if declared is not None and declared != stored:
            raise ArtifactError(f"{where}: Config gbtree_model_param differs from the model's")
    n_class = _int(model["learner_model_param"].get("num_class", "0"), f"{where} num_class")
    _check_objective(config.get("objective"), n_class, f"{where}.Config")


def _get(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise ArtifactError(f"{where}: '{key}' is missing or has the wrong type")
    return value


def _int(value: Any, where: str) -> int:
    """XGBoost writes parameters as decimal strings; numbers are accepted too."""
    if isinstance(value, bool):
        raise ArtifactError(f"{where}: expected an integer, got {value!r}")
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ArtifactError(f"{where}: expected an integer, got {str(value)[:40]!r}")


def _ints(doc: dict[str, Any], key: str, n: int | None, where: str) -> np.ndarray:
    return _array(doc, key, n, where, np.int64)


def _floats(doc: dict[str, Any], key: str, n: int, where: str) -> np.ndarray:
    return _array(doc, key, n, where, np.float64)


def _array(doc: dict[str, Any], key: str, n: int | None, where: str, dtype: type) -> np.ndarray:
    value = doc.get(key)
    if not isinstance(value, list | np.ndarray):
        raise ArtifactError(f"{where}: '{key}' is missing or not an array")
    try:
        array = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        raise ArtifactError(f"{where}: '{key}' holds non-numeric values") from None
    if array.ndim != 1 or (n is not None and len(array) != n):
        raise ArtifactError(f"{where}: '{key}' has {len(value)} entries, expected {n}")
    if dtype is np.int64 and isinstance(value, list) and any(isinstance(v, float) for v in value):
        raise ArtifactError(f"{where}: '{key}' holds non-integer values")
    return array
