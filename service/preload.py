"""Register a model file found on disk at start: how Kestrel runs as a KServe serving runtime.

KServe's storage initializer downloads an InferenceService's ``storageUri`` into ``/mnt/models``
before the server starts, and passes the service's name through the runtime's templated
environment. ``KESTREL_PRELOAD`` (a model file, or a directory holding exactly one) and
``KESTREL_PRELOAD_NAME`` make that file a model through the normal registration path — the same
trust boundary, compile, warm-up and parity check as an upload — and ``/readyz`` answers 200 only
once it is READY, so no request reaches a pod that cannot score.

Starting again on the same store does not add a version when the file is already current.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from service import artifacts
from service.errors import http_error_for
from service.models import ModelManager
from service.store import validate_name
from service.versions import State, Upload

log = logging.getLogger("kestrel.preload")


class PreloadError(ValueError):
    """The configured preload path does not name exactly one usable model file."""


def is_model_file(path: Path) -> bool:
    """Whether ``path`` is a visible regular file whose extension is a known model format."""
    if path.name.startswith(".") or not path.is_file():
        return False
    try:
        artifacts.detect_format(path.name, b"")  # by extension only: no content given
    except artifacts.ArtifactError:
        return False
    return True


def find_model_file(path: Path) -> Path:
    """The model file ``path`` names: the file itself, or the single model file in a directory.

    Only the directory's top level is searched (where the storage initializer puts a single-file
    ``storageUri``); hidden entries are ignored. Zero or several candidates is an error naming
    them, since guessing which model to serve would be worse than refusing.
    """
    if not path.exists():
        raise PreloadError(f"preload path {str(path)!r} does not exist")
    if path.is_file():
        return path
    if not path.is_dir():
        raise PreloadError(f"preload path {str(path)!r} is neither a file nor a directory")
    candidates = sorted(p for p in path.iterdir() if is_model_file(p))
    if not candidates:
        listed = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        raise PreloadError(
            f"no model file in {str(path)!r} (it holds {listed or 'nothing'}); expected one "
            f"file in a supported format: {', '.join(artifacts.FORMATS)}"
        )
    if len(candidates) > 1:
        raise PreloadError(
            f"{len(candidates)} model files in {str(path)!r}: {[p.name for p in candidates]}; "
            "point KESTREL_PRELOAD at the one to serve"
        )
    return candidates[0]


@dataclass
class Preloader:
    """One model file to register at start, and what became of it (read by ``/readyz``)."""

    file: Path
    name: str
    allow_pickle: bool = False
    error: str | None = None
    ready: bool = False

    @classmethod
    def resolve(cls, path: Path, name: str | None, *, allow_pickle: bool = False) -> Preloader:
        """Check the path and name now, so a bad setting stops ``serve`` before it binds.

        Without a name, the model is named after the directory given (or the file's stem).
        """
        file = find_model_file(path)
        default = path.name if path.is_dir() else file.stem
        chosen = name or default
        try:
            validate_name(chosen, "preloaded model name")
        except ValueError as exc:
            hint = "" if name else " (from the path; set KESTREL_PRELOAD_NAME)"
            raise PreloadError(f"{exc}{hint}") from None
        return cls(file, chosen, allow_pickle=allow_pickle)

    async def run(self, manager: ModelManager, wait_s: float) -> None:
        """Register the file unless it is already the current version; wait until READY.

        Never raises: a failure is kept in :attr:`error` (``/readyz`` shows it) and logged.
        """
        try:
            await self._load(manager, wait_s)
        except Exception as exc:  # every failure becomes the visible reason
            self.error = f"preloading {str(self.file)!r} as model {self.name!r}: {_reason(exc)}"
            log.error("%s", self.error, extra={"model": self.name})
            return
        self.ready = True

    async def _load(self, manager: ModelManager, wait_s: float) -> None:
        data = self.file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        current = manager.current(self.name)
        if current is not None and current.record is not None and current.record.artifact == digest:
            log.info(
                "model %s version %s already serves %s",
                self.name,
                current.version,
                self.file,
                extra={"model": self.name, "version": current.version},
            )
            mv = current
        else:
            # The operator chose this file (it is not an upload): its pickle switch is the whole
            # decision, there is no caller to present an admin token.
            mv = await manager.register(
                Upload(
                    name=self.name,
                    data=data,
                    filename=self.file.name,
                    pickle_allowed=self.allow_pickle,
                )
            )
        if not await manager.wait(mv, wait_s):
            raise TimeoutError(f"version {mv.version} was not READY within {wait_s:g} s")
        if mv.state is not State.READY:
            raise PreloadError(f"version {mv.version} is {mv.state.value}: {mv.error}")
        log.info(
            "preloaded %s as model %s version %s",
            self.file,
            self.name,
            mv.version,
            extra={"model": self.name, "version": mv.version},
        )


def _reason(exc: BaseException) -> str:
    mapped = http_error_for(exc)
    text = mapped.message if mapped is not None else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, artifacts.PickleNotAllowedError):
        text += "; to serve this file anyway, set KESTREL_ALLOW_PICKLE=true"
    return text
