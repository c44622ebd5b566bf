"""Persistent tiers under the executable cache: a local directory and a shared one (as a store
would be), entries for other backends, signatures, read-only and failing tiers."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import lazy as lz
from lazy import cache_tiers

ROWS = np.linspace(-2, 2, 18, dtype=np.float32).reshape(3, 6)


def _options(max_batch: int = 4) -> lz.Options:
    # Every bucket on the device (host plans are never written to a tier).
    return lz.Options(max_batch=max_batch, call_rows=max_batch, host_rows=0)


def _buckets(compiled: lz.CompiledProgram) -> int:
    return len(compiled.graphs[0].buckets)


class FailingTier:
    """A shared tier whose every write fails (a store that is down or refuses the write)."""

    name = "store"
    writable = True

    def read(self, filename: str) -> bytes | None:
        return None

    def write(self, filename: str, data: bytes) -> None:
        raise OSError("the store refused the write")

    def names(self, prefix: str) -> list[str]:
        return []


class ReadOnly(lz.DirectoryTier):
    writable = False


def test_second_replica_loads_from_the_shared_tier_and_fills_its_own(graph, tmp_path) -> None:
    shared = lz.DirectoryTier(tmp_path / "shared", name="store")
    first = lz.ExecutableCache(disk_dir=tmp_path / "a", tiers=[shared])
    compiled = lz.compile(graph, _options(), first)
    n = _buckets(compiled)
    assert first.stats.total_compiles == n
    assert first.stats.tier_writes == {"disk": n, "store": n}

    second = lz.ExecutableCache(disk_dir=tmp_path / "b", tiers=[shared])
    again = lz.compile(graph, _options(), second)
    assert second.stats.total_compiles == 0
    assert second.stats.tier_loads == {"store": n}
    assert second.stats.tier_writes == {"disk": n}  # copied into its local directory
    np.testing.assert_array_equal(again({"x": ROWS})["proba"], compiled({"x": ROWS})["proba"])

    restarted = lz.ExecutableCache(disk_dir=tmp_path / "b", tiers=[shared])
    lz.compile(graph, _options(), restarted)
    assert restarted.stats.total_compiles == 0
    assert restarted.stats.tier_loads == {"disk": n}


def test_an_entry_for_another_backend_is_named_and_compiled_here(graph, tmp_path, caplog) -> None:
    shared = lz.DirectoryTier(tmp_path, name="store")
    compiled = lz.compile(graph, _options(max_batch=1), lz.ExecutableCache(tiers=[shared]))
    key = compiled.graphs[0].key(1)
    (ours,) = tmp_path.glob("*.xc")
    # What a replica on another jaxlib would have written beside it, under its own fingerprint.
    theirs = key._replace(backend=key.backend.replace("jaxlib=", "jaxlib=0.0.1+"))
    payload = cache_tiers.decode(key, ours.read_bytes(), None)
    shared.write(theirs.filename(), cache_tiers.encode(theirs, payload, None))
    ours.unlink()

    fresh = lz.ExecutableCache(tiers=[shared])
    with caplog.at_level(logging.INFO, logger="kestrel.lazy.cache"):
        lz.compile(graph, _options(max_batch=1), fresh)
    assert fresh.stats.total_compiles == 1
    assert fresh.stats.tier_foreign == {"store": 1}
    (line,) = [r.getMessage() for r in caplog.records if "another backend" in r.getMessage()]
    assert "jaxlib 0.0.1+" in line and "here " in line
    assert len(list(tmp_path.glob("*.xc"))) == 2  # ours written beside theirs


def test_signed_entries_need_the_key(graph, tmp_path, caplog) -> None:
    key = b"operator secret"
    lz.compile(graph, _options(max_batch=1), lz.ExecutableCache(disk_dir=tmp_path, signing_key=key))
    (signed,) = tmp_path.glob("*.xc")

    same = lz.ExecutableCache(disk_dir=tmp_path, signing_key=key)
    lz.compile(graph, _options(max_batch=1), same)
    assert same.stats.total_compiles == 0 and same.stats.disk_hits == 1

    # Sealed otherwise (no key, another key): an entry of their own beside it, and a line why.
    for other in (None, b"another secret"):
        cache = lz.ExecutableCache(disk_dir=tmp_path, signing_key=other)
        with caplog.at_level(logging.INFO, logger="kestrel.lazy.cache"):
            lz.compile(graph, _options(max_batch=1), cache)
        assert cache.stats.total_compiles == 1 and cache.stats.tier_foreign == {"disk": 1}
        assert "sealed with a signing key this process does not hold" in caplog.text
    assert len(list(tmp_path.glob("*.xc"))) == 3

    # Whoever writes the directory without the key cannot forge an entry under the signed name.
    key_ = lz.compile(graph, _options(max_batch=1), lz.ExecutableCache()).graphs[0].key(1)
    unsigned = (tmp_path / key_.filename()).read_bytes()
    payload = cache_tiers.decode(key_, unsigned, None)
    forged = {
        "it is not signed": unsigned,
        "signature does not match": cache_tiers.encode(key_, payload, b"another secret"),
    }
    for reason, data in forged.items():
        signed.write_bytes(data)
        cache = lz.ExecutableCache(disk_dir=tmp_path, signing_key=key)
        with caplog.at_level(logging.WARNING, logger="kestrel.lazy.cache"):
            lz.compile(graph, _options(max_batch=1), cache)
        assert cache.stats.tier_errors == {"disk": 1} and cache.stats.total_compiles == 1
        assert reason in caplog.text


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[:-3] + b"xyz", "checksum does not match"),
        (lambda data: data[:40], "truncated"),
        (lambda data: b"#!/bin/sh\n" + data, "not a cached executable"),
    ],
)
def test_entry_errors_say_why(graph, tmp_path, caplog, damage, reason) -> None:
    lz.compile(graph, _options(max_batch=1), lz.ExecutableCache(disk_dir=tmp_path))
    (entry,) = tmp_path.glob("*.xc")
    entry.write_bytes(damage(entry.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="kestrel.lazy.cache"):
        lz.compile(graph, _options(max_batch=1), lz.ExecutableCache(disk_dir=tmp_path))
    assert any(reason in r.getMessage() for r in caplog.records), caplog.text


def test_a_read_only_tier_serves_and_is_never_written(graph, tmp_path) -> None:
    lz.compile(graph, _options(), lz.ExecutableCache(disk_dir=tmp_path))
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    reader = lz.ExecutableCache(tiers=[ReadOnly(tmp_path, name="store")])
    compiled = lz.compile(graph, _options(), reader)
    assert reader.stats.total_compiles == 0
    assert reader.stats.tier_loads == {"store": _buckets(compiled)}

    other = lz.compile(graph, _options(max_batch=8), reader)  # one new bucket compiles here
    assert reader.stats.total_compiles == _buckets(other) - _buckets(compiled)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    assert reader.stats.tier_writes == {}


def test_a_failing_tier_costs_a_compile_never_a_call(graph, tmp_path) -> None:
    cache = lz.ExecutableCache(disk_dir=tmp_path, tiers=[FailingTier()])
    compiled = lz.compile(graph, _options(max_batch=1), cache)
    assert compiled({"x": ROWS[:1]})["proba"].shape == (1, 3)
    assert cache.stats.tier_errors == {"store": 1}
    assert cache.stats.tier_writes == {"disk": 1}


def test_fingerprint_difference_names_each_changed_part() -> None:
    ours = "jax=0.8;jaxlib=0.8;platform=cpu;xla_flags="
    theirs = "jax=0.8;jaxlib=0.7;platform=gpu;xla_flags="
    assert cache_tiers.fingerprint_difference(theirs, ours) == (
        "jaxlib 0.7 (here 0.8); platform gpu (here cpu)"
    )


def test_file_names_group_one_keys_backends(graph) -> None:
    key = lz.compile(graph, _options(max_batch=1), lz.ExecutableCache()).graphs[0].key(1)
    other = key._replace(backend="numpy")
    assert key.filename() != other.filename()
    assert key.filename().startswith(cache_tiers.entry_prefix(key))
    assert other.filename().startswith(cache_tiers.entry_prefix(key))
    assert Path(key.filename()).suffix == ".xc"
