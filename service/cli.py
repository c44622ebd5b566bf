"""Command-line entry point: ``kestrel serve | register | compile | demo``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from service.settings import Settings


def _cmd_demo(args: argparse.Namespace) -> int:
    from service.demo import run_demo

    return run_demo(cache_dir=args.cache_dir, max_batch=args.max_batch)


def _cmd_serve(args: argparse.Namespace) -> int:
    from service import logs
    from service.settings import Settings

    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "store_url": args.store,
            "cache_dir": args.cache_dir,
            "log_format": args.log_format,
            "preload": args.preload,
            "preload_name": args.preload_name,
            "workers": args.workers,
        }.items()
        if value is not None
    }
    if args.demo:
        overrides["demo_model"] = True
    if args.allow_unauthenticated_management:
        overrides["allow_unauthenticated_management"] = True
    settings = Settings(**overrides)
    logs.configure(settings.log_level, settings.log_format)
    if settings.management_exposed_without_token() and not (
        settings.allow_unauthenticated_management
    ):
        print(
            f"refusing to serve model management on {settings.host} without a token: set "
            "KESTREL_ADMIN_TOKEN, bind to 127.0.0.1, or pass --allow-unauthenticated-management",
            file=sys.stderr,
        )
        return 2
    workers = settings.worker_count()
    if workers == 1:
        return _serve_one_process(settings)
    if settings.preload is not None:
        from service.preload import Preloader, PreloadError

        try:  # here, not in each worker: a wrong path stops `serve` before any worker starts
            Preloader.resolve(
                settings.preload, settings.preload_name, allow_pickle=settings.allow_pickle
            )
        except PreloadError as exc:
            print(f"cannot preload a model: {exc}", file=sys.stderr)
            return 2
    from service.supervisor import serve_workers

    # The workers read their settings from the environment, as this process did; the options
    # given on the command line join it.
    environment = {f"KESTREL_{key.upper()}": str(value) for key, value in overrides.items()}
    return serve_workers(settings, workers, environment)


def _serve_one_process(settings: Settings) -> int:
    import uvicorn

    from service.app import create_app
    from service.preload import PreloadError
    from service.shedding import protocol_for

    try:
        app = create_app(settings)
    except PreloadError as exc:
        print(f"cannot preload a model: {exc}", file=sys.stderr)
        return 2
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler it found: with
    # the default one the process would die by the signal (exit -15) after a clean drain. An
    # orchestrator's SIGTERM is a normal stop, so once drained (or before serving) exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # uvicorn's httptools protocol, refusing overloaded scoring requests on their headers.
        http=protocol_for(app.state.admission),
        workers=1,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _cmd_register(args: argparse.Namespace) -> int:
    from service.register import register_file

    return register_file(
        args.file,
        name=args.name,
        url=args.url,
        version=args.version,
        format=args.format,
        sample=args.sample,
        options=args.options,
        token=args.token or os.environ.get("KESTREL_ADMIN_TOKEN"),
        wait=not args.no_wait,
        timeout=args.timeout,
        as_json=args.json,
    )


def _cmd_promote(args: argparse.Namespace) -> int:
    from service.rollout import change_current

    return change_current(
        args.url,
        args.name,
        version=getattr(args, "version", None),
        token=args.token or os.environ.get("KESTREL_ADMIN_TOKEN"),
        actor=args.actor,
        timeout=args.timeout,
    )


def _cmd_compile(args: argparse.Namespace) -> int:
    from service.offline import compile_file

    return compile_file(
        args.file,
        sample=args.sample,
        max_batch=args.max_batch,
        tree_strategy=args.tree_strategy,
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        allow_pickle=args.allow_pickle,
        as_json=args.json,
    )


def _cmd_score(args: argparse.Namespace) -> int:
    from rich.console import Console

    from service.score import load_model, open_source, score
    from service.settings import Settings

    overrides = {"store_url": args.store, "cache_dir": args.cache_dir}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    err = Console(stderr=True)
    source = open_source(args.input)  # fails fast on a missing or unknown input
    loaded = load_model(args.model, settings, allow_pickle=args.allow_pickle)
    heads = [h for h in args.heads.split(",") if h] if args.heads else None
    done = score(loaded, source, args.output, heads, progress=None if args.quiet else err)
    resumed = f", resumed at unit {done.resumed_at}" if done.resumed_at else ""
    rate = done.rows / done.seconds if done.seconds > 0 else float("inf")
    err.print(
        f"scored {done.rows:,} rows in {done.units} units into {args.output} "
        f"({done.seconds:.1f} s, {rate:,.0f} rows/s{resumed})"
    )
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error of the CLI (``-h`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} -h)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kestrel", description="Serve traditional ML models compiled to XLA.")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="run `kestrel COMMAND -h` for its options",
    )

    serve = sub.add_parser("serve", help="run the HTTP service (settings: KESTREL_* variables)")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--store", default=None, help="model store: a path or fsspec URL")
    serve.add_argument("--cache-dir", default=None, help="trusted compiled-executable cache")
    serve.add_argument("--demo", action="store_true", help="register the iris demo model")
    serve.add_argument(
        "--log-format", choices=("text", "json"), default=None, help="log lines (default text)"
    )
    serve.add_argument(
        "--preload",
        type=Path,
        default=None,
        help="model file, or directory holding one (KServe: /mnt/models), registered at start",
    )
    serve.add_argument("--preload-name", default=None, help="name of the preloaded model")
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="worker processes on the one port (default: KESTREL_WORKERS, else the cores the "
        "process may use; 1: a single process)",
    )
    serve.add_argument(
        "--allow-unauthenticated-management",
        action="store_true",
        help="serve management routes on a non-loopback address without an admin token",
    )
    serve.set_defaults(func=_cmd_serve)

    register = sub.add_parser(
        "register",
        help="upload a model file to a running service and follow it until READY",
        description="Upload a model file to a running `kestrel serve`, show its progress "
        "(upload, buckets compiled and warmed up, parity check) on stderr, and print a summary "
        "with a curl command that scores it.",
    )
    register.add_argument("file", type=Path, help="the model: .skops, LightGBM text, XGBoost JSON")
    register.add_argument("--name", required=True, help="model name (letters, digits, . _ -)")
    register.add_argument("--version", default=None, help="version name (default: the next number)")
    register.add_argument(
        "--format", default=None, help="skops, lightgbm, xgboost-json, … (default: from the file)"
    )
    register.add_argument(
        "--sample", type=Path, default=None, help="JSON file of real rows, for schema and parity"
    )
    register.add_argument(
        "--options", default=None, help='compile options as JSON, e.g. {"max_batch": 512}'
    )
    register.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the service (default %(default)s)"
    )
    register.add_argument("--token", default=None, help="admin token (or KESTREL_ADMIN_TOKEN)")
    register.add_argument(
        "--no-wait", action="store_true", help="return once the upload is accepted (LOADING)"
    )
    register.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the upload and the load (default %(default)g)",
    )
    register.add_argument(
        "--json", action="store_true", help="print the version's description as JSON instead"
    )
    register.set_defaults(func=_cmd_register)

    for command, what in (
        ("promote", "make a stored version of a model current on a running service"),
        ("rollback", "make the version current before the current one current again"),
    ):
        move = sub.add_parser(command, help=what, description=f"{what[0].upper()}{what[1:]}.")
        move.add_argument("name", help="model name")
        if command == "promote":
            move.add_argument("version", help="the version (or an alias) to make current")
        move.add_argument(
            "--url", default="http://127.0.0.1:8000", help="the service (default %(default)s)"
        )
        move.add_argument("--token", default=None, help="admin token (or KESTREL_ADMIN_TOKEN)")
        move.add_argument(
            "--actor",
            default=None,
            help="who asks, for the version history (default: the client address the server sees)",
        )
        move.add_argument(
            "--timeout",
            type=float,
            default=900.0,
            help="seconds to wait for the version to load (default %(default)g)",
        )
        move.set_defaults(func=_cmd_promote)

    comp = sub.add_parser(
        "compile",
        help="compile a model file offline and time each bucket",
        description="Load a model file as an upload would be, compile and warm up every bucket "
        "(progress on stderr), check parity with the source model, and print the report.",
    )
    comp.add_argument("file", type=Path, help="the model: .skops, LightGBM text, XGBoost JSON")
    comp.add_argument(
        "--sample", type=Path, default=None, help="JSON file of real rows, for schema and parity"
    )
    comp.add_argument(
        "--max-batch",
        type=_positive_int,
        default=1024,
        help="largest compiled bucket; larger calls run in chunks of this many rows "
        "(default %(default)s)",
    )
    comp.add_argument(
        "--tree-strategy",
        default="auto",
        help="how tree ensembles become tensors (default: auto, chosen per model; an unknown "
        "name is refused with the list of known ones)",
    )
    comp.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64"),
        help="the graph's float type (default %(default)s)",
    )
    comp.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep compiled executables here (a directory you trust); a second run loads them",
    )
    comp.add_argument("--allow-pickle", action="store_true", help="the file is yours: unpickle it")
    comp.add_argument("--json", action="store_true", help="print the report as JSON instead")
    comp.set_defaults(func=_cmd_compile)

    sc = sub.add_parser(
        "score",
        help="score a whole table offline, with the service's answers",
        description="Score a Parquet, CSV or Arrow table (a path or fsspec URL) with a stored "
        "model version (name or name@version; compiled as the service loads it: its plan and "
        "compile cache) or a model file, unit by unit (row group, record batch, CSV block) with "
        "bounded memory. The output keeps the input's rows in order, with the heads appended. "
        "A run that stops resumes at the first unit it had not written when run again.",
    )
    sc.add_argument("model", help="name[@version] in the store, or a model file")
    sc.add_argument("--input", required=True, help="table to score (.parquet, .csv, .arrow)")
    sc.add_argument("--output", required=True, help="where to write it (format by suffix)")
    sc.add_argument(
        "--heads", default=None, help="comma-separated heads (default: predict, predict_proba)"
    )
    sc.add_argument("--store", default=None, help="model store (default: KESTREL_STORE_URL)")
    sc.add_argument("--cache-dir", default=None, help="compile cache (default: KESTREL_CACHE_DIR)")
    sc.add_argument("--allow-pickle", action="store_true", help="the file is yours: unpickle it")
    sc.add_argument("--quiet", action="store_true", help="no progress bar")
    sc.set_defaults(func=_cmd_score)

    demo = sub.add_parser("demo", help="compile a small pipeline and show it serving")
    demo.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep compiled executables here (a directory you trust); a second run loads them",
    )
    demo.add_argument(
        "--max-batch",
        type=_positive_int,
        default=1024,
        help="largest compiled bucket; larger calls run in chunks of this many rows "
        "(default %(default)s)",
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from service.terminal import CommandError, one_line

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CommandError as exc:
        print(f"kestrel {args.command}: {one_line(str(exc))}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"kestrel {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
