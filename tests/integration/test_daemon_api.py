"""tensorvaultd end to end over HTTP (docs/openapi.yaml): import ->
list -> tensors (pagination, prefix, order) -> tensor bytes equal the official
loader (Range at unaligned offsets, a-, -n, 416, multi-range, ETag/304) ->
activate -> alias set/move -> rollback -> retire (409 active/aliased) -> gc;
percent-encoded names ('/', '%', space, non-ASCII) for tensors and models;
model delete; devices, version, status, metrics, openapi; the auth matrix
(no token 401, revoked 401, read token 403 on every mutating route);
import-root escapes (.., symlinks, prefixes) 403; malformed, oversized and
wrongly typed bodies 4xx with the daemon still up; a second daemon on the
same store refused naming the holder."""
import hashlib
import json
import os
import re
import struct
import subprocess

import numpy as np
import pytest
from safetensors import safe_open

import harness.checkpoints as gen
from harness.daemon import SLOW, Daemon, make_checkpoint, seg
from harness.store import reference_tensors

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

ERROR_STATUS = {400, 401, 403, 404, 405, 409, 413, 416, 422, 503, 507}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("daemon_api")
    (w / "root").mkdir()
    (w / "outside").mkdir()
    return w


@pytest.fixture(scope="module")
def d(build_dir, work):
    dm = Daemon(build_dir, work, settings={"import.roots": str(work / "root")}).start()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


def ckpt_dir(work, name, seed, n_tensors=30, shards=2, big=0):
    rng = np.random.default_rng(seed)
    tensors = gen.random_tensors(rng, n_tensors, big_tensor_bytes=big)
    out = work / "root" / name
    gen.write_checkpoint(str(out), tensors, shards)
    return str(out)


def shard_files(src):
    idx = os.path.join(src, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return [os.path.join(src, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    return [os.path.join(src, "model.safetensors") if os.path.isdir(src) else src]


def headers_of(src):
    """{tensor: (shard file name, shard index, header_len, [begin, end])}."""
    out = {}
    for i, p in enumerate(shard_files(src)):
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (os.path.basename(p), i, n, v["data_offsets"])
    return out


def walk_tensors(d, model, gen_spec, query="", limit=7):
    names, pages, cursor = [], 0, None
    while True:
        q = f"limit={limit}" + (f"&{query}" if query else "")
        if cursor is not None:
            q += f"&cursor={seg(cursor)}"
        doc = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen_spec}/tensors?{q}")
        assert len(doc["tensors"]) <= limit
        assert doc["model"] == model
        names.extend(doc["tensors"])
        pages += 1
        cursor = doc["next_cursor"]
        if cursor is None:
            return names, pages
        assert isinstance(cursor, str) and cursor


def numpy_reference(src):
    """{name: numpy array} from safe_open(framework="numpy") for every tensor
    numpy has a dtype for (the F8 formats it lacks are compared as bytes)."""
    out = {}
    for p in shard_files(src):
        with safe_open(p, framework="numpy") as f:
            for k in f.keys():
                try:
                    out[k] = f.get_tensor(k)
                except AttributeError:  # numpy has no float8_* dtype
                    pass
    return out


def check_bytes(d, model, gen_spec, src):
    """Every tensor of src, through the data route, equals the official
    loader's bytes (safetensors.deserialize) and, where numpy can hold it,
    safe_open's array (bytes and shape); dtype and shape through the tensor
    route."""
    ref = reference_tensors(src)
    arrays = numpy_reference(src)
    assert len(arrays) >= len(ref) // 2
    hdr = headers_of(src)
    for name, (dtype, shape, data) in ref.items():
        base = f"/v1/models/{seg(model)}/generations/{gen_spec}/tensors/{seg(name)}"
        t = d.ok("GET", base)
        assert (t["name"], t["dtype"], t["shape"], t["nbytes"]) == (name, dtype, shape, len(data))
        shard, idx, hlen, offs = hdr[name]
        assert (t["shard"], t["shard_index"], t["data_offsets"]) == (shard, idx, offs)
        assert t["file_offset"] == 8 + hlen + offs[0]
        assert len(t["replicas"]) == 1 and t["replicas"][0]["device_offset"] >= 0
        r = d.get(base + "/data")
        assert r.status == 200, (name, r)
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.body == data, name
        if name in arrays:
            a = arrays[name]
            got = np.frombuffer(r.body, dtype=a.dtype).reshape(a.shape)
            assert list(a.shape) == t["shape"] and got.tobytes() == a.tobytes(), name
    return ref


# -- the whole flow ------------------------------------------------------------


def test_flow_import_list_tensors_bytes_activate_alias_rollback_retire_gc(d, work):
    src1 = ckpt_dir(work, "flow1", seed=1, big=100_003)
    src2 = ckpt_dir(work, "flow2", seed=2)
    files1 = shard_files(src1)
    dev0 = d.device()

    # import (not activated): a 202 job that succeeds with an ImportResult.
    job = d.submit_import("flow", src1)
    assert job["kind"] == "import" and job["state"] in ("queued", "running", "succeeded")
    assert (job["model"], job["source"], job["activate"], job["alias"]) == ("flow", src1, False, None)
    job = d.wait_job(job["id"])
    assert job["state"] == "succeeded" and job["error"] is None, job
    assert job["generation"] == 1 and job["finished_at"] >= job["started_at"] >= job["created_at"]
    res = job["result"]
    ref1 = reference_tensors(src1)
    assert (res["model"], res["generation"], res["active"], res["aliases"]) == ("flow", 1, False, [])
    assert (res["n_shards"], res["n_tensors"]) == (2, len(ref1))
    assert res["total_bytes"] == sum(os.path.getsize(p) for p in files1)
    assert res["written_bytes"] >= res["total_bytes"] and res["deduplicated_bytes"] == 0

    # list
    models = d.ok("GET", "/v1/models")
    assert models["next_cursor"] is None
    m = [x for x in models["models"] if x["name"] == "flow"]
    assert m == [{"name": "flow", "active_generation": None, "aliases": {}, "n_generations": 1,
                  "created_at": m[0]["created_at"], "description": "", "tags": {}}]
    assert d.ok("GET", "/v1/models/flow") == m[0]
    gens = d.ok("GET", "/v1/models/flow/generations")
    assert gens["model"] == "flow" and gens["next_cursor"] is None
    (g1,) = gens["generations"]
    assert (g1["generation"], g1["state"], g1["active"], g1["aliases"]) == (1, "ready", False, [])
    assert (g1["n_shards"], g1["n_tensors"], g1["source"]) == (2, len(ref1), src1)
    assert g1["total_bytes"] == res["total_bytes"]
    one = d.ok("GET", "/v1/models/flow/generations/1")
    assert {k: v for k, v in one.items() if k != "shards"} == g1
    assert [s["index"] for s in one["shards"]] == [0, 1]
    for s, p in zip(one["shards"], files1):
        with open(p, "rb") as f:
            raw = f.read()
        assert s["name"] == os.path.basename(p)
        assert s["file_bytes"] == len(raw)
        assert s["header_bytes"] == struct.unpack("<Q", raw[:8])[0]
        assert s["sha256"] == hashlib.sha256(raw).hexdigest()
        assert len(s["replicas"]) == 1 and s["replicas"][0]["device_id"] == dev0["id"]
    dev1 = d.device()
    assert dev1["used_bytes"] - dev0["used_bytes"] >= res["total_bytes"]
    assert dev1["n_objects"] == dev0["n_objects"] + 2
    # no active generation yet
    assert d.get("/v1/models/flow/generations/active").status in (404, 409)

    # tensors: pages of 7 in file order walk every tensor once, in order
    tensors, pages = walk_tensors(d, "flow", 1, "order=file")
    assert pages == -(-len(ref1) // 7)
    assert sorted(t["name"] for t in tensors) == sorted(ref1)
    keys = [(t["shard_index"], t["data_offsets"][0]) for t in tensors]
    assert keys == sorted(keys)
    by_name, _ = walk_tensors(d, "flow", 1, "order=name", limit=5)
    assert [t["name"] for t in by_name] == sorted(ref1, key=lambda s: s.encode())
    assert by_name[0] == {k: v for k, v in sorted(tensors, key=lambda t: t["name"].encode())[0].items()}
    # by size: largest first, ties by name (bytes); pages of 2 walk every tensor once
    by_size, pages = walk_tensors(d, "flow", 1, "order=size", limit=2)
    want = sorted(tensors, key=lambda t: (-t["nbytes"], t["name"].encode()))
    assert by_size == want and pages == -(-len(ref1) // 2)
    sizes = [t["nbytes"] for t in by_size]
    assert len(set(sizes)) < len(sizes) and sizes[0] == len(ref1["big.f32"][2])  # ties exist
    pre_s, _ = walk_tensors(d, "flow", 1, "order=size&prefix=" + seg("model.layers.1."), limit=2)
    assert pre_s == [t for t in want if t["name"].startswith("model.layers.1.")] and pre_s
    first = d.ok("GET", "/v1/models/flow/generations/1/tensors?order=size&limit=3")
    assert first["tensors"] == want[:3] and first["next_cursor"].startswith("s")
    nxt = d.ok("GET", "/v1/models/flow/generations/1/tensors?order=size&limit=3&cursor="
               + seg(first["next_cursor"]))
    assert nxt["tensors"] == want[3:6]
    # prefix
    pre, _ = walk_tensors(d, "flow", 1, "prefix=" + seg("model.layers.1."), limit=2)
    assert sorted(t["name"] for t in pre) == sorted(n for n in ref1 if n.startswith("model.layers.1."))
    assert pre
    none = d.ok("GET", "/v1/models/flow/generations/1/tensors?prefix=nothing.here")
    assert none["tensors"] == [] and none["next_cursor"] is None
    # bad pagination arguments
    name_cursor = d.ok("GET", "/v1/models/flow/generations/1/tensors?order=name&limit=1")["next_cursor"]
    bad_size = ["s" + k.encode().hex() for k in ["abc", "01:x", "-1:x", "5:", ":x", "99999999999999999999:x"]]
    for q in ["limit=0", "limit=1001", "limit=x", "cursor=%25%25bad", "order=bogus", "order=SIZE",
              "cursor=m61"] + [f"order=size&cursor={c}" for c in bad_size]:
        r = d.get(f"/v1/models/flow/generations/1/tensors?{q}")
        assert r.status == 400 and r.json()["error"]["code"] == "TV_E_BAD_REQUEST", (q, r)
    # A cursor continues the order it was made for, whatever order says.
    base = "/v1/models/flow/generations/1/tensors?limit=3"
    for cursor, own in ((name_cursor, "name"), (first["next_cursor"], "size")):
        want = d.ok("GET", f"{base}&order={own}&cursor={seg(cursor)}")
        for other in ("", "&order=file", "&order=name", "&order=size"):
            assert d.ok("GET", f"{base}{other}&cursor={seg(cursor)}") == want, (own, other)
    # An empty cursor is the first page.
    assert d.ok("GET", f"{base}&order=size&cursor=") == first

    # bytes, dtype, shape of every tensor equal the official loader's
    check_bytes(d, "flow", 1, src1)

    # Range on the big tensor (unaligned), a-, -n, past the end, multi-range, ETag
    data = ref1["big.f32"][2]
    n = len(data)
    base = "/v1/models/flow/generations/1/tensors/big.f32/data"
    full = d.get(base)
    etag = full.headers["etag"]
    assert full.headers["accept-ranges"] == "bytes"
    sha = one["shards"][headers_of(src1)["big.f32"][1]]["sha256"]
    b, e = headers_of(src1)["big.f32"][3]
    assert etag == f'"{sha}:{b}-{e}"'
    for rng, lo, hi in [("3-17", 3, 17), ("4095-4097", 4095, 4097), ("12345-", 12345, n - 1),
                        ("-7", n - 7, n - 1), ("0-0", 0, 0), (f"{n - 1}-{n + 100}", n - 1, n - 1),
                        (f"-{n + 5}", 0, n - 1), ("1-99999999999", 1, n - 1)]:
        r = d.get(base, headers={"Range": f"bytes={rng}"})
        assert r.status == 206, (rng, r)
        assert r.headers["content-range"] == f"bytes {lo}-{hi}/{n}", rng
        assert r.body == data[lo:hi + 1], rng
        assert r.headers["etag"] == etag
    for rng in [f"{n}-", f"{n}-{n + 10}", "99999999999-"]:
        r = d.get(base, headers={"Range": f"bytes={rng}"})
        assert r.status == 416, (rng, r)
        assert r.headers["content-range"] == f"bytes */{n}", rng
        assert r.json()["error"]["code"] == "TV_E_RANGE"
    r = d.get(base, headers={"Range": "bytes=0-1,4-5"})
    assert r.status == 200 and r.body == data
    r = d.get(base, headers={"If-None-Match": etag})
    assert r.status == 304 and r.body == b"" and r.headers["etag"] == etag
    r = d.get(base, headers={"If-None-Match": '"' + "0" * 64 + ':0-4"'})
    assert r.status == 200 and r.body == data
    # a zero-length tensor: 200 empty; any range of it is unsatisfiable
    empty = [k for k, v in ref1.items() if len(v[2]) == 0][0]
    r = d.get(f"/v1/models/flow/generations/1/tensors/{seg(empty)}/data")
    assert r.status == 200 and r.body == b""
    r = d.get(f"/v1/models/flow/generations/1/tensors/{seg(empty)}/data",
              headers={"Range": "bytes=0-0"})
    assert r.status == 416 and r.headers["content-range"] == "bytes */0"
    assert d.get("/v1/models/flow/generations/1/tensors/no.such.tensor").status == 404
    assert d.get("/v1/models/flow/generations/1/tensors/no.such.tensor/data").status == 404
    assert d.get("/v1/models/flow/generations/9/tensors").status == 404

    # activate
    g = d.ok("POST", "/v1/models/flow/generations/1/activate")
    assert (g["generation"], g["state"], g["active"]) == (1, "ready", True)
    assert d.ok("GET", "/v1/models/flow")["active_generation"] == 1
    check_bytes(d, "flow", "active", src1)

    # a second generation with an alias
    job = d.import_ok("flow", src2, alias="canary")
    assert job["result"]["generation"] == 2 and job["result"]["aliases"] == ["canary"]
    assert job["result"]["active"] is False and job["alias"] == "canary"
    g2 = d.ok("GET", "/v1/models/flow/generations/2")
    assert g2["aliases"] == ["canary"] and g2["active"] is False
    assert d.ok("GET", "/v1/models/flow")["aliases"] == {"canary": 2}
    check_bytes(d, "flow", "canary", src2)
    assert d.ok("GET", "/v1/models/flow/generations/canary")["generation"] == 2

    # alias set and move
    a = d.ok("PUT", "/v1/models/flow/aliases/prod", body={"generation": 1})
    assert a == {"model": "flow", "alias": "prod", "generation": 1}
    check_bytes(d, "flow", "prod", src1)
    a = d.ok("PUT", "/v1/models/flow/aliases/prod", body={"generation": 2})
    assert a == {"model": "flow", "alias": "prod", "generation": 2}
    check_bytes(d, "flow", "prod", src2)
    al = d.ok("GET", "/v1/models/flow/aliases")
    assert al == {"model": "flow", "aliases": [
        {"model": "flow", "alias": "canary", "generation": 2},
        {"model": "flow", "alias": "prod", "generation": 2}]}
    assert d.ok("GET", "/v1/models/flow/generations/2")["aliases"] == ["canary", "prod"]
    r = d.request("PUT", "/v1/models/flow/aliases/" + seg("bad name"), body={"generation": 1})
    assert r.status == 400 and r.json()["error"]["code"] == "TV_E_NAME", r
    r = d.request("PUT", "/v1/models/flow/aliases/x", body={"generation": 7})
    assert r.status == 404, r
    # the alias "active" activates
    a = d.ok("PUT", "/v1/models/flow/aliases/active", body={"generation": 2})
    assert a == {"model": "flow", "alias": "active", "generation": 2}
    assert d.ok("GET", "/v1/models/flow")["active_generation"] == 2
    assert "active" not in d.ok("GET", "/v1/models/flow")["aliases"]
    assert d.request("DELETE", "/v1/models/flow/aliases/active").status == 400

    # rollback: to the highest ready generation below the active one
    g = d.ok("POST", "/v1/models/flow/rollback")
    assert (g["generation"], g["active"]) == (1, True)
    check_bytes(d, "flow", "active", src1)
    r = d.request("POST", "/v1/models/flow/rollback")
    assert r.status == 409, r

    # retire: 409 while active, 409 while aliased (the message names the alias)
    r = d.request("POST", "/v1/models/flow/generations/1/retire")
    assert r.status == 409 and r.json()["error"]["code"] in ("TV_E_STATE", "TV_E_CONFLICT"), r
    r = d.request("POST", "/v1/models/flow/generations/2/retire")
    assert r.status == 409, r
    assert re.search("canary|prod", r.json()["error"]["message"]), r
    assert d.ok("DELETE", "/v1/models/flow/aliases/canary") == {
        "model": "flow", "alias": "canary", "generation": 2}
    assert d.request("DELETE", "/v1/models/flow/aliases/canary").status == 404
    r = d.request("POST", "/v1/models/flow/generations/prod/retire")
    assert r.status == 409 and "prod" in r.json()["error"]["message"], r
    d.ok("DELETE", "/v1/models/flow/aliases/prod")
    assert d.ok("GET", "/v1/models/flow/aliases")["aliases"] == []
    # the model cannot be deleted while a generation is active
    r = d.request("DELETE", "/v1/models/flow")
    assert r.status == 409, r
    d.ok("POST", "/v1/models/flow/generations/2/activate")
    used = d.device()["used_bytes"]
    g = d.ok("POST", "/v1/models/flow/generations/1/retire")
    assert (g["generation"], g["state"], g["active"], g["aliases"]) == (1, "retired", False, [])
    # until gc its objects are intact: served right or not at all
    r = d.get("/v1/models/flow/generations/1/tensors/big.f32/data")
    assert r.status in (404, 409) or (r.status == 200 and r.body == data), r
    r = d.request("POST", "/v1/models/flow/generations/1/activate")
    assert r.status == 409, r

    # gc frees generation 1's two objects
    gc = d.ok("POST", "/v1/gc")
    assert gc["n_objects_freed"] == 2 and gc["freed_bytes"] >= res["total_bytes"]
    dev = d.device()
    assert dev["used_bytes"] == used - gc["freed_bytes"]
    assert d.ok("POST", "/v1/gc") == {"n_objects_freed": 0, "freed_bytes": 0}
    # after gc a retired generation's bytes are gone: never served
    for spec in ["1", "1/tensors", "1/tensors/big.f32", "1/tensors/big.f32/data"]:
        r = d.get(f"/v1/models/flow/generations/{spec}")
        if spec == "1":
            assert r.status == 200 and r.json()["state"] == "retired", r
        elif spec.endswith("data"):
            assert r.status in (404, 409), r
    check_bytes(d, "flow", "active", src2)
    states = [(x["generation"], x["state"], x["active"]) for x in d.generations("flow")]
    assert states == [(1, "retired", False), (2, "ready", True)]

    # verify: a job whose result covers every object, none failed
    r = d.request("POST", "/v1/verify", body={})
    assert r.status == 202 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    v = d.wait_job(r.json()["id"])
    assert v["kind"] == "verify" and v["state"] == "succeeded", v
    vr = v["result"]
    assert vr["n_failed"] == 0 and vr["n_objects"] == dev["n_objects"] == len(vr["objects"])
    assert all(o["status"] == "ok" for o in vr["objects"])
    assert d.request("POST", "/v1/verify", body={"device_id": 999}).status == 404

    # the metrics saw all of it (Prometheus text, base units)
    text = d.get("/metrics").body.decode()

    def metric(pattern):
        m = re.findall(rf"^{pattern} ([0-9.e+]+)$", text, re.M)
        assert m, (pattern, text[:3000])
        return sum(float(x) for x in m)

    assert metric("tensorvault_imported_bytes_total") >= res["written_bytes"]
    data_route = re.escape("GET /v1/models/{name}/generations/{gen}/tensors/{tensor}/data")
    assert metric(rf'tensorvault_read_bytes_total\{{route="{data_route}"\}}') >= sum(
        len(v[2]) for v in ref1.values())
    assert metric(r'tensorvault_import_jobs\{state="succeeded"\}') >= 2
    assert metric(r'tensorvault_generations\{state="retired"\}') >= 1
    for status in ("206", "304", "416", "409"):
        assert metric(rf'tensorvault_http_requests_total\{{.*status="{status}".*\}}') >= 1
    n_reads = metric(r"tensorvault_read_duration_seconds_count")
    assert n_reads >= len(ref1) and metric(r'tensorvault_read_duration_seconds_bucket\{le="\+Inf"\}') == n_reads


def test_generation_pagination(d, work):
    src = ckpt_dir(work, "pages", seed=3, n_tensors=4, shards=1)
    for i in range(3):
        # same bytes: every generation after the first is deduplicated
        j = d.import_ok("pages", src)
        assert j["result"]["generation"] == i + 1
        assert j["result"]["deduplicated_bytes"] == (0 if i == 0 else j["result"]["total_bytes"])
    seen, cursor = [], None
    while True:
        q = "limit=1" + (f"&cursor={seg(cursor)}" if cursor else "")
        doc = d.ok("GET", f"/v1/models/pages/generations?{q}")
        seen += [g["generation"] for g in doc["generations"]]
        cursor = doc["next_cursor"]
        if cursor is None:
            break
    assert seen == [1, 2, 3]
    # models pages: by name
    names, cursor = [], None
    while True:
        q = "limit=1" + (f"&cursor={seg(cursor)}" if cursor else "")
        doc = d.ok("GET", f"/v1/models?{q}")
        names += [m["name"] for m in doc["models"]]
        cursor = doc["next_cursor"]
        if cursor is None:
            break
    assert names == sorted(names, key=lambda s: s.encode()) and "pages" in names
    assert len(names) == len(set(names)) == len(d.ok("GET", "/v1/models?limit=1000")["models"])
    assert d.get("/v1/models?cursor=%25%25bad").status == 400
    # jobs: newest first, filters, pages
    jobs = d.ok("GET", "/v1/jobs?kind=import&limit=1000")["jobs"]
    ids = [j["id"] for j in jobs]
    assert ids == sorted(ids, reverse=True) and all(j["kind"] == "import" for j in jobs)
    assert all(j["state"] == "succeeded" for j in d.ok("GET", "/v1/jobs?state=succeeded")["jobs"])
    first = d.ok("GET", "/v1/jobs?limit=1")
    assert len(first["jobs"]) == 1 and first["next_cursor"] is not None
    second = d.ok("GET", f"/v1/jobs?limit=1&cursor={seg(first['next_cursor'])}")
    assert second["jobs"][0]["id"] < first["jobs"][0]["id"]
    for q in ["state=done", "kind=copy", "limit=0"]:
        assert d.get(f"/v1/jobs?{q}").status == 400, q
    assert d.get("/v1/jobs/999999").status == 404
    assert d.get("/v1/jobs/abc").status in (400, 404)


# -- names ---------------------------------------------------------------------

ODD_NAMES = ["a/b.c", "100%", "with space", "x%2Fy", "ünï/cödé τ", "q?x=1#frag", "plus+and&",
             "dots..", "émoji 🙂/%00"]


def test_percent_encoded_names_round_trip(d, work):
    rng = np.random.default_rng(9)
    tensors = {n: rng.integers(0, 255, size=(i + 3,), dtype=np.uint8) for i, n in enumerate(ODD_NAMES)}
    src = make_checkpoint(work / "root" / "odd" / "model.safetensors", tensors)
    model = "org/team.x/Model-1.0_b"
    job = d.import_ok(model, src, activate=True)
    assert job["result"]["model"] == model and job["result"]["active"] is True
    assert model in [m["name"] for m in d.ok("GET", "/v1/models?limit=1000")["models"]]
    assert d.ok("GET", f"/v1/models/{seg(model)}")["name"] == model
    assert d.ok("GET", f"/v1/models/{seg(model)}/generations/1")["model"] == model
    listed, _ = walk_tensors(d, model, "active", limit=3)
    assert sorted(t["name"] for t in listed) == sorted(ODD_NAMES)
    check_bytes(d, model, "active", src)
    check_bytes(d, model, 1, src)
    # prefix with a '/' and a '%'
    pre = d.ok("GET", f"/v1/models/{seg(model)}/generations/1/tensors?prefix={seg('a/')}")
    assert [t["name"] for t in pre["tensors"]] == ["a/b.c"]
    pre = d.ok("GET", f"/v1/models/{seg(model)}/generations/1/tensors?prefix={seg('x%')}")
    assert [t["name"] for t in pre["tensors"]] == ["x%2Fy"]
    # an unencoded '/' is another path (not the tensor "a/b.c"), and a bad escape is 400
    assert d.get(f"/v1/models/{seg(model)}/generations/1/tensors/a/b.c").status in (404, 405)
    assert d.get(f"/v1/models/{seg(model)}/generations/1/tensors/%zz").status == 400
    assert d.get(f"/v1/models/{seg(model)}/generations/1/tensors/a%00b").status == 400
    # the model's '/' unencoded is not the model
    assert d.get("/v1/models/org/team").status == 404
    # jobs name the model as given
    assert d.job(job["id"])["model"] == model


def test_model_delete(d, work):
    src = ckpt_dir(work, "del", seed=5, n_tensors=5, shards=1)
    model = "del/me"
    d.import_ok(model, src, activate=True)
    d.import_ok(model, ckpt_dir(work, "del2", seed=6, n_tensors=5, shards=1), alias="keep")
    r = d.request("DELETE", f"/v1/models/{seg(model)}")
    assert r.status == 409 and r.json()["error"]["code"] in ("TV_E_STATE", "TV_E_CONFLICT"), r
    d.ok("POST", f"/v1/models/{seg(model)}/generations/keep/activate")
    assert d.request("DELETE", f"/v1/models/{seg(model)}").status == 409  # still active
    # a model with no active and no aliased generation goes, freeing its objects
    model2 = "del/other"
    d.import_ok(model2, ckpt_dir(work, "del3", seed=7, n_tensors=5, shards=1))
    d.import_ok(model2, ckpt_dir(work, "del4", seed=8, n_tensors=5, shards=1), alias="x")
    assert d.request("DELETE", f"/v1/models/{seg(model2)}").status == 409  # aliased
    d.ok("DELETE", f"/v1/models/{seg(model2)}/aliases/x")
    used = d.device()["used_bytes"]
    r = d.ok("DELETE", f"/v1/models/{seg(model2)}")
    assert r["model"] == model2 and r["n_generations_retired"] == 2 and r["freed_bytes"] > 0
    assert d.device()["used_bytes"] == used - r["freed_bytes"]
    assert d.get(f"/v1/models/{seg(model2)}").status == 404
    assert d.get(f"/v1/models/{seg(model2)}/generations").status == 404
    assert model2 not in [m["name"] for m in d.ok("GET", "/v1/models?limit=1000")["models"]]
    assert d.request("DELETE", f"/v1/models/{seg(model2)}").status == 404
    # the other model is untouched
    assert d.ok("GET", f"/v1/models/{seg(model)}")["active_generation"] == 2


# -- one schema: the CLI's --json is the API's document --------------------------


def test_cli_json_is_the_api_document(d, work, build_dir):
    """One schema (docs/openapi.yaml): tensorvault --json prints the API's
    document, remote (--url, against this daemon) and local (--store, the
    read commands beside the daemon) alike."""
    src = ckpt_dir(work, "schema", seed=21, n_tensors=6, shards=2)
    d.import_ok("one/schema", src, activate=True)
    d.ok("PUT", "/v1/models/one%2Fschema/aliases/prod", body={"generation": 1})
    name = sorted(reference_tensors(src))[0]
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    url = f"http://127.0.0.1:{d.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    env["TENSORVAULT_TOKEN"] = d.token
    cases = [
        (["models"], "/v1/models"),
        (["models", "one/schema"], "/v1/models/one%2Fschema"),
        (["generations", "one/schema"], "/v1/models/one%2Fschema/generations"),
        (["generation", "one/schema@1"], "/v1/models/one%2Fschema/generations/1"),
        (["tensors", "one/schema@prod"], "/v1/models/one%2Fschema/generations/prod/tensors"),
        (["tensor", "one/schema", name],
         f"/v1/models/one%2Fschema/generations/active/tensors/{seg(name)}"),
        (["alias", "list", "one/schema"], "/v1/models/one%2Fschema/aliases"),
        (["devices"], "/v1/devices"),
    ]
    for args, path in cases:
        want = d.ok("GET", path)
        for mode in (["--url", url], ["--store", d.store]):
            p = subprocess.run([exe, *args, *mode, "--json"], capture_output=True, text=True,
                               env=env, cwd=str(work))
            assert p.returncode == 0, (args, mode[0], p.stderr)
            assert json.loads(p.stdout) == want, (args, mode[0], p.stdout[:2000])
    # errors too
    p = subprocess.run([exe, "models", "no/such", "--url", url, "--json"], capture_output=True,
                       text=True, env=env, cwd=str(work))
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout) == d.get("/v1/models/no%2Fsuch").json()


def test_version_is_one_answer_per_build(d, build_dir):
    """The CLI and the daemon of one build describe it alike (Version)."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    p = subprocess.run([exe, "version", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == d.ok("GET", "/v1/version")


# -- info routes ---------------------------------------------------------------


def test_info_routes(d):
    assert d.ok("GET", "/healthz", token=None) == {"status": "ok"}
    assert d.ok("GET", "/readyz", token=None) == {"status": "ready"}
    v = d.ok("GET", "/v1/version")
    assert v["name"] == "tensorvault" and v["api"] == "v1"
    assert set(v["features"]) == {"cuda", "nvme", "io_uring"}
    assert all(isinstance(x, bool) for x in v["features"].values())
    s = d.ok("GET", "/v1/status")
    assert s["version"] == v["version"] and s["n_devices"] == 1
    assert os.path.realpath(s["store"]) == os.path.realpath(d.store)
    assert s["anonymous_reads"] is True and s["uptime_seconds"] >= 0
    assert set(s["jobs"]) == {"queued", "running"}
    devs = d.ok("GET", "/v1/devices")["devices"]
    assert len(devs) == 1
    dev = devs[0]
    assert dev["kind"] == "file" and dev["status"] == "ok" and dev["message"] == ""
    assert dev["used_bytes"] + dev["free_bytes"] <= dev["region_bytes"]
    assert 0 < dev["largest_free_bytes"] <= dev["free_bytes"]
    assert d.ok("GET", f"/v1/devices/{dev['id']}") == d.device()
    assert d.get("/v1/devices/999").status == 404
    r = d.get("/v1/openapi.yaml", token=None)
    assert r.status == 200 and r.headers["content-type"].startswith("application/yaml")
    with open(os.path.join(ROOT, "docs", "openapi.yaml"), "rb") as f:
        assert r.body == f.read()
    r = d.get("/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.body.decode()
    for name in ["tensorvault_http_requests_total", "tensorvault_build_info",
                 "tensorvault_imported_bytes_total", "tensorvault_device_capacity_bytes",
                 "tensorvault_generations", "tensorvault_import_jobs"]:
        assert re.search(rf"^{name}[{{ ]", text, re.M), name
    assert re.search(r'^tensorvault_http_requests_total\{.*status="200".*\} [1-9]', text, re.M)
    # unknown paths 404, wrong methods 405 with Allow
    r = d.get("/v1/nothing")
    assert r.status == 404 and r.json()["error"]["code"] in ("TV_E_NOT_FOUND", "TV_E_BAD_REQUEST")
    r = d.request("DELETE", "/v1/devices")
    assert r.status == 405 and "GET" in r.headers["allow"], r
    assert r.json()["error"]["code"] == "TV_E_BAD_REQUEST"
    r = d.request("PUT", "/v1/models/x/rollback", body={})
    assert r.status == 405 and "POST" in r.headers["allow"], r


def test_error_bodies_are_always_json(d):
    """An error whose message quotes a long non-ASCII name (cut to fit the
    message buffer, possibly inside a UTF-8 sequence) is still a JSON error
    document (schemathesis found empty 404 bodies here)."""
    for n in range(240, 300, 3):
        for name in ["a" + "\u00ca" * n, "\U0005b6ba\u00f9" + "\u00f3" * n]:
            for path in [f"/v1/models/{seg(name)}", f"/v1/models/{seg(name)}/generations",
                         f"/v1/models/m/generations/1/tensors/{seg(name)}"]:
                r = d.get(path)
                assert r.status in (400, 404), (n, path[:40], r)
                assert r.headers["content-type"].startswith("application/json"), (n, r)
                err = r.json()["error"]
                assert err["code"] in ("TV_E_NOT_FOUND", "TV_E_CKPT_NOT_FOUND", "TV_E_NAME",
                                       "TV_E_BAD_REQUEST"), (n, err)
                assert err["message"], (n, err)


# -- auth ----------------------------------------------------------------------

MUTATING = [
    ("DELETE", "/v1/models/m", None),
    ("POST", "/v1/models/m/generations/1/activate", None),
    ("POST", "/v1/models/m/generations/1/retire", None),
    ("POST", "/v1/models/m/rollback", None),
    ("POST", "/v1/models/m/deactivate", None),
    ("PUT", "/v1/models/m/aliases/x", {"generation": 1}),
    ("DELETE", "/v1/models/m/aliases/x", None),
    ("POST", "/v1/imports", {"model": "m2", "source": "SRC"}),
    ("POST", "/v1/verify", {}),
    ("POST", "/v1/gc", None),
    ("POST", "/v1/jobs/JOB/cancel", None),
    ("GET", "/v1/tokens", None),
    ("POST", "/v1/tokens", {"name": "t", "scope": "admin"}),
    ("DELETE", "/v1/tokens/1", None),
]


def test_auth_matrix(d, work):
    src = ckpt_dir(work, "auth", seed=11, n_tensors=4, shards=1)
    job = d.import_ok("m", src, activate=True)
    d.ok("PUT", "/v1/models/m/aliases/x", body={"generation": 1})
    read = d.ok("POST", "/v1/tokens", status=201, body={"name": "reader", "scope": "read"})
    assert read["scope"] == "read" and read["revoked_at"] is None
    assert re.fullmatch(r"tvk_[0-9a-f]{64}", read["token"])
    adm = d.ok("POST", "/v1/tokens", status=201, body={"name": "gone", "scope": "admin"})
    rev = d.ok("DELETE", f"/v1/tokens/{adm['id']}")
    assert rev["id"] == adm["id"] and rev["revoked_at"] is not None and "token" not in rev
    assert d.ok("DELETE", f"/v1/tokens/{adm['id']}")["revoked_at"] == rev["revoked_at"]
    listed = d.ok("GET", "/v1/tokens")["tokens"]
    assert {t["name"] for t in listed} >= {"reader", "gone"}
    assert all("token" not in t and "secret" not in json.dumps(t) for t in listed)
    assert read["token"] not in json.dumps(listed)
    assert d.request("DELETE", "/v1/tokens/999999").status == 404
    for body in [{"name": "t"}, {"scope": "read"}, {"name": "t", "scope": "write"},
                 {"name": "t", "scope": "read", "token": "tvk_" + "1" * 64}]:
        r = d.request("POST", "/v1/tokens", body=body)
        assert r.status == 400 and r.json()["error"]["code"] == "TV_E_BAD_REQUEST", (body, r)
    bogus = "tvk_" + "0" * 64
    before = d.ok("GET", "/v1/models/m")
    for method, path, body in MUTATING:
        path = path.replace("JOB", str(job["id"]))
        if body and body.get("source") == "SRC":
            body = dict(body, source=src)
        for token, want in [(None, 401), (adm["token"], 401), (bogus, 401),
                            ("not-a-token", 401), (read["token"], 403)]:
            r = d.request(method, path, body=body, token=token)
            assert r.status == want, (method, path, token and token[:8], r)
            assert r.json()["error"]["code"] == ("TV_E_UNAUTHORIZED" if want == 401
                                                 else "TV_E_FORBIDDEN")
            if want == 401:
                assert r.headers.get("www-authenticate", "").startswith("Bearer"), r.headers
    # nothing changed
    assert d.ok("GET", "/v1/models/m") == before
    assert [t["revoked_at"] for t in d.ok("GET", "/v1/tokens")["tokens"] if t["id"] == 1] == [None]
    assert "m2" not in [m["name"] for m in d.ok("GET", "/v1/models?limit=1000")["models"]]
    # reads: anonymous on loopback (the default), a read token, not a revoked or bogus one
    assert d.get("/v1/models/m", token=None).status == 200
    assert d.get("/v1/models/m", token=read["token"]).status == 200
    assert d.get("/v1/models/m/generations/1/tensors", token=read["token"]).status == 200
    assert d.get("/v1/models/m", token=adm["token"]).status == 401
    assert d.get("/v1/models/m", token=bogus).status == 401
    # the admin token still works
    assert d.ok("DELETE", "/v1/models/m/aliases/x")["alias"] == "x"


def test_anonymous_reads_never(build_dir, tmp_path):
    dm = Daemon(build_dir, tmp_path, settings={"http.anonymous_reads": "never"}).start()
    try:
        for path in ["/v1/models", "/v1/devices", "/v1/status", "/v1/jobs", "/metrics"]:
            r = dm.get(path, token=None)
            assert r.status == 401 and r.headers["www-authenticate"].startswith("Bearer"), (path, r)
        assert dm.get("/healthz", token=None).status == 200
        assert dm.get("/v1/openapi.yaml", token=None).status == 200
        read = dm.ok("POST", "/v1/tokens", status=201, body={"name": "r", "scope": "read"})
        assert dm.get("/v1/models", token=read["token"]).status == 200
        assert dm.ok("GET", "/v1/status", token=read["token"])["anonymous_reads"] is False
        assert dm.get("/v1/tokens", token=read["token"]).status == 403
    finally:
        assert dm.stop() == 0, dm.log_text()


def test_admin_token_file(d):
    path = os.path.join(d.store, "admin.token")
    assert os.stat(path).st_mode & 0o777 == 0o600
    with open(path) as f:
        text = f.read()
    assert re.fullmatch(r"tvk_[0-9a-f]{64}\n", text)


# -- import roots --------------------------------------------------------------


def test_import_roots_refuse_escapes(d, work):
    root = work / "root"
    outside = work / "outside"
    rng = np.random.default_rng(12)
    t = {"w": rng.integers(0, 255, size=(16,), dtype=np.uint8)}
    out_file = make_checkpoint(outside / "model.safetensors", t)
    evil = work / "rootevil"
    evil.mkdir(exist_ok=True)
    evil_file = make_checkpoint(evil / "model.safetensors", t)
    (root / "link_file.safetensors").symlink_to(out_file)
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "sub").mkdir()
    (root / "sub" / "up").symlink_to("../../outside", target_is_directory=True)
    n_jobs = len(d.ok("GET", "/v1/jobs?limit=1000")["jobs"])
    for src in [out_file, str(outside), f"{root}/../outside/model.safetensors",
                f"{root}/../outside", str(root / "link_file.safetensors"), str(root / "link_dir"),
                str(root / "link_dir" / "model.safetensors"), str(root / "sub" / "up"),
                evil_file, str(evil), "/etc/passwd", "/", f"{root}/.."]:
        r = d.request("POST", "/v1/imports", body={"model": "esc", "source": src})
        assert r.status == 403, (src, r)
        assert r.json()["error"]["code"] == "TV_E_OUTSIDE_ROOTS", (src, r)
    # missing sources inside the root are 404; bad names 400
    r = d.request("POST", "/v1/imports", body={"model": "esc", "source": str(root / "missing")})
    assert r.status == 404, r
    inside = make_checkpoint(root / "ok" / "model.safetensors", t)
    for bad in ["", "bad name", "a@b", "../up", "a//b", "é", "x" * 129]:
        r = d.request("POST", "/v1/imports", body={"model": bad, "source": str(root / "ok")})
        assert r.status == 400 and r.json()["error"]["code"] == "TV_E_NAME", (bad, r)
    assert len(d.ok("GET", "/v1/jobs?limit=1000")["jobs"]) == n_jobs
    assert d.get("/v1/models/esc").status == 404
    # a path inside the root that goes through '..' but stays inside is fine
    j = d.import_ok("esc", f"{root}/sub/../ok/model.safetensors")
    assert j["result"]["n_tensors"] == 1
    assert os.path.exists(inside)


def test_invalid_checkpoints_fail_their_job_with_the_parser_code(d, work):
    """What can only be seen by reading the checkpoint is reported by the job:
    state failed, error {code, message, errno} of the parser, nothing
    published, nothing left reserved."""
    expect = gen.malformed(str(work / "root" / "malformed"))
    used = d.device()["used_bytes"]
    picked = [n for n in sorted(expect) if expect[n].startswith(("TV_E_ST_", "TV_E_IDX_"))][::3]
    assert len(picked) >= 5
    for name in picked:
        src = str(work / "root" / "malformed" / name)
        r = d.request("POST", "/v1/imports", body={"model": "bad", "source": src, "activate": True})
        if r.status != 202:  # refused before queuing: the same code, as 422
            assert r.status == 422 and r.json()["error"]["code"] == expect[name], (name, r)
            continue
        j = d.wait_job(r.json()["id"])
        assert j["state"] == "failed" and j["result"] is None, (name, j)
        assert j["error"]["code"] == expect[name], (name, j["error"])
        assert j["error"]["errno"] < 0 and j["error"]["message"], (name, j["error"])
        assert j["finished_at"] is not None
    assert [g for g in d.generations("bad") if g["state"] in ("ready", "importing")] == []
    assert d.get("/v1/models/bad/generations/active").status in (404, 409)
    assert d.device()["used_bytes"] == used
    failed = d.ok("GET", "/v1/jobs?state=failed&limit=1000")["jobs"]
    assert len([j for j in failed if j["model"] == "bad"]) >= 1


# -- hostile bodies ------------------------------------------------------------


def test_malformed_bodies_are_4xx_never_a_crash(d, work):
    src = ckpt_dir(work, "bodies", seed=13, n_tensors=3, shards=1)
    d.import_ok("bodies", src)
    cases = [
        ("POST", "/v1/imports", b"{", None, 400),
        ("POST", "/v1/imports", b"", None, 400),
        ("POST", "/v1/imports", b"[1,2]", None, 400),
        ("POST", "/v1/imports", b"null", None, 400),
        ("POST", "/v1/imports", b'"str"', None, 400),
        ("POST", "/v1/imports", b'{"model":"a","source":"' + src.encode() + b'"} trailing', None, 400),
        ("POST", "/v1/imports", b'{"model":"a","source":"\xff\xfe"}', None, 400),
        ("POST", "/v1/imports", b'{"model":"a\\u0000b","source":"x"}', None, 400),
        ("POST", "/v1/imports", json.dumps({"model": 1, "source": src}).encode(), "model", 400),
        ("POST", "/v1/imports", json.dumps({"model": "a", "source": ["x"]}).encode(), "source", 400),
        ("POST", "/v1/imports", json.dumps({"model": "a", "source": src, "activate": "yes"}).encode(),
         "activate", 400),
        ("POST", "/v1/imports", json.dumps({"model": "a", "source": src, "strict": 1}).encode(),
         "strict", 400),
        ("POST", "/v1/imports", json.dumps({"model": "a", "source": src, "alias": 5}).encode(),
         "alias", 400),
        ("POST", "/v1/imports", json.dumps({"model": "a", "source": src, "extra": 1}).encode(),
         "extra", 400),
        ("POST", "/v1/imports", json.dumps({"source": src}).encode(), "model", 400),
        ("POST", "/v1/imports", b"[" * 30000 + b"]" * 30000, None, 400),
        ("POST", "/v1/imports", b'{"model":"a","source":"' + b"x" * (70 << 10) + b'"}', None, 413),
        ("POST", "/v1/imports", b" " * (65 << 10) + b"{}", None, 413),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":"1"}', "generation", 400),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":1.5}', "generation", 400),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":-1}', None, (400, 404)),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":1e400}', None, 400),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":99999999999999999999999}', None, 400),
        ("PUT", "/v1/models/bodies/aliases/p", b'{"generation":true}', "generation", 400),
        ("PUT", "/v1/models/bodies/aliases/p", b"{}", "generation", 400),
        ("POST", "/v1/verify", b'{"device_id":"1"}', "device_id", 400),
        ("POST", "/v1/tokens", b'{"name":"t","scope":"root"}', "scope", 400),
        ("POST", "/v1/tokens", b'{"name":["t"],"scope":"read"}', "name", 400),
    ]
    for method, path, raw, field, want in cases:
        r = d.request(method, path, raw=raw, headers={"Content-Type": "application/json"})
        assert r.status in (want if isinstance(want, tuple) else (want,)), (path, raw[:60], r)
        err = r.json()["error"]
        assert set(err) == {"code", "message", "errno"}
        codes = {413: {"TV_E_TOO_LARGE"}, 404: {"TV_E_NOT_FOUND"},
                 400: {"TV_E_BAD_REQUEST", "TV_E_INVALID_ARG", "TV_E_NAME"}}[r.status]
        assert err["code"] in codes, (raw[:60], err)
        if field is None and r.status == 400 and b"u0000" not in raw and b"-1" not in raw:
            assert err["code"] == "TV_E_BAD_REQUEST", (raw[:60], err)
        if field:
            assert field in err["message"], (raw[:60], err)
        assert d.get("/healthz", token=None).status == 200, (raw[:60], d.log_text()[-2000:])
    # a wrong Content-Type
    r = d.request("POST", "/v1/imports", raw=json.dumps({"model": "a", "source": src}).encode(),
                  headers={"Content-Type": "text/plain"})
    assert r.status in (400, 415), r
    # a Content-Length far over the limit is refused before the body is read
    r = d.request("POST", "/v1/imports", raw=b"{}", headers={"Content-Length": str(1 << 30)})
    assert r.status == 413, r
    assert d.alive() and d.get("/healthz", token=None).status == 200
    assert d.get("/v1/models/a").status == 404 and d.get("/v1/models/bodies/aliases").json()[
        "aliases"] == []


def test_second_daemon_on_the_same_store_is_refused(d, build_dir, work):
    other = Daemon(build_dir, work, store=d.store, name="second",
                   settings={"import.roots": str(work / "root")})
    p = other.spawn()
    rc = p.wait(30 * SLOW)
    log = other.log_text()
    assert rc == 1, log
    assert "TV_E_LOCKED" in log or "locked" in log, log
    assert str(d.proc.pid) in log, log
    assert d.get("/healthz", token=None).status == 200


def test_second_daemon_on_the_same_port_is_refused(d, build_dir, tmp_path):
    """A port is one daemon's: a second one (another store) must fail to
    listen, not share the port and answer half of its requests
    (SO_REUSEPORT)."""
    other = Daemon(build_dir, tmp_path, name="sameport")
    p = other.spawn(port=d.port)
    try:
        rc = p.wait(5 * SLOW)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        seen = {d.get("/v1/status", token=None).json()["store"] for _ in range(20)}
        if other.alive():
            other.stop()
    assert seen == {d.ok("GET", "/v1/status")["store"]}, seen
    assert rc == 1 and "in use" in other.log_text(), (rc, other.log_text()[-500:])
