"""Model store: content-addressed blobs and the manifest, on a local directory and on S3 (moto)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import boto3
import pytest

from service.store import (
    BlobNotFound,
    InvalidDigest,
    InvalidName,
    InvalidRecord,
    Manifest,
    ModelNotFound,
    ModelStore,
    StoreCorruptionError,
    StoreError,
    VersionConflict,
    VersionRecord,
)

ARTIFACT = b"fitted model bytes \x00\x01\x02"
SAMPLE = b'{"x": [1.0, 2.0]}'


def blob_file(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest[:2] / digest


def make_record(store: ModelStore, name: str, version: str, payload: bytes = ARTIFACT, **kw):
    """Store ``payload`` (plus a sample) and return a record pointing at them."""
    return VersionRecord(
        name=name,
        version=version,
        artifact=store.put_blob(payload),
        format="skops",
        filename="model.skops",
        options={"max_batch": 64, "dtype": "float32"},
        sample=store.put_blob(SAMPLE),
        metadata={"framework": {"sklearn": "1.9.1"}, "parity": {"max_abs": 0.0}},
        **kw,
    )


def payload_in_same_directory_as(digest: str) -> bytes:
    """New bytes whose blob lands in the same fan-out directory as ``digest``'s blob."""
    for i in range(100_000):
        payload = f"payload {i}".encode()
        other = hashlib.sha256(payload).hexdigest()
        if other[:2] == digest[:2] and other != digest:
            return payload
    raise AssertionError("no payload found")  # 1 in 256 hashes match: unreachable in practice


def age(path: Path, seconds: float) -> None:
    """Backdate a file's modification time."""
    past = time.time() - seconds
    os.utime(path, (past, past))


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(str(tmp_path / "store"))


# --------------------------------------------------------------------------- local round trip


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_local_round_trip_survives_a_restart(tmp_path: Path, scheme: str) -> None:
    root = tmp_path / "does" / "not" / "exist"
    store = ModelStore(f"{scheme}{root}")
    assert root.is_dir()  # created on open
    assert store.load_manifest() == Manifest()  # new store: empty, generation 0

    record = make_record(store, "iris", store.next_version("iris"))
    manifest = store.commit(record)
    assert manifest.generation == 2 and manifest.current("iris") == record  # reserve, commit

    reopened = ModelStore(f"{scheme}{root}")  # what a restarted server does
    loaded = reopened.load_manifest()
    assert loaded == manifest
    assert loaded.records() == [record]
    assert reopened.get_blob(record.artifact) == ARTIFACT
    assert reopened.get_blob(record.sample) == SAMPLE
    assert json.loads((root / "manifest.json").read_text())["generation"] == 2


def test_version_record_json_round_trip_is_exact_and_isolated() -> None:
    options = {"buckets": (1, 2, 4), "dtype": "float32"}
    record = VersionRecord(
        name="m",
        version="1",
        artifact="a" * 64,
        format="lightgbm",
        filename="model.txt",
        options=options,
        created=12,
    )
    options["dtype"] = "float64"  # the record holds its own copy
    assert record.options == {"buckets": [1, 2, 4], "dtype": "float32"}
    assert record.created == 12.0 and record.sample is None and record.metadata == {}
    document = json.loads(json.dumps(record.to_json()))
    assert VersionRecord.from_json(document) == record


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("metadata", {"parity": float("nan")}, "metadata must be JSON-serializable"),
        ("options", {"f": object()}, "options must be JSON-serializable"),
        ("options", [1, 2], "options must be a dict"),
        ("format", "", "format must be a non-empty string"),
        ("created", "yesterday", "created must be an epoch number"),
    ],
)
def test_version_record_rejects_bad_fields(field: str, value: object, message: str) -> None:
    fields = {"name": "m", "version": "1", "artifact": "a" * 64, "format": "skops"}
    fields["filename"] = "m.skops"
    fields[field] = value
    with pytest.raises(InvalidRecord, match=message):
        VersionRecord(**fields)


def test_version_record_from_json_names_missing_fields() -> None:
    with pytest.raises(InvalidRecord, match="missing artifact, created"):
        VersionRecord.from_json({"name": "m", "version": "1", "format": "x", "filename": ""})


# --------------------------------------------------------------------------- blobs


def test_put_blob_is_content_addressed_and_idempotent(store: ModelStore, tmp_path: Path) -> None:
    digest = store.put_blob(ARTIFACT)
    assert digest == hashlib.sha256(ARTIFACT).hexdigest()
    path = blob_file(tmp_path / "store", digest)
    inode = path.stat().st_ino

    assert store.put_blob(bytearray(ARTIFACT)) == digest
    assert path.stat().st_ino == inode  # not rewritten: the same file, not a replaced one
    assert sorted(p.name for p in path.parent.iterdir()) == [digest]  # no temp files left
    assert store.has_blob(digest) and store.get_blob(digest) == ARTIFACT
    with pytest.raises(TypeError, match="blob data must be bytes, got str"):
        store.put_blob("text")  # type: ignore[arg-type]


def test_corrupt_blob_is_detected(store: ModelStore, tmp_path: Path) -> None:
    digest = store.put_blob(ARTIFACT)
    path = blob_file(tmp_path / "store", digest)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01  # flip one bit
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptionError, match=f"blob {digest} .* is corrupt"):
        store.get_blob(digest)


def test_missing_blob_is_not_found(store: ModelStore) -> None:
    digest = hashlib.sha256(b"never stored").hexdigest()
    assert not store.has_blob(digest)
    with pytest.raises(BlobNotFound, match=f"blob {digest} not found"):
        store.get_blob(digest)


@pytest.mark.parametrize(
    "digest",
    ["../../manifest.json", "A" * 64, "a" * 63, "a" * 65, "g" * 64, "/" + "a" * 63, ""],
)
def test_digests_are_validated_before_touching_paths(store: ModelStore, digest: str) -> None:
    with pytest.raises(InvalidDigest, match="expected 64 lowercase hexadecimal"):
        store.get_blob(digest)
    with pytest.raises(InvalidDigest):
        store.has_blob(digest)


# --------------------------------------------------------------------------- manifest durability


def test_truncated_manifest_falls_back_to_prev(
    store: ModelStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    store.commit(make_record(store, "a", "1"))
    kept = store.commit(make_record(store, "b", "1", b"model b"))
    # A crash while writing the next manifest on a filesystem without atomic rename: prev was
    # written (it holds `kept`), manifest.json holds half of the new document.
    store.commit(make_record(store, "c", "1", b"model c"))
    manifest_path = root / "manifest.json"
    manifest_path.write_bytes(manifest_path.read_bytes()[:100])

    with caplog.at_level(logging.WARNING, logger="service.store"):
        recovered = store.load_manifest()
    assert "recovered 2 model(s)" in caplog.text and "not valid JSON" in caplog.text
    assert recovered.models == kept.models  # a and b intact; the interrupted change is lost
    # Strictly above anything a replica could have seen (3), so pollers notice the change.
    assert recovered.generation == 4

    after = store.commit(make_record(store, "c", "2", b"model c"))  # writing repairs the store
    assert sorted(after.models) == ["a", "b", "c"] and after.generation == 5
    assert ModelStore(str(root)).load_manifest() == after


def test_stray_temp_file_is_ignored_and_later_collected(store: ModelStore, tmp_path: Path) -> None:
    root = tmp_path / "store"
    manifest = store.commit(make_record(store, "a", "1"))
    stray = root / ".tmp-crashed"  # what a crash between write and os.replace leaves
    stray.write_bytes(b'{"kind": "kestrel-manif')
    assert store.load_manifest() == manifest

    # A server killed while writing a shared executable leaves one in executables/.
    store.write_executable("0" * 64 + "-" + "1" * 16 + ".xc", b"compiled")
    stray_executable = root / "executables" / ".tmp-killed"
    stray_executable.write_bytes(b"half an exec")

    store.gc(grace_s=60)
    assert stray.exists() and stray_executable.exists()  # fresh: a writer may be in progress
    age(stray, 120)
    age(stray_executable, 120)
    store.gc(grace_s=60)
    assert not stray.exists() and not stray_executable.exists()
    assert (
        store.read_executable("0" * 64 + "-" + "1" * 16 + ".xc") == b"compiled"
    )  # executables are kept


def test_missing_manifest_recovers_from_prev(store: ModelStore, tmp_path: Path) -> None:
    kept = store.commit(make_record(store, "a", "1"))
    store.commit(make_record(store, "b", "1", b"model b"))
    (tmp_path / "store" / "manifest.json").unlink()
    assert store.load_manifest().models == kept.models


def test_unrecoverable_manifest_raises_instead_of_dropping_models(
    store: ModelStore, tmp_path: Path
) -> None:
    store.commit(make_record(store, "a", "1"))
    (tmp_path / "store" / "manifest.json").write_text("{")
    (tmp_path / "store" / "manifest.prev.json").write_text('{"kind": "kestrel-manifest"}')
    with pytest.raises(StoreCorruptionError, match="fallback is unusable too"):
        store.load_manifest()
    with pytest.raises(StoreCorruptionError):
        store.commit(make_record(store, "b", "1"))  # never overwrite with an empty manifest


def test_manifest_from_a_newer_schema_is_refused(store: ModelStore, tmp_path: Path) -> None:
    manifest = store.commit(make_record(store, "a", "1")).to_json()
    manifest["schema"] = 99
    (tmp_path / "store" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="schema 99 is newer"):
        store.load_manifest()  # no fallback: the prev manifest would silently lose models


def test_inconsistent_manifest_is_corrupt(store: ModelStore, tmp_path: Path) -> None:
    document = store.commit(make_record(store, "a", "1")).to_json()
    document["models"]["a"]["current"] = "7"
    with pytest.raises(StoreCorruptionError, match="current version '7' missing"):
        Manifest.from_json(document)
    document["models"]["../x"] = document["models"].pop("a")
    with pytest.raises(StoreCorruptionError, match="invalid model name"):
        Manifest.from_json(document)


# --------------------------------------------------------------------------- versions


def test_version_numbers_are_never_reused(store: ModelStore) -> None:
    assert store.next_version("m") == "1"
    assert store.next_version("m") == "2"  # "1" is reserved by an upload in flight
    store.commit(make_record(store, "m", "2"))
    store.commit(make_record(store, "m", "1", b"slow upload"))
    assert store.next_version("m") == "3"
    store.commit(make_record(store, "m", "3", b"v3"))
    store.delete("m", "3")
    assert ModelStore(store.url).next_version("m") == "4"
    store.delete("m")
    assert store.load_manifest().retired == {"m": 5}
    fresh = ModelStore(store.url)
    assert fresh.next_version("m") == "5"
    manifest = fresh.commit(make_record(store, "m", "5", b"v5"))
    assert manifest.models["m"].next_version == 6 and manifest.retired == {}


def test_a_reserved_number_survives_a_restart(store: ModelStore) -> None:
    """A 202 promises the number before the version is committed: a crash (a fresh process on
    the same store) must not promise it again."""
    assert store.next_version("new") == "1"  # no entry yet: reserved under retired
    assert ModelStore(store.url).next_version("new") == "2"
    store.commit(make_record(store, "m", "1"))
    assert store.next_version("m") == "2"
    assert ModelStore(store.url).next_version("m") == "3"
    assert store.load_manifest().models["m"].next_version == 4


def test_a_failed_upload_gives_its_number_back(store: ModelStore) -> None:
    """A registration that fails before its commit releases its number, while it is still the
    last one handed out: the next upload gets it, and nothing is written otherwise."""
    assert store.next_version("new") == "1"
    assert store.release_version("new", "1") is not None
    assert store.load_manifest().retired == {}  # as if never reserved
    assert ModelStore(store.url).next_version("new") == "1"  # a restart numbers the same
    store.commit(make_record(store, "new", "1"))
    assert store.next_version("new") == "2"
    assert store.release_version("new", "2") is not None
    assert store.next_version("new") == "2"
    assert store.next_version("new") == "3"  # a second upload in flight
    generation = store.load_manifest().generation
    assert store.release_version("new", "2") is None  # "3" is out: "2" stays used
    assert store.release_version("new", "1") is None  # committed
    assert store.release_version("new", "rc1") is None  # not a number
    assert store.load_manifest().generation == generation  # nothing written
    assert store.release_version("new", "3") is not None
    assert store.next_version("new") == "3"
    store.delete("new")
    assert store.next_version("new") == "4"
    assert store.release_version("new", "4") is not None
    assert store.load_manifest().retired == {"new": 4}  # deleted numbers stay used


def test_custom_version_names_are_allowed(store: ModelStore) -> None:
    store.commit(make_record(store, "m", "2024-06-01.rc1"))
    assert store.next_version("m") == "1"


def test_concurrent_uploads_get_distinct_versions(store: ModelStore) -> None:
    errors: list[BaseException] = []

    def upload(i: int) -> None:
        try:
            store.commit(make_record(store, "m", store.next_version("m"), f"model {i}".encode()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    manifest = store.load_manifest()
    assert sorted(manifest.models["m"].versions, key=int) == [str(i) for i in range(1, 9)]
    assert manifest.generation == 16  # a reservation and a commit each


def test_commit_requires_stored_blobs_and_never_overwrites(store: ModelStore) -> None:
    ghost = hashlib.sha256(b"not uploaded").hexdigest()
    record = VersionRecord(name="m", version="1", artifact=ghost, format="pickle", filename="m.pkl")
    with pytest.raises(StoreError, match=f"blob\\(s\\) {ghost} are not in the store"):
        store.commit(record)
    assert store.load_manifest().generation == 0

    store.commit(make_record(store, "m", "1"))
    with pytest.raises(VersionConflict, match="already has version '1'"):
        store.commit(make_record(store, "m", "1", b"other bytes"))
    with pytest.raises(TypeError, match="takes a VersionRecord"):
        store.commit({"name": "m"})  # type: ignore[arg-type]


def test_staged_version_becomes_current_only_when_asked(store: ModelStore) -> None:
    v1 = make_record(store, "m", "1")
    store.commit(v1)
    v2 = make_record(store, "m", "2", b"v2")
    staged = store.commit(v2, make_current=False)  # compiling: v1 keeps serving
    assert staged.current("m") == v1 and staged.models["m"].versions["2"] == v2
    assert store.set_current("m", "2").current("m") == v2
    with pytest.raises(ModelNotFound, match="has no version '9'"):
        store.set_current("m", "9")

    first = store.commit(make_record(store, "n", "1", b"n"), make_current=False)
    assert first.current("n") is None and first.records() == [v2]


# --------------------------------------------------------------------------- delete


def test_delete_semantics(store: ModelStore) -> None:
    r1 = make_record(store, "m", "1", created=100.0)
    r2 = make_record(store, "m", "2", b"v2", created=200.0)
    r3 = make_record(store, "m", "3", b"v3", created=300.0)
    for record in (r1, r2, r3):
        store.commit(record)
    store.set_current("m", "2")

    manifest = store.delete("m", "3")  # not current: current unchanged
    assert manifest.current("m") == r2 and sorted(manifest.models["m"].versions) == ["1", "2"]
    manifest = store.delete("m", "2")  # current: the newest remaining takes over
    assert manifest.current("m") == r1
    manifest = store.delete("m", "1")  # the last version: the model disappears
    assert "m" not in manifest.models and manifest.current("m") is None

    store.commit(make_record(store, "n", "1"))
    store.commit(make_record(store, "n", "2", b"n2"))
    assert "n" not in store.delete("n").models  # the whole model at once

    with pytest.raises(ModelNotFound, match="model 'n' not found"):
        store.delete("n")
    store.commit(make_record(store, "k", "1"))
    with pytest.raises(ModelNotFound, match="model 'k' has no version '5'"):
        store.delete("k", "5")


# --------------------------------------------------------------------------- gc


def test_gc_keeps_referenced_and_fresh_blobs(store: ModelStore, tmp_path: Path) -> None:
    root = tmp_path / "store"
    live = make_record(store, "m", "1")
    store.commit(live)
    staged = make_record(store, "m", "2", b"staged, not current")
    store.commit(staged, make_current=False)
    dropped = make_record(store, "m", "3", b"dropped")
    store.commit(dropped)
    store.delete("m", "3")  # still referenced by manifest.prev.json
    orphan = store.put_blob(b"an upload that never committed")
    in_flight = store.put_blob(b"an upload still in progress")
    for digest in (live.artifact, live.sample, staged.artifact, dropped.artifact, orphan):
        age(blob_file(root, digest), 7200)

    assert store.gc(grace_s=3600) == [orphan]
    assert not blob_file(root, orphan).exists()
    for digest in (live.artifact, live.sample, staged.artifact, dropped.artifact, in_flight):
        assert store.has_blob(digest)

    store.delete("m", "1")
    store.delete("m", "2")  # the store is empty; manifest.prev.json holds only m/2
    age(blob_file(root, in_flight), 7200)
    collected = store.gc(grace_s=3600)
    assert sorted(collected) == sorted({live.artifact, dropped.artifact, in_flight})
    assert store.has_blob(staged.artifact)  # m/2 in the prev manifest still needs these
    assert store.get_blob(staged.sample) == SAMPLE
    with pytest.raises(ValueError, match="grace_s must be a non-negative"):
        store.gc(grace_s=-1)


def test_reuploading_an_old_orphan_protects_it_from_gc(store: ModelStore, tmp_path: Path) -> None:
    digest = store.put_blob(ARTIFACT)
    age(blob_file(tmp_path / "store", digest), 7200)
    assert store.put_blob(ARTIFACT) == digest  # an upload of the same bytes is in flight again
    assert store.gc(grace_s=3600) == []


# --------------------------------------------------------------------------- names


BAD_NAMES = ["", "-lead", ".hidden", "a/b", "..", "a b", "ümlaut", "x" * 129, "a\n", None, 3]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_names_are_refused_with_the_value(store: ModelStore, bad: object) -> None:
    with pytest.raises(InvalidName, match=re.escape(f"invalid model name {bad!r}")):
        store.next_version(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="invalid model name"):
        store.delete(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="invalid version"):
        VersionRecord(name="m", version=bad, artifact="a" * 64, format="skops", filename="")  # type: ignore[arg-type]
    assert isinstance(InvalidName("x"), ValueError)


def test_longest_valid_name_is_accepted(store: ModelStore) -> None:
    name = "A" + "b._-9" * 25 + "xy"  # 128 characters
    assert len(name) == 128
    assert store.commit(make_record(store, name, "1")).current(name) is not None


@pytest.mark.parametrize(
    ("url", "message"),
    [("", "non-empty string"), ("nosuchproto://x/y", "unsupported model store URL")],
)
def test_bad_store_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        ModelStore(url)


# --------------------------------------------------------------------------- S3 (moto server)


def test_s3_round_trip_across_replicas(s3_bucket: str, s3_storage_options: dict) -> None:
    url = f"s3://{s3_bucket}/kestrel/models"
    writer = ModelStore(url, dict(s3_storage_options))
    record = make_record(writer, "iris", writer.next_version("iris"))
    committed = writer.commit(record)

    replica = ModelStore(url, dict(s3_storage_options))  # a restarted server / second replica
    assert replica._fs is not writer._fs  # nothing shared: it really reads the bucket
    seen = replica.load_manifest()
    assert seen == committed and seen.records() == [record]
    assert replica.get_blob(record.artifact) == ARTIFACT
    assert replica.next_version("iris") == "2"

    # The writer lists blobs (filling s3fs's listing cache); then the replica uploads a blob into
    # a directory that listing covered. The writer must still see it when committing (a stale
    # listing would say it is missing), and the replica must see the new generation.
    assert writer.gc(grace_s=3600) == []
    v2 = make_record(replica, "iris", "2", payload_in_same_directory_as(record.artifact))
    updated = writer.commit(v2)
    # + 2: the replica reserved "2" (a manifest write), the writer committed it.
    assert replica.load_manifest() == updated and updated.generation == committed.generation + 2

    # Content addressing and corruption detection hold over the S3 protocol too.
    client = boto3.client(
        "s3",
        endpoint_url=s3_storage_options["client_kwargs"]["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    key = f"kestrel/models/blobs/sha256/{v2.artifact[:2]}/{v2.artifact}"
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"tampered")
    with pytest.raises(StoreCorruptionError, match=v2.artifact):
        writer.get_blob(v2.artifact)


def test_s3_manifest_recovery_and_gc(s3_bucket: str, s3_storage_options: dict) -> None:
    url = f"s3://{s3_bucket}/store"
    store = ModelStore(url, dict(s3_storage_options))
    kept = store.commit(make_record(store, "a", "1"))
    store.commit(make_record(store, "b", "1", b"model b"))
    orphan = store.put_blob(b"orphan")
    assert sorted(store.gc(grace_s=0)) == [orphan]  # S3 LastModified dates the blobs
    assert store.has_blob(kept.current("a").artifact)

    client = boto3.client(
        "s3",
        endpoint_url=s3_storage_options["client_kwargs"]["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.put_object(Bucket=s3_bucket, Key="store/manifest.json", Body=b'{"kind": "kes')
    recovered = ModelStore(url, dict(s3_storage_options)).load_manifest()
    assert recovered.models == kept.models
