"""Probe rows for the registration gate, built from the fitted model rather than from data.

Random or sampled rows rarely land on the values where a model decides, and that is where a
compiled model goes wrong: a threshold that sits on a data value, a bin edge, a quantile knot.
The compiler records those raw values (:attr:`compiler.CompiledModel.decisions`); each probe
group here takes the base rows (the user's sample, or synthesised ones) and sets one column to
the values on and around every decision of one step (:func:`compiler.probes.neighbourhood`),
midway between consecutive decisions, to NaN and to ±inf, or to every known category and an
unseen one. Joint rows then draw every decided column at once from its probe values, so splits
deeper in a tree see probed values too. Groups the source itself refuses (NaN into a model that
rejects it, an unseen category into ``handle_unknown='error'``) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import compiler
from compiler.probes import DecisionPoints, midpoints, neighbourhood

#: A category no fitted encoder has seen.
UNSEEN = "<kestrel: unseen category>"


@dataclass(frozen=True)
class ProbeGroup:
    """Rows probing ``column`` at ``values``; ``what`` names the probe for error messages."""

    column: int
    values: np.ndarray
    what: str


@dataclass(frozen=True)
class ProbeRows:
    rows: object  # the source's input form: a DataFrame or an ndarray
    labels: list[str]  # what each row probes

    def __len__(self) -> int:
        return len(self.labels)


def probe_groups(
    schema: compiler.InputSchema, decisions: Sequence[DecisionPoints], limit: int
) -> list[ProbeGroup]:
    """Every probe group of a model, at most about ``limit`` values in all (decisions thinned
    evenly where a large ensemble has more)."""
    names = schema.names
    groups: list[ProbeGroup] = []
    by_column: dict[int, list[np.ndarray]] = {}
    for d in decisions:
        by_column.setdefault(d.column, []).append(d.values)
    numeric = [j for j in range(len(names)) if j not in schema.vocabularies]
    # Special values first: they are few and always kept.
    for j in numeric:
        groups.append(ProbeGroup(j, np.array([np.nan]), f"column {names[j]!r} = NaN"))
        groups.append(ProbeGroup(j, np.array([np.inf, -np.inf]), f"column {names[j]!r} = ±inf"))
    for j, vocab in schema.vocabularies.items():
        known = np.asarray(vocab.categories, dtype=object)
        groups.append(ProbeGroup(j, known, f"column {names[j]!r}, every category"))
        groups.append(ProbeGroup(j, np.asarray([UNSEEN], dtype=object), f"column {names[j]!r}"))
    budget = max(limit - sum(len(g.values) for g in groups), 0)
    points = [neighbourhood(d.values) for d in decisions]
    between = {j: midpoints(np.concatenate(v)) for j, v in by_column.items()}
    total = sum(len(p) for p in points) + sum(len(m) for m in between.values())
    keep = min(1.0, budget / total) if total else 1.0
    for d, values in zip(decisions, points, strict=True):
        groups.append(
            ProbeGroup(
                d.column,
                _thinned(values, keep),
                f"column {names[d.column]!r} near a {d.kind} of {d.step}",
            )
        )
    for j, values in between.items():
        groups.append(
            ProbeGroup(j, _thinned(values, keep), f"column {names[j]!r} between decisions")
        )
    return groups


def build(
    schema: compiler.InputSchema,
    base: object,
    decisions: Sequence[DecisionPoints],
    accepts: Callable[[object], bool],
    *,
    limit: int,
    joint_rows: int = 256,
    seed: int = 0,
) -> ProbeRows:
    """The probe rows of a model over ``base`` rows (source form), keeping only groups the source
    ``accepts``."""
    kept: list[tuple[object, list[str]]] = []
    for kind in _by_kind(probe_groups(schema, decisions, limit), schema):
        parts = [
            (_with_column(base, g.column, g.values), [f"{g.what}: {_shown(v)}" for v in g.values])
            for g in kind
        ]
        if accepts(_concat([t for t, _ in parts])):
            kept += parts
            continue
        # Some group of this kind the source refuses (inf into one branch of a column
        # transformer): keep the groups it accepts, each asked on one base row.
        for group, part in zip(kind, parts, strict=True):
            if accepts(_with_column(_slice(base, 1), group.column, group.values)):
                kept.append(part)
    joint = _joint(base, decisions, joint_rows, seed)
    if joint is not None and accepts(joint):
        kept.append((joint, ["every decided column drawn from its probe values"] * len(joint)))
    if not kept:
        return ProbeRows(_slice(base, 0), [])
    return ProbeRows(_concat([t for t, _ in kept]), [label for _, ls in kept for label in ls])


def _by_kind(groups: list[ProbeGroup], schema: compiler.InputSchema) -> list[list[ProbeGroup]]:
    """Groups by what the source may refuse: NaN (not where the schema knows it does), ±inf,
    categories, finite numbers."""
    nan, inf, categories, finite = [], [], [], []
    for g in groups:
        if g.values.dtype.kind == "O":
            categories.append(g)
        elif np.isnan(g.values).any():
            if g.column not in schema.rejects_nan:
                nan.append(g)
        elif np.isinf(g.values).any():
            inf.append(g)
        else:
            finite.append(g)
    return [kind for kind in (finite, nan, inf, categories) if kind]


def _thinned(values: np.ndarray, keep: float) -> np.ndarray:
    if keep >= 1.0 or len(values) <= 1:
        return values
    n = max(1, int(len(values) * keep))
    return values[np.linspace(0, len(values) - 1, n).round().astype(int)]


def _shown(value: object) -> str:
    return repr(float(value)) if isinstance(value, (float, np.floating)) else repr(value)


def _joint(
    base: object,
    decisions: Sequence[DecisionPoints],
    n: int,
    seed: int,
) -> object | None:
    """``n`` base rows with every decided column drawn at once from its probe values."""
    if not decisions or n <= 0:
        return None
    rng = np.random.default_rng(seed)
    pools: dict[int, list[np.ndarray]] = {}
    for d in decisions:
        pools.setdefault(d.column, []).append(neighbourhood(d.values, steps=1))
    table = _tiled(base, n)
    for j, pool in pools.items():
        values = np.concatenate(pool)
        table = _set(table, j, values[rng.integers(0, len(values), n)])
    return table


def _with_column(base: object, column: int, values: np.ndarray) -> object:
    return _set(_tiled(base, len(values)), column, values)


def _tiled(base: object, n: int) -> object:
    index = np.arange(n) % max(len(base), 1)  # type: ignore[arg-type]
    if hasattr(base, "iloc"):
        return base.iloc[index].reset_index(drop=True)
    return np.asarray(base)[index].copy()


def _set(table: object, column: int, values: np.ndarray) -> object:
    if hasattr(table, "iloc"):
        import pandas as pd

        name = table.columns[column]
        table = table.copy()
        dtype = table[name].dtype
        if isinstance(dtype, pd.CategoricalDtype):  # unseen values become missing, as in pandas
            table[name] = pd.Categorical(values, categories=dtype.categories)
        else:
            table[name] = values.astype(np.float64) if values.dtype.kind == "f" else values
        return table
    out = np.asarray(table)
    if out.ndim == 1:  # a 1-D input (LabelEncoder's labels): the probed values themselves
        return values.astype(object if values.dtype.kind == "O" else np.float64)
    if values.dtype.kind == "O":  # categories into a numeric table
        out = out.astype(object)
    elif out.dtype.kind in "iub":
        out = out.astype(np.float64)
    out[:, column] = values
    return out


def joined(base: object, probes: object) -> object:
    """The base rows followed by the probe rows, in the base's form."""
    return _concat([base, probes])


def _slice(base: object, n: int) -> object:
    return base.iloc[:n] if hasattr(base, "iloc") else np.asarray(base)[:n]


def _concat(tables: list[object]) -> object:
    if hasattr(tables[0], "iloc"):
        import pandas as pd

        return pd.concat(tables, ignore_index=True)
    if any(np.asarray(t).dtype.kind == "O" for t in tables):
        return np.concatenate([np.asarray(t, dtype=object) for t in tables])
    return np.concatenate([np.asarray(t, dtype=np.float64) for t in tables])
