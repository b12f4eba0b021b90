"""Content-addressed blobs (GET /v1/blobs/sha256:HEX) end to end: a daemon with a
2-shard checkpoint "m" (generation 1) and a single file "solo" imported
twice (generations 1 and 2: one object, deduplicated). Every shard's sha256
(GET generation detail) is served at /v1/blobs/sha256:HEX byte-identical to
its file (compared with the file and with hashlib.sha256 of the body), whole
and by Range (first byte, last byte, a span crossing 4096, suffix, open end,
416, several ranges -> 200 whole), 304 on If-None-Match, HEAD with
Content-Length and no body; tokens: none 401 even on loopback, read 403,
fleet and admin 200, a fleet token anywhere else 403; the listing pages
with limit=1 cover every blob once; a retired and gc'd blob is 404."""
import hashlib
import http.client
import os

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import SLOW, Daemon, make_checkpoint, seg


@pytest.fixture(scope="module")
def d(build_dir, tmp_path_factory):
    w = tmp_path_factory.mktemp("blobs")
    dm = Daemon(build_dir, w, settings={"store.image_size": "256M"}).start()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


@pytest.fixture(scope="module")
def tokens(d):
    out = {}
    for scope in ("read", "fleet", "admin"):
        t = d.ok("POST", "/v1/tokens", status=201, body={"name": f"t-{scope}", "scope": scope})
        assert t["scope"] == scope
        out[scope] = t["token"]
    return out


@pytest.fixture(scope="module")
def store(d):
    """{sha256: path of the file with those bytes}"""
    rng = np.random.default_rng(13)
    mdir = os.path.join(d.workdir, "m")
    gen.write_checkpoint(mdir, gen.random_tensors(rng, 12, big_tensor_bytes=3 << 20), 2)
    d.import_ok("m", mdir, activate=True)
    solo = make_checkpoint(os.path.join(d.workdir, "solo", "model.safetensors"),
                           {"w": rng.standard_normal(5000).astype(np.float32)})
    d.import_ok("solo", solo)
    d.import_ok("solo", solo, activate=True)  # same bytes: the same object
    files = {}
    for model, number, where in (("m", 1, mdir), ("solo", 1, os.path.dirname(solo)),
                                 ("solo", 2, os.path.dirname(solo))):
        g = d.ok("GET", f"/v1/models/{model}/generations/{number}")
        for s in g["shards"]:
            path = os.path.join(where, s["name"])
            assert os.path.getsize(path) == s["file_bytes"]
            files[s["sha256"]] = path
    assert len(files) == 3, files  # m's 2 shards, solo's one (twice)
    return files


def blob(d, hexd, token, method="GET", headers=None):
    return d.request(method, f"/v1/blobs/sha256:{hexd}", token=token, headers=headers)


def test_every_shard_is_served_byte_identical(d, store, tokens):
    for hexd, path in store.items():
        data = open(path, "rb").read()
        r = blob(d, hexd, tokens["fleet"])
        assert r.status == 200, r
        assert r.body == data
        assert hashlib.sha256(r.body).hexdigest() == hexd
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-length"] == str(len(data))
        assert r.headers["accept-ranges"] == "bytes"
        assert r.headers["etag"] == f'"sha256:{hexd}"'


def test_ranges(d, store, tokens):
    hexd, path = max(store.items(), key=lambda kv: os.path.getsize(kv[1]))
    data = open(path, "rb").read()
    n = len(data)
    assert n > 3 << 20
    cases = [("bytes=0-0", 0, 1), (f"bytes={n - 1}-{n - 1}", n - 1, 1),
             ("bytes=4090-4101", 4090, 12), ("bytes=-700", n - 700, 700),
             (f"bytes={n - 5000}-", n - 5000, 5000), ("bytes=1000000-", 1000000, n - 1000000),
             (f"bytes=10-{n + 100}", 10, n - 10)]
    for h, off, ln in cases:
        r = blob(d, hexd, tokens["fleet"], headers={"Range": h})
        assert r.status == 206, (h, r)
        assert r.headers["content-range"] == f"bytes {off}-{off + ln - 1}/{n}", h
        assert r.headers["content-length"] == str(ln)
        assert r.body == data[off:off + ln], h
    for h in (f"bytes={n}-", "bytes=5-2", "bytes=-0", "bytes=x-"):
        r = blob(d, hexd, tokens["fleet"], headers={"Range": h})
        assert r.status == 416, (h, r)
        assert r.headers["content-range"] == f"bytes */{n}"
        assert r.json()["error"]["code"] == "TV_E_RANGE"
    r = blob(d, hexd, tokens["fleet"], headers={"Range": "bytes=0-1,5-6"})
    assert r.status == 200 and r.body == data
    r = blob(d, hexd, tokens["fleet"], headers={"If-None-Match": f'"sha256:{hexd}"'})
    assert r.status == 304 and r.body == b""
    r = blob(d, hexd, tokens["fleet"], headers={"If-None-Match": '"sha256:00"'})
    assert r.status == 200 and r.body == data


def test_head(d, store, tokens):
    hexd, path = next(iter(store.items()))
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30 * SLOW)
    try:
        conn.request("HEAD", f"/v1/blobs/sha256:{hexd}",
                     headers={"Authorization": f"Bearer {tokens['fleet']}"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.getheader("Content-Length") == str(os.path.getsize(path))
        assert r.getheader("ETag") == f'"sha256:{hexd}"'
        assert r.read() == b""
    finally:
        conn.close()


def test_not_modified_length(d, store, tokens):
    """A 304 (GET or HEAD) carries no Content-Length but the 200's (RFC 9110
    8.6: never 0 for a blob that has bytes), here and on the data route."""
    hexd, path = next(iter(store.items()))
    tl = d.ok("GET", "/v1/models/m/generations/1/tensors?limit=1000")["tensors"]
    t = next(x for x in tl if x["data_offsets"][1] > x["data_offsets"][0])
    data_path = f"/v1/models/m/generations/1/tensors/{seg(t['name'])}/data"
    cases = [(f"/v1/blobs/sha256:{hexd}", f'"sha256:{hexd}"', os.path.getsize(path), "fleet"),
             (data_path, None, t["data_offsets"][1] - t["data_offsets"][0], "admin")]
    for url, etag, n, who in cases:
        for method in ("GET", "HEAD"):
            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30 * SLOW)
            try:
                auth = {"Authorization": f"Bearer {tokens[who]}"}
                if etag is None:
                    conn.request("HEAD", url, headers=auth)
                    r0 = conn.getresponse()
                    r0.read()
                    etag = r0.getheader("ETag")
                conn.request(method, url, headers={**auth, "If-None-Match": etag})
                r = conn.getresponse()
                assert r.status == 304, (url, method, r.status)
                assert r.read() == b""
                cl = r.getheader("Content-Length")
                assert cl is None or cl == str(n), (url, method, cl, n)
                assert r.getheader("ETag") == etag
                # the connection still frames the next answer right
                conn.request("HEAD", url, headers=auth)
                r = conn.getresponse()
                assert r.status == 200 and r.read() == b""
                assert r.getheader("Content-Length") == str(n)
            finally:
                conn.close()


def test_tokens(d, store, tokens):
    hexd = next(iter(store))
    for target in (f"/v1/blobs/sha256:{hexd}", "/v1/blobs"):
        r = d.request("GET", target, token=None)  # loopback: still 401
        assert r.status == 401, r
        assert r.json()["error"]["code"] == "TV_E_UNAUTHORIZED"
        r = d.request("GET", target, token=tokens["read"])
        assert r.status == 403 and r.json()["error"]["code"] == "TV_E_FORBIDDEN", r
        for t in ("fleet", "admin"):
            assert d.request("GET", target, token=tokens[t]).status == 200
        assert d.request("GET", target).status == 200  # the daemon's admin token
    for method, target in (("GET", "/v1/models"), ("GET", "/v1/status"),
                           ("GET", "/v1/models/m/generations/1"), ("POST", "/v1/gc"),
                           ("GET", "/v1/tokens")):
        r = d.request(method, target, token=tokens["fleet"])
        assert r.status == 403, (target, r)
        e = r.json()["error"]
        assert e["code"] == "TV_E_FORBIDDEN" and "blob" in e["message"], e
    # a fleet token is listed with its scope
    toks = d.ok("GET", "/v1/tokens")["tokens"]
    assert [t["scope"] for t in toks if t["name"] == "t-fleet"] == ["fleet"]


def test_bad_digests_and_unknown(d, store, tokens):
    hexd = next(iter(store))
    for bad in ("abc", f"sha512:{hexd}", f"SHA256:{hexd}", f"sha256:{hexd[:-1]}",
                f"sha256:{hexd}0", f"sha256:{hexd.upper()}", "sha256:" + "g" * 64,
                seg(f"sha256:{hexd[:-1]} ")):
        r = d.request("GET", f"/v1/blobs/{bad}", token=tokens["fleet"])
        assert r.status == 400, (bad, r)
        assert r.json()["error"]["code"] == "TV_E_BAD_REQUEST"
        assert "sha256" in r.json()["error"]["message"]
    r = blob(d, "0" * 64, tokens["fleet"])
    assert r.status == 404 and r.json()["error"]["code"] == "TV_E_NOT_FOUND", r
    r = d.request("GET", f"/v1/blobs/sha256:{hexd}?x=1", token=tokens["fleet"])
    assert r.status == 400


def listing(d, token, limit):
    seen, target = [], f"/v1/blobs?limit={limit}"
    while True:
        doc = d.ok("GET", target, token=token)
        assert set(doc) == {"blobs", "next_cursor"}
        assert len(doc["blobs"]) <= limit
        for b in doc["blobs"]:
            assert set(b) == {"digest", "bytes", "n_replicas"}, b
        seen += doc["blobs"]
        if doc["next_cursor"] is None:
            return seen
        target = f"/v1/blobs?limit={limit}&cursor={doc['next_cursor']}"


def test_listing_pages_cover_every_blob_once(d, store, tokens):
    one = listing(d, tokens["fleet"], 1)
    assert [b["digest"] for b in one] == sorted(f"sha256:{h}" for h in store)
    for b in one:
        h = b["digest"][len("sha256:"):]
        assert b["bytes"] == os.path.getsize(store[h]) and b["n_replicas"] == 1, b
    assert listing(d, tokens["admin"], 1000) == one
    assert d.request("GET", "/v1/blobs?cursor=zz", token=tokens["fleet"]).status == 400


def test_dedup_and_gc(d, store, tokens):
    # solo@1 and solo@2 share one object: one blob; retiring @1 keeps it
    # (@2 is active), retiring and deleting the model frees it -> 404
    g1 = d.ok("GET", "/v1/models/solo/generations/1")["shards"]
    g2 = d.ok("GET", "/v1/models/solo/generations/2")["shards"]
    assert g1[0]["sha256"] == g2[0]["sha256"]
    hexd = g1[0]["sha256"]
    assert g1[0]["replicas"] == g2[0]["replicas"]
    d.ok("POST", "/v1/models/solo/generations/1/retire")
    d.ok("POST", "/v1/gc")
    assert blob(d, hexd, tokens["fleet"]).status == 200
    d.ok("POST", "/v1/models/solo/deactivate")
    d.ok("POST", "/v1/models/solo/generations/2/retire")
    assert blob(d, hexd, tokens["fleet"]).status == 200  # retired, not yet collected
    assert d.ok("POST", "/v1/gc")["n_objects_freed"] == 1
    r = blob(d, hexd, tokens["fleet"])
    assert r.status == 404, r
    assert f"sha256:{hexd}" not in [b["digest"] for b in listing(d, tokens["fleet"], 1)]
    # m's shards are still served
    for h, path in store.items():
        if h != hexd:
            assert blob(d, h, tokens["fleet"]).body == open(path, "rb").read()


def test_read_bytes_metric_counts_blob_bodies(d, store, tokens):
    """tensorvault_read_bytes_total counts a blob's bytes whether the body
    is sent whole or streamed (it counted only streamed ones)."""
    route = 'tensorvault_read_bytes_total{route="GET /v1/blobs/{digest}"}'

    def counted():
        for line in d.get("/metrics").body.decode().splitlines():
            if line.startswith(route + " "):
                return int(float(line.split()[-1]))
        return 0

    hexd, path = next(iter(store.items()))
    before = counted()
    r = blob(d, hexd, tokens["fleet"])
    assert r.status == 200
    r = blob(d, hexd, tokens["fleet"], headers={"Range": "bytes=0-99"})
    assert r.status == 206
    assert counted() - before == os.path.getsize(path) + 100
