"""Offline scoring of a Parquet file: ``kestrel score`` against the model's own ``predict``.

Each pipeline (bench/exactness.py's, fitted on its mixed frame) scores the same Parquet file of
``--rows`` rows in row groups of ``--row-group``, writing the input with ``predict`` and
``predict_proba`` appended to a Parquet file, two ways:

- ``kestrel``: ``service.score.score`` (what ``kestrel score`` runs), the model compiled first
  (not timed), as a file model;
- ``sklearn``: per row group, ``to_pandas``, the fitted pipeline's ``predict`` and
  ``predict_proba``, the columns appended, the group written: the same reads and writes.

Each runs in its own process on 1 core and on 2 cores (``taskset``; the thread pools of OpenMP,
BLAS, numba and XLA sized to match), ``--rounds`` times in alternating order; a figure is the
median rows/s.

Then, in the same run, Ray Data (``service.distributed.ScoreBatches``) with 1 worker and with 2
over the same file, read, scored and written to Parquet, on 2 cores (one thread per worker): one
process per pipeline, one local Ray cluster, the two worker counts alternating round by round.
Two rates each: ``job``, the whole job (Ray starts the workers and each loads the model, from a
warm compile cache, every job); ``scoring``, from the first batch a worker starts scoring to the
last one's end. Needs ``kestrel[ray]``; ``--no-ray`` leaves it out.

Prints tables; never asserts.

Usage: python bench/offline.py [--pipelines ct_hgb,scaled_rf] [--rows 200000]
       [--row-group 20000] [--rounds 3] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("ct_hgb", "scaled_rf", "scaled_lr")
ENGINES = ("kestrel", "sklearn")


def _threads(cores: int) -> dict[str, str]:
    n = str(cores)
    return {
        "OMP_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "NUMBA_NUM_THREADS": n,
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={'true' if cores > 1 else 'false'} "
        f"intra_op_parallelism_threads={n}",
    }


def run(name: str, engine: str, data: str, rounds: int) -> None:
    """In a worker: fit, prepare, then score ``data`` ``rounds`` times; prints the seconds of
    each run as a JSON list."""
    sys.path.insert(0, str(ROOT / "bench"))
    import exactness
    import pyarrow as pa
    import pyarrow.parquet as pq
    import skops.io as sio

    from service import score
    from service.settings import Settings

    model, _ = exactness._fit(name)
    out = tempfile.mkdtemp(prefix="kestrel-offline-")
    seconds = []
    if engine == "kestrel":
        path = Path(out) / "model.skops"
        path.write_bytes(sio.dumps(model))
        settings = Settings(cache_dir=Path(out) / "cache")
        loaded = score.load_model(str(path), settings)
        source = score.open_source(data)
        for i in range(rounds):
            t0 = time.perf_counter()
            score.score(loaded, source, f"{out}/scored-{i}.parquet")
            seconds.append(time.perf_counter() - t0)
    else:
        for i in range(rounds):
            t0 = time.perf_counter()
            reader = pq.ParquetFile(data)
            writer = None
            for group in range(reader.num_row_groups):
                table = reader.read_row_group(group)
                frame = table.to_pandas()
                table = table.append_column("predict", pa.array(model.predict(frame)))
                for k, column in enumerate(model.predict_proba(frame).T):
                    table = table.append_column(f"predict_proba_{k}", pa.array(column))
                if writer is None:
                    writer = pq.ParquetWriter(f"{out}/scored-{i}.parquet", table.schema)
                writer.write_table(table)
            if writer is not None:
                writer.close()
            seconds.append(time.perf_counter() - t0)
    print(json.dumps(seconds), flush=True)


WORKERS = (1, 2)


def run_ray(name: str, data: str, rounds: int, batch: int) -> None:
    """In a worker: fit, warm the compile cache, then run the Ray Data job (``batch`` rows a
    call) ``rounds`` times with each worker count; prints ``{workers: {"job": [seconds], "scoring": [seconds]}}`` as JSON."""
    sys.path.insert(0, str(ROOT / "bench"))
    import exactness
    import ray
    import skops.io as sio

    from service import score
    from service.settings import Settings

    model, _ = exactness._fit(name)
    out = Path(tempfile.mkdtemp(prefix="kestrel-offline-ray-"))
    path, cache = out / "model.skops", out / "cache"
    path.write_bytes(sio.dumps(model))
    score.load_model(str(path), Settings(cache_dir=cache))  # workers load what this compiled
    # A logical CPU per worker and one for Ray Data's read and write tasks (on the same two
    # cores): with only as many as workers, the reads wait for a CPU the workers never free.
    ray.init(num_cpus=max(WORKERS) + 1, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    seconds: dict[int, dict[str, list[float]]] = {w: {"job": [], "scoring": []} for w in WORKERS}
    for i in range(rounds):
        for workers in WORKERS if i % 2 == 0 else WORKERS[::-1]:
            spans = out / f"spans-{i}-{workers}"
            spans.mkdir()
            kwargs = {"model": str(path), "cache_dir": str(cache), "spans": str(spans)}
            t0 = time.perf_counter()
            ray.data.read_parquet(data).map_batches(
                TimedScoreBatches,
                fn_constructor_kwargs=kwargs,
                batch_format="pyarrow",
                batch_size=batch,
                concurrency=workers,
            ).write_parquet(str(out / f"scored-{i}-{workers}"))
            seconds[workers]["job"].append(time.perf_counter() - t0)
            seconds[workers]["scoring"].append(_span(spans))
    ray.shutdown()
    print(json.dumps(seconds), flush=True)


class TimedScoreBatches:
    """``ScoreBatches`` that appends each call's start and end (wall clock, comparable across
    the workers' processes) to a file of its own under ``spans``."""

    def __init__(self, spans: str, **kwargs: Any) -> None:
        from service.distributed import ScoreBatches

        self._score = ScoreBatches(**kwargs)
        self._log = Path(spans) / f"{os.getpid()}-{id(self)}.txt"

    def __call__(self, batch: Any) -> Any:
        start = time.time()
        scored = self._score(batch)
        with self._log.open("a") as f:
            f.write(f"{start} {time.time()}\n")
        return scored


def _span(spans: Path) -> float:
    """Seconds from the first call's start to the last call's end, over every worker."""
    calls = [
        tuple(map(float, line.split()))
        for log in spans.iterdir()
        for line in log.read_text().splitlines()
    ]
    return max(end for _, end in calls) - min(start for start, _ in calls)


def _measure(name: str, engine: str, cores: int, data: str, rounds: int, batch: int = 0) -> Any:
    """The figures of ``run`` (or ``run_ray``, engine ``ray``) in a process pinned to ``cores``."""
    # Ray's workers import this module too (TimedScoreBatches): bench/ on their path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")])}
    env |= _threads(1 if engine == "ray" else cores)  # ray: one thread per worker process
    call = (
        f"offline.run_ray({name!r}, {data!r}, {rounds}, {batch})"
        if engine == "ray"
        else f"offline.run({name!r}, {engine!r}, {data!r}, {rounds})"
    )
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import offline; {call}"
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:cores]))
    done = subprocess.run(
        ["taskset", "-c", cpus, sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} {engine} on {cores} cores failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write_data(rows: int, row_group: int, path: str) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import exactness
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = exactness._sample(exactness._frame(20_000, 0), rows, seed=3)
    pq.write_table(
        pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=row_group
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--row-group", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-ray", dest="ray", action="store_false")
    args = parser.parse_args()
    cores = [1, 2] if len(os.sched_getaffinity(0)) >= 2 else [1]
    with tempfile.TemporaryDirectory() as tmp:
        data = f"{tmp}/rows.parquet"
        _write_data(args.rows, args.row_group, data)
        print(
            f"{args.rows:,} rows in row groups of {args.row_group:,}; rows/s, median of "
            f"{args.rounds} runs each; CPUs {sorted(os.sched_getaffinity(0))}\n"
        )
        print("| pipeline | engine | " + " | ".join(f"{c} core(s)" for c in cores) + " | 2/1 |")
        print("|---|---|" + "---|" * len(cores) + "---|")
        ray_rows: list[str] = []
        for name in args.pipelines.split(","):
            rates: dict[str, dict[int, float]] = {}
            for c in cores:
                for engine in ENGINES if c % 2 else ENGINES[::-1]:
                    seconds = _measure(name, engine, c, data, args.rounds)
                    rates.setdefault(engine, {})[c] = args.rows / statistics.median(seconds)
            for engine in ENGINES:
                r = rates[engine]
                scaling = f"{r[2] / r[1]:.2f}x" if 2 in r else "n/a"
                cells = " | ".join(f"{r[c]:,.0f}" for c in cores)
                print(f"| {name} | {engine} | {cells} | {scaling} |")
            ratio = " | ".join(f"{rates['kestrel'][c] / rates['sklearn'][c]:.2f}x" for c in cores)
            print(f"| {name} | kestrel / sklearn | {ratio} | |", flush=True)
            if args.ray and len(cores) > 1:
                figures = _measure(name, "ray", 2, data, args.rounds, args.row_group)
                ray_rows += [_ray_row(name, measure, figures, args.rows) for measure in MEASURES]
        if ray_rows:
            print(
                "\nRay Data on 2 cores, 1 and 2 workers (one thread each), same file, same "
                f"run; rows/s, median of {args.rounds} runs each\n"
            )
            print("| pipeline | measure | 1 worker | 2 workers | 2/1 |")
            print("|---|---|---|---|---|")
            print("\n".join(ray_rows))


MEASURES = ("job", "scoring")


def _ray_row(name: str, measure: str, figures: dict[str, Any], rows: int) -> str:
    rate = {int(w): rows / statistics.median(f[measure]) for w, f in figures.items()}
    return f"| {name} | {measure} | {rate[1]:,.0f} | {rate[2]:,.0f} | {rate[2] / rate[1]:.2f}x |"


if __name__ == "__main__":
    main()
