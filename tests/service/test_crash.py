"""Crash safety: ``kill -9`` a real server at random points of uploads, deletes and manifest
writes, 20 times over one local store, and check the store after every restart.

Each round starts the server on the same store and executable cache (restarts load from the
disk cache, so they compile nothing), checks that the store and the server agree and are whole,
re-registers whatever the previous kill interrupted, then races one mutation against a
``SIGKILL``. The kill comes after a seeded random delay spread over a registration's phases
(upload, trace, compile, warm, parity, blob writes, manifest commit), or the moment a manifest
write is seen on disk (a temp file beside ``manifest.json``, or ``manifest.prev.json`` replaced).

Consistency after each restart:

- ``manifest.json`` parses strictly (no fallback needed) and every blob any version names is
  present and hashes to its name; no other file in the store is anything but a blob or a temp
  file (``.tmp-*``, ignored by readers, removed by gc).
- ``GET /models`` lists exactly the manifest's versions: nothing half-registered; each model's
  current version is READY, the others RETIRED.
- every version confirmed before a kill (201 / committed) is still there, every confirmed delete
  is still gone, and every version's artifact is one this test uploaded.
- each current version answers exactly what it answered before the kill and what its source
  estimator predicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from service.store import MANIFEST_FILE, PREV_MANIFEST_FILE, Manifest, ModelStore
from tests.service.live import ADMIN_TOKEN, LiveServer

pytestmark = pytest.mark.slow

ROUNDS = 20
SEED = 20240607
OPTIONS = '{"max_batch": 8}'
# The parity check's tolerances: compiled float32 against the float64 source estimator.
RTOL, ATOL = 1e-4, 1e-5

_rng = np.random.default_rng(0)
X = _rng.normal(size=(200, 4)).astype(np.float32)
Y = (X[:, 0] - X[:, 2] > 0).astype(int)
PROBE = X[:16]

# "lin" versions share one graph structure (cache hits: a registration takes ~0.2 s), "forest"
# versions each have a new number of trees (a real compile: seconds), so random delays land in
# every phase of both kinds of registration.
FAST, COMPILE = "lin", "forest"


# ------------------------------------------------------------------------- what the test knows


@dataclass
class Ledger:
    """What this test uploaded and what the server confirmed, to judge the store against."""

    estimators: dict[str, Any] = field(default_factory=dict)  # artifact sha256 → estimator
    confirmed: set[tuple[str, str]] = field(default_factory=set)  # committed versions
    deleted: set[tuple[str, str]] = field(default_factory=set)  # confirmed deletes
    # Deletes a kill interrupted: gone or not; once a restart shows which, that must hold.
    doubtful: set[tuple[str, str]] = field(default_factory=set)
    served: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # first answers
    outcomes: Counter[str] = field(default_factory=Counter)

    def artifact(self, estimator: Any) -> bytes:
        data = sio.dumps(estimator)
        self.estimators[hashlib.sha256(data).hexdigest()] = estimator
        return data


def _estimator(kind: str, k: int) -> Any:
    if kind == FAST:
        return make_pipeline(StandardScaler(), LogisticRegression(C=0.5 + 0.25 * k)).fit(X, Y)
    return RandomForestClassifier(n_estimators=2 + k, max_depth=3, random_state=k).fit(X, Y)


# ------------------------------------------------------------------------- the race


@dataclass
class Race:
    """One mutation sent from a thread while the test kills the server."""

    action: str
    upload: tuple[str, bytes] | None = None  # (model, artifact) when the action is an upload
    temps_before: set[str] = field(default_factory=set)  # temp files in the store root before
    response: httpx.Response | None = None
    error: BaseException | None = None  # what the request got instead of an answer


def _race(
    live: LiveServer,
    race: Race,
    send: Callable[[httpx.Client], httpx.Response],
    *,
    delay_s: float | None = None,
    trigger: Callable[[], bool] | None = None,
    limit_s: float = 120.0,
) -> Race:
    """Run ``send`` in a thread and ``kill -9`` the server after ``delay_s`` or as soon as
    ``trigger()`` is true (polled in a tight loop; killed anyway once ``send`` returned)."""
    action = race.action
    finished = threading.Event()

    def request() -> None:
        try:
            with httpx.Client(base_url=live.url, timeout=limit_s, headers=live.admin) as client:
                race.response = send(client)
        except httpx.TransportError as exc:  # the kill cut the connection
            race.error = exc
        finally:
            finished.set()

    thread = threading.Thread(target=request, name=f"race-{action}")
    t0 = time.monotonic()
    thread.start()
    if trigger is None:
        finished.wait(delay_s)
    else:
        deadline = t0 + limit_s
        while not finished.is_set() and time.monotonic() < deadline:
            if trigger():
                break
    live.kill()
    thread.join(60)
    assert not thread.is_alive(), f"{action}: the request thread hung after the kill"
    return race


def _new_temp_in(directory: Path, before: set[str], nth: int = 1) -> Callable[[], bool]:
    """True once the ``nth`` temp file not in ``before`` appears in ``directory``: a write in
    progress (each manifest mutation writes two: manifest.prev.json, then manifest.json)."""
    seen_names: set[str] = set()

    def seen() -> bool:
        with os.scandir(directory) as entries:
            seen_names.update(
                e.name for e in entries if e.name.startswith(".tmp-") and e.name not in before
            )
        return len(seen_names) >= nth

    return seen


def _replaced(path: Path, nth: int = 1) -> Callable[[], bool]:
    """True once ``path`` has been replaced ``nth`` times (``os.replace`` gives a new inode)."""
    inodes = [path.stat().st_ino if path.exists() else None]

    def seen() -> bool:
        try:
            inode = path.stat().st_ino
        except FileNotFoundError:
            return False
        if inode != inodes[-1]:
            inodes.append(inode)
        return len(inodes) > nth

    return seen


def _temps(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.startswith(".tmp-")}


# ------------------------------------------------------------------------- the checks


def _strict_manifest(root: Path) -> Manifest:
    """``manifest.json`` itself must parse: atomic writes never need the fallback."""
    return Manifest.from_json(json.loads((root / MANIFEST_FILE).read_bytes()))


def _check_files(root: Path) -> Counter[str]:
    """Every file in the store is a manifest, a blob whose content hashes to its name, or a
    temp file a kill left behind (counted by place, for the report)."""
    leftovers: Counter[str] = Counter()
    for path in root.rglob("*"):
        if path.is_dir():
            continue
        relative = path.relative_to(root)
        if path.name.startswith(".tmp-"):
            leftovers["manifest temp" if path.parent == root else "blob temp"] += 1
        elif path.parent == root:
            assert path.name in (MANIFEST_FILE, PREV_MANIFEST_FILE), f"stray file {relative}"
        else:
            if relative.parts[0] == "executables":  # shared by servers (service.shared_cache)
                assert path.suffix == ".xc", f"stray file {relative}"
                continue  # its checksum is checked where it is read (lazy.cache_tiers)
            assert relative.parts[:2] == ("blobs", "sha256"), f"stray file {relative}"
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest == path.name, f"blob {relative} holds bytes hashing to {digest}"
    return leftovers


def _answer(live: LiveServer, name: str) -> dict[str, Any]:
    r = live.client.post(f"/models/{name}/predict", json=PROBE.tolist())
    assert r.status_code == 200, r.text
    return r.json()


def _assert_matches_source(doc: dict[str, Any], estimator: Any, what: str) -> None:
    outputs = doc["outputs"]
    np.testing.assert_array_equal(outputs["predict"], estimator.predict(PROBE), err_msg=what)
    np.testing.assert_allclose(
        outputs["predict_proba"], estimator.predict_proba(PROBE), rtol=RTOL, atol=ATOL, err_msg=what
    )


def _check_consistent(live: LiveServer, root: Path, ledger: Ledger) -> Manifest:
    """The store is whole, the server serves exactly it, and nothing confirmed was lost."""
    manifest = _strict_manifest(root)
    store = ModelStore(str(root))
    stored = {
        (name, version): record
        for name, entry in manifest.models.items()
        for version, record in entry.versions.items()
    }
    for key, record in stored.items():
        assert record.artifact in ledger.estimators, f"{key}: artifact this test never uploaded"
        for digest in record.blobs():
            store.get_blob(digest)  # raises unless present and hashing to its digest
    ledger.deleted |= ledger.doubtful - stored.keys()
    ledger.doubtful.clear()
    lost = ledger.confirmed - ledger.deleted - stored.keys()
    assert not lost, f"confirmed versions lost by a crash: {sorted(lost)}"
    revived = ledger.deleted & stored.keys()
    assert not revived, f"confirmed deletes undone by a crash: {sorted(revived)}"

    listing = live.client.get("/models", headers=live.admin).json()["models"]
    assert {m["name"] for m in listing} == set(manifest.models), listing
    for model in listing:
        entry = manifest.models[model["name"]]
        states = {v["version"]: v["state"] for v in model["versions"]}
        assert set(states) == set(entry.versions), f"{model['name']}: {states} vs the manifest"
        assert model["current"] == entry.current, model
        want = {v: "READY" if v == entry.current else "RETIRED" for v in entry.versions}
        assert states == want, f"{model['name']}: {states}"

    for name, entry in manifest.models.items():
        if entry.current is None:
            continue
        key = (name, entry.current)
        doc = _answer(live, name)
        assert doc["version"] == entry.current, doc
        _assert_matches_source(doc, ledger.estimators[stored[key].artifact], f"{key}")
        if key in ledger.served:
            assert doc["outputs"] == ledger.served[key]["outputs"], f"{key} answers differently"
        ledger.served.setdefault(key, doc)
    ledger.confirmed |= stored.keys()  # committed is durable from now on
    _check_files(root)
    return manifest


def _register(client: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return client.post(
        "/models",
        params={"wait": "true"},
        data={"name": name, "options": OPTIONS},
        files={"file": ("model.skops", data)},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )


def _confirm_upload(live: LiveServer, ledger: Ledger, name: str, response: httpx.Response) -> None:
    assert response.status_code == 201, response.text
    key = (name, response.json()["version"])
    ledger.confirmed.add(key)
    ledger.served[key] = _answer(live, name)
    assert ledger.served[key]["version"] == key[1]


# ------------------------------------------------------------------------- the test


def test_kill_9_during_uploads_deletes_and_manifest_writes_keeps_the_store_consistent(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    root = tmp_path / "store"
    ledger = Ledger()
    made = Counter[str]()

    def next_artifact(kind: str) -> bytes:
        made[kind] += 1
        return ledger.artifact(_estimator(kind, made[kind]))

    # Setup, no kills: two versions of each model; the second of each times a registration.
    live = LiveServer(tmp_path).start()
    port = live.port
    phase_s: dict[str, float] = {}
    try:
        for kind in (FAST, COMPILE):
            for _ in range(2):
                t0 = time.monotonic()
                response = _register(live.client, kind, next_artifact(kind))
                phase_s[kind] = time.monotonic() - t0
                _confirm_upload(live, ledger, kind, response)
        _check_consistent(live, root, ledger)
    finally:
        live.kill()

    interrupted: list[tuple[str, bytes]] = []  # uploads a kill cut off: registered again
    for _ in range(ROUNDS):
        live = LiveServer(tmp_path, port=port).start()
        try:
            _check_consistent(live, root, ledger)
            for name, data in interrupted:  # re-registering what a kill interrupted works
                _confirm_upload(live, ledger, name, _register(live.client, name, data))
            interrupted.clear()
            manifest = _check_consistent(live, root, ledger)
            action = rng.choices(list(ACTIONS), list(ACTIONS.values()))[0]
            race = _round(live, root, manifest, ledger, action, rng, phase_s, next_artifact)
        finally:
            live.kill()
        ledger.outcomes[_classify(race, root)] += 1
        if race.upload is not None and race.response is None:
            interrupted.append(race.upload)

    # Last restart: still consistent; gc clears what the kills left behind; serving goes on.
    live = LiveServer(tmp_path, port=port).start()
    try:
        _check_consistent(live, root, ledger)
        for name, data in interrupted:
            _confirm_upload(live, ledger, name, _register(live.client, name, data))
        leftovers = _check_files(root)
        ModelStore(str(root)).gc(grace_s=0)
        assert not _check_files(root), "gc left temp files behind"
        _check_consistent(live, root, ledger)
        assert "Traceback" not in live.logs(), live.logs()
    finally:
        live.stop()

    print(
        f"\ncrash rounds: {dict(sorted(ledger.outcomes.items()))}; temp files left by kills: "
        f"{dict(leftovers)}; uninterrupted registration took {phase_s}"
    )
    assert ledger.outcomes["kill inside a manifest write"] >= 1, ledger.outcomes
    # Delays are drawn from timings measured once, on a machine whose speed varies: some kills
    # come after the work is done. Enough must cut something off for the rounds to mean anything.
    cut = sum(n for outcome, n in ledger.outcomes.items() if not outcome.endswith("the kill"))
    assert cut >= ROUNDS // 4, f"too few kills interrupted anything: {ledger.outcomes}"


# How often each kind of round is drawn.
ACTIONS = {
    "upload-fast": 4,
    "upload-compile": 4,
    "manifest-temp": 4,
    "manifest-swap": 2,
    "delete": 3,
}


def _round(
    live: LiveServer,
    root: Path,
    manifest: Manifest,
    ledger: Ledger,
    action: str,
    rng: random.Random,
    phase_s: dict[str, float],
    next_artifact: Callable[[str], bytes],
) -> Race:
    """Start ``action`` and kill the server during it."""
    if action == "delete" and manifest.models:
        return _delete_race(live, root, manifest, ledger, rng)
    kind = COMPILE if action == "upload-compile" else FAST
    data = next_artifact(kind)
    race = Race(action, upload=(kind, data), temps_before=_temps(root))

    def send(client: httpx.Client) -> httpx.Response:
        return _register(client, kind, data)

    # A registration writes the manifest twice: reserving its version number, then committing.
    mutation = rng.choice([1, 2])
    if action == "manifest-temp":  # the kill lands while a manifest file is being written
        trigger = _new_temp_in(root, race.temps_before, nth=2 * mutation - rng.choice([0, 1]))
        _race(live, race, send, trigger=trigger)
    elif action == "manifest-swap":  # ... or just after manifest.prev.json was replaced
        _race(live, race, send, trigger=_replaced(root / PREV_MANIFEST_FILE, nth=mutation))
    else:  # anywhere from the first byte of the upload to the answer
        _race(live, race, send, delay_s=rng.uniform(0.0, phase_s[kind]))
    if race.response is not None:
        assert race.response.status_code == 201, race.response.text
        ledger.confirmed.add((kind, race.response.json()["version"]))
    return race


def _delete_race(
    live: LiveServer, root: Path, manifest: Manifest, ledger: Ledger, rng: random.Random
) -> Race:
    """Delete the current version (the server swaps back to the newest other one) or an old one."""
    name = rng.choice(sorted(manifest.models))
    entry = manifest.models[name]
    version = entry.current if rng.random() < 0.5 else rng.choice(sorted(entry.versions))
    assert version is not None
    race = Race("delete", temps_before=_temps(root))

    def send(client: httpx.Client) -> httpx.Response:
        return client.delete(f"/models/{name}/versions/{version}")

    _race(live, race, send, delay_s=rng.uniform(0.0, 0.4))
    if race.response is not None:
        assert race.response.status_code == 204, race.response.text
        ledger.deleted.add((name, version))
    else:
        ledger.confirmed.discard((name, version))
        ledger.doubtful.add((name, version))
    return race


def _classify(race: Race, root: Path) -> str:
    """Where the kill landed, as far as the files tell."""
    if race.response is not None:
        return f"{race.action}: done before the kill"
    if _temps(root) - race.temps_before:  # a temp file beside the manifest: killed mid-write
        return "kill inside a manifest write"
    if (root / PREV_MANIFEST_FILE).read_bytes() == (root / MANIFEST_FILE).read_bytes():
        return "kill inside a manifest write"  # prev replaced, manifest.json not yet
    return f"interrupted {race.action}"
