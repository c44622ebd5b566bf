"""``kestrel`` that counts the calls its event-loop thread makes, for ``bench/calls.py``.

Usage: KESTREL_CALLS_OUT=calls.json python bench/kestrel_counting.py serve --port 8000

SIGUSR1 starts counting every Python and C function call on the main thread (the event loop,
where a request's admission, routing, decoding and encoding run); SIGUSR2 stops and writes
``[[file, function, calls], ...]`` to ``KESTREL_CALLS_OUT``. A count does not depend on what
else the machine runs, so two checkouts compare to the call where wall-clock rounds cannot.

Run from a checkout's root: that checkout's ``service`` is imported, not this one's.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

Key = tuple[str, str]


class CallCounter:
    def __init__(self, out: Path, root: str) -> None:
        self.out = out
        self.root = root
        self.calls: collections.Counter[Key] = collections.Counter()

    def _where(self, filename: str) -> str:
        # Comparable across checkouts and environments: relative to the checkout or to
        # site-packages.
        return filename.removeprefix(self.root).split("site-packages/")[-1].lstrip("/")

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            self.calls[(self._where(code.co_filename), code.co_qualname)] += 1
        elif event == "c_call":
            self.calls[("<C>", getattr(arg, "__qualname__", repr(arg)))] += 1

    def start(self, signum: int, frame: FrameType | None) -> None:
        self.calls.clear()
        sys.setprofile(self._profile)

    def stop(self, signum: int, frame: FrameType | None) -> None:
        sys.setprofile(None)
        rows = [[where, name, n] for (where, name), n in self.calls.items()]
        tmp = self.out.with_suffix(".part")
        tmp.write_text(json.dumps(rows))
        tmp.replace(self.out)  # whole or absent: the driver polls for it


def main(argv: list[str]) -> int:
    root = os.getcwd()
    sys.path.insert(0, root)  # the checkout's own service package
    counter = CallCounter(Path(os.environ["KESTREL_CALLS_OUT"]), root)
    # Signal handlers run on the main thread, the one to count.
    signal.signal(signal.SIGUSR1, counter.start)
    signal.signal(signal.SIGUSR2, counter.stop)
    from service.cli import main as kestrel

    return kestrel(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
