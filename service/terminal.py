"""The CLI's side of the terminal: live progress on stderr, and one-line errors.

On a terminal a rich live display follows each phase of a model load (upload bytes, buckets
compiled and warmed up, parity); anywhere else (a pipe, a CI log) each phase is one plain line.
Either way stdout carries only the result, so ``--json`` output can be piped. What the user got
wrong (a missing file, bad JSON in an option) is a :class:`CommandError` naming the option.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from rich.console import Console
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from service.codecs import loads

#: Labels of the phases a load goes through: the client's upload, then the server's (or
#: ``kestrel compile``'s) phases, as ``GET /models/{name}/versions/{version}`` names them.
PHASES = {
    "uploading": "upload",
    "queued": "queued",
    "compiling": "compile + warm-up",
    "parity": "parity check",
    "storing": "store",
    "replicating": "load in the other workers",
}
_UNITS = {"uploading": "bytes", "compiling": "buckets"}


class CommandError(Exception):
    """A failure the user can act on: shown as one line on stderr, exit status ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def one_line(message: str) -> str:
    """The first line of ``message`` (some libraries append a native stack trace)."""
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def joined(message: str) -> str:
    """A message whose further lines are advice (an untrusted type's notes) as one line."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def read_file(path: Path, option: str | None = None) -> bytes:
    """The bytes of ``path`` (given as ``option``, or the command's file argument)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        where = f"{option}: " if option else ""
        raise CommandError(f"{where}cannot read {path}: {exc.strerror or exc}") from None


def parse_json(data: bytes | str, option: str, *, allow_nan: bool = False) -> Any:
    """``data`` decoded as JSON; a CommandError naming ``option`` if it is not JSON.
    ``allow_nan``: ``NaN`` and ``Infinity`` are numbers too, as the server reads a ``sample``
    (real rows have missing values)."""
    try:
        return loads(data, allow_nan=allow_nan)
    except ValueError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None


class _Amount(ProgressColumn):
    """A phase's amount in its unit: bytes uploaded, or buckets warmed of the total."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit")
        if unit == "bytes":
            return Text(f"{decimal(int(task.completed))}/{decimal(int(task.total or 0))}")
        if unit and task.total is not None:
            return Text(f"{int(task.completed)}/{int(task.total)} {unit}")
        return Text("")


class LoadDisplay:
    """The phases of a model load on ``console`` (stderr): a live display on a terminal, else a
    plain line as each phase starts. Use as a context manager; :meth:`show` moves it on."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓[/green]"),
            TextColumn("{task.description:<18}"),
            BarColumn(),
            _Amount(),
            TimeElapsedColumn(),
            console=console,
            disable=not self.live,
        )
        self._tasks: dict[str, TaskID] = {}
        self._phase: str | None = None
        self._total: float | None = None  # the phase's total, as last shown
        self._announced = False  # the phase's plain line is printed (no live display)

    def __enter__(self) -> LoadDisplay:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self._end_phase()
        self._progress.stop()

    def show(self, phase: str, done: float = 0, total: float | None = None) -> None:
        """``phase`` is under way, ``done`` of ``total`` (None: not known yet) in its unit;
        phases without a unit (parity) show no amount."""
        unit = _UNITS.get(phase)
        if unit is None:
            done, total = 0, None
        if phase != self._phase:
            self._end_phase()
            self._phase, self._announced = phase, False
            label = PHASES.get(phase, phase)
            self._tasks[phase] = self._progress.add_task(label, total=total, unit=unit)
        self._total = total
        self._progress.update(self._tasks[phase], completed=done, total=total)
        if unit is None or total is not None:
            self._announce()

    def shown(self, phase: str) -> bool:
        """Whether ``phase`` has been shown."""
        return phase in self._tasks

    def upload(self, file: BinaryIO, size: int) -> BinaryIO:
        """``file``, counting what is read of it as the upload's progress."""
        self.show("uploading", 0, size)
        return self._progress.wrap_file(file, total=size, task_id=self._tasks["uploading"])

    def _announce(self) -> None:
        """Without a live display: the phase under way as one line, with its total if known."""
        if self.live or self._announced or self._phase is None:
            return
        self._announced = True
        label, unit = PHASES.get(self._phase, self._phase), _UNITS.get(self._phase)
        amount = f": {_plain_amount(self._total, unit)}" if self._total and unit else ""
        self.console.print(f"{label}{amount}", markup=False, highlight=False)

    def _end_phase(self) -> None:
        """Mark the phase under way as done (the spinner turns into a tick)."""
        if self._phase is None:
            return
        self._announce()  # a phase whose total never came
        task, total = self._tasks[self._phase], self._total or 1
        self._progress.update(task, total=total, completed=total)
        self._progress.stop_task(task)
        self._phase = None


def _plain_amount(total: float, unit: str) -> str:
    return decimal(int(total)) if unit == "bytes" else f"{int(total)} {unit}"
