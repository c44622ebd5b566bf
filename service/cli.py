"""Command-line entry point: ``kestrel <command>``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from service.demo import run_demo

    return run_demo(cache_dir=args.cache_dir, max_batch=args.max_batch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kestrel", description="Serve traditional ML models compiled to XLA."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="compile a small pipeline and show it serving")
    demo.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep compiled executables here (a directory you trust); a second run loads them",
    )
    demo.add_argument("--max-batch", type=int, default=1024, help="largest compiled batch")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
