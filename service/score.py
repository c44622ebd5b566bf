"""``kestrel score MODEL --input PATH --output PATH``: a whole table scored offline, with the
answers online scoring gives.

MODEL is a registered ``name[@version]`` in the store (the current version without ``@``) or a
model file. A stored version is compiled as the service loads it: its options, its sample, its
stored execution plan (each bucket on the lowering the service placed it on) and the same
compile cache, in batches of the same top bucket, so a row's answers are the service's answers.

The input (Parquet, CSV or Arrow IPC; a path or any fsspec URL) is read one unit at a time (a
Parquet row group, an Arrow record batch, a CSV block), scored, and written as a part, so memory
stays bounded by a unit. Parts go to ``OUTPUT.parts/`` and each is renamed into place only when
whole, beside a manifest naming the input and the model: a run that stops (killed, interrupted,
a failure) resumes at its first missing part when started again with the same arguments. The
parts are then joined into OUTPUT, in the input's row order, in the output's format (by its
suffix), with the chosen heads appended as columns: ``predict``, ``predict_proba_<class>``, …
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.ipc as pa_ipc
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import compiler
from service import artifacts, codecs, parity
from service.loading import stored_plan
from service.settings import Settings
from service.shared_cache import executable_cache
from service.store import ModelNotFound, ModelStore, StoreError
from service.terminal import CommandError
from service.versions import ModelOptions

#: Table formats by file suffix.
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow"}
FORMATS |= {".feather": "arrow", ".ipc": "arrow"}
#: A CSV is read in blocks of about this many bytes (its unit of work and of resumption).
CSV_BLOCK_BYTES = 8 << 20
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Loaded:
    """A compiled model and what names it (for the parts' manifest)."""

    model: compiler.CompiledModel
    identity: str


def table_format(url: str) -> str:
    suffix = PurePosixPath(url.split("?", 1)[0]).suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(sorted(FORMATS))
        raise CommandError(f"{url}: unknown table format {suffix or '(no suffix)'!r}; use {known}")
    return FORMATS[suffix]


def load_model(spec: str, settings: Settings, *, allow_pickle: bool = False) -> Loaded:
    """``spec`` as a model file (where it is one) or a stored ``name[@version]``, compiled with
    the service's options, plan and cache (the store's shared executables read, never written)."""
    if _exists(spec):
        with fsspec.open(spec, "rb") as f:
            data = f.read()
        loaded = artifacts.load_artifact(
            data,
            filename=PurePosixPath(spec).name,
            allow_pickle=allow_pickle,
            host_step_modules=settings.host_step_modules,
        )
        options = ModelOptions().compile_options(
            max_batch=settings.max_batch,
            call_rows=settings.max_batch,
            cache=executable_cache(settings),
        )
        model = compiler.compile(loaded.estimator, options=options)
        return Loaded(model, f"file sha256:{hashlib.sha256(data).hexdigest()}")
    name, _, version = spec.partition("@")
    store = ModelStore(settings.store_url, dict(settings.store_options) or None)
    try:
        manifest = store.load_manifest()
        entry = manifest.models.get(name)
        record = (
            manifest.current(name)
            if not version
            else manifest.record(name, entry.resolve(version) if entry else version)
        )
    except (ModelNotFound, StoreError) as exc:
        raise CommandError(
            f"{spec}: no such file, and no such model version in the store {store.url} ({exc})"
        ) from None
    if record is None:
        raise CommandError(f"{spec}: model {name!r} has no current version in {store.url}")
    loaded = artifacts.load_artifact(
        store.get_blob(record.artifact),
        filename=record.filename,
        format=record.format,
        allow_pickle=record.format == "pickle",
        host_step_modules=settings.host_step_modules,
    )
    sample = None
    if record.sample:
        rows = codecs.loads(store.get_blob(record.sample), allow_nan=True)
        sample = parity.source_input(compiler.schema_for(loaded.estimator), rows)
    opts = ModelOptions.model_validate(record.options)
    max_batch = opts.max_batch or settings.max_batch
    plan = stored_plan(record)  # as a replica reads it: an unreadable plan is placed anew
    cache = executable_cache(settings, store)
    options = opts.compile_options(max_batch=max_batch, call_rows=max_batch, cache=cache, plan=plan)
    model = compiler.compile(loaded.estimator, sample=sample, options=options)
    return Loaded(model, f"{record.name}@{record.version} {record.artifact}")


def _exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.isfile(path))


# -- input units ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """An input table read unit by unit."""

    url: str
    format: str
    units: Callable[[int], Iterator[pa.Table]]  # the units from the given one on
    rows: int | None  # None: not known before reading (CSV)
    fingerprint: str  # changes when the input does


def open_source(url: str) -> Source:
    fmt = table_format(url)
    fs, path = fsspec.core.url_to_fs(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise CommandError(f"{url}: no such input file") from None
    fingerprint = json.dumps(
        {k: str(info.get(k)) for k in ("size", "mtime", "ETag", "LastModified") if k in info}
    )
    if fmt == "parquet":
        with fs.open(path, "rb") as f:
            metadata = pq.ParquetFile(f).metadata
        rows = metadata.num_rows

        def parquet_units(start: int) -> Iterator[pa.Table]:
            with fs.open(path, "rb") as f:
                reader = pq.ParquetFile(f)
                for group in range(start, reader.num_row_groups):
                    yield reader.read_row_group(group)

        return Source(url, fmt, parquet_units, rows, fingerprint)
    if fmt == "arrow":

        def arrow_units(start: int) -> Iterator[pa.Table]:
            with fs.open(path, "rb") as f:
                reader = _ipc_reader(f)
                for i, batch in enumerate(reader):
                    if i >= start:
                        yield pa.Table.from_batches([batch])

        # Its row count would take a pass over every batch: the progress shows no total.
        return Source(url, fmt, arrow_units, None, fingerprint)

    def csv_units(start: int) -> Iterator[pa.Table]:
        with fs.open(path, "rb") as f:
            options = pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES)
            for i, batch in enumerate(pa_csv.open_csv(f, read_options=options)):
                if i >= start:
                    yield pa.Table.from_batches([batch])

    return Source(url, fmt, csv_units, None, fingerprint)


def _ipc_reader(f: Any) -> Iterator[pa.RecordBatch]:
    """An Arrow IPC file's record batches (or a stream's)."""
    try:
        reader = pa_ipc.open_file(f)
    except pa.ArrowInvalid:
        f.seek(0)
        yield from pa_ipc.open_stream(f)
        return
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


# -- scoring -------------------------------------------------------------------------------------
def head_columns(model: compiler.CompiledModel, heads: Sequence[str], outputs: dict) -> dict:
    """Each chosen head as named output columns: a 1-D head under its name; a 2-D one a column
    per class (``predict_proba_<label>``) or per position."""
    columns: dict[str, np.ndarray] = {}
    classes = model.classes_
    for head in heads:
        value = outputs[head]
        if isinstance(value, list):  # a list-valued head (multi-output): one block per output
            for i, part in enumerate(value):
                for j in range(part.shape[1]):
                    columns[f"{head}_{i}_{j}"] = part[:, j]
            continue
        value = np.asarray(value)
        if value.ndim == 1:
            columns[head] = value
            continue
        labels = classes if classes is not None and len(classes) == value.shape[1] else None
        for j in range(value.shape[1]):
            columns[f"{head}_{labels[j] if labels is not None else j}"] = value[:, j]
    return columns


def default_heads(model: compiler.CompiledModel) -> list[str]:
    """``predict``, and ``predict_proba`` where the model has it; else every method."""
    wanted = [m for m in ("predict", "predict_proba") if m in model.methods]
    return wanted or list(model.methods)


def chosen_heads(model: compiler.CompiledModel, heads: Sequence[str] | None) -> list[str]:
    """``heads``, each one the model has (the default ones where none are given)."""
    chosen = list(heads or default_heads(model))
    unknown = [h for h in chosen if h not in model.methods]
    if unknown:
        raise CommandError(f"unknown heads {unknown}; this model has {list(model.methods)}")
    return chosen


def head_types(model: compiler.CompiledModel, heads: Sequence[str]) -> dict[str, pa.DataType]:
    """The Arrow type of each column :func:`score_unit` appends for ``heads``, known before any
    row is scored, for engines that need an output schema up front (Spark). One row of each
    head's declared type goes through the same naming and conversion as scored rows do."""
    one_row: dict[str, Any] = {}
    for head in heads:
        spec = model.output_specs[head]
        if head == "predict" and model.classes_ is not None:
            # Labels as decoding gives them: an object array of strings must not read as int.
            value = model.classes_[:1]
        else:
            value = np.zeros((1, *spec.shape), spec.dtype)
        parts = np.cumsum(spec.parts)[:-1]
        one_row[head] = np.split(value, parts, axis=1) if spec.parts else value
    columns = head_columns(model, heads, one_row)
    return {name: pa.array(values).type for name, values in columns.items()}


def score_unit(model: compiler.CompiledModel, heads: Sequence[str], table: pa.Table) -> pa.Table:
    frame = table.to_pandas()
    try:
        outputs = model.decode(model.run(frame))
    except compiler.SchemaError as exc:
        raise CommandError(f"the input does not fit the model: {exc}") from None
    out = table
    for name, values in head_columns(model, heads, outputs).items():
        if name in out.column_names:
            raise CommandError(f"the input already has a column {name!r}, which a head would add")
        out = out.append_column(name, pa.array(values))
    return out


@dataclass
class Scored:
    rows: int
    units: int
    resumed_at: int  # the first unit this run scored (0: from the start)
    seconds: float


def score(
    loaded: Loaded,
    source: Source,
    output: str,
    heads: Sequence[str] | None = None,
    *,
    progress: Console | None = None,
    on_unit: Callable[[int], None] | None = None,
) -> Scored:
    """Score ``source`` into ``output``, resuming from its parts where a run stopped.
    ``on_unit``: called after each unit is written (its index)."""
    model = loaded.model
    heads = chosen_heads(model, heads)
    out_format = table_format(output)
    fs, out_path = fsspec.core.url_to_fs(output)
    parts = f"{out_path}.parts"
    state = {"input": source.url, "input_version": source.fingerprint, "model": loaded.identity}
    state["heads"] = heads
    done, rows_done = _resume(fs, parts, state)
    t0 = time.perf_counter()
    rows, units = rows_done, done
    with _ProgressBar(progress, source.rows, rows_done) as advance:
        for index, table in enumerate(source.units(done), start=done):
            _write_part(fs, f"{parts}/{_part(index)}", score_unit(model, heads, table))
            rows, units = rows + table.num_rows, index + 1
            advance(table.num_rows)
            if on_unit is not None:
                on_unit(index)
    _join(fs, parts, out_path, out_format, units)
    fs.rm(parts, recursive=True)
    return Scored(rows, units, done, time.perf_counter() - t0)


def _part(index: int) -> str:
    return f"part-{index:08d}.parquet"


def _resume(fs: Any, parts: str, state: dict[str, Any]) -> tuple[int, int]:
    """(the first unit to score, rows already scored) from the parts of an earlier run with
    the same input, model and heads; a fresh parts directory otherwise."""
    manifest = f"{parts}/{_MANIFEST}"
    if fs.exists(manifest):
        with fs.open(manifest, "r") as f:
            earlier = json.load(f)
        if earlier != state:
            raise CommandError(
                f"{parts} holds the parts of another run (input, model or heads differ: "
                f"{earlier}); remove it, or write to another output"
            )
        done, rows = 0, 0
        while fs.exists(f"{parts}/{_part(done)}"):
            with fs.open(f"{parts}/{_part(done)}", "rb") as f:
                rows += pq.ParquetFile(f).metadata.num_rows
            done += 1
        return done, rows
    fs.makedirs(parts, exist_ok=True)
    with fs.open(manifest, "w") as f:
        json.dump(state, f)
    return 0, 0


def _write_part(fs: Any, path: str, table: pa.Table) -> None:
    """Written whole under a temporary name, then renamed: a part that exists is complete."""
    partial = f"{path}.partial"
    with fs.open(partial, "wb") as f:
        pq.write_table(table, f)
    fs.mv(partial, path)


def _join(fs: Any, parts: str, out_path: str, out_format: str, units: int) -> None:
    """The parts, in order, as one table in ``out_format``, streamed part by part."""
    partial = f"{out_path}.partial"
    writer: Any = None
    with fs.open(partial, "wb") as sink:
        for i in range(units):
            with fs.open(f"{parts}/{_part(i)}", "rb") as f:
                table = pq.read_table(f)
            if writer is None:
                writer = _writer(out_format, sink, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()
    fs.mv(partial, out_path)


def _writer(out_format: str, sink: Any, schema: pa.Schema) -> Any:
    if out_format == "parquet":
        return pq.ParquetWriter(sink, schema)
    if out_format == "arrow":
        return pa_ipc.new_file(sink, schema)
    return pa_csv.CSVWriter(sink, schema)


class _ProgressBar:
    """A rich progress bar on ``console`` (rows, rows/s, ETA); nothing without a console."""

    def __init__(self, console: Console | None, total: int | None, done: int) -> None:
        self._bar = None
        if console is not None:
            self._bar = Progress(
                TextColumn("scoring"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows"),
                TextColumn("{task.fields[speed]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task("score", total=total, completed=done, speed="")
            self._t0, self._done0 = time.perf_counter(), done

    def __enter__(self) -> Callable[[int], None]:
        if self._bar is None:
            return lambda rows: None
        self._bar.start()
        bar, task = self._bar, self._task

        def advance(rows: int) -> None:
            bar.advance(task, rows)
            done = bar.tasks[0].completed - self._done0
            rate = done / max(time.perf_counter() - self._t0, 1e-9)
            bar.update(task, speed=f"{rate:,.0f} rows/s")

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
