"""What users of a registry expect to see (migrations/0008_registry_notes.sql):
descriptions and tags on models and generations (PATCH, the ?tag= filter,
the limits as 400s naming the field, admin only); the diff of two
generations (tensors added, removed, changed in dtype or shape or content,
by the tensors' XXH3-128 or, for generations imported without them, by the
shards' SHA-256), the API and the CLI agreeing; the event log: every
mutating route of docs/openapi.yaml leaves exactly one event with its actor,
before and after (a route added without one fails here), pages by `before`
are stable, and a uid that may not read a model does not see its events."""
import ctypes
import ctypes.util
import json
import os
import sqlite3
import subprocess
import tempfile

import numpy as np
import pytest
import yaml

from harness.daemon import SLOW, Daemon, make_checkpoint, seg

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPEC = os.path.join(ROOT, "docs", "openapi.yaml")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("notes")
    (w / "root").mkdir()
    return w


@pytest.fixture(scope="module")
def d(build_dir, work):
    dm = Daemon(build_dir, work, settings={"import.roots": str(work / "root"),
                                           "store.image_size": "512M"}).start()
    yield dm
    assert dm.stop() == 0, dm.log_text()


def pair(root, name, seed=3):
    """Two checkpoints that differ in exactly: w.change (content), w.gone
    (removed), w.new (added), w.dtype (F32 -> F16); w.same and w.shape_same
    unchanged."""
    rng = np.random.default_rng(seed)
    a = {"w.same": rng.standard_normal((16, 8)).astype(np.float32),
         "w.change": rng.standard_normal((32,)).astype(np.float32),
         "w.gone": rng.integers(0, 255, size=(7,), dtype=np.uint8),
         "w.dtype": np.ones((4, 2), np.float32),
         "w.shape_same": rng.integers(0, 255, size=(3, 3), dtype=np.uint8)}
    b = dict(a)
    b["w.change"] = a["w.change"] + 1
    del b["w.gone"]
    b["w.new"] = np.arange(5, dtype=np.int32)
    b["w.dtype"] = np.ones((4, 2), np.float16)
    pa = make_checkpoint(root / f"{name}-a" / "model.safetensors", a)
    pb = make_checkpoint(root / f"{name}-b" / "model.safetensors", b)
    return pa, pb, a, b


def xxh3_128(data):
    """XXH3-128 in xxHash's canonical (big-endian) order, from libxxhash."""
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")

    class H(ctypes.Structure):
        _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]

    lib.XXH3_128bits.restype = H
    lib.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h = lib.XXH3_128bits(bytes(data), len(data))
    return f"{h.high64:016x}{h.low64:016x}"


def events(d, token=None, **q):
    qs = "&".join(f"{k}={seg(str(v))}" for k, v in q.items())
    kw = {} if token is None else {"token": token}
    return d.ok("GET", "/v1/events" + (f"?{qs}" if qs else ""), **kw)


def newest_id(d):
    ev = events(d, limit=1)["events"]
    return ev[0]["id"] if ev else 0


def since(d, last):
    """Every event after id last, oldest first."""
    out, before = [], None
    while True:
        q = {"limit": 1000}
        if before:
            q["before"] = before
        page = events(d, **q)
        out += [e for e in page["events"] if e["id"] > last]
        if page["next"] is None or page["events"][-1]["id"] <= last:
            return sorted(out, key=lambda e: e["id"])
        before = page["next"]


def read_token(d, name="reader"):
    return d.ok("POST", "/v1/tokens", status=201, body={"name": name, "scope": "read"})["token"]


# -- descriptions and tags ------------------------------------------------------


def test_notes_set_get_remove_filter_and_shapes(d, work):
    pa, pb, _, _ = pair(work / "root", "n1")
    d.import_ok("notes", pa)
    d.import_ok("notes", pb)
    d.import_ok("other", pa)
    m = d.ok("GET", "/v1/models/notes")
    assert (m["description"], m["tags"]) == ("", {})
    g = d.ok("GET", "/v1/models/notes/generations/1")
    assert (g["description"], g["tags"]) == ("", {})

    m = d.ok("PATCH", "/v1/models/notes",
             body={"description": "Llama 3 8B \u00e9t\u00e9", "tags": {"team": "nlp", "stage": "dev"}})
    assert m["name"] == "notes" and m["description"] == "Llama 3 8B \u00e9t\u00e9"
    assert m["tags"] == {"team": "nlp", "stage": "dev"}
    # tags not named stay; null removes; a string replaces
    m = d.ok("PATCH", "/v1/models/notes", body={"tags": {"stage": None, "owner": "ann"}})
    assert m["tags"] == {"team": "nlp", "owner": "ann"}
    assert m["description"] == "Llama 3 8B \u00e9t\u00e9"
    assert d.ok("GET", "/v1/models/notes") == m
    # a generation's notes are its own
    g = d.ok("PATCH", "/v1/models/notes/generations/2",
             body={"description": "retrained", "tags": {"data": "2026-03"}})
    assert (g["model"], g["generation"], g["description"], g["tags"]) == \
        ("notes", 2, "retrained", {"data": "2026-03"})
    assert d.ok("GET", "/v1/models/notes/generations/2")["tags"] == {"data": "2026-03"}
    assert d.ok("GET", "/v1/models/notes/generations/1")["tags"] == {}
    gens = d.ok("GET", "/v1/models/notes/generations")["generations"]
    assert [(x["generation"], x["description"]) for x in gens] == [(1, ""), (2, "retrained")]
    # an alias names the generation too
    d.ok("PUT", "/v1/models/notes/aliases/prod", body={"generation": 1})
    assert d.ok("PATCH", "/v1/models/notes/generations/prod",
                body={"tags": {"x": "1"}})["generation"] == 1
    d.ok("DELETE", "/v1/models/notes/aliases/prod")
    # the filter: only the models with that tag value
    names = [x["name"] for x in d.ok("GET", "/v1/models?tag=team=nlp")["models"]]
    assert names == ["notes"]
    assert d.ok("GET", "/v1/models?tag=team=other")["models"] == []
    assert d.ok("GET", "/v1/models?tag=nope=nlp")["models"] == []
    assert {x["name"] for x in d.ok("GET", "/v1/models")["models"]} >= {"notes", "other"}
    for bad in ("team", "=nlp", "bad key=1"):
        r = d.get(f"/v1/models?tag={seg(bad)}")
        assert r.status == 400 and "tag" in r.json()["error"]["message"], (bad, r)
    # the description clears with ""
    assert d.ok("PATCH", "/v1/models/other", body={"description": "x"})["description"] == "x"
    assert d.ok("PATCH", "/v1/models/other", body={"description": ""})["description"] == ""


def test_notes_limits_are_400_naming_the_field_and_change_nothing(d, work):
    pa, _, _, _ = pair(work / "root", "n2")
    d.import_ok("lim", pa)
    d.ok("PATCH", "/v1/models/lim", body={"tags": {"keep": "1"}})
    before = d.ok("GET", "/v1/models/lim")
    n0 = newest_id(d)
    cases = [
        ({"description": "x" * 4097}, "description"),
        ({"description": "\u00e9" * 2049}, "description"),  # 4098 bytes of UTF-8
        ({"description": 3}, "description"),
        ({"tags": {"": "v"}}, "tag"),
        ({"tags": {"k" * 65: "v"}}, "tag key"),
        ({"tags": {"bad key": "v"}}, "bad key"),
        ({"tags": {"k\u00e9": "v"}}, "tag key"),
        ({"tags": {"k": "v" * 1025}}, "tags.k"),
        ({"tags": {"k": 3}}, "tags.k"),
        ({"tags": ["k"]}, "tags"),
        ({"tags": {f"t{i}": "v" for i in range(64)}}, "64"),  # 65 with the stored one
        ({}, "nothing to change"),
        ({"name": "x"}, "name"),
    ]
    for body, word in cases:
        r = d.request("PATCH", "/v1/models/lim", body=body)
        assert r.status == 400, (body, r)
        err = r.json()["error"]
        assert word in err["message"], (word, err)
    r = d.request("PATCH", "/v1/models/lim/generations/1", body={"tags": {"k": "v" * 1025}})
    assert r.status == 400 and "tags.k" in r.json()["error"]["message"]
    # the limits themselves pass
    ok = d.ok("PATCH", "/v1/models/lim", body={"description": "\u00e9" * 2048,
                                               "tags": {"k" * 64: "v" * 1024}})
    assert len(ok["description"].encode()) == 4096
    d.ok("PATCH", "/v1/models/lim", body={"description": before["description"],
                                          "tags": {"k" * 64: None}})
    assert d.ok("GET", "/v1/models/lim") == before
    # refused changes wrote no event; the two accepted ones did
    assert [e["action"] for e in since(d, n0)] == ["notes", "notes"]
    assert d.request("PATCH", "/v1/models/nosuch", body={"description": "x"}).status == 404
    assert d.request("PATCH", "/v1/models/lim/generations/9", body={"description": "x"}).status == 404


def test_notes_need_an_admin_token(d, work):
    pa, _, _, _ = pair(work / "root", "n3")
    d.import_ok("adm", pa)
    tok = read_token(d, "notes-reader")
    for path in ("/v1/models/adm", "/v1/models/adm/generations/1"):
        r = d.request("PATCH", path, body={"description": "x"}, token=tok)
        assert r.status == 403, r
        r = d.request("PATCH", path, body={"description": "x"}, token=None)
        assert r.status == 401, r
    assert d.ok("GET", "/v1/models/adm", token=tok)["description"] == ""


# -- diff --------------------------------------------------------------------------


def check_diff(doc, basis):
    assert [t["name"] for t in doc["added"]] == ["w.new"]
    assert doc["added"][0] == {"name": "w.new", "dtype": "I32", "shape": [5]}
    assert [t["name"] for t in doc["removed"]] == ["w.gone"]
    assert [(c["name"], c["from"]["dtype"], c["to"]["dtype"]) for c in doc["changed"]] == \
        [("w.dtype", "F32", "F16")]
    assert doc["basis"] == basis


def test_diff_reports_exactly_the_changes_api_and_cli_agree(d, work, tv):
    pa, pb, a, b = pair(work / "root", "d1")
    d.import_ok("dm", pa)
    d.import_ok("dm", pb)
    doc = d.ok("GET", "/v1/models/dm/diff?from=1&to=2")
    check_diff(doc, "xxh3")
    assert doc["content_changed"] == [{"name": "w.change", "basis": "xxh3",
                                       "note": "content differs"}]
    assert doc["unchanged"] == 2  # w.same, w.shape_same
    assert doc["from"] == {"model": "dm", "generation": 1}
    assert doc["to"] == {"model": "dm", "generation": 2}
    # the same generation: nothing changed
    same = d.ok("GET", "/v1/models/dm/diff?from=2&to=2")
    assert (same["added"], same["removed"], same["changed"], same["content_changed"],
            same["unchanged"]) == ([], [], [], [], len(b))
    # across models: a copy of generation 1 under another name is unchanged
    d.import_ok("dm-copy", pa)
    x = d.ok("GET", "/v1/models/dm/diff?from=1&to=1&to_model=dm-copy")
    assert x["unchanged"] == len(a) and x["to"] == {"model": "dm-copy", "generation": 1}
    x = d.ok("GET", "/v1/models/dm-copy/diff?from=1&to=2&to_model=dm")
    check_diff(x, "xxh3")
    # the CLI (remote) prints the same document with --json, and the text says it
    env = dict(os.environ, TENSORVAULT_URL=f"http://127.0.0.1:{d.port}",
               TENSORVAULT_TOKEN=d.token)
    p = tv("diff", "dm@1", "dm@2", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == doc
    p = tv("diff", "dm@1", "dm@2", env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "+ w.new  I32 [5]" in lines and "- w.gone  U8 [7]" in lines
    assert "~ w.dtype  F32 [4,2] -> F16 [4,2]" in lines
    assert "* w.change  content differs (xxh3)" in lines
    assert lines[-1].startswith("1 added, 1 removed, 1 changed in dtype or shape, "
                                "1 changed in content, 2 unchanged"), lines[-1]
    # bad requests
    for q in ("from=1", "to=1", "from=1&to=9", "from=1&to=1&to_model=nosuch", "from=x!&to=1"):
        r = d.get(f"/v1/models/dm/diff?{q}")
        assert r.status in (400, 404), (q, r)


def test_diff_names_the_sidecar_files_that_changed(d, work, tv):
    pa, pb, _, _ = pair(work / "root", "sc")
    da, db = os.path.dirname(pa), os.path.dirname(pb)
    for dd, cfg, only in ((da, '{"layers": 2}', "only_a.txt"), (db, '{"layers": 3}', "only_b.txt")):
        with open(os.path.join(dd, "config.json"), "w") as f:
            f.write(cfg)
        with open(os.path.join(dd, "tokenizer.json"), "w") as f:
            f.write('{"same": true}')
        with open(os.path.join(dd, only), "w") as f:
            f.write(only)
    d.import_ok("sc", da)
    d.import_ok("sc", db)
    doc = d.ok("GET", "/v1/models/sc/diff?from=1&to=2")
    assert doc["files"] == {"added": ["only_b.txt"], "removed": ["only_a.txt"],
                            "changed": ["config.json"]}
    env = dict(os.environ, TENSORVAULT_URL=f"http://127.0.0.1:{d.port}",
               TENSORVAULT_TOKEN=d.token)
    out = tv("diff", "sc@1", "sc@2", env=env, check=True).stdout.splitlines()
    assert "+ file only_b.txt" in out and "- file only_a.txt" in out
    assert "* file config.json" in out


def test_tensor_hashes_are_xxh3_of_the_bytes_and_old_generations_fall_back(tmp_path, tv):
    """Through the CLI on a store directory: the recorded hashes are the
    tensors' XXH3-128; a generation imported without them (the column
    cleared, as before migration 0008) is compared by its shards' SHA-256."""
    pa, pb, a, b = pair(tmp_path, "h")
    st = tmp_path / "st"
    tv("store", "init", "--store", st, "--image", tmp_path / "img", "--size", "64M", check=True)
    tv("import", "--store", st, "m", pa, check=True)
    tv("import", "--store", st, "m", pb, check=True)
    with sqlite3.connect(st / "registry.db") as db:
        rows = dict(db.execute("SELECT t.name, t.xxh3 FROM tensors t JOIN generations g "
                               "ON g.id = t.generation_id WHERE g.number = 1"))
    assert rows == {k: xxh3_128(v.tobytes()) for k, v in a.items()}
    with sqlite3.connect(st / "registry.db") as db:
        db.execute("UPDATE tensors SET xxh3 = NULL WHERE generation_id = "
                   "(SELECT id FROM generations WHERE number = 1)")
    doc = json.loads(tv("diff", "--store", st, "m@1", "m@2", "--json", check=True).stdout)
    check_diff(doc, "shard_sha256")
    # one shard each, and they differ: every same-shaped tensor may differ
    assert sorted(c["name"] for c in doc["content_changed"]) == ["w.change", "w.same",
                                                                 "w.shape_same"]
    assert {c["note"] for c in doc["content_changed"]} == \
        {"content may differ (shard hash differs)"}
    assert doc["unchanged"] == 0
    text = tv("diff", "--store", st, "m@1", "m@2", check=True).stdout
    assert "* w.same  content may differ (shard hash differs) (shard_sha256)" in text
    # the same shard (one generation against itself) is unchanged by its hash
    doc = json.loads(tv("diff", "--store", st, "m@1", "m@1", "--json", check=True).stdout)
    assert doc["unchanged"] == len(a) and doc["basis"] == "shard_sha256"
    # store-direct commands are recorded as "cli"
    ev = json.loads(tv("events", "--store", st, "m", "--json", check=True).stdout)["events"]
    assert {e["actor"] for e in ev} == {"cli"}
    assert [e["action"] for e in ev] == ["publish", "import.queued", "publish", "import.queued"]


# -- the event log -----------------------------------------------------------------


def mutating_operations():
    with open(SPEC) as f:
        spec = yaml.safe_load(f)
    return {(m.upper(), p) for p, item in spec["paths"].items() for m in item
            if m in ("post", "put", "patch", "delete")}


def one(evs, action):
    hit = [e for e in evs if e["action"] == action]
    assert len(hit) == 1, (action, evs)
    return hit[0]


def test_every_mutating_route_leaves_one_event(d, work):
    root = work / "root"
    pa, pb, _, _ = pair(root, "ev")
    admin = "admin"  # the daemon's first token's name

    def run(method, path, body=None, status=200):
        n0 = newest_id(d)
        out = d.ok(method, path, status=status, body=body)
        return out, since(d, n0)

    def imports():
        job, evs = run("POST", "/v1/imports", {"model": "ev", "source": pa}, 202)
        e = one(evs, "import.queued")
        assert (e["model"], e["after"]["job"], e["after"]["source"]) == ("ev", job["id"], pa)
        assert e["actor"] == admin and e["before"] is None
        n0 = evs[-1]["id"]
        assert d.wait_job(job["id"])["state"] == "succeeded"
        p = one(since(d, n0), "publish")  # the job's, for who queued it
        assert (p["actor"], p["model"], p["generation"]) == (admin, "ev", 1)
        assert (p["before"], p["after"]) == ({"state": "importing"}, {"state": "ready"})
        d.import_ok("ev", pb)
        return evs

    def activate():
        _, evs = run("POST", "/v1/models/ev/generations/2/activate")
        e = one(evs, "activate")
        assert (e["generation"], e["before"], e["after"]) == (2, {"active": None}, {"active": 2})
        return evs

    def rollback():
        _, evs = run("POST", "/v1/models/ev/rollback")
        e = one(evs, "rollback")
        assert (e["generation"], e["before"], e["after"]) == (1, {"active": 2}, {"active": 1})
        return evs

    def alias_put():
        _, evs = run("PUT", "/v1/models/ev/aliases/prod", {"generation": 2})
        e = one(evs, "alias.set")
        assert (e["before"], e["after"]) == ({"alias": "prod", "generation": None},
                                             {"alias": "prod", "generation": 2})
        return evs

    def alias_delete():
        _, evs = run("DELETE", "/v1/models/ev/aliases/prod")
        e = one(evs, "alias.remove")
        assert (e["before"], e["after"]) == ({"alias": "prod", "generation": 2},
                                             {"alias": "prod", "generation": None})
        return evs

    def patch_model():
        _, evs = run("PATCH", "/v1/models/ev", {"description": "d", "tags": {"a": "1"}})
        e = one(evs, "notes")
        assert (e["model"], e["generation"]) == ("ev", None)
        assert e["before"] == {"description": "", "tags": {}}
        assert e["after"] == {"description": "d", "tags": {"a": "1"}}
        return evs

    def patch_generation():
        _, evs = run("PATCH", "/v1/models/ev/generations/1", {"tags": {"b": "2"}})
        e = one(evs, "notes")
        assert (e["generation"], e["before"], e["after"]) == (1, {"tags": {}},
                                                              {"tags": {"b": "2"}})
        return evs

    def retire():
        _, evs = run("POST", "/v1/models/ev/generations/2/retire")
        e = one(evs, "retire")
        assert (e["generation"], e["before"], e["after"]) == (2, {"state": "ready"},
                                                              {"state": "retired"})
        return evs

    def deactivate():
        _, evs = run("POST", "/v1/models/ev/deactivate")
        e = one(evs, "deactivate")
        assert (e["generation"], e["before"], e["after"]) == (1, {"active": 1}, {"active": None})
        return evs

    def delete_model():
        _, evs = run("DELETE", "/v1/models/ev")
        e = one(evs, "model.delete")
        assert (e["model"], e["before"], e["after"]) == ("ev", {"n_generations": 2}, None)
        return evs

    def gc():
        out, evs = run("POST", "/v1/gc")
        e = one(evs, "gc")
        assert e["model"] is None and e["after"] == out
        return evs

    def verify():
        job, evs = run("POST", "/v1/verify", {}, 202)
        e = one(evs, "verify.queued")
        assert e["after"]["job"] == job["id"] and e["model"] is None
        d.wait_job(job["id"])
        return evs

    def token_create():
        t, evs = run("POST", "/v1/tokens", {"name": "ev-tok", "scope": "read"}, 201)
        e = one(evs, "token.create")
        assert e["after"] == {"id": t["id"], "name": "ev-tok", "scope": "read"}
        assert t["token"] not in json.dumps(evs)  # the secret is never logged
        state["token"] = t["id"]
        return evs

    def token_revoke():
        _, evs = run("DELETE", f"/v1/tokens/{state['token']}")
        e = one(evs, "token.revoke")
        assert e["before"]["revoked_at"] is None and e["after"]["revoked_at"] > 0
        return evs

    def cancel():
        # a job still queued or running when the cancel comes: a larger import
        big = make_checkpoint(root / "ev-big" / "model.safetensors",
                              {f"w{i}": np.full((1 << 20,), i, np.float32) for i in range(24)})
        for _ in range(5):
            job = d.submit_import("ev-big", big)
            n0 = newest_id(d)
            r = d.request("POST", f"/v1/jobs/{job['id']}/cancel")
            if r.status == 409:  # it finished first: try again
                continue
            assert r.status == 200, r
            assert d.wait_job(job["id"])["state"] == "cancelled"
            evs = since(d, n0)
            e = one(evs, "job.cancelled")
            assert e["after"]["job"] == job["id"] and e["actor"] == admin
            return evs
        pytest.fail("every import finished before its cancel")

    def fleet_alias():
        # without fleet.postgres the route is refused and nothing changes
        n0 = newest_id(d)
        r = d.request("PUT", "/v1/fleet/aliases/ev/prod", body={"generation": 1})
        assert r.status >= 400, r
        assert since(d, n0) == []
        return None

    state = {}
    drivers = {
        ("POST", "/v1/imports"): imports,
        ("POST", "/v1/models/{name}/generations/{gen}/activate"): activate,
        ("POST", "/v1/models/{name}/rollback"): rollback,
        ("PUT", "/v1/models/{name}/aliases/{alias}"): alias_put,
        ("DELETE", "/v1/models/{name}/aliases/{alias}"): alias_delete,
        ("PATCH", "/v1/models/{name}"): patch_model,
        ("PATCH", "/v1/models/{name}/generations/{gen}"): patch_generation,
        ("POST", "/v1/models/{name}/generations/{gen}/retire"): retire,
        ("POST", "/v1/models/{name}/deactivate"): deactivate,
        ("DELETE", "/v1/models/{name}"): delete_model,
        ("POST", "/v1/gc"): gc,
        ("POST", "/v1/verify"): verify,
        ("POST", "/v1/tokens"): token_create,
        ("DELETE", "/v1/tokens/{id}"): token_revoke,
        ("POST", "/v1/jobs/{id}/cancel"): cancel,
        # a fleet's alias move is recorded by the node that applies it
        # (tests/fleet); here there is no fleet
        ("PUT", "/v1/fleet/aliases/{name}/{alias}"): fleet_alias,
    }
    assert set(drivers) == mutating_operations(), \
        "a mutating route of docs/openapi.yaml has no event test (or one was removed)"
    for key, fn in drivers.items():
        evs = fn()
        if evs is None:
            continue
        for e in evs:
            assert e["actor"] == admin, (key, e)
            assert isinstance(e["time"], int) and e["time"] > 0


def test_events_page_by_before_stably_and_filter_by_model(d, work):
    pa, _, _, _ = pair(work / "root", "pg")
    d.import_ok("pg", pa)
    for i in range(12):
        d.ok("PATCH", "/v1/models/pg", body={"tags": {"i": str(i)}})
    every = since(d, 0)
    ids = [e["id"] for e in every]
    assert ids == sorted(set(ids))
    # pages of 5 walk every event once, newest first, even with new events
    # written between the pages
    got, before, first = [], None, None
    while True:
        q = {"limit": 5}
        if before:
            q["before"] = before
        page = events(d, **q)
        assert len(page["events"]) <= 5
        got += page["events"]
        if first is None:
            first = page["events"][0]["id"]
            d.ok("PATCH", "/v1/models/pg", body={"tags": {"late": "1"}})
        if page["next"] is None:
            break
        assert page["next"] == page["events"][-1]["id"]
        before = page["next"]
    assert [e["id"] for e in got] == sorted((i for i in ids if i <= first), reverse=True)
    # one model's events
    mine = events(d, model="pg", limit=1000)["events"]
    assert mine and {e["model"] for e in mine} == {"pg"}
    assert [e["after"]["tags"]["i"] for e in mine if e["action"] == "notes"
            and "late" not in e["after"]["tags"]][:3] == ["11", "10", "9"]
    for q in ("limit=0", "before=0", "before=x", "model=", "nope=1"):
        assert d.get(f"/v1/events?{q}").status == 400, q


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as uid 65534")
def test_a_denied_uid_does_not_see_other_models_events(build_dir, tmp_path):
    sockdir = tempfile.mkdtemp(prefix="tvnotes-", dir="/tmp")
    os.chmod(sockdir, 0o755)
    sock = os.path.join(sockdir, "http.sock")
    d = Daemon(build_dir, tmp_path, name="acl", settings={
        "access.default": "uid:0", f"access.open": f"uid:0 uid:{NOBODY}",
        "http.socket": sock, "http.socket_mode": "0666"}).start()
    try:
        pa, _, _, _ = pair(tmp_path, "acl")
        d.import_ok("secret", pa)
        d.import_ok("open", pa)
        d.ok("PATCH", "/v1/models/secret", body={"description": "hidden"})

        def as_nobody(path):
            p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                "--clear-groups", "curl", "-sS", "--unix-socket", sock,
                                "-w", "\n%{http_code}", f"http://localhost{path}"],
                               capture_output=True, timeout=30 * SLOW)
            body, _, code = p.stdout.rpartition(b"\n")
            return int(code or 0), body

        st, body = as_nobody("/v1/events?limit=1000")
        assert st == 200, body
        seen = json.loads(body)["events"]
        assert seen and {e["model"] for e in seen} == {"open"}, seen
        assert b"hidden" not in body and b"secret" not in body
        st, body = as_nobody("/v1/events?model=secret")
        assert st == 403 and json.loads(body)["error"]["code"] == "TV_E_PEER_DENIED", body
        st, body = as_nobody("/v1/models/secret/diff?from=1&to=1")
        assert st == 403, body
        st, body = as_nobody("/v1/models/open/diff?from=1&to=1&to_model=secret")
        assert st == 403, body
        # the daemon's own user (root, no token) reads both, under its uid's name
        st, body = 0, None
        p = subprocess.run(["curl", "-sS", "--unix-socket", sock, "-X", "PATCH", "-H",
                            "Content-Type: application/json", "-d", '{"tags":{"k":"v"}}',
                            "http://localhost/v1/models/open"], capture_output=True, timeout=30)
        assert b"needs an admin token" in p.stdout, p.stdout
        ev = events(d, model="open")["events"]
        assert {e["actor"] for e in ev} == {"admin"}
    finally:
        assert d.stop() == 0, d.log_text()
        for f in os.listdir(sockdir):
            os.unlink(os.path.join(sockdir, f))
        os.rmdir(sockdir)
