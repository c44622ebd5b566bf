"""``kestrel`` with some of its performance mechanisms switched off, for ``bench/internals.py``.

Usage: python bench/kestrel_without.py fastpath,shedding serve --port 8000

Each mechanism depends on a library's internals (docs/architecture.md); switching it off here
measures what it buys. Nothing of this is a serving option: production runs all of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

MECHANISMS = ("fastpath", "shedding")


def _no_fastpath() -> None:
    from service import fastpath

    fastpath.install = lambda app, paths: None  # every request through FastAPI's router


def _no_shedding() -> None:
    from service import shedding

    # uvicorn's own httptools protocol: overload is refused by the middleware, after routing.
    shedding.protocol_for = lambda admission: "httptools"


SWITCHES: dict[str, Callable[[], None]] = {
    "fastpath": _no_fastpath,
    "shedding": _no_shedding,
}


def main(argv: list[str]) -> int:
    off = [name for name in argv[0].split(",") if name and name != "none"]
    unknown = sorted(set(off) - set(SWITCHES))
    if unknown:
        print(f"unknown mechanisms {unknown}; choose from {list(SWITCHES)}", file=sys.stderr)
        return 2
    for name in off:
        SWITCHES[name]()
    from service.cli import main as kestrel

    return kestrel(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
