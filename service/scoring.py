"""One scoring request against one model version: encode its rows, batch them with other
requests, decode the heads the client asked for, refuse arithmetic that overflowed.

The ``contributions`` output (a version registered with ``explain``) is batched on the version's
explanation batcher, from the same encoded rows, concurrently with the heads asked beside it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

import compiler
from service.batcher import Batcher
from service.errors import BadRequest, InvalidInput, some_of

#: The output of each row's per-column contributions (``CompiledModel.contributions``).
CONTRIBUTIONS = "contributions"
NO_CONTRIBUTIONS = 'this version has no contributions; register it with options {"explain": true}'

#: Requests with more rows than this are encoded on a worker thread, not on the event loop: a
#: small decode costs less than the thread hop, a large one would stall every other request.
OFF_LOOP_ROWS = 2048


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


@dataclass(frozen=True)
class Explained:
    """What names a ``contributions`` answer's axes: (rows, columns) where the model has one
    raw output, (rows, columns, outputs) where it has several (a class each)."""

    columns: tuple[str, ...]  # the input columns, then "bias"
    outputs: list[Any] | None  # the raw outputs' class labels, as JSON values (None: one output)


@dataclass(frozen=True)
class Scored:
    outputs: dict[str, np.ndarray]
    rows: int
    decode_s: float  # host decode of the outputs; the route adds its rendering and records it
    ignored: tuple[str, ...]  # the request's columns the model does not read
    explained: Explained | None = None  # where ``contributions`` was answered


async def score(
    model: compiler.CompiledModel,
    batcher: Batcher,
    data: Any,
    *,
    outputs: tuple[str, ...] | None,
    deadline: float | None,
    strict_columns: bool,
    dtype: str,
    decode_seconds: Observer,
    explainer: Batcher | None = None,
) -> Scored:
    """``data`` through ``model`` on ``batcher``; the encode time goes to ``decode_seconds``
    (the request's decode). ``contributions`` come from ``explainer`` (None: the version has
    none, and asking for them is a 400). Raises the batcher's errors (a closed batcher: a hot
    swap)."""
    wanted = _select_outputs(model, outputs, explains=explainer is not None)
    heads = [k for k in wanted if k != CONTRIBUTIONS]
    t0 = time.perf_counter()
    if _row_count(data) > OFF_LOOP_ROWS:
        feed, rows, ignored = await asyncio.to_thread(_encode, model, data, strict_columns)
    else:
        feed, rows, ignored = _encode(model, data, strict_columns)
    decode_seconds.observe(time.perf_counter() - t0)
    explained = None
    if len(heads) == len(wanted):
        raw = await batcher.submit(feed, rows, deadline=deadline)
    else:
        assert explainer is not None
        explain = explainer.submit(feed, rows, deadline=deadline)
        if heads:
            raw, explained = await _together(batcher.submit(feed, rows, deadline=deadline), explain)
        else:
            raw, explained = {}, await explain
    t0 = time.perf_counter()
    answered = {k: raw[k] for k in heads}
    _reject_overflow(feed, answered, dtype)  # only heads the client sees
    decoded = model.decode(answered)
    named = None
    if explained is not None:
        contributions = explained[CONTRIBUTIONS]  # (rows, columns + bias, raw outputs)
        named = _explained(model, contributions.shape[2])
        if named.outputs is None:
            contributions = contributions[:, :, 0]
        decoded = {k: contributions if k == CONTRIBUTIONS else decoded[k] for k in wanted}
    return Scored(decoded, rows, time.perf_counter() - t0, ignored, named)


def _explained(model: compiler.CompiledModel, outputs: int) -> Explained:
    """The names of ``model``'s contributions with ``outputs`` raw outputs: one per class (a
    forest classifier's probabilities, a multiclass booster's margins), else numbered."""
    if outputs == 1:
        return Explained(model.contribution_columns, None)
    classes = model.classes_
    labels = np.asarray(classes).tolist() if classes is not None else []
    if len(labels) != outputs:
        labels = list(range(outputs))
    return Explained(model.contribution_columns, labels)


async def _together(
    first: Awaitable[dict[str, np.ndarray]], second: Awaitable[dict[str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Both submissions at once; where one fails, the other is cancelled (a batcher never
    computes the untaken rows of a cancelled request) and the failure raised."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    try:
        a, b = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    return a, b


def _encode(
    model: compiler.CompiledModel, data: Any, strict_columns: bool
) -> tuple[dict[str, np.ndarray], int, tuple[str, ...]]:
    """``model.encode(data)``, and the columns of ``data`` it does not read (every row's, and
    refused, under ``strict_columns``)."""
    feed, rows = model.encode(data)
    ignored = model.schema.extra_columns(data, every_row=strict_columns)
    if ignored and strict_columns:
        reads = model.schema.names
        noun = "column" if len(ignored) == 1 else "columns"
        raise InvalidInput(
            f"strict_columns: the model does not read {noun} {some_of(list(ignored))}; it reads "
            f"{some_of(reads)}"
        )
    return feed, rows, ignored


def _row_count(data: Any) -> int:
    if isinstance(data, dict):
        return len(next(iter(data.values()), ()))
    return len(data)


def _reject_overflow(
    feed: Mapping[str, np.ndarray], raw: Mapping[str, np.ndarray], dtype: str
) -> None:
    """A NaN head for a row without NaN inputs is arithmetic that overflowed (e.g. inputs near
    3e38 scaled in float32, where the source computes in float64): answer 422 naming the rows,
    never ``null`` scores or a label picked from NaN probabilities. (Rows with missing values
    may give NaN where the source does, e.g. a scaler's transform.)"""
    if not any(_has_nan(values) for values in raw.values()):
        return  # the common case: the row-wise check runs only on a NaN
    bad = _nan_rows(raw)
    if bad is not None:
        missing = _nan_rows(feed)
        if missing is not None:
            bad &= ~missing
        if not bad.any():
            return
        where = np.flatnonzero(bad)
        listed = ", ".join(str(i) for i in where[:5]) + (", ..." if len(where) > 5 else "")
        raise InvalidInput(
            f"row(s) {listed}: the model's {dtype} arithmetic overflowed (NaN) on these values; "
            'scale the inputs down, or register the model with options {"dtype": "float64"}'
        )


def _has_nan(values: np.ndarray) -> bool:
    """Whether a float array holds a NaN: its dot product with itself is NaN exactly then (squares
    are >= 0, so no inf - inf), in one BLAS call instead of ``isnan`` + ``any``."""
    return values.dtype.kind == "f" and values.size > 0 and math.isnan(np.vdot(values, values))


def _nan_rows(arrays: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """Which rows have a NaN in any float array of ``arrays`` (None: no NaN anywhere)."""
    rows: np.ndarray | None = None
    for values in arrays.values():
        if values.dtype.kind == "f":
            nan = np.isnan(values)
            if nan.any():
                found = nan.reshape(len(nan), -1).any(axis=1)
                rows = found if rows is None else rows | found
    return rows


def _select_outputs(
    model: compiler.CompiledModel, outputs: tuple[str, ...] | None, *, explains: bool = False
) -> tuple[str, ...]:
    """The outputs to answer: every method by default (contributions only when asked for)."""
    if outputs is None:
        return tuple(model.methods)
    unknown = [o for o in outputs if o not in model.methods and o != CONTRIBUTIONS]
    if unknown:
        has = [*model.methods, CONTRIBUTIONS] if explains else list(model.methods)
        raise BadRequest(f"unknown outputs {unknown}; this model has {has}")
    if CONTRIBUTIONS in outputs and not explains:
        raise BadRequest(NO_CONTRIBUTIONS)
    return outputs
