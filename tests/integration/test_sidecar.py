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
        "d1/d2/d3/d4/d5/d6/deep.txt": b"seven levels down",
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
            r = d.get(f"/v1/models/m1/generations/{spec}/files/{seg(p)}")
            assert r.status == 200 and r.body == b, (p, r)
            assert r.headers["etag"] == f'"{sha(b)}"'
            assert int(r.headers["content-length"]) == len(b)
            ct = "application/json" if p.endswith(".json") else "text/plain"
            assert r.headers["content-type"].startswith(ct), (p, r.headers)
    # a '/' may also come as it is; an ETag that matches is 304
    r = d.get("/v1/models/m1/generations/1/files/sub/deeper/vocab.txt")
    assert r.status == 200 and r.body == keep["sub/deeper/vocab.txt"]
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


def cli(build_dir, d, *args, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    env.update(TENSORVAULT_URL=f"http://127.0.0.1:{d.port}",
               TENSORVAULT_TOKEN_FILE=os.path.join(d.store, "admin.token"))
    p = subprocess.run([os.path.join(os.path.abspath(build_dir), "tensorvault"), *args],
                       capture_output=True, text=True, timeout=60, env=env)
    if check:
        assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p


def test_cli_files_and_checkout(build_dir, d, work):
    src, keep = model_dir(work, "c1", seed=7)
    d.import_ok("c", src, activate=True)
    d.ok("PUT", "/v1/models/c/aliases/prod", body={"generation": 1})

    doc = json.loads(cli(build_dir, d, "files", "c@prod", "--json").stdout)
    assert doc == d.ok("GET", "/v1/models/c/generations/1/files")
    text = cli(build_dir, d, "files", "c").stdout
    assert "1_Pooling/config.json" in text and sha(keep["config.json"])[:12] in text
    assert f"{len(keep)} files of c generation 1" in text

    out = work / "co"
    p = cli(build_dir, d, "checkout", "c@prod", str(out))
    assert "generation 1" in p.stdout
    for path, b in keep.items():
        assert (out / path).read_bytes() == b, path
    rec = json.loads((out / "tensorvault.json").read_text())
    assert (rec["model"], rec["generation"], rec["url"]) == ("c", 1, f"http://127.0.0.1:{d.port}")
    assert rec["files"] == doc["files"]
    assert [s["name"] for s in rec["shards"]] == ["model.safetensors"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"w": "model.safetensors"}
    assert not (out / "model.safetensors").exists()
    # again: nothing differs, nothing is written
    before = {p: os.stat(out / p).st_ino for p in keep}
    assert "(%d unchanged)" % (len(keep) + 2) in cli(build_dir, d, "checkout", "c", str(out)).stdout
    assert before == {p: os.stat(out / p).st_ino for p in keep}

    # a different file in DIR is refused (nothing written), --force replaces it
    src2, _ = model_dir(work, "c2", extra={"config.json": b'{"model_type": "bert", "v": 2}'})
    d.import_ok("c", src2)
    p = cli(build_dir, d, "checkout", "c@2", str(out), check=False)
    assert p.returncode == 1 and "refusing to overwrite" in p.stderr and "--force" in p.stderr
    assert (out / "config.json").read_bytes() == keep["config.json"]
    assert json.loads((out / "tensorvault.json").read_text())["generation"] == 1
    cli(build_dir, d, "checkout", "c@2", str(out), "--force")
    assert (out / "config.json").read_bytes() == b'{"model_type": "bert", "v": 2}'
    assert json.loads((out / "tensorvault.json").read_text())["generation"] == 2
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    # a symbolic link inside DIR is not written through
    shutil.rmtree(out / "1_Pooling")
    os.symlink(work / "outside", out / "1_Pooling")
    p = cli(build_dir, d, "checkout", "c@1", str(out), "--force", check=False)
    assert p.returncode == 1 and "symbolic link" in p.stderr
    assert not (work / "outside" / "config.json").exists()
    # a generation that does not exist
    p = cli(build_dir, d, "checkout", "c@9", str(work / "co9"), check=False)
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr
    assert not (work / "co9").exists()


def test_minilm_checkout_loads_bit_identical(build_dir, tmp_path, monkeypatch):
    """The acceptance: the real MiniLM directory (weights, config, tokenizer,
    1_Pooling/) imported through the daemon, `tensorvault checkout
    minilm@1 DIR`, then transformers' AutoConfig, AutoTokenizer and
    AutoModel.from_pretrained(DIR) under tensorvault.patched(): the weights
    come through tensorvault from generation 1 (DIR holds no shard), and
    the embeddings equal the official loader's on the original directory
    bit for bit."""
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import tensorvault
    from tensorvault import _files
    from transformers import AutoConfig, AutoTokenizer

    from .test_python_switch import embed, minilm_dir

    orig = minilm_dir()
    os.chmod(tmp_path, 0o755)
    src = tmp_path / "root" / "minilm"
    shutil.copytree(orig, src)  # model.safetensors (a link out of the directory) copied
    dm = Daemon(build_dir, tmp_path, settings={"import.roots": str(tmp_path / "root"),
                                               "store.image_size": "512M"}, name="ml").start()
    try:
        dm.import_ok("minilm", str(src), activate=True)
        dm.wait_socket()
        out = tmp_path / "checkout"
        cli(build_dir, dm, "checkout", "minilm@1", str(out))
        for rel in ("config.json", "tokenizer.json", "vocab.txt", "1_Pooling/config.json"):
            assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel
        assert not (out / "model.safetensors").exists()
        assert tensorvault._checkout.spec_of(out) == "minilm@1"

        opened = []
        real = _files.open_file
        monkeypatch.setattr(_files, "open_file",
                            lambda *a, **kw: opened.append(real(*a, **kw)) or opened[-1])
        want, official = embed(orig)
        assert not opened
        cfg = AutoConfig.from_pretrained(str(out))
        ref_cfg = AutoConfig.from_pretrained(orig)
        assert {**cfg.to_dict(), "_name_or_path": ""} == {**ref_cfg.to_dict(), "_name_or_path": ""}
        assert AutoTokenizer.from_pretrained(str(out))("a b c")["input_ids"] == \
            AutoTokenizer.from_pretrained(orig)("a b c")["input_ids"]
        with tensorvault.patched(socket=dm.socket_path):
            got, model = embed(str(out))
        assert opened and all(type(f) is tensorvault.safe_open for f in opened), opened
        assert {f._spec for f in opened} == {"minilm@1"}
        assert torch.equal(got, want)  # bit for bit
        ref = official.state_dict()
        for name, t in model.state_dict().items():
            assert torch.equal(t, ref[name]), name
        # the same through the Python checkout(), by alias: the record names the number
        dm.ok("PUT", "/v1/models/minilm/aliases/prod", body={"generation": 1})
        rec = tensorvault.checkout("minilm", tmp_path / "co2", "prod",
                                   http=f"http://127.0.0.1:{dm.port}")
        assert rec["generation"] == 1
        assert json.loads((tmp_path / "co2" / "tensorvault.json").read_bytes())["generation"] == 1
        assert (tmp_path / "co2" / "model.safetensors.index.json").read_bytes() == \
            (out / "model.safetensors.index.json").read_bytes()
        for f in rec["files"]:
            assert (tmp_path / "co2" / f["path"]).read_bytes() == (out / f["path"]).read_bytes()
    finally:
        assert dm.stop() == 0, dm.log_text()


def test_vllm_plugin_takes_model_and_generation_from_the_checkout(build_dir, tmp_path):
    """The vLLM loader (python/tensorvault/vllm.py) pointed at a checkout
    directory reads the model and generation number of its
    tensorvault.json (and its store), whatever an alias says since; extra
    config that disagrees is refused. Without running vLLM: pick(), then,
    when vLLM is installed, its loader's load_weights on a stand-in."""
    import tensorvault.vllm as tvllm

    exe = os.path.join(os.path.abspath(build_dir), "tensorvault")
    store = str(tmp_path / "st")
    rng = np.random.default_rng(3)
    w1 = {"w": rng.standard_normal((4, 4)).astype(np.float32)}
    w2 = {"w": w1["w"] + 1}
    run = lambda *a: subprocess.run([exe, *a], capture_output=True, text=True, check=True)
    run("store", "init", "--store", store, "--image", str(tmp_path / "img"), "--size", "64M")
    for i, w in ((1, w1), (2, w2)):
        d = tmp_path / f"src{i}"
        make_checkpoint(d / "model.safetensors", w)
        (d / "config.json").write_text(json.dumps({"model_type": "x", "v": i}))
        run("import", "--store", store, "m", str(d))
    run("alias", "set", "m", "prod", "1", "--store", store)
    co = tmp_path / "co"
    run("checkout", "m@prod", str(co), "--store", store)
    run("alias", "set", "m", "prod", "2", "--store", store)  # the alias moves on; DIR does not

    name, src = tvllm.pick(str(co), {})
    assert (name, src) == ("m", {"generation": 1, "alias": None, "socket": None, "store": store})
    assert tvllm.pick(str(co), {"model": "m", "generation": 1})[1]["generation"] == 1
    assert tvllm.pick(str(co), {"socket": "/x.sock"})[1] == {
        "generation": 1, "alias": None, "socket": "/x.sock", "store": None}
    for bad in ({"model": "other"}, {"generation": 2}, {"alias": "prod"}):
        with pytest.raises(ValueError, match="is a tensorvault checkout of m@1"):
            tvllm.pick(str(co), bad)
    # not a checkout: as before
    assert tvllm.pick("hf/x", {"model": "m", "alias": "prod"}) == (
        "m", {"generation": None, "alias": "prod", "socket": None, "store": None})
    assert tvllm.pick(str(tmp_path / "src1"), {})[0] == str(tmp_path / "src1")

    try:
        import torch
        from vllm.config.load import LoadConfig
        from vllm.model_executor.model_loader import get_model_loader
    except ImportError:
        return
    tvllm.register()

    class Cfg:
        model, quantization = str(co), None

    class Collector(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4, 4))
            self.got = {}

        def load_weights(self, weights):
            self.got.update((n, t.clone()) for n, t in weights)
            return set(self.got)

    ld = get_model_loader(LoadConfig(load_format="tensorvault", model_loader_extra_config={}))
    ld.download_model(Cfg())
    m = Collector()
    ld.load_weights(m, Cfg())
    assert np.array_equal(m.got["w"].numpy(), w1["w"])  # generation 1, not the alias's 2


def test_a_malformed_checkout_record_is_no_checkout(tmp_path):
    """A tensorvault.json that is not a record (not JSON, not an object, no
    model, a generation that is not a positive integer, no shard list)
    makes its directory no checkout: nothing resolves through it, so a
    loader fails on the missing shard file instead of reading other
    weights; a well-formed one resolves its shards."""
    from tensorvault import _checkout
    good = {"model": "m", "generation": 2, "shards": [{"name": "model.safetensors"}]}
    bad = [b"", b"{", b"[]", json.dumps({**good, "model": 7}).encode(),
           json.dumps({k: v for k, v in good.items() if k != "model"}).encode(),
           json.dumps({**good, "generation": 0}).encode(),
           json.dumps({**good, "generation": "2"}).encode(),
           json.dumps({**good, "generation": True}).encode(),
           json.dumps({**good, "shards": {}}).encode(), b"\xff\xfe"]
    rec = tmp_path / "tensorvault.json"
    for b in bad:
        rec.write_bytes(b)
        assert _checkout.read_record(tmp_path) is None, b
        assert _checkout.spec_of(tmp_path) is None, b
        assert _checkout.shard_of(tmp_path / "model.safetensors") is None, b
    rec.write_text(json.dumps(good))
    assert _checkout.spec_of(tmp_path) == "m@2"
    assert _checkout.shard_of(tmp_path / "model.safetensors")[1:] == (0, "model.safetensors")
    assert _checkout.shard_of(tmp_path / "other.safetensors") is None


def test_http_origin_sidecar_files_are_the_well_known_names(build_dir, tmp_path):
    """An http(s) origin cannot be listed: the importer asks for the
    well-known names beside the checkpoint, keeps those answered 200 (one
    over the per-file cap skipped), ignores a 404, and asks for nothing
    else (a README.md beside them is not fetched)."""
    from harness.origin import Origin

    o = Origin(tmp_path / "origin").start()
    try:
        root = tmp_path / "origin" / "models" / "m"
        make_checkpoint(root / "model.safetensors", {"w": np.arange(8, dtype=np.float32)})
        keep = {"config.json": b'{"model_type": "bert"}', "tokenizer.json": b'{"v": 1}',
                "chat_template.jinja": b"{{ messages }}"}
        for p, b in keep.items():
            (root / p).write_bytes(b)
        (root / "vocab.txt").write_bytes(b"v" * (MAX + 1))
        (root / "README.md").write_bytes(b"not asked for")
        os.chmod(tmp_path, 0o755)
        dm = Daemon(build_dir, tmp_path, name="org",
                    settings={"import.origins": f"{o.url}/models/",
                              "import.sidecar_max_bytes": str(MAX)}).start()
        try:
            for i, src in enumerate((o.url_of("models/m/"), o.url_of("models/m/model.safetensors"))):
                job = dm.import_ok("m", src)
                assert job["result"]["n_files"] == len(keep), job
                assert job["result"]["skipped"] == [f"skipped: vocab.txt ({MAX + 1} bytes > {MAX})"]
                got = files_of(dm, "m", i + 1)
                assert sorted(got) == sorted(keep)
                for p, b in keep.items():
                    assert dm.get(f"/v1/models/m/generations/{i + 1}/files/{p}").body == b
            asked = {path for _, path, _, _, _ in o.requests()}
            assert "/models/m/merges.txt" in asked      # 404: ignored
            assert "/models/m/README.md" not in asked
            gets = [(m, p) for m, p, _, _, _ in o.requests() if p == "/models/m/vocab.txt"]
            assert gets and all(m == "HEAD" for m, _ in gets)  # over the cap: never fetched
        finally:
            assert dm.stop() == 0, dm.log_text()
    finally:
        o.stop()


def test_sidecar_files_are_published_with_the_generation(build_dir, tv_crash, tmp_path):
    """kill -9 inside the publishing transaction (crash point "publish")
    leaves no file and no content; right after its commit ("import.commit")
    the generation and its files are there together."""
    exe = os.path.join(os.path.abspath(build_dir), "tensorvault")
    store = str(tmp_path / "st")
    subprocess.run([exe, "store", "init", "--store", store, "--image", str(tmp_path / "img"),
                    "--size", "64M"], check=True, capture_output=True)
    src, keep = model_dir(tmp_path, "m")

    def rows():
        db = sqlite3.connect(f"file:{os.path.join(store, 'registry.db')}?mode=ro", uri=True)
        try:
            return [db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                    for t in ("generations", "generation_files", "sidecar_blobs")]
        finally:
            db.close()

    p = tv_crash("import", "--store", store, "m", src, crash_at="publish")
    assert p.returncode != 0
    assert rows() == [0, 0, 0]
    p = tv_crash("import", "--store", store, "m", src, crash_at="import.commit")
    assert p.returncode != 0
    assert rows() == [1, len(keep), len(keep)]
