"""GET /v1/devices/{id}/extents end to end (docs/openapi.yaml): a daemon with model
"alpha" (generations 1, 2 and 3, 3 importing the same file as 1, so one
object has two users) and a 2-shard model "beta"; generation 2 retired and
gc'd leaves a hole. The extents tile the region exactly, in offset order
(label, objects, free gaps); every replica of every live generation's shards
is an object extent at its device_offset with the right users; the hole is
a free extent between objects; 404 unknown device, 400 bad id or query;
anonymous loopback reads work like /v1/devices (and are refused with them
when anonymous reads are off)."""
import os
import sqlite3

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import Daemon, make_checkpoint

PATH = "/v1/devices/1/extents"


@pytest.fixture(scope="module")
def d(build_dir, tmp_path_factory):
    w = tmp_path_factory.mktemp("extents")
    dm = Daemon(build_dir, w, settings={"store.image_size": "256M"}).start()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


def one_file(d, name, seed):
    rng = np.random.default_rng(seed)
    tensors = {f"w{i}": rng.standard_normal(4096 + 1000 * i).astype(np.float32) for i in range(3)}
    return make_checkpoint(os.path.join(d.workdir, name, "model.safetensors"), tensors)


def sharded(d, name, seed):
    rng = np.random.default_rng(seed)
    out = os.path.join(d.workdir, name)
    gen.write_checkpoint(out, gen.random_tensors(rng, 12), 2)
    return out


def extents(d, **kw):
    doc = d.ok("GET", PATH, **kw)
    assert set(doc) == {"device_id", "region_offset", "region_bytes", "data_offset",
                        "object_align", "extents"}, doc
    return doc


def check_tiling(doc):
    ex = doc["extents"]
    assert ex[0] == {"offset": doc["region_offset"], "kind": "label",
                     "bytes": doc["data_offset"] - doc["region_offset"]}
    pos = doc["region_offset"]
    for e in ex:
        assert e["offset"] == pos and e["bytes"] > 0, (e, pos)
        pos += e["bytes"]
    assert pos == doc["region_offset"] + doc["region_bytes"]
    assert sum(e["bytes"] for e in ex) == doc["region_bytes"]
    # free extents are maximal: never two in a row
    kinds = [e["kind"] for e in ex]
    assert all(not (a == b == "free") for a, b in zip(kinds, kinds[1:])), kinds
    assert kinds.count("label") == 1
    return ex


def replicas(d, model, number):
    g = d.ok("GET", f"/v1/models/{model}/generations/{number}")
    return [(s["name"], s["file_bytes"], r) for s in g["shards"] for r in s["replicas"]]


@pytest.fixture(scope="module")
def store(d):
    a1 = one_file(d, "a1", 1)
    d.import_ok("alpha", a1)
    d.import_ok("alpha", one_file(d, "a2", 2))
    d.import_ok("beta", sharded(d, "b1", 3), activate=True)
    d.import_ok("alpha", a1, activate=True)  # generation 3: alpha@1's object again
    before = extents(d)
    gen2 = replicas(d, "alpha", 2)
    d.ok("POST", "/v1/models/alpha/generations/2/retire")
    assert d.ok("POST", "/v1/gc")["n_objects_freed"] == 1
    return before, gen2


def test_extents_tile_the_region_and_name_every_user(d, store):
    before, gen2 = store
    doc = extents(d)
    dev = d.device()
    assert (doc["device_id"], doc["region_offset"], doc["region_bytes"], doc["data_offset"],
            doc["object_align"]) == (dev["id"], dev["region_offset"], dev["region_bytes"],
                                     dev["data_offset"], dev["object_align"])
    ex = check_tiling(doc)
    check_tiling(before)
    objs = {e["offset"]: e for e in ex if e["kind"] == "object"}
    assert len(objs) == dev["n_objects"] == 3  # alpha@1 (= @3), beta's two shards; @2 freed
    assert sum(e["bytes"] for e in objs.values()) == dev["used_bytes"]
    for e in objs.values():
        assert set(e) == {"offset", "bytes", "kind", "object_id", "state", "canonical_bytes",
                          "sha256", "users"}, e
        assert e["state"] == "committed" and len(e["sha256"]) == 64
        assert e["bytes"] % doc["object_align"] == 0 and 0 < e["canonical_bytes"] <= e["bytes"]
        assert e["users"] == sorted(e["users"], key=lambda u: (u["model"], u["generation"],
                                                               u["shard"]))
    # every replica of every live generation is an object extent listing it
    expected = {}
    for model, number in (("alpha", 1), ("alpha", 3), ("beta", 1)):
        for shard, file_bytes, r in replicas(d, model, number):
            assert r["device_id"] == 1
            e = objs[r["device_offset"]]
            assert (e["object_id"], e["canonical_bytes"]) == (r["object_id"], file_bytes)
            expected.setdefault(r["device_offset"], []).append(
                {"model": model, "generation": number, "shard": shard, "state": "ready"})
    assert sorted(expected) == sorted(objs)
    for off, users in expected.items():
        assert objs[off]["users"] == sorted(users, key=lambda u: (u["model"], u["generation"],
                                                                  u["shard"]))
    shared = [e for e in objs.values() if len(e["users"]) == 2]
    assert len(shared) == 1 and [(u["model"], u["generation"]) for u in shared[0]["users"]] == [
        ("alpha", 1), ("alpha", 3)]
    beta = sorted(u["shard"] for e in objs.values() for u in e["users"] if u["model"] == "beta")
    assert len(beta) == 2 and beta[0] != beta[1]
    # alpha@2's object, listed before gc, is now a free extent between objects
    [(_, _, r2)] = gen2
    old = [e for e in before["extents"] if e.get("object_id") == r2["object_id"]]
    assert len(old) == 1 and old[0]["users"] == [
        {"model": "alpha", "generation": 2, "shard": "model.safetensors", "state": "ready"}]
    i = next(k for k, e in enumerate(ex) if e["offset"] == r2["device_offset"])
    assert ex[i] == {"offset": r2["device_offset"], "bytes": old[0]["bytes"], "kind": "free"}
    assert ex[i - 1]["kind"] == "object" and ex[i + 1]["kind"] == "object"
    assert ex[-1]["kind"] == "free"


def test_retired_generation_still_listed_until_gc(d, store):
    # beta@2 (same shards as beta@1 plus nothing new): retire beta@1 after
    # activating @2; its users say "retired" until gc, the object stays
    d.import_ok("beta", os.path.join(d.workdir, "b1"), activate=True)
    d.ok("POST", "/v1/models/beta/generations/1/retire")
    ex = check_tiling(extents(d))
    beta = [u for e in ex if e["kind"] == "object" for u in e["users"] if u["model"] == "beta"]
    assert sorted((u["generation"], u["state"]) for u in beta) == [
        (1, "retired"), (1, "retired"), (2, "ready"), (2, "ready")]
    assert d.ok("POST", "/v1/gc")["n_objects_freed"] == 0  # still needed by beta@2


def test_errors(d, store):
    for path, status, code in (("/v1/devices/99/extents", 404, "TV_E_NOT_FOUND"),
                               ("/v1/devices/abc/extents", 400, "TV_E_BAD_REQUEST"),
                               ("/v1/devices/0/extents", 400, "TV_E_BAD_REQUEST"),
                               ("/v1/devices/-1/extents", 400, "TV_E_BAD_REQUEST"),
                               (PATH + "?limit=3", 400, "TV_E_BAD_REQUEST")):
        r = d.get(path)
        assert r.status == status, (path, r)
        err = r.json()["error"]
        assert err["code"] == code, (path, err)
    assert "99" in d.get("/v1/devices/99/extents").json()["error"]["message"]
    assert d.request("POST", PATH).status == 405


def test_anonymous_loopback_reads_like_devices(d, store, build_dir, tmp_path):
    assert d.get("/v1/devices/1", token=None).status == 200
    r = d.get(PATH, token=None)
    assert r.status == 200 and r.json() == extents(d)
    dm = Daemon(build_dir, tmp_path, settings={"store.image_size": "256M",
                                               "http.anonymous_reads": "never"}).start()
    try:
        for path in ("/v1/devices/1", PATH):
            assert dm.get(path, token=None).status == 401, path
        doc = dm.ok("GET", PATH)
        assert [e["kind"] for e in doc["extents"]] == ["label", "free"]
        check_tiling(doc)
    finally:
        assert dm.stop() == 0, dm.log_text()


def test_corrupt_extents_answer_500_naming_object_and_device(build_dir, tmp_path):
    """An object row overlapping its predecessor (written behind the
    schema's trigger) is a registry corruption: 500 naming both, never a
    negative or overlapping extent. GET /v1/devices/{id} and /v1/devices
    (the allocator's free-space accounting) answer the same registry error,
    not a 400, and an import (which reserves an extent) fails with it."""
    dm = Daemon(build_dir, tmp_path, settings={"store.image_size": "256M"}).start()
    try:
        dm.import_ok("m", one_file(dm, "m1", 7))
        [obj] = [e for e in dm.ok("GET", PATH)["extents"] if e["kind"] == "object"]
    finally:
        assert dm.stop() == 0, dm.log_text()
    con = sqlite3.connect(os.path.join(dm.store, "registry.db"))
    try:
        con.execute("DROP TRIGGER objects_extent_insert")
        con.execute("INSERT INTO objects (id, device_id, base_off, alloc_len, canonical_len, sha256, "
                    "state) VALUES (777, 1, ?, ?, 1, ?, 'committed')",
                    (obj["offset"] + obj["bytes"] // 2, 65536, "e" * 64))
        con.commit()
    finally:
        con.close()
    dm.start()
    try:
        r = dm.get(PATH)
        assert r.status == 500, r
        err = r.json()["error"]
        assert err["code"] == "TV_E_REGISTRY", err
        assert "object 777" in err["message"] and "device 1" in err["message"], err
        assert f"object {obj['object_id']}" in err["message"], err
        for path in ("/v1/devices/1", "/v1/devices"):
            r = dm.get(path)
            assert r.status == 500, (path, r)
            assert r.json()["error"] == err, (path, r.json())
        job = dm.wait_job(dm.submit_import("n", one_file(dm, "n1", 8))["id"])
        assert job["state"] == "failed", job
        assert job["error"]["code"] == "TV_E_REGISTRY", job
        assert "object 777" in job["error"]["message"], job
        assert dm.get("/v1/models").status == 200  # the rest still answers
    finally:
        assert dm.stop() == 0, dm.log_text()
    con = sqlite3.connect(os.path.join(dm.store, "registry.db"))
    try:  # the refused reservation left no row behind
        assert con.execute("SELECT id FROM objects ORDER BY id").fetchall() == [
            (obj["object_id"],), (777,)]
    finally:
        con.close()
