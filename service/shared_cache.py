"""The compile cache a Kestrel process uses: its local directory, then the model store's
``executables/`` shared by every replica, so one compile serves the fleet and every restart.

Trust: an executable runs code when loaded, so whoever can write the store's ``executables/``
can run code in every server. Only servers write there; offline scorers (``kestrel score``, the
Ray and Spark helpers) read it and never write. ``KESTREL_CACHE_SIGNING_KEY`` adds a seal (an
HMAC under a secret the servers share) that a store writer without the secret cannot forge.
Every entry is bound to its backend's fingerprint (lazy.cache_tiers): a replica on another
jaxlib, device or XLA flags compiles for itself and logs which part differs.
"""

from __future__ import annotations

import os

import lazy as lz
from service.settings import Settings
from service.store import ModelStore


class StoreTier:
    """The store's shared executables as a tier of the executable cache."""

    name = "store"

    def __init__(self, store: ModelStore, *, writable: bool) -> None:
        self.store = store
        self.writable = writable

    def __repr__(self) -> str:
        return f"StoreTier({self.store.url!r}, writable={self.writable})"

    def read(self, filename: str) -> bytes | None:
        return self.store.read_executable(filename)

    def write(self, filename: str, data: bytes) -> None:
        self.store.write_executable(filename, data)

    def names(self, prefix: str) -> list[str]:
        return self.store.executable_names(prefix)


def executable_cache(
    settings: Settings, store: ModelStore | None = None, *, writes_store: bool = False
) -> lz.ExecutableCache:
    """The cache of a process run with ``settings``: ``cache_dir`` first, then ``store``'s
    shared executables where ``shared_cache`` is on (written only when ``writes_store``)."""
    if settings.cache_dir is not None:
        # Native kernels' machine code (numba, lazy/forest.py) beside the executables, under
        # the same trust: numba reads this when a model first needs it, after start-up.
        os.environ.setdefault("NUMBA_CACHE_DIR", str(settings.cache_dir / "numba"))
    shared = (
        [StoreTier(store, writable=writes_store)]
        if store is not None and settings.shared_cache
        else []
    )
    key = settings.cache_signing_key
    return lz.ExecutableCache(
        disk_dir=settings.cache_dir,
        tiers=shared,
        signing_key=key.get_secret_value().encode() if key is not None else None,
    )
