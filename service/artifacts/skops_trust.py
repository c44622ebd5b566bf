"""The server-owned skops allow-list, and content checks for the trusted types that need them.

skops trusts scikit-learn's public estimators, numpy / scipy ufuncs and builtins by default;
:func:`trusted_types` adds what fitted pipelines of the classes Kestrel compiles contain
(discovered by dumping representative fitted models with ``skops.io.dumps`` and asking
``get_untrusted_types``). The list is built from the server's code only — never from an upload.

Two added types hold raw node indices that scikit-learn's Cython follows without bounds checks
(skops leaves them out of its defaults for that reason): ``sklearn.tree._tree.Tree`` and HistGB's
``TreePredictor``. They are trusted only together with :func:`check_loaded`, which checks those
indices (and scipy sparse matrices' index arrays) after loading and before anything predicts.
scipy's ``BSpline`` (a SplineTransformer's fitted splines) is checked there too: its compiled
evaluation trusts that knots, coefficients and degree agree, which its constructor checks and
skops' loading does not.
KD / ball trees and distance-metric objects are refused instead: their index arrays are as
unchecked, and Kestrel computes neighbours by brute force anyway.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Iterator, Sequence
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any

import numpy as np
import scipy.sparse
import sklearn.feature_selection
from scipy.interpolate import BSpline
from sklearn._loss import loss as sklearn_losses
from sklearn.compose import make_column_selector
from sklearn.dummy import DummyClassifier, DummyRegressor
from sklearn.ensemble._bagging import BaseBagging
from sklearn.ensemble._forest import BaseForest
from sklearn.ensemble._gb import BaseGradientBoosting
from sklearn.ensemble._hist_gradient_boosting.common import PREDICTOR_RECORD_DTYPE
from sklearn.ensemble._hist_gradient_boosting.gradient_boosting import BaseHistGradientBoosting
from sklearn.ensemble._hist_gradient_boosting.predictor import TreePredictor
from sklearn.metrics import get_scorer, get_scorer_names
from sklearn.model_selection import _split
from sklearn.tree._tree import Tree

import compiler

from .limits import ArtifactError
from .tree_links import check_feature_indices, check_node_links

# Fitted-state types beyond skops' defaults, each with why it is safe to construct.
_INTERNALS = (
    # Index-bearing tree storage: safe only because check_loaded() validates it.
    "sklearn.tree._tree.Tree",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    # Plain containers / parameter holders without native code.
    "sklearn.utils._bunch.Bunch",  # named_estimators_ of Voting* / Stacking*
    "collections.OrderedDict",  # LightGBM's sklearn wrappers
    "numpy.dtype",  # encoders' dtype parameter
    "sklearn.calibration._CalibratedClassifier",
    "sklearn.calibration._SigmoidCalibration",
    "sklearn.calibration._TemperatureScaling",
    "sklearn.neural_network._stochastic_optimizers.AdamOptimizer",  # MLP's optimizer state
    "sklearn.neural_network._stochastic_optimizers.SGDOptimizer",
    "sklearn.metrics._scorer._PassthroughScorer",  # search CV's scorer_
    "sklearn.metrics._scorer._Scorer",
    # HistGB with categorical features: its preprocessor wraps this validator in a partial (the
    # wrapped function is audited by skops on its own).
    "functools.partial",
    "sklearn.utils.validation.check_array",
)
# A ColumnTransformer's column selector: a dtype / name-pattern filter its fit applied.
_SELECTORS = (make_column_selector,)
# A SplineTransformer's splines (checked by check_loaded()), and the array constructor each
# keeps, named from an instance: its module is private to scipy and moves between versions.
_SPLINE = BSpline(np.arange(4.0), np.ones(2), 1)
_SPLINE_TYPES = (BSpline, _SPLINE._asarray)
# Univariate feature selectors keep their score function; it ran at fit, never at predict.
_SCORE_FUNCTIONS = tuple(
    getattr(sklearn.feature_selection, name)
    for name in sklearn.feature_selection.__all__
    if inspect.isfunction(getattr(sklearn.feature_selection, name))
)
# scipy sparse types (e.g. SVC fitted on sparse input); index arrays checked by check_loaded().
_SPARSE = (
    scipy.sparse.csr_matrix,
    scipy.sparse.csc_matrix,
    scipy.sparse.csr_array,
    scipy.sparse.csc_array,
)

# Types refused on purpose, with what to do instead (shown in the UntrustedTypeError).
_REFUSED_PREFIXES = {
    (
        "sklearn.neighbors._kd_tree.",
        "sklearn.neighbors._ball_tree.",
        "sklearn.metrics._dist_metrics.",
    ): (
        "KD / ball trees and distance metrics hold index arrays scikit-learn does not check; "
        "fit neighbours models with algorithm='brute' (Kestrel computes neighbours by brute "
        "force)"
    ),
}


def _name(obj: Any) -> str:
    """The fully-qualified name skops reports for a type or function."""
    return f"{obj.__module__}.{obj.__name__}"


@functools.cache
def _trusted() -> tuple[str, ...]:
    names = {_name(registration.cls) for registration in compiler.supported()}
    names.update(_INTERNALS)
    names.update(_name(obj) for obj in (*_SPARSE, *_SELECTORS, *_SPLINE_TYPES, *_SCORE_FUNCTIONS))
    # Every concrete loss: fitted GLMs and boosting models keep one (parameters only).
    names.update(
        _name(cls)
        for cls in vars(sklearn_losses).values()
        if inspect.isclass(cls)
        and issubclass(cls, sklearn_losses.BaseLoss)
        and cls is not sklearn_losses.BaseLoss
    )
    # Search CV wrappers keep their splitter and scorer: public splitters and the metric
    # functions behind scikit-learn's named scorers (parameters / pure functions only).
    bases = (_split.BaseCrossValidator, _split.BaseShuffleSplit, _split._RepeatedSplits)
    names.update(
        _name(cls)
        for name, cls in vars(_split).items()
        if inspect.isclass(cls) and issubclass(cls, bases) and not name.startswith(("_", "Base"))
    )
    for scorer_name in get_scorer_names():
        score_func = getattr(get_scorer(scorer_name), "_score_func", None)
        if score_func is not None:
            names.add(_name(score_func))
    return tuple(sorted(names))


def trusted_types() -> list[str]:
    """The fully-qualified type names trusted on top of skops' defaults."""
    return list(_trusted())


#: The setting (service/settings.py) that lists the modules of :func:`host_step_types`.
HOST_STEP_SETTING = "KESTREL_HOST_STEP_MODULES"


def refusal_notes(types: list[str], host_step_modules: Sequence[str] = ()) -> list[str]:
    """Advice for untrusted types: those refused on purpose, and how the rest could be trusted."""
    notes = []
    refused: set[str] = set()
    for prefixes, note in _REFUSED_PREFIXES.items():
        hits = [t for t in types if t.startswith(prefixes)]
        if hits:
            notes.append(f"{', '.join(hits)}: {note}")
            refused.update(hits)
    if any(t not in refused for t in types):
        listed = ", ".join(host_step_modules) or "none"
        notes.append(
            "functions and classes of a module the operator trusts may be uploaded, and then run "
            f"as host steps: the operator lists the module in {HOST_STEP_SETTING} (now: {listed})"
        )
    return notes


def host_step_types(types: Sequence[str], modules: Sequence[str]) -> list[str]:
    """The names among ``types`` (untrusted by the server's own list) of functions and classes
    defined in one of the operator's trusted ``modules`` (exactly those modules, not their
    submodules); importing those modules is what trusting them means, and nothing else is
    imported. A name under a trusted module must be an object *defined* there: ``mod.system``
    for an ``os.system`` that ``mod`` imported is refused (:class:`ArtifactError`)."""
    found = []
    for name in types:
        module_name = next((m for m in modules if name.startswith(m + ".")), None)
        if module_name is None:
            continue
        try:
            obj: Any = importlib.import_module(module_name)
            for part in name[len(module_name) + 1 :].split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ArtifactError(
                f"{name}: cannot be found in trusted module {module_name} ({HOST_STEP_SETTING}): "
                f"{exc}"
            ) from None
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj.__module__ != module_name:
            raise ArtifactError(
                f"{name} is not a function or class defined in trusted module {module_name} "
                f"({HOST_STEP_SETTING}); only those are trusted"
            )
        found.append(name)
    return found


def iter_objects(root: Any) -> Iterator[Any]:
    """Every object reachable from ``root`` through containers and instance attributes."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, str | bytes | int | float | bool | type(None)):
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, type | ModuleType | FunctionType | BuiltinFunctionType | np.ufunc):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, functools.partial):  # its arguments are not in its __dict__
            stack.extend([obj.func, *obj.args, *obj.keywords.values()])
        elif isinstance(obj, np.ndarray):
            if obj.dtype == object:
                stack.extend(obj.ravel().tolist())
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())


def check_loaded(root: Any) -> None:
    """Check the index-bearing objects of a freshly loaded skops object; raise ArtifactError."""
    for obj in iter_objects(root):
        try:
            _check_object(obj)
        except ArtifactError:
            raise
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
            # Fitted state missing or of the wrong kind: not something scikit-learn wrote.
            raise ArtifactError(
                f"{type(obj).__name__} has inconsistent fitted state: {exc}"
            ) from None


def _check_object(obj: Any) -> None:
    if isinstance(obj, Tree):
        _check_tree(obj, type(obj).__name__)
    elif isinstance(obj, TreePredictor):
        _check_predictor(obj, "HistGradientBoosting tree")
    elif isinstance(obj, BSpline):
        _check_spline(obj)
    elif scipy.sparse.issparse(obj):
        try:
            obj.check_format(full_check=True)
        except (ValueError, TypeError) as exc:
            raise ArtifactError(f"invalid scipy sparse matrix: {exc}") from None
    if isinstance(getattr(obj, "tree_", None), Tree):
        _check_tree_owner(obj)
    if isinstance(obj, BaseForest | BaseBagging | BaseGradientBoosting):
        _check_ensemble(obj)
    if isinstance(obj, BaseHistGradientBoosting) and hasattr(obj, "_predictors"):
        _check_hist_gradient_boosting(obj)


def _check_spline(spline: BSpline) -> None:
    """Knots sorted and enough for the degree, coefficients enough for the knots: what the
    constructor checks (loading sets the attributes directly); and the array constructor
    scipy's own, since evaluating a spline calls it."""
    if spline._asarray is not _SPLINE._asarray:
        raise ArtifactError(f"BSpline: its array constructor is {spline._asarray!r}, not scipy's")
    try:
        BSpline(spline.t, spline.c, spline.k, spline.extrapolate, spline.axis)
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"BSpline has inconsistent fitted state: {exc}") from None


def _check_tree(tree: Tree, where: str) -> None:
    # node_count bounds the arrays scikit-learn exposes (children_left, …): check it first, as
    # those views are built from the node buffer of `capacity` entries.
    if not 0 < tree.node_count <= tree.capacity:
        raise ArtifactError(
            f"{where}: node_count {tree.node_count} is not in [1, capacity {tree.capacity}]"
        )
    left, right = tree.children_left, tree.children_right
    is_leaf = left == -1  # scikit-learn's TREE_LEAF
    check_node_links(left, right, is_leaf, f"scikit-learn {where}")
    check_feature_indices(tree.feature[~is_leaf], tree.n_features, f"scikit-learn {where}")


def _n_features(est: Any) -> int:
    n = getattr(est, "n_features_in_", None)
    if not isinstance(n, int | np.integer) or n < 1:
        raise ArtifactError(f"{type(est).__name__} has no valid n_features_in_ (not fitted?)")
    return int(n)


def _check_tree_owner(est: Any) -> None:
    """A tree estimator's predict validates its input against n_features_in_; the tree must match."""
    if est.tree_.n_features != _n_features(est):
        raise ArtifactError(
            f"{type(est).__name__}: its tree reads {est.tree_.n_features} features but "
            f"n_features_in_ is {est.n_features_in_}"
        )


def _check_ensemble(est: Any) -> None:
    """Forests, bagging and gradient boosting pass their validated input to member trees
    unchecked: each tree must read exactly the columns it is given."""
    name = type(est).__name__
    members = getattr(est, "estimators_", None)
    if members is None:
        return
    n_features = _n_features(est)
    subsets = getattr(est, "estimators_features_", None)
    flat = members.ravel().tolist() if isinstance(members, np.ndarray) else list(members)
    for i, member in enumerate(flat):
        tree = getattr(member, "tree_", None)
        if not isinstance(tree, Tree):
            continue
        expected = n_features
        if subsets is not None:
            if i >= len(subsets) or len(subsets[i]) > n_features:
                raise ArtifactError(f"{name}: estimators_features_ does not match estimators_")
            expected = len(subsets[i])
        if tree.n_features != expected:
            raise ArtifactError(
                f"{name}: member tree {i} reads {tree.n_features} features, expected {expected}"
            )
    if isinstance(est, BaseGradientBoosting):
        _check_gradient_boosting(est, members)


def _check_gradient_boosting(est: Any, members: Any) -> None:
    """predict_stages writes tree k into column k of the init estimator's raw predictions."""
    name = type(est).__name__
    if not isinstance(members, np.ndarray) or members.ndim != 2:
        raise ArtifactError(f"{name}: estimators_ must be a 2-D array of trees")
    k = members.shape[1]
    if k != est.n_trees_per_iteration_:
        raise ArtifactError(f"{name}: estimators_ has {k} columns, expected n_trees_per_iteration_")
    init = est.init_
    if hasattr(est, "classes_"):
        n_classes = len(est.classes_)
        if k != (1 if n_classes == 2 else n_classes) or est._loss.is_multiclass != (n_classes > 2):
            raise ArtifactError(
                f"{name}: trees per iteration / loss do not match {n_classes} classes"
            )
        if isinstance(init, DummyClassifier) and len(init.classes_) != n_classes:
            raise ArtifactError(
                f"{name}: init_ knows {len(init.classes_)} classes, not {n_classes}"
            )
    elif k != 1 or (isinstance(init, DummyRegressor) and init.n_outputs_ != 1):
        raise ArtifactError(f"{name}: a regressor has exactly one tree per iteration and output")
    if not (
        isinstance(init, DummyClassifier | DummyRegressor)
        or (isinstance(init, str) and init == "zero")
    ):
        raise ArtifactError(
            f"{name}(init={type(init).__name__}) is not supported; supported: the default Dummy "
            "estimator or 'zero'"
        )


def _check_predictor(predictor: TreePredictor, where: str) -> None:
    nodes = predictor.nodes
    if (
        not isinstance(nodes, np.ndarray)
        or nodes.dtype != PREDICTOR_RECORD_DTYPE
        or nodes.ndim != 1
    ):
        raise ArtifactError(f"{where}: nodes is not a 1-D array of predictor records")
    is_leaf = nodes["is_leaf"].astype(bool)
    check_node_links(nodes["left"], nodes["right"], is_leaf, where)
    for attr in ("raw_left_cat_bitsets", "binned_left_cat_bitsets"):
        bitsets = getattr(predictor, attr)
        if (
            not isinstance(bitsets, np.ndarray)
            or bitsets.dtype != np.uint32
            or bitsets.ndim != 2
            or bitsets.shape[1] != 8
            or not bitsets.flags.c_contiguous
        ):
            raise ArtifactError(f"{where}: {attr} is not a C-contiguous (n, 8) uint32 array")
    categorical = ~is_leaf & nodes["is_categorical"].astype(bool)
    n_bitsets = len(predictor.raw_left_cat_bitsets)
    if (
        nodes["bitset_idx"][categorical] >= min(n_bitsets, len(predictor.binned_left_cat_bitsets))
    ).any():
        raise ArtifactError(f"{where}: a categorical split's bitset index is out of range")


def _check_hist_gradient_boosting(est: Any) -> None:
    """Split features index the input and, for categorical splits, the known-category bitsets."""
    name = type(est).__name__
    n_features = _n_features(est)
    is_categorical = getattr(getattr(est, "_bin_mapper", None), "is_categorical_", None)
    if not isinstance(is_categorical, np.ndarray) or is_categorical.shape != (n_features,):
        raise ArtifactError(f"{name}: _bin_mapper.is_categorical_ does not match n_features_in_")
    for iteration in est._predictors:
        for predictor in iteration:
            if not isinstance(predictor, TreePredictor):
                raise ArtifactError(f"{name}: _predictors holds a {type(predictor).__name__}")
            _check_predictor(predictor, f"{name} tree")
            nodes = predictor.nodes
            internal = ~nodes["is_leaf"].astype(bool)
            features = nodes["feature_idx"][internal]
            check_feature_indices(features, n_features, f"{name} tree")
            categorical = nodes["is_categorical"][internal].astype(bool)
            if not is_categorical[features[categorical]].all():
                raise ArtifactError(f"{name}: a categorical split is on a numerical feature")
