"""Payload capture: a sampled share of scored requests and their answers, written to the model
store as Parquet for audits and retraining.

The request path only appends the request's data and answer to an in-memory buffer (bounded by
``KESTREL_CAPTURE_MAX_ROWS``; past it rows are dropped and counted). A background thread turns
the buffer into one Parquet file per (model, version, hour) every ``KESTREL_CAPTURE_FLUSH_S``,
or sooner once it holds a quarter of its bound, under
``capture/model=M/version=V/hour=YYYY-MM-DDTHH/`` in the store (the Hive layout:
``pyarrow.dataset`` and Spark read the partitions as columns), and removes partitions older
than ``KESTREL_CAPTURE_RETENTION_HOURS``. A file holds the model's input columns as the client
sent them, ``kestrel_time`` (Unix seconds of the answer) and one ``output_<head>`` column per
head answered (a list per row for multi-column heads such as ``predict_proba``).
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import parity
from service.metrics import Metrics
from service.settings import Settings
from service.store import ModelStore
from service.versions import ModelVersion
from service.workers import LazyThread

log = logging.getLogger("kestrel.capture")

#: A buffer holding this share of ``KESTREL_CAPTURE_MAX_ROWS`` is written at once, not at the
#: next tick: busy traffic then writes smaller files more often instead of dropping rows, and
#: each write holds the GIL (building the table) for less time.
EARLY_FLUSH_SHARE = 0.25


@dataclass(frozen=True)
class _Request:
    schema: Any  # the version's compiler.InputSchema
    data: Any  # as the client sent it
    answer: dict[str, Any]
    rows: int
    at: float


def hour_of(at: float) -> str:
    """The UTC hour partition of a Unix time: ``YYYY-MM-DDTHH``."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H")


def table(requests: list[_Request]) -> Any:
    """One Arrow table of captured requests of one version: input columns, time, outputs.

    Built column by column from each request's arrays (one pandas concatenation of the inputs,
    list columns from flat values and offsets), never row by row: the writer thread holds the
    GIL while it builds, and per-row Python objects would take it from the request path."""
    import pandas as pd
    import pyarrow as pa

    frames = []
    for r in requests:
        rows = parity.source_input(r.schema, r.data)
        frames.append(
            rows if hasattr(rows, "columns") else pd.DataFrame(rows, columns=r.schema.names)
        )
    inputs = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    out = pa.Table.from_pandas(inputs.reset_index(drop=True), preserve_index=False)
    at = np.repeat([r.at for r in requests], [r.rows for r in requests])
    out = out.append_column("kestrel_time", pa.array(at, pa.float64()))
    heads = dict.fromkeys(head for r in requests for head in r.answer)
    for head in heads:
        pieces = [_output(r.answer[head]) if head in r.answer else r.rows for r in requests]
        kind = next(p.type for p in pieces if not isinstance(p, int))
        column = [pa.nulls(p, kind) if isinstance(p, int) else p for p in pieces]
        out = out.append_column(f"output_{head}", pa.chunked_array(column, kind))
    return out


def _output(value: Any) -> Any:
    """One request's answer of one head as an Arrow array: a value per row, or a list per row
    for a multi-column head."""
    import pyarrow as pa

    answer = parity.side_by_side(value)
    if answer.ndim == 1:
        return pa.array(answer)
    flat = answer.reshape(len(answer), -1)
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.ravel()))


class Capture:
    """The buffer of captured requests and the thread writing it to the store."""

    def __init__(self, settings: Settings, store: ModelStore, metrics: Metrics) -> None:
        self.share, self.flush_s = settings.capture_share, settings.capture_flush_s
        self.retention_s = settings.capture_retention_hours * 3600
        self.max_rows = settings.capture_max_rows
        self.store, self.metrics = store, metrics
        self._buffer: dict[tuple[str, str, str], list[_Request]] = defaultdict(list)
        self._rows = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._due = threading.Event()  # set when the buffer holds a flush's worth of rows
        self._writer = LazyThread(self._run, "kestrel-capture")

    def offer(self, mv: ModelVersion, data: Any, answer: Mapping[str, Any], rows: int) -> None:
        """Maybe capture one scored request (its share); the request path's only cost."""
        if self.share <= 0 or random.random() >= self.share or mv.model is None or not rows:
            return
        now = time.time()
        with self._lock:
            if self._rows + rows > self.max_rows:
                self._count(mv.name, mv.version, "dropped", rows)
                return
            self._rows += rows
            key = (mv.name, mv.version, hour_of(now))
            self._buffer[key].append(_Request(mv.model.schema, data, dict(answer), rows, now))
            if self._rows >= self.max_rows * EARLY_FLUSH_SHARE:
                self._due.set()
        self._writer.ensure()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._due.wait(self.flush_s)
            self._due.clear()
            if not self._stop.is_set():
                self.flush()

    def flush(self) -> None:
        """Write what was captured since the last flush, then apply the retention."""
        with self._lock:
            buffer, self._buffer, self._rows = self._buffer, defaultdict(list), 0
        for (model, version, hour), requests in buffer.items():
            rows = sum(r.rows for r in requests)
            try:
                data = _parquet(table(requests))
                name = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}.parquet"
                self.store.put_capture(model, version, hour, name, data)
            except Exception as exc:  # the store's or a row's trouble: counted, never raised
                log.warning(
                    "capture of model %s version %s: %d rows not written: %s",
                    model,
                    version,
                    rows,
                    exc,
                    extra={"model": model, "version": version},
                )
                self._count(model, version, "dropped", rows)
                continue
            self._count(model, version, "written", rows)
        self._expire()

    def _expire(self) -> None:
        oldest = hour_of(time.time() - self.retention_s)
        try:
            for model, version, hour in self.store.capture_hours():
                if hour < oldest:
                    self.store.drop_capture(model, version, hour)
        except Exception as exc:
            log.warning("capture retention: %s", exc)

    def _count(self, model: str, version: str, result: str, rows: int) -> None:
        m = self.metrics
        m.child(m.capture_rows, model, version, result).inc(rows)

    def close(self) -> None:
        """Stop the writer after a last flush."""
        self._stop.set()
        self._due.set()
        if self._writer.started:
            self._writer.join(30)
            self.flush()


def _parquet(arrow_table: Any) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(arrow_table, sink, compression="zstd")
    return sink.getvalue()
