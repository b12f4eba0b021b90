"""Sidecar files: a generation is a whole model. An import of a checkpoint
directory stores its small non-weight files (config.json, the tokenizer's,
a subdirectory's) in the registry, byte for byte, and lists what it did
not keep (over import.sidecar_max_bytes, a FIFO, a symlink leaving the
directory); GET .../files lists them and GET .../files/{path} answers the
bytes; two generations with the same config share one stored content; a
failed import stores nothing; import.sidecar_total_bytes fails the import
naming the key; gc drops the files of retired generations; a denied uid
gets 403 on the files routes (setpriv, as test_security_http.py)."""
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess

import numpy as np
import pytest

from harness.daemon import Daemon, make_checkpoint, seg

MAX = 64 << 10
TOTAL = 512 << 10
NOBODY = 65534


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("sidecar")
    (w / "root").mkdir()
    (w / "outside").mkdir()
    os.chmod(w, 0o755)
    return w


@pytest.fixture(scope="module")
def d(build_dir, work):
    dm = Daemon(build_dir, work, settings={"import.roots": str(work / "root"),
                                           "import.sidecar_max_bytes": str(MAX),
                                           "import.sidecar_total_bytes": str(TOTAL)}).start()
    yield dm
    assert dm.stop() == 0, dm.log_text()


def model_dir(work, name, seed=1, extra=None):
    """A checkpoint directory with sidecar files: {path: bytes} it should keep."""
    rng = np.random.default_rng(seed)
    root = work / "root" / name
    make_checkpoint(root / "model.safetensors",
                    {"w": rng.standard_normal((16, 8)).astype(np.float32)})
    keep = {
        "config.json": json.dumps({"model_type": "bert", "hidden_size": 8,
                                   "architectures": ["BertModel"]}).encode(),
        "tokenizer.json": b'{"version": "1.0", "added_tokens": []}',
        "README.md": b"# a model card\n\xe2\x9c\x93 bytes as they are\n",
        "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
        "sub/deeper/vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    }
    keep.update(extra or {})
    for p, b in keep.items():
        os.makedirs(os.path.dirname(root / p), exist_ok=True)
        (root / p).write_bytes(b)
    return str(root), keep


def files_of(d, model, gen):
    doc = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/files")
    return {f["path"]: f for f in doc["files"]}


def registry(d):
    return sqlite3.connect(f"file:{os.path.join(d.store, 'registry.db')}?mode=ro", uri=True)


def blob_count(d):
    with registry(d) as db:
        return db.execute("SELECT count(*) FROM sidecar_blobs").fetchone()[0]


def test_import_stores_lists_and_serves_sidecar_files(d, work):
    src, keep = model_dir(work, "m1", extra={"only1.txt": b"generation one only"})
    root = work / "root" / "m1"
    (root / "big.txt").write_bytes(b"x" * (MAX + 1))           # over the per-file cap
    (work / "outside" / "secret.txt").write_bytes(b"secret")
    os.symlink(work / "outside" / "secret.txt", root / "leak.txt")  # leaves the directory
    os.symlink("../../../outside/secret.txt", root / "sub" / "rel-leak.txt")
    os.mkfifo(root / "pipe")                                     # not a regular file
    (root / ".hidden").write_bytes(b"dot-file")                  # never a sidecar
    (root / "pytorch_model.bin").write_bytes(b"weights in another format")
    os.symlink("config.json", root / "config-link.json")         # inside: kept

    job = d.import_ok("m1", src, activate=True)
    res = job["result"]
    assert res["n_files"] == len(keep) + 1, res
    skipped = "\n".join(res["skipped"])
    assert f"skipped: big.txt ({MAX + 1} bytes > {MAX})" in skipped, res
    assert "skipped: leak.txt (" in skipped and "outside the" in skipped, res
    assert "skipped: sub/rel-leak.txt (" in skipped, res
    assert "skipped: pipe (not a regular file)" in skipped, res
    assert ".hidden" not in skipped and "pytorch_model.bin" not in skipped
    assert "sidecar file skipped: big.txt" in d.log_text()

    want = dict(keep, **{"config-link.json": keep["config.json"]})
    got = files_of(d, "m1", 1)
    assert sorted(got) == sorted(want)
    for p, b in want.items():
        assert got[p]["size"] == len(b) and got[p]["sha256"] == sha(b), p
        for spec in ("1", "active"):
            r = d.get(f"/v1/models/m1/generations/{spec}/files/{p}")
            assert r.status == 200 and r.body == b, (p, r)
            assert r.headers["etag"] == f'"{sha(b)}"'
            assert int(r.headers["content-length"]) == len(b)
            ct = "application/json" if p.endswith(".json") else "text/plain"
            assert r.headers["content-type"].startswith(ct), (p, r.headers)
    # a '/' may also come percent-encoded; an ETag that matches is 304
    r = d.get("/v1/models/m1/generations/1/files/1_Pooling%2Fconfig.json")
    assert r.status == 200 and r.body == keep["1_Pooling/config.json"]
    r = d.get("/v1/models/m1/generations/1/files/config.json",
              headers={"If-None-Match": f'"{sha(keep["config.json"])}"'})
    assert r.status == 304
    # what was not kept is not there; the error is the API's JSON
    for p in ("big.txt", "leak.txt", "pipe", ".hidden", "pytorch_model.bin", "model.safetensors",
              "nope/config.json"):
        r = d.get(f"/v1/models/m1/generations/1/files/{p}")
        assert r.status == 404 and r.json()["error"]["code"] == "TV_E_NOT_FOUND", (p, r)
    assert d.get("/v1/models/m1/generations/9/files").status == 404
    assert d.ok("GET", "/v1/models/m1/generations/1")["n_files"] == len(want)

    # a second generation with the same files: the contents are stored once
    n_blobs = blob_count(d)
    src2, keep2 = model_dir(work, "m1b")
    d.import_ok("m1", src2)
    assert blob_count(d) == n_blobs
    g2 = files_of(d, "m1", 2)
    assert g2["config.json"]["sha256"] == got["config.json"]["sha256"]
    assert "only1.txt" not in g2

    # gc: a retired generation's files go; contents another generation names stay
    d.ok("POST", "/v1/models/m1/generations/2/activate")
    d.ok("POST", "/v1/models/m1/generations/1/retire")
    d.ok("POST", "/v1/gc")
    assert files_of(d, "m1", 1) == {}
    assert blob_count(d) == n_blobs - 1  # only1.txt
    assert d.get("/v1/models/m1/generations/2/files/config.json").body == keep["config.json"]


def test_failed_imports_store_nothing(d, work):
    n_blobs = blob_count(d)
    # a corrupt shard: nothing published, no file stored
    src, _ = model_dir(work, "bad", extra={"unique-to-bad.txt": b"never stored"})
    with open(os.path.join(src, "model.safetensors"), "r+b") as f:
        f.seek(8)
        f.write(b"[")
    job = d.wait_job(d.submit_import("bad", src)["id"])
    assert job["state"] == "failed", job
    assert blob_count(d) == n_blobs
    with registry(d) as db:
        assert db.execute("SELECT count(*) FROM sidecar_blobs WHERE sha256 = ?",
                          (sha(b"never stored"),)).fetchone()[0] == 0
    # over import.sidecar_total_bytes: the import fails naming the key
    extra = {f"part{i}.txt": bytes([i]) * (MAX - 1) for i in range(TOTAL // MAX + 1)}
    src, _ = model_dir(work, "huge", extra=extra)
    job = d.wait_job(d.submit_import("huge", src)["id"])
    assert job["state"] == "failed", job
    assert "import.sidecar_total_bytes" in job["error"]["message"], job
    assert job["error"]["code"] == "TV_E_TOO_LARGE", job
    assert d.get("/v1/models/huge").status == 404
    assert blob_count(d) == n_blobs


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as uid 65534")
def test_denied_uid_gets_403_on_the_files_routes(build_dir, tmp_path):
    os.chmod(tmp_path, 0o755)
    dm = Daemon(build_dir, tmp_path, settings={"access.default": "uid:0"}, name="acc").start()
    try:
        src, keep = model_dir(tmp_path, "m")
        dm.import_ok("m", src, activate=True)
        base = f"http://127.0.0.1:{dm.port}/v1/models/m/generations/active/files"
        for url, own in ((base, None), (base + "/config.json", keep["config.json"])):
            p = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", url],
                               capture_output=True, timeout=30)
            body, _, code = p.stdout.rpartition(b"\n")
            assert code == b"200" and (own is None or body == own)
            p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                "--clear-groups", "curl", "-sS", "-o", "-", "-w", "\n%{http_code}",
                                url], capture_output=True, timeout=30)
            body, _, code = p.stdout.rpartition(b"\n")
            assert code == b"403", (url, p)
            assert json.loads(body)["error"]["code"] == "TV_E_PEER_DENIED"
    finally:
        assert dm.stop() == 0, dm.log_text()
