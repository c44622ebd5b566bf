"""Promotion and rollback: the store's history of current versions, replicas following it, a
version that cannot load not left current, and the routes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from service.errors import Conflict, NotFound, NotReady
from service.store import (
    HISTORY_LIMIT,
    Manifest,
    ModelStore,
    NoPreviousVersion,
    VersionRecord,
)
from service.versions import State
from tests.service.test_replica_sync import registered, replica, run, serves


def _stored(store: ModelStore, *versions: str) -> None:
    digest = store.put_blob(b"artifact")
    for v in versions:
        store.commit(VersionRecord("m", v, digest, "skops", "m.skops"), by="ci")


def test_every_change_of_the_current_version_is_recorded(tmp_path: Path) -> None:
    store = ModelStore(str(tmp_path))
    _stored(store, "1", "2", "3")
    store.set_current("m", "1", by="alice")
    store.delete("m", "1", by="bob")  # the current one: the newest remaining takes over
    history = [
        (c.action, c.previous, c.current, c.by) for c in store.load_manifest().models["m"].history
    ]
    assert history == [
        ("register", None, "1", "ci"),
        ("register", "1", "2", "ci"),
        ("register", "2", "3", "ci"),
        ("promote", "3", "1", "alice"),
        ("delete", "1", "3", "bob"),
    ]
    generation = store.load_manifest().generation
    store.set_current("m", "3")  # already current: nothing is written
    assert store.load_manifest().generation == generation


def test_rollbacks_undo_in_turn(tmp_path: Path) -> None:
    store = ModelStore(str(tmp_path))
    _stored(store, "1", "2", "3")
    store.set_current("m", "1")
    assert store.rollback("m").models["m"].current == "3"  # undoes the promotion
    assert store.rollback("m").models["m"].current == "2"  # then the registration of 3
    assert store.rollback("m").models["m"].current == "1"
    with pytest.raises(NoPreviousVersion, match="no earlier current version"):
        store.rollback("m")
    store.set_current("m", "3")  # a promotion after rollbacks starts a new undo step
    assert store.rollback("m").models["m"].current == "1"


def test_a_rollback_to_a_deleted_version_is_refused(tmp_path: Path) -> None:
    store = ModelStore(str(tmp_path))
    _stored(store, "1", "2", "3")
    store.delete("m", "2")
    with pytest.raises(NoPreviousVersion, match="version 2, current before 3, was deleted"):
        store.rollback("m")
    assert store.load_manifest().models["m"].current == "3"


def test_history_is_bounded_and_survives_old_manifests(tmp_path: Path) -> None:
    store = ModelStore(str(tmp_path))
    _stored(store, "1", "2")
    for i in range(HISTORY_LIMIT + 5):
        store.set_current("m", "1" if i % 2 == 0 else "2")
    entry = store.load_manifest().models["m"]
    assert len(entry.history) == HISTORY_LIMIT and entry.history[-1].current == entry.current
    # A manifest written before histories existed reads with an empty one.
    doc = json.loads((tmp_path / "manifest.json").read_text())
    del doc["models"]["m"]["history"]
    assert Manifest.from_json(doc).models["m"].history == []


def test_replicas_follow_a_promotion_and_a_rollback(tmp_path: Path) -> None:
    a, b = replica(tmp_path), replica(tmp_path)

    async def scenario() -> None:
        await registered(a, "a")
        await registered(a, "b")
        await b.recover()
        await serves(b, "b", "2")
        mv = await a.promote("m", "1", "alice")
        assert mv.state is State.READY and a.current("m") is mv
        await serves(a, "a", "1")
        assert a.lookup("m", "2").state is State.RETIRED  # the one it replaced
        await b.sync()
        await serves(b, "a", "1")
        await a.rollback("m", "bob")
        await serves(a, "b", "2")
        await b.sync()
        await serves(b, "b", "2")
        changes = [(c.action, c.current, c.by) for c in b.histories["m"]]
        assert changes[-2:] == [("promote", "1", "alice"), ("rollback", "2", "bob")]
        with pytest.raises(Conflict, match="not stored"):
            a.lookup("m", "2").record = None  # as an upload still compiling
            await a.promote("m", "2")

    run(a, b)(scenario)


def test_a_version_that_cannot_load_is_not_left_current(tmp_path: Path) -> None:
    a = replica(tmp_path)

    async def scenario() -> None:
        first = await registered(a, "a")
        await registered(a, "b")
        record = first.record
        assert record is not None
        blob = Path(a.store.url) / "blobs/sha256" / record.artifact[:2] / record.artifact
        blob.unlink()
        with pytest.raises(NotReady, match="could not be loaded"):
            await a.promote("m", "1", "alice")
        manifest = a.store.load_manifest()
        assert manifest.models["m"].current == "2"
        assert manifest.models["m"].history[-1].by.startswith("alice (back: version 1 failed")
        await serves(a, "b", "2")

    run(a)(scenario)


@pytest.mark.slow  # two live servers under load: make test-slow (CI)
def test_promote_and_rollback_under_load_lose_no_request(tmp_path: Path) -> None:
    import threading
    import time

    import httpx
    import numpy as np
    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    from tests.service.live import LiveServer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 2] > 0).astype(int)
    models = [
        LogisticRegression().fit(x, y),
        RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(x, y),
    ]
    options = '{"max_batch": 8}'
    a = LiveServer(tmp_path).start()
    b = LiveServer(tmp_path, port=None, KESTREL_POLL_INTERVAL_S="0.2")
    b.log_path = tmp_path / "replica-b.log"
    try:
        for model in models:
            assert a.register("m", sio.dumps(model), options=options).status_code == 201
        b.start()
        stop = threading.Event()
        answers: dict[str, list[tuple[int, str]]] = {a.url: [], b.url: []}

        def load(url: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/models/m/predict", json=x[:3].tolist())
                    answers[url].append((r.status_code, r.json().get("version", r.text)))

        threads = [threading.Thread(target=load, args=(u,)) for u in (a.url, b.url) * 2]
        for t in threads:
            t.start()

        def settled_on(version: str) -> None:
            """Both replicas answer with ``version`` (b within its poll interval)."""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(answers[u] and answers[u][-1][1] == version for u in answers):
                    return
                time.sleep(0.05)
            raise AssertionError(f"not every replica serves version {version}")

        headers = {**a.admin, "x-kestrel-actor": "release-bot"}
        try:
            settled_on("2")
            r = a.client.post("/models/m/promote", json={"version": "1"}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["previous"] == "2" and r.json()["current"] == "1"
            assert r.json()["change"]["action"] == "promote"
            settled_on("1")
            r = a.client.post("/models/m/rollback", headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["current"] == "2"
            settled_on("2")
        finally:
            stop.set()
            for t in threads:
                t.join()
        for url, got in answers.items():
            assert {status for status, _ in got} == {200}, (url, sorted({s for s, _ in got}))
        history = a.client.get("/models/m", headers=a.admin).json()["history"]
        assert [(c["action"], c["from"], c["to"], c["by"]) for c in history[-2:]] == [
            ("promote", "2", "1", "release-bot"),
            ("rollback", "1", "2", "release-bot"),
        ]
        r = a.client.post("/models/m/promote", json={"version": "9"}, headers=a.admin)
        assert r.status_code == 404 and "no version '9'" in r.text
        r = a.client.post("/models/m/promote", json={"v": "1"}, headers=a.admin)
        assert r.status_code == 400 and '{"version": "2"}' in r.json()["error"]["message"]
        assert a.client.post("/models/m/rollback").status_code == 401
        # An alias: served beside the current version on every scoring route, on both replicas.
        r = a.client.put("/models/m/aliases/stable", json={"version": "1"}, headers=a.admin)
        assert r.status_code == 200 and r.json()["version"] == "1", r.text
        for server in (a, b):
            deadline = time.monotonic() + 30
            while True:
                r = server.client.post("/models/m@stable/predict", json=x[:3].tolist())
                if r.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert r.status_code == 200 and r.json()["version"] == "1", r.text
            assert r.json()["model"] == "m"
            assert (
                server.client.post("/models/m/predict", json=x[:3].tolist()).json()["version"]
                == "2"
            )
        infer = {
            "inputs": [
                {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": x[:3].ravel().tolist()}
            ]
        }
        r = a.client.post("/v2/models/m/versions/stable/infer", json=infer)
        assert r.status_code == 200 and r.json()["model_version"] == "1", r.text
        assert a.client.get("/models/m", headers=a.admin).json()["aliases"] == {"stable": "1"}
        r = a.client.put("/models/m/aliases/7", json={"version": "1"}, headers=a.admin)
        assert r.status_code == 400 and "numbers name versions" in r.text
        assert a.client.delete("/models/m/aliases/stable", headers=a.admin).status_code == 204
        assert a.client.post("/models/m@stable/predict", json=x[:3].tolist()).status_code == 404
        # A 5 % canary of version 1, by route key, alike on both replicas.
        r = a.client.put("/models/m/traffic", json={"weights": {"2": 95, "1": 5}}, headers=a.admin)
        assert r.status_code == 200 and r.json()["weights"] == {"1": 5.0, "2": 95.0}, r.text

        def versions_for(server: LiveServer, keys: list[str]) -> list[str]:
            return [
                server.client.post(
                    "/models/m/predict", json=x[:1].tolist(), headers={"x-kestrel-route-key": k}
                ).json()["version"]
                for k in keys
            ]

        keys = [f"user-{i}" for i in range(2000)]
        on_a = versions_for(a, keys)
        assert 0.04 <= on_a.count("1") / len(keys) <= 0.06, on_a.count("1")
        # Replica b follows within its poll interval, once it has loaded version 1 too (until
        # then its share goes to the rest of the split).
        canary_key = keys[on_a.index("1")]
        deadline = time.monotonic() + 30
        while versions_for(b, [canary_key]) != ["1"]:
            assert time.monotonic() < deadline, "replica b did not follow the split"
            time.sleep(0.05)
        assert versions_for(b, keys[:200]) == on_a[:200]
        r = a.client.put("/models/m/traffic", json={"weights": {"1": -1}}, headers=a.admin)
        assert r.status_code == 400 and "at least 0" in r.text
        r = a.client.put("/models/m/traffic", json={"weights": {}}, headers=a.admin)
        assert r.status_code == 200 and r.json()["weights"] == {}
        assert set(versions_for(a, keys[:100])) == {"2"}
        # A retrained version 2 with one branch moved, staged (stored only) and shadowing:
        # every label it flips on live requests is counted; the clients still get version 2.
        import copy
        import io

        flipped = copy.deepcopy(models[1])
        root = flipped.estimators_[0].tree_
        root.threshold[0] += 0.75
        flips = flipped.predict(x) != models[1].predict(x)
        assert flips.any()
        r = a.client.post(
            "/models",
            params={"wait": "true", "promote": "false"},
            data={"name": "m", "options": options},
            files={"file": ("m.skops", io.BytesIO(sio.dumps(flipped)))},
            headers=a.admin,
        )
        assert r.status_code == 201 and r.json()["version"] == "3", r.text
        r = a.client.put("/models/m/shadow", json={"version": "3", "share": 1.0}, headers=a.admin)
        assert r.status_code == 200 and r.json()["shadow"] == {"version": "3", "share": 1.0}
        for i in range(0, len(x), 3):
            r = a.client.post("/models/m/predict", json=x[i : i + 3].tolist())
            assert r.json()["version"] == "2"
        labels = {"model": "m", "version": "2", "shadow": "3"}
        deadline = time.monotonic() + 30
        while a.metric("kestrel_shadow_rows_total", **labels) < len(x):
            assert time.monotonic() < deadline, "the mirrors did not finish"
            time.sleep(0.05)
        disagreements = a.metric("kestrel_shadow_label_disagreements_total", **labels)
        assert disagreements == int(flips.sum()), (disagreements, int(flips.sum()))
        assert a.client.delete("/models/m/shadow", headers=a.admin).status_code == 204
        # With a rule allowing no flipped label, the first flip stops the mirroring; version 2
        # serves on.
        bad = {"version": "3", "share": 1.0, "rule": {"after_rows": 0}}
        r = a.client.put("/models/m/shadow", json=bad, headers=a.admin)
        assert r.status_code == 400 and "'after_rows'" in r.text, r.text
        rule = {"after_rows": len(x), "max_label_disagreement": 0.0, "max_abs_diff": None}
        body = {"version": "3", "share": 1.0, "rule": rule}
        r = a.client.put("/models/m/shadow", json=body, headers=a.admin)
        assert r.status_code == 200 and r.json()["shadow"] == body, r.text
        decided = {"model": "m", "shadow": "3", "decision": "reject"}
        for i in range(0, len(x), 3):
            assert a.client.post("/models/m/predict", json=x[i : i + 3].tolist()).status_code == 200
            if a.metric("kestrel_shadow_decisions_total", **decided):
                break
        deadline = time.monotonic() + 30
        while a.client.get("/models/m", headers=a.admin).json()["shadow"] is not None:
            assert time.monotonic() < deadline, "the rule did not stop the shadow"
            time.sleep(0.05)
        assert a.metric("kestrel_shadow_decisions_total", **decided) == 1
        assert a.client.post("/models/m/predict", json=x[:3].tolist()).json()["version"] == "2"
    finally:
        b.stop()
        a.stop()


def test_aliases_name_versions_and_go_with_them(tmp_path: Path) -> None:
    from service.store import InvalidName, ModelNotFound, VersionConflict

    store = ModelStore(str(tmp_path))
    _stored(store, "1", "2", "3")
    store.set_alias("m", "stable", "2")
    store.set_alias("m", "canary", "stable")  # an alias of an alias names its version
    entry = store.load_manifest().models["m"]
    assert entry.aliases == {"canary": "2", "stable": "2"} and entry.resolve("canary") == "2"
    with pytest.raises(InvalidName, match="numbers name versions"):
        store.set_alias("m", "4", "1")
    _stored(store, "gold")
    store.set_current("m", "3")
    with pytest.raises(VersionConflict, match="has a version named 'gold'"):
        store.set_alias("m", "gold", "1")
    with pytest.raises(ModelNotFound, match="no version 'beta'"):
        store.set_alias("m", "next", "beta")
    digest = store.put_blob(b"artifact")
    with pytest.raises(VersionConflict, match="has an alias named 'stable'"):
        store.commit(VersionRecord("m", "stable", digest, "skops", "m.skops"))
    store.delete("m", "2")
    assert store.load_manifest().models["m"].aliases == {}
    with pytest.raises(ModelNotFound, match="no alias 'stable'"):
        store.delete_alias("m", "stable")


def test_an_alias_serves_its_version_beside_the_current_one(tmp_path: Path) -> None:
    from tests.service.test_replica_sync import X

    a, b = replica(tmp_path), replica(tmp_path)

    async def answer(manager, name: str, version: str | None = None) -> str:  # type: ignore[no-untyped-def]
        result = await manager.predict(name, version, X[:2].tolist(), outputs=None, deadline=None)
        return result.version.version

    async def scenario() -> None:
        await registered(a, "a")
        await registered(a, "b")
        await b.recover()
        await a.set_alias("m", "stable", "1")
        assert await answer(a, "m@stable") == "1" and await answer(a, "m") == "2"
        assert await answer(a, "m", "stable") == "1"  # an alias where a version is named
        with pytest.raises(NotFound, match="names its version already"):
            await answer(a, "m@stable", "1")  # two versions named: no such model
        await b.sync()
        assert await answer(b, "m@stable") == "1" and await answer(b, "m") == "2"
        # Promoting the version an alias serves switches to it; the old current one stays
        # only if an alias names it.
        await a.promote("m", "stable")
        await asyncio.sleep(0.05)  # the replaced version stops in a task of its own
        assert a.current("m").version == "1" and a.lookup("m", "2").state is State.RETIRED
        await a.set_alias("m", "canary", "2")
        await a.rollback("m")
        assert await answer(a, "m") == "2" and await answer(a, "m@stable") == "1"
        await a.delete_alias("m", "stable")
        assert a.lookup("m", "1").state is State.RETIRED
        await b.sync()
        assert await answer(b, "m") == "2" and b.lookup("m", "1").state is State.RETIRED
        with pytest.raises(NotFound, match="no version 'stable'"):
            await answer(b, "m@stable")  # no such alias any more: read as a version name

    run(a, b)(scenario)


def test_a_canary_gets_its_share_and_a_key_sticks_to_one_version(tmp_path: Path) -> None:
    import random

    from tests.service.test_replica_sync import X, upload

    a, b = replica(tmp_path), replica(tmp_path)

    async def served(manager, key: str | None) -> str:  # type: ignore[no-untyped-def]
        result = await manager.predict(
            "m", None, X[:1].tolist(), outputs=None, deadline=None, route_key=key
        )
        return result.version.version

    async def scenario() -> None:
        await registered(a, "a")
        staged = upload("b")
        staged.promote = False  # stored only: version 1 keeps serving
        mv = await a.register(staged)
        assert await a.wait(mv, 120) and mv.record is not None
        await asyncio.sleep(0.05)
        assert a.current("m").version == "1" and mv.state is State.RETIRED
        await b.recover()

        assert await a.set_traffic("m", {"1": 95, "2": 5}) == {"1": 95.0, "2": 5.0}
        assert a.lookup("m", "2").state is State.READY  # loaded beside the current one
        await b.sync()
        keys = [f"user-{i}" for i in range(2000)]
        on_a = [await served(a, k) for k in keys]
        share = on_a.count("2") / len(keys)
        assert 0.04 <= share <= 0.06, share
        assert [await served(b, k) for k in keys[:300]] == on_a[:300]  # every replica alike
        random.seed(7)
        unkeyed = [await served(a, None) for _ in range(2000)]
        assert 0.04 <= unkeyed.count("2") / 2000 <= 0.06

        from service.store import InvalidRecord, ModelNotFound

        with pytest.raises(ModelNotFound, match="no version '9'"):
            await a.set_traffic("m", {"1": 1, "9": 1})
        with pytest.raises(InvalidRecord, match="some version with a positive weight"):
            await a.set_traffic("m", {"1": 0})
        assert a.traffic["m"] == {"1": 95.0, "2": 5.0}  # refused: unchanged

        await a.promote("m", "2")  # a promotion ends the split
        assert a.traffic.get("m") is None
        assert {await served(a, k) for k in keys[:50]} == {"2"}
        await b.sync()
        await asyncio.sleep(0.05)
        assert b.current("m").version == "2" and b.lookup("m", "1").state is State.RETIRED

    run(a, b)(scenario)


def test_a_shadow_version_scores_mirrored_requests_off_the_request_path(tmp_path: Path) -> None:
    from service.shadow import divergence
    from tests.service.test_replica_sync import MODELS, X, upload

    a = replica(tmp_path)

    async def scenario() -> None:
        await registered(a, "a")
        staged = upload("b")
        staged.promote = False
        mv = await a.register(staged)
        assert await a.wait(mv, 120)
        await a.set_shadow("m", "2", 1.0)
        assert a.lookup("m", "2").state is State.READY and a.current("m").version == "1"
        for _ in range(20):
            await serves(a, "a", "1")  # the client's answer is version 1's
        for _ in range(100):  # the mirrors finish on their own
            if a.mirror.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        registry = a.metrics.registry
        labels = {"model": "m", "version": "1", "shadow": "2"}
        sample = registry.get_sample_value
        assert sample("kestrel_shadow_requests_total", {**labels, "result": "compared"}) == 20
        assert sample("kestrel_shadow_rows_total", labels) == 20 * 5
        gap = float(np.max(np.abs(MODELS["a"].predict(X[:5]) - MODELS["b"].predict(X[:5]))))
        count = sample("kestrel_shadow_max_abs_diff_count", {**labels, "output": "predict"})
        assert count == 20
        total = sample("kestrel_shadow_max_abs_diff_sum", {**labels, "output": "predict"})
        assert abs(total / 20 - gap) < 1e-3 * max(1.0, gap)
        await a.set_shadow("m", None)
        await asyncio.sleep(0.05)
        assert a.lookup("m", "2").state is State.RETIRED and a.shadows.get("m") is None

    run(a)(scenario)

    same = divergence(
        {"predict": np.array([0, 1, 1])}, {"predict": np.array([0, 0, 1])}, 3, labels=True
    )
    assert same is not None and same.label_disagreements == 1 and same.max_abs_diff == {}
    proba = divergence(
        {"predict_proba": np.array([[0.2, 0.8]])},
        {"predict_proba": np.array([[0.25, 0.75]])},
        1,
        labels=True,
    )
    assert proba is not None and abs(proba.max_abs_diff["predict_proba"] - 0.05) < 1e-12
    assert (
        divergence(
            {"predict_proba": np.zeros((1, 2))}, {"predict_proba": np.zeros((1, 3))}, 1, labels=True
        )
        is None
    )


def test_a_split_skips_versions_not_loaded_here_yet() -> None:
    from service.versions import ModelOptions, ModelVersion, Versions

    table = Versions(poll_interval_s=0)
    for version, state in (("1", State.READY), ("2", State.LOADING)):
        table.add(ModelVersion("m", version, "skops", "m.skops", ModelOptions(), state=state))
    table.traffic["m"] = {"1": 50.0, "2": 50.0}
    assert {table.route("m", None, f"user-{i}") for i in range(200)} == {"1"}
    table.by_name["m"]["2"].state = State.READY
    assert {table.route("m", None, f"user-{i}") for i in range(200)} == {"1", "2"}
    table.by_name["m"]["1"].state = State.RETIRED
    assert table.route("m", "1", "user-1") == "1"  # a version named: no split
    table.by_name["m"]["2"].state = State.LOADING
    assert table.route("m", None, "user-1") is None  # none of the split here: the current one


def test_a_shadow_rule_decides_on_the_rows_compared() -> None:
    from service.shadow import Divergence
    from service.shadow_rule import InvalidRule, ShadowRule, Tally, Verdict

    rule = ShadowRule(after_rows=100, max_label_disagreement=0.02)
    tally = Tally()
    tally.add(Divergence(60, 1, {"predict_proba": 0.01}))
    assert tally.verdict(rule) is None  # 60 rows: not yet
    tally.add(Divergence(40, 1, {}))
    assert tally.verdict(rule) is Verdict.PROMOTE  # 2 of 100 labels: exactly the share allowed
    early = Tally()
    early.add(Divergence(10, 3, {}))  # 3 > 2 % of 100: it cannot pass any more
    assert early.verdict(rule) is Verdict.REJECT
    late = Tally()
    late.add(Divergence(150, 4, {}))
    assert late.verdict(rule) is Verdict.REJECT  # 4 of 150 > 2 %
    strict = ShadowRule(after_rows=10, max_abs_diff=1e-6)
    gap = Tally()
    gap.add(Divergence(1, 0, {"predict": 1e-3}))
    assert gap.verdict(strict) is Verdict.REJECT
    assert ShadowRule.from_json({"after_rows": 5}) == ShadowRule(5)
    for bad, field in [
        ({"after_rows": 0}, "after_rows"),
        ({"after_rows": 2.5}, "after_rows"),
        ({"after_rows": 5, "max_label_disagreement": 2}, "max_label_disagreement"),
        ({"after_rows": 5, "max_abs_diff": -1}, "max_abs_diff"),
        ({"after_rows": 5, "max_abs_dif": 1}, "unknown fields"),
        ({}, "after_rows"),
        ([], "JSON object"),
    ]:
        with pytest.raises(InvalidRule, match=field):
            ShadowRule.from_json(bad)


def test_a_shadow_rule_promotes_an_agreeing_version_and_drops_a_disagreeing_one(
    tmp_path: Path,
) -> None:
    from service.shadow_rule import Shadow, ShadowRule
    from tests.service.test_replica_sync import upload

    a, b = replica(tmp_path), replica(tmp_path)

    async def staged(kind: str) -> str:
        up = upload(kind)
        up.promote = False
        mv = await a.register(up)
        assert await a.wait(mv, 120) and mv.record is not None, mv.error  # stored, not serving
        return mv.version

    def decisions(shadow: str, decision: str) -> float:
        value = a.metrics.registry.get_sample_value(
            "kestrel_shadow_decisions_total",
            {"model": "m", "shadow": shadow, "decision": decision},
        )
        return value or 0.0

    async def settled() -> None:
        for _ in range(200):
            if a.mirror.in_flight == 0 and not a._sync_lock.locked():
                return
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        await registered(a, "a")
        await b.recover()
        # Version 2 computes another function: its first mirrored answer is further apart than
        # the rule allows, so it is dropped at once, and version 1 serves on.
        other = await staged("b")
        await a.set_shadow("m", other, 1.0, ShadowRule(after_rows=50, max_abs_diff=1e-6))
        await serves(a, "a", "1")
        await settled()
        assert a.shadows.get("m") is None and decisions(other, "reject") == 1
        assert a.current("m").version == "1" and a.lookup("m", other).state is State.RETIRED
        # Version 3 is the same model again: after 50 rows (10 requests of 5) it is promoted.
        same = await staged("a")
        rule = ShadowRule(after_rows=50, max_abs_diff=1e-4)
        await a.set_shadow("m", same, 1.0, rule)
        assert a.shadows["m"] == Shadow(same, 1.0, rule)
        for _ in range(9):
            await serves(a, "a", "1")
        await settled()
        assert a.current("m").version == "1"  # 45 rows: not yet
        await serves(a, "a", "1")
        await settled()
        assert a.current("m").version == same and decisions(same, "promote") == 1
        assert a.shadows.get("m") is None
        change = a.histories["m"][-1]
        assert (change.action, change.previous, change.current, change.by) == (
            "promote",
            "1",
            same,
            "shadow-rule",
        )
        await b.sync()  # the other replica follows the store
        assert b.current("m").version == same
        await serves(b, "a", same)
        # A decision on a shadow setting that changed since writes nothing.
        assert a.store.decide_shadow("m", Shadow(same, 1.0, rule), True).models["m"].current == same
        assert a.store.load_manifest().models["m"].history[-1].current == same

    run(a, b)(scenario)
