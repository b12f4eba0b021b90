"""Fleet rollout (docs/fleet.md "Rollout"): three
daemons on loopback ports sharing one catalog. An import on one node, one
alias move in the catalog (PUT /v1/fleet/aliases/...), and every placed
node pulls the blobs (from a peer that holds them, else the object store),
imports them under the same generation number, reports ready, and switches
its local alias only when the placement is ready (or a quorum after the
timeout). Two operators moving the same alias: one 200, one 409."""
import json
import os
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from harness.daemon import Daemon, make_checkpoint, seg
from harness.fleet import check_published, sample_tensors
from harness.postgres import fresh_db
from harness.wait import wait_for

FLEET_TOKEN = "fleet-shared-secret-0123456789"


def node(build_dir, tmp_path, dsn, name, **extra):
    wd = tmp_path / name
    wd.mkdir(exist_ok=True)
    # a node is down (and its name free for a daemon at another URL, as n3
    # started again on another port) 5 s after its last heartbeat, not 30
    settings = {"store.image_size": "256M", "fleet.postgres": dsn, "fleet.node": name,
                "fleet.token": FLEET_TOKEN, "import.roots": str(tmp_path),
                "fleet.node_down_s": "5"}
    settings.update(extra)
    d = Daemon(build_dir, wd, name=name, settings=settings)
    d.node = name
    return d


@pytest.fixture
def three(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvroll_")
    nodes = [node(build_dir, tmp_path, dsn, f"n{i}") for i in (1, 2, 3)]
    for n in nodes:
        n.start()
    wait_for(lambda: all(len(fleet(n)["nodes"]) == 3 for n in nodes), what="three nodes listed")
    yield nodes
    for n in nodes:
        n.stop()


def fleet(d):
    return d.ok("GET", "/v1/fleet")


def move(d, model, alias, generation, expect, **kw):
    body = {"generation": generation, "expect_version": expect, **kw}
    return d.request("PUT", f"/v1/fleet/aliases/{seg(model)}/{alias}", body=body)


def local_alias(d, model, alias):
    r = d.request("GET", f"/v1/models/{seg(model)}/aliases")
    if r.status != 200:
        return None
    for a in r.json()["aliases"]:
        if a["alias"] == alias:
            return a["generation"]
    return None


def publish(d, model, src, seen_by=None):
    """Imports src as model on d and waits until the catalog (as seen_by,
    default d, reads it) lists that generation; returns its number."""
    gen = d.import_ok(model, str(src))["generation"]
    wait_for(lambda: any(g["model"] == model and g["number"] == gen
                         for g in fleet(seen_by or d)["generations"]),
             what=f"{model} generation {gen} published")
    return gen


def sharded(tmp_path, name, seed):
    """A two-shard checkpoint with an index; returns (dir, tensors)."""
    t = sample_tensors(seed)
    names = sorted(t)
    d = tmp_path / name
    a = {k: t[k] for k in names[:2]}
    b = {k: t[k] for k in names[2:]}
    make_checkpoint(d / "model-00001-of-00002.safetensors", a)
    make_checkpoint(d / "model-00002-of-00002.safetensors", b)
    wm = {k: "model-00001-of-00002.safetensors" for k in a}
    wm.update({k: "model-00002-of-00002.safetensors" for k in b})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d, t


def alias_state(d, model, alias):
    for a in fleet(d)["aliases"]:
        if a["model"] == model and a["alias"] == alias:
            return a
    return None


def node_states(d, model, alias):
    a = alias_state(d, model, alias)
    return {x["node"]: x["state"] for x in a["nodes"]} if a else {}


def test_rollout_to_every_node_from_a_peer(three, tmp_path):
    n1, n2, n3 = three
    src, want = sharded(tmp_path, "ckpt", 7)
    job = n1.import_ok("roll", str(src))
    gen = job["generation"]
    wait_for(lambda: any(g["model"] == "roll" and g["holders"] == ["n1"]
                         for g in fleet(n1)["generations"]), what="n1 holds it in the catalog")
    r = move(n1, "roll", "prod", gen, 0)
    assert r.status == 200, r
    assert r.json()["version"] == 1
    for n in three:
        wait_for(lambda n=n: local_alias(n, "roll", "prod") == gen, timeout=60,
                 what=f"{n.node} switched")
    for n in three:
        check_published(n, "roll", "prod", want)
        # the official loader's view of each shard equals the node's tensors
        for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
            for k, arr in load_file(str(src / shard)).items():
                got = n.ok("GET", f"/v1/models/roll/generations/prod/tensors/{seg(k)}")
                assert got["dtype"] == {"float32": "F32", "uint8": "U8"}[arr.dtype.name]
                assert got["shape"] == list(arr.shape)
    st = alias_state(n2, "roll", "prod")
    assert st["version"] == 1 and st["placement"] is None
    wait_for(lambda: all(x["state"] == "ready" and x["serving"] == gen
                         for x in (alias_state(n2, "roll", "prod") or {"nodes": [None]})["nodes"]
                         if x),
             what="every node reports ready and serving")
    # pulled as the same generation number; the job's source names the
    # catalog's model@number, the generation's also the peers it came from
    # (never n1's local path)
    for n in (n2, n3):
        gens = n.generations("roll")
        assert [g["generation"] for g in gens] == [gen]
        assert gens[0]["source"].startswith(f"fleet:roll@{gen} from n"), gens[0]
        assert set(gens[0]["source"].split(" from ")[1].split(", ")) <= {"n1", "n2", "n3"}
        jobs = n.ok("GET", "/v1/jobs")["jobs"]
        assert any(j["model"] == "roll" and j["state"] == "succeeded"
                   and j["source"] == f"fleet:roll@{gen}" for j in jobs), jobs
    # the pulls were served by peers (no object store is configured here)
    for n in (n2, n3):
        assert "(2 shards, 2 from peers)" in n.log_text(), n.log_text()


def test_two_operators_one_winner(three, tmp_path):
    n1, n2, _ = three
    src, _ = sharded(tmp_path, "ck2", 8)
    gen = publish(n1, "race", src, seen_by=n2)
    results = []

    def go(d):
        results.append(move(d, "race", "prod", gen, 0).status)

    ts = [threading.Thread(target=go, args=(d,)) for d in (n1, n2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(results) == [200, 409], results
    stale = move(n2, "race", "prod", gen, 0)
    assert stale.status == 409
    assert "version 1" in stale.json()["error"]["message"]
    ok = move(n2, "race", "prod", gen, 1)
    assert ok.status == 200 and ok.json()["version"] == 2


def test_alias_move_refusals(three, build_dir, tmp_path):
    n1 = three[0]
    r = move(n1, "nope", "prod", 1, 0)
    assert r.status == 404, r
    assert "no generation 1" in r.json()["error"]["message"]
    r = n1.request("PUT", "/v1/fleet/aliases/m/prod", body={"generation": 1})
    assert r.status == 400 and "expect_version" in r.json()["error"]["message"]
    r = n1.request("PUT", "/v1/fleet/aliases/m/prod", token=None,
                   body={"generation": 1, "expect_version": 0})
    assert r.status == 401
    r = n1.request("PUT", "/v1/fleet/aliases/m/bad%20alias",
                   body={"generation": 1, "expect_version": 0})
    assert r.status == 400
    # the shared fleet token reads blobs only
    r = n1.request("GET", "/v1/fleet", token=FLEET_TOKEN)
    assert r.status == 403
    assert n1.request("GET", "/v1/blobs", token=FLEET_TOKEN).status == 200
    # a standalone node
    wd = tmp_path / "alone"
    wd.mkdir()
    d = Daemon(build_dir, wd, name="alone", settings={"store.image_size": "64M"})
    d.start()
    try:
        assert d.ok("GET", "/v1/fleet")["mode"] == "standalone"
        r = move(d, "m", "prod", 1, 0)
        assert r.status == 409 and "standalone" in r.json()["error"]["message"]
    finally:
        d.stop()


def test_two_phase_waits_for_every_placed_node(three, tmp_path):
    n1, n2, n3 = three
    src, want = sharded(tmp_path, "ck3", 9)
    gen = publish(n1, "late", src)
    assert n3.stop() == 0
    assert move(n1, "late", "prod", gen, 0).status == 200
    # n2 pulls and is ready, but n3 is placed (every node) and down: nobody switches
    wait_for(lambda: node_states(n1, "late", "prod").get("n2") == "ready", timeout=60,
             what="n2 ready")
    time.sleep(2)
    assert local_alias(n1, "late", "prod") is None
    assert local_alias(n2, "late", "prod") is None
    # n3 comes back, catches up, and all three switch
    n3.start()
    for n in three:
        wait_for(lambda n=n: local_alias(n, "late", "prod") == gen, timeout=60,
                 what=f"{n.node} switched")
    check_published(n3, "late", "prod", want)


def test_quorum_after_timeout(three, tmp_path):
    n1, n2, n3 = three
    src, _ = sharded(tmp_path, "ck4", 10)
    gen = publish(n1, "quo", src)
    r = move(n1, "quo", "canary", gen, 0, placement=["n1", "n2", "ghost"], quorum=2,
             timeout_s=3)
    assert r.status == 200, r
    t0 = time.monotonic()
    for n in (n1, n2):
        wait_for(lambda n=n: local_alias(n, "quo", "canary") == gen, timeout=60,
                 what=f"{n.node} switched on the quorum")
    assert time.monotonic() - t0 >= 2.5
    # n3 is not placed: it neither pulls nor switches
    assert local_alias(n3, "quo", "canary") is None
    assert n3.generations("quo") == [] if n3.request(
        "GET", "/v1/models/quo/generations").status == 200 else True
    st = {x["node"]: x for x in alias_state(n1, "quo", "canary")["nodes"]}
    assert sorted(st) == ["ghost", "n1", "n2"]
    assert st["ghost"]["state"] == "missing" and st["ghost"]["up"] is False


def test_object_store_copy_and_a_bad_peer_dropped(build_dir, postgres, s3, tmp_path):
    """n1 imports from a local path: its shards are copied to the object
    store (multipart reads of its own blob route) and recorded in `blobs`.
    Then one of n1's objects is corrupted on its device: n2's pull gets bad
    bytes from that peer, the hash says so, the peer is dropped, and the
    next attempt takes the object store's copy. n2's bytes are exact."""
    import uuid
    db, dsn = fresh_db(postgres, "tvroll_")
    bucket = "tvfleet" + uuid.uuid4().hex[:8]
    s3.bucket(bucket)
    conf = {"fleet.object_store": f"s3://{bucket}/fleet/", "s3.endpoint": s3.endpoint,
            "s3.region": s3.region, "s3.access_key_id": s3.access_key,
            "s3.secret_access_key": s3.secret_key, "import.http_timeout": "10",
            "import.http_retries": "1"}
    n1 = node(build_dir, tmp_path, dsn, "n1", **conf)
    n2 = node(build_dir, tmp_path, dsn, "n2", **conf)
    for n in (n1, n2):
        n.start()
    try:
        src, want = sharded(tmp_path, "ck5", 11)
        gen = n1.import_ok("bad", str(src))["generation"]

        def blobs():
            out = postgres.psql(f"SELECT sha256, bytes, url, uploaded_by FROM blobs ORDER BY url",
                                as_app=True, dbname=db).strip()
            return [r.split("|") for r in out.splitlines()] if out else []

        wait_for(lambda: len(blobs()) == 2, timeout=60, what="two blobs in the object store")
        shards = n1.ok("GET", f"/v1/models/bad/generations/{gen}")["shards"]
        by_sha = {s["sha256"]: s for s in shards}
        for sha, nbytes, url, by in blobs():
            assert by == "n1" and url == f"s3://{bucket}/fleet/sha256/{sha}"
            assert int(nbytes) == by_sha[sha]["file_bytes"]
            body = s3.get(bucket, f"fleet/sha256/{sha}")
            assert body == (src / by_sha[sha]["name"]).read_bytes()
        # corrupt n1's copy of the first shard (bytes inside its tensor data)
        victim = shards[0]
        ex = n1.ok("GET", "/v1/devices/1/extents")["extents"]
        off = next(e["offset"] for e in ex
                   if e["kind"] == "object" and e["sha256"] == victim["sha256"])
        with open(os.path.join(n1.store, "store.img"), "r+b") as f:
            f.seek(off + victim["file_bytes"] - 64)
            f.write(b"\xa5" * 64)
            f.flush()
            os.fsync(f.fileno())
        r = move(n1, "bad", "prod", gen, 0, placement=["n2"])
        assert r.status == 200, r
        wait_for(lambda: local_alias(n2, "bad", "prod") == gen, timeout=90, what="n2 switched")
        check_published(n2, "bad", "prod", want)
        log = n2.log_text()
        assert "TV_E_HASH_MISMATCH" in log and "dropping http://" in log, log
        # n1 is not placed: it keeps its own alias-less state
        assert local_alias(n1, "bad", "prod") is None
    finally:
        n1.stop()
        n2.stop()


def test_pull_binds_shards_stored_already(three, tmp_path):
    """Generation 2 shares its first shard with generation 1 (a fine-tune
    that changed one shard): a node holding generation 1 binds that shard
    by the catalog's SHA-256 and fetches only the other."""
    n1, n2, _ = three
    src, want1 = sharded(tmp_path, "ft1", 12)
    g1 = publish(n1, "ft", src)
    assert move(n1, "ft", "prod", g1, 0, placement=["n1", "n2"]).status == 200
    wait_for(lambda: local_alias(n2, "ft", "prod") == g1, timeout=60, what="n2 on generation 1")
    # generation 2: shard 2 changes, shard 1 stays byte for byte
    shard1 = src / "model-00001-of-00002.safetensors"
    t2 = {k: v + 1 for k, v in load_file(str(src / "model-00002-of-00002.safetensors")).items()}
    from safetensors.numpy import save_file
    save_file(t2, str(src / "model-00002-of-00002.safetensors"))
    g2 = publish(n1, "ft", src)
    assert move(n1, "ft", "prod", g2, 1, placement=["n1", "n2"]).status == 200
    wait_for(lambda: local_alias(n2, "ft", "prod") == g2, timeout=60, what="n2 on generation 2")
    want2 = dict(load_file(str(shard1)))
    want2.update(t2)
    check_published(n2, "ft", g2, want2)
    res = [j for j in n2.ok("GET", "/v1/jobs")["jobs"]
           if j["model"] == "ft" and j["state"] == "succeeded"]
    newest = max(res, key=lambda j: j["id"])["result"]
    assert newest["generation"] == g2
    assert newest["deduplicated_bytes"] == shard1.stat().st_size, newest
    assert newest["written_bytes"] < newest["total_bytes"], newest
    assert "is stored here already: bound, not fetched" in n2.log_text()


def test_origin_read_about_once_for_three_nodes(build_dir, postgres, origin, tmp_path):
    """n1 imports from an HTTP origin and the alias moves to all three: n2
    and n3 pull from n1, so the origin sends about one copy of the model
    (the issue's target: <= 1.2 x model bytes), not three."""
    import shutil
    db, dsn = fresh_db(postgres, "tvroll_")
    extra = {"import.origins": origin.url + "/models/"}
    nodes = [node(build_dir, tmp_path, dsn, f"n{i}", **extra) for i in (1, 2, 3)]
    for n in nodes:
        n.start()
    try:
        wait_for(lambda: all(len(fleet(n)["nodes"]) == 3 for n in nodes), what="three nodes")
        src, want = sharded(tmp_path, "ck6", 13)
        shutil.copytree(src, os.path.join(origin.root, "models", "ck6"))
        model_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        origin.reset_counters()
        url = origin.url_of("models/ck6/model.safetensors.index.json")
        gen = publish(nodes[0], "once", url)
        assert move(nodes[0], "once", "prod", gen, 0).status == 200
        for n in nodes:
            wait_for(lambda n=n: local_alias(n, "once", "prod") == gen, timeout=60,
                     what=f"{n.node} switched")
            check_published(n, "once", "prod", want)
        served = origin.bytes_served()
        assert model_bytes <= served <= 1.2 * model_bytes, (served, model_bytes)
        for n in nodes[1:]:
            assert "(2 shards, 2 from peers)" in n.log_text()
    finally:
        for n in nodes:
            n.stop()


def test_two_daemons_under_one_node_name(build_dir, postgres, tmp_path):
    """A second daemon (another URL) under a fleet.node the first one uses
    does not take the name over: its heartbeat is refused with a message
    naming the first one, it does not act in the fleet, and the first
    keeps its row."""
    db, dsn = fresh_db(postgres, "tvroll_")
    a = node(build_dir, tmp_path, dsn, "same")
    (tmp_path / "same2").mkdir()
    b = Daemon(build_dir, tmp_path / "same2", name="same2",
               settings={"store.image_size": "64M", "fleet.postgres": dsn,
                         "fleet.node": "same", "fleet.token": FLEET_TOKEN})
    a.start()
    try:
        wait_for(lambda: fleet(a)["catalog"]["connected"], what="the first connected")
        b.start()
        try:
            wait_for(lambda: "is in use by" in (fleet(b)["catalog"].get("error") or ""),
                     timeout=30, what="the second refused")
            st, a_url = fleet(b)["catalog"], fleet(a)["url"]
            assert st["connected"] is False and a_url in st["error"], st
            assert "give every node its own fleet.node" in b.log_text()
            rows = postgres.psql("SELECT name, url FROM nodes", as_app=True, dbname=db).split()
            assert rows == [f"same|{a_url}"], rows
            assert fleet(a)["catalog"]["connected"] is True
        finally:
            b.stop()
    finally:
        a.stop()


def files_of(d, model, gen):
    """{path: {path, size, sha256}} of a generation's sidecar files on d."""
    doc = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/files")
    return {f["path"]: f for f in doc["files"]}


def test_pull_carries_sidecar_files(three, postgres, tmp_path):
    """A generation's sidecar files (config, tokenizer, files in
    subdirectories down to five levels, a name that needs escaping) are recorded in the catalog
    when it is published, and a pull fetches each from a holding peer's
    files route with the fleet token, checked against the catalog's
    SHA-256: the pulled generation has the publisher's files, byte for
    byte; one deeper than a peer's files route takes in a pull's URL is
    left out, and the log says so."""
    n1, n2, _ = three
    src, _ = sharded(tmp_path, "ckside", 11)
    side = {"config.json": b'{"model_type": "gpt2", "n_layer": 2}',
            "tokenizer.json": b'{"version": "1.0", "added_tokens": []}',
            "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
            "a/b/c/d/e/deep.txt": b"five levels down\n",
            "notes #1 & more.txt": "caf\u00e9\n".encode()}
    # deeper than a peer's files route takes in a pull's URL (no %2F there)
    too_deep = "a/b/c/d/e/f/g/deeper.txt"
    for p, b in {**side, too_deep: b"seven levels down\n"}.items():
        os.makedirs(os.path.dirname(src / p), exist_ok=True)
        (src / p).write_bytes(b)
    gen = publish(n1, "side", src, seen_by=n2)
    want = files_of(n1, "side", gen)
    assert sorted(want) == sorted([*side, too_deep]), want
    db = n1.settings["fleet.postgres"].rsplit("/", 1)[1]
    rows = postgres.psql("SELECT path, len, sha256 FROM generation_files WHERE model = 'side' "
                         "ORDER BY path", as_app=True, dbname=db).split("\n")
    assert sorted(r for r in rows if r) == sorted(f"{p}|{f['size']}|{f['sha256']}"
                                                 for p, f in want.items()), rows
    # the fleet token reads a sidecar file (as the blobs), nothing else
    tok = {"Authorization": f"Bearer {FLEET_TOKEN}"}
    r = n1.request("GET", f"/v1/models/side/generations/{gen}/files/config.json", token=None,
                   headers=tok)
    assert r.status == 200 and r.body == side["config.json"], r
    r = n1.request("GET", f"/v1/models/side/generations/{gen}/tensors", token=None, headers=tok)
    assert r.status == 403, r
    assert move(n1, "side", "prod", gen, 0, placement=["n1", "n2"]).status == 200
    wait_for(lambda: local_alias(n2, "side", "prod") == gen, timeout=60, what="n2 switched")
    got = files_of(n2, "side", gen)
    assert got == {p: f for p, f in want.items() if p != too_deep}, (got, want)
    assert f"sidecar file '{too_deep}' is not pulled" in n2.log_text()
    for p, b in side.items():
        r = n2.request("GET", f"/v1/models/side/generations/{gen}/files/{seg(p)}")
        assert r.status == 200 and r.body == b, (p, r)
    assert n2.ok("GET", f"/v1/models/side/generations/{gen}")["source"] == \
        f"fleet:side@{gen} from n1"
