"""Imports from the Hugging Face Hub, hf://REPO[@REVISION]
(server/import/src_hub.c), against a local Hub (harness.hub) whose CDN is
another host (127.0.0.2): a sharded repository through redirects, the bytes
equal to the official safetensors loader's, the repository and the commit
recorded (API and CLI); revisions by branch, tag and commit; a corrupted
blob, a gated repository (without and with the daemon's HF_TOKEN, which the
CDN never sees), a missing revision; the redirect policy (http:// refused,
more hops than the bound refused); a connection cut mid-file resumed with
Range; HF_ENDPOINT as a mirror."""
import json
import os
import sqlite3
import subprocess
import time

import pytest
from safetensors.numpy import load, save

from harness.daemon import Daemon
from harness.fleet import check_published, sample_tensors
from harness.hub import Hub

RANGE = 256 << 10  # import.http_range: several Range requests per shard
NO_HF_ENV = {"HF_TOKEN": None, "HF_ENDPOINT": None}


def sharded_files(seed, per=300_000):
    t = sample_tensors(seed, n=6, per=per)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:3],
              "model-00002-of-00002.safetensors": names[3:]}
    files, wm = {}, {}
    for shard, keys in shards.items():
        files[shard] = save({k: t[k] for k in keys})
        wm.update({k: shard for k in keys})
    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": wm}).encode()
    files["config.json"] = json.dumps({"model_type": "test", "seed": seed}).encode()
    files["tokenizer.json"] = b'{"version": "1.0"}'
    files["1_Pooling/config.json"] = b'{"pooling_mode_mean_tokens": true}'
    files["vocab.txt"] = b"tok\n" * 25_000  # over the daemon's import.sidecar_max_bytes
    files[".cache/x.json"] = b"{}"
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    files["pytorch_model.bin"] = b"not kept"
    return files


def big_files():
    """Two 20 MiB shards: the first takes longer than the importer's resume
    record interval (2 s) at the test's rate, so a record names flushed
    bytes while the second is fetched."""
    import numpy as np
    rng = np.random.default_rng(7)
    t = {f"big.{i}": rng.integers(0, 255, size=20 << 20, dtype=np.uint8) for i in range(2)}
    files = {"model-00001-of-00002.safetensors": save({"big.0": t["big.0"]}),
             "model-00002-of-00002.safetensors": save({"big.1": t["big.1"]})}
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {"big.0": "model-00001-of-00002.safetensors",
                                        "big.1": "model-00002-of-00002.safetensors"}}).encode()
    return files


def tensors_of(files):
    out = {}
    for name, data in files.items():
        if name.endswith(".safetensors"):
            out.update(load(data))
    return out


@pytest.fixture(scope="module")
def hub():
    h = Hub().start()
    from harness.hub import Repo
    r = Repo()
    h.v1 = sharded_files(1)
    h.c1 = r.commit(h.v1, refs=("main", "v1.0"))
    h.v2 = {"model.safetensors": save(sample_tensors(2)), "config.json": b'{"v": 2}'}
    h.c2 = r.commit(h.v2, refs=("dev",))
    h.repos["org/sharded"] = r
    g = Repo(gated_token="hf_gate_secret_0123")
    h.cg = g.commit({"model.safetensors": save(sample_tensors(3))})
    h.repos["org/gated"] = g
    n = Repo()
    n.commit({"pytorch_model.bin": b"x" * 100, "config.json": b"{}"})
    h.repos["org/noweights"] = n
    # one repository per test that must fetch (a shard stored already is bound, not fetched)
    for i, name in enumerate(("corrupt", "cut", "policy", "resume", "expire")):
        r = Repo()
        files = sharded_files(10 + i) if name != "resume" else big_files()
        r.commit(files)
        h.repos[f"org/{name}"] = r
        setattr(h, "files_" + name, files)
    try:
        yield h
    finally:
        h.stop()


def make_daemon(build_dir, tmp_path_factory, name, settings, env=None):
    work = tmp_path_factory.mktemp(name)
    s = {"store.image_size": "1G", "import.http_range": str(RANGE),
         "import.http_retries": "3", "import.http_timeout": "10"}
    s.update(settings)
    e = dict(NO_HF_ENV)
    e.update(env or {})
    return Daemon(os.path.abspath(build_dir), work, settings=s, env=e).start()


@pytest.fixture(scope="module")
def daemon(build_dir, hub, tmp_path_factory):
    d = make_daemon(build_dir, tmp_path_factory, "hub",
                    {"import.hf_endpoint": hub.url, "import.hf_redirect_http": "true",
                     "import.hf_redirect_private": "true", "import.sidecar_max_bytes": "64K"})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def fresh(hub):
    hub.reset()
    yield hub
    hub.reset()


def failed(d, model, source):
    j = d.wait_job(d.submit_import(model, source)["id"])
    assert j["state"] == "failed", j
    assert all(g["state"] != "ready" for g in d.generations(model))
    return j


def test_sharded_import_through_redirects(daemon, fresh, build_dir):
    hub = fresh
    j = daemon.import_ok("hub/sharded", "hf://org/sharded")
    assert j["result"]["n_shards"] == 2
    check_published(daemon, "hub/sharded", j["result"]["generation"], tensors_of(hub.v1))
    g = daemon.generations("hub/sharded")[-1]
    assert g["source"] == f"hf://org/sharded@{hub.c1}"
    assert g["source_repo"] == "org/sharded" and g["source_commit"] == hub.c1
    # every weight byte came from the CDN, after a 302 of the Hub's resolve route
    assert set(hub.cdn_bytes) == {"model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors"}
    for name, n in hub.cdn_bytes.items():
        assert len(hub.v1[name]) <= n <= 1.1 * len(hub.v1[name]), (name, n)
    resolves = [r for r in hub.requests if r[1] == "hub" and "/resolve/" in r[2]]
    assert resolves and all(f"/resolve/{hub.c1}/" in r[2] for r in resolves), resolves
    assert any(r[3] == 302 for r in resolves)
    # the CDN sees GETs only (a presigned URL may refuse a HEAD): Range GETs, a first byte probed
    cdn = [r for r in hub.requests if r[1] == "cdn"]
    assert cdn and all(r[0] == "GET" and r[3] == 206 for r in cdn), cdn
    assert not any("pytorch_model.bin" in r[2] or ".gitattributes" in r[2] or ".cache" in r[2]
                   for r in resolves), resolves
    # the sidecars (small non-weight files) were fetched whole and checked (git blob SHA-1)
    got = {r[2].split(f"/resolve/{hub.c1}/", 1)[1] for r in resolves
           if r[0] == "GET" and r[3] == 200}
    assert {"config.json", "tokenizer.json", "1_Pooling/config.json",
            "model.safetensors.index.json"} <= got, got
    # the sidecars arrived with the generation, byte for byte; the rest did not
    gen = g["generation"]
    listed = daemon.ok("GET", f"/v1/models/hub%2Fsharded/generations/{gen}/files")["files"]
    side = {"config.json", "tokenizer.json", "1_Pooling/config.json"}
    assert {f["path"] for f in listed} == side, listed
    for name in side:
        r = daemon.get(f"/v1/models/hub%2Fsharded/generations/{gen}/files/{name}")
        assert r.status == 200 and r.body == hub.v1[name], (name, r)
    assert j["result"]["n_files"] == 3, j["result"]
    assert [x for x in j["result"]["skipped"] if "vocab.txt" in x], j["result"]
    assert not any("vocab.txt" in r[2] and r[0] == "GET" for r in resolves)  # never fetched
    # the CLI shows the repository and the commit
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    url = f"http://127.0.0.1:{daemon.port}"
    p = subprocess.run([exe, "generation", f"hub/sharded@{g['generation']}", "--url", url],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "org/sharded" in p.stdout and hub.c1 in p.stdout, p.stdout
    p = subprocess.run([exe, "generations", "hub/sharded", "--url", url],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and f"hf://org/sharded@{hub.c1}" in p.stdout, p.stdout + p.stderr
    # the CLI sends an hf:// source as it is (with its HF_TOKEN left at home)
    env["HF_TOKEN"] = "hf_client_token_not_sent"
    p = subprocess.run([exe, "import", "hub/cli", "hf://org/sharded@v1.0", "--wait", "--json",
                        "--url", url], capture_output=True, text=True, env=env, timeout=120,
                       cwd=daemon.workdir)  # ./var/admin.token
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    gen = doc.get("generation") or doc["result"]["generation"]
    assert daemon.generations("hub/cli")[-1]["source_commit"] == hub.c1
    check_published(daemon, "hub/cli", gen, tensors_of(hub.v1))
    assert hub.cdn_auth == [] and "hf_client_token_not_sent" not in daemon.log_text()
    p = subprocess.run([exe, "import", "hub/cli", "hf://org/a--b", "--url", url],
                       capture_output=True, text=True, env=env, timeout=60, cwd=daemon.workdir)
    assert p.returncode == 1 and "TV_E_BAD_REQUEST" in p.stderr, p.stderr


def test_revisions_by_branch_tag_and_commit(daemon, fresh):
    hub = fresh
    for rev, commit, files in (("dev", hub.c2, hub.v2), ("v1.0", hub.c1, hub.v1),
                               (hub.c2, hub.c2, hub.v2)):
        j = daemon.import_ok("hub/revs", f"hf://org/sharded@{rev}")
        assert j["source"] == f"hf://org/sharded@{rev}"
        gen = j["result"]["generation"]
        g = [x for x in daemon.generations("hub/revs") if x["generation"] == gen][0]
        assert g["source_commit"] == commit, (rev, g)
        check_published(daemon, "hub/revs", gen, tensors_of(files))
    # files were always named at the commit, never at the branch or tag
    assert set(hub.resolved_revs) <= {hub.c1, hub.c2}, hub.resolved_revs


def test_corrupted_blob_fails_naming_the_file(daemon, fresh):
    free = daemon.device()["free_bytes"]
    fresh.corrupt.add("model-00002-of-00002.safetensors")
    j = failed(daemon, "hub/corrupt", "hf://org/corrupt")
    assert j["error"]["code"] == "TV_E_HASH_MISMATCH", j
    assert "model-00002-of-00002.safetensors" in j["error"]["message"], j
    assert daemon.device()["free_bytes"] == free  # no reservation ('writing' object) left
    # a file kept in git (a sidecar): its git blob SHA-1, before any weight byte
    fresh.reset()
    fresh.corrupt.add("config.json")
    j = failed(daemon, "hub/corrupt", "hf://org/corrupt")
    assert j["error"]["code"] == "TV_E_HASH_MISMATCH" and "'config.json'" in \
        j["error"]["message"] and "git blob" in j["error"]["message"], j
    assert not fresh.cdn_bytes.get("model-00001-of-00002.safetensors"), fresh.cdn_bytes


def test_missing_revision_repo_and_weights(daemon, fresh):
    j = failed(daemon, "hub/missing", "hf://org/sharded@nope")
    msg = j["error"]["message"]
    assert "RevisionNotFound" in msg and "hf://org/sharded@nope" in msg, j
    j = failed(daemon, "hub/missing", "hf://org/absent")
    assert "RepoNotFound" in j["error"]["message"] and "org/absent" in j["error"]["message"], j
    j = failed(daemon, "hub/missing", "hf://org/noweights")
    assert j["error"]["code"] == "TV_E_CKPT_NOT_FOUND" and "safetensors" in j["error"]["message"]
    # malformed sources are refused before a job exists
    for bad in ("hf://org/../x", "hf://org/a--b", "hf://org/x@", "hf://a/b/c", "hf://org/x@a..b"):
        r = daemon.request("POST", "/v1/imports", body={"model": "hub/bad", "source": bad})
        assert r.status == 400, (bad, r)


def test_gated_repository_and_token(daemon, fresh, build_dir, hub, tmp_path_factory):
    j = failed(daemon, "hub/gated", "hf://org/gated")
    msg = j["error"]["message"]
    assert j["error"]["code"] == "TV_E_FORBIDDEN" and "401" in msg and "GatedRepo" in msg, j
    assert "hf://org/gated" in msg and "HF_TOKEN" in msg, j
    assert len([r for r in hub.requests if r[3] == 401]) == 1  # a 4xx is not tried again
    # the daemon's HF_TOKEN opens it, HF_ENDPOINT (a mirror) overrides the config's
    # endpoint, and the CDN never sees the token
    d = make_daemon(build_dir, tmp_path_factory, "hubtok",
                    {"import.hf_endpoint": "http://127.0.0.1:9/",
                     "import.hf_redirect_http": "true", "import.hf_redirect_private": "true"},
                    env={"HF_TOKEN": "hf_gate_secret_0123", "HF_ENDPOINT": hub.url})
    try:
        hub.reset()
        j = d.import_ok("hub/gated", "hf://org/gated")
        assert d.generations("hub/gated")[-1]["source_commit"] == hub.cg
        assert hub.cdn_bytes and hub.cdn_auth == [], hub.cdn_auth
    finally:
        d.stop()


def test_redirect_policy(daemon, fresh, build_dir, hub, tmp_path_factory):
    # more hops than the bound
    fresh.loop = True
    j = failed(daemon, "hub/loop", "hf://org/policy")
    assert "more than 5 redirects" in j["error"]["message"], j
    fresh.loop = False
    # https only by default: the CDN's http:// is refused; and private addresses too
    tok = tmp_path_factory.mktemp("hubtokfile") / "hf.token"
    tok.write_text("hf_gate_secret_0123\n")
    tok.chmod(0o600)
    for settings, want in (({"import.hf_token_file": str(tok)}, "only https:// redirects"),
                           ({"import.hf_redirect_http": "true"}, "private")):
        d = make_daemon(build_dir, tmp_path_factory, "hubstrict",
                        dict({"import.hf_endpoint": hub.url}, **settings))
        try:
            j = failed(d, "hub/strict", "hf://org/policy")
            assert j["error"]["code"] == "TV_E_FORBIDDEN" and want in j["error"]["message"], j
            if "import.hf_token_file" in settings:
                # the token file's token passes the gate: the policy stops it at the CDN
                j = failed(d, "hub/strict", "hf://org/gated")
                assert want in j["error"]["message"] and "GatedRepo" not in \
                    j["error"]["message"], j
        finally:
            d.stop()


def test_expired_cdn_url_keeps_the_reservations(daemon, fresh):
    """A CDN URL that stops answering (403, an expired presigned URL) fails
    the job as a transient error: the same import again resolves anew."""
    free = daemon.device()["free_bytes"]
    fresh.expired.add("model-00002-of-00002.safetensors")
    j = failed(daemon, "hub/expire", "hf://org/expire")
    assert "presigned URL may have expired" in j["error"]["message"], j
    assert "model-00002-of-00002.safetensors" in j["error"]["message"], j
    assert daemon.device()["free_bytes"] < free  # its reservations are kept for the next try
    fresh.expired.clear()
    j2 = daemon.import_ok("hub/expire", "hf://org/expire")
    assert f"taking up job {j['id']}'s record: " in daemon.log_text()
    j = j2
    check_published(daemon, "hub/expire", j["result"]["generation"],
                    tensors_of(fresh.files_expire))
    assert daemon.device()["free_bytes"] < free


def test_cut_connection_resumes_with_range(daemon, fresh):
    hub = fresh
    name = "model-00001-of-00002.safetensors"
    hub.cut_once.add(name)
    j = daemon.import_ok("hub/cut", "hf://org/cut")
    check_published(daemon, "hub/cut", j["result"]["generation"], tensors_of(hub.files_cut))
    assert not hub.cut_once  # the cut happened
    assert any(r[1] == "cdn-cut" for r in hub.requests)
    # only the cut range was fetched again, not the whole file
    assert hub.cdn_bytes[name] < 1.5 * len(hub.files_cut[name]), (hub.cdn_bytes, len(hub.files_cut[name]))


def resume_done(d, job_id):
    """Bytes the job's resume record names written and flushed (0: none)."""
    con = sqlite3.connect(f"file:{os.path.join(d.store, 'registry.db')}?mode=ro", uri=True,
                          timeout=10)
    try:
        row = con.execute("SELECT resume FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    if not row or not row[0]:
        return 0
    return sum(o["done"] for o in json.loads(row[0])["objects"])


def test_interrupted_job_resumes(build_dir, hub, tmp_path_factory):
    """A daemon killed mid-import keeps what it flushed; the same import
    again takes it over and fetches only the rest."""
    hub.reset()
    files = hub.files_resume
    d = make_daemon(build_dir, tmp_path_factory, "hubresume",
                    {"import.hf_endpoint": hub.url, "import.hf_redirect_http": "true",
                     "import.hf_redirect_private": "true", "import.http_range": "2M"})
    try:
        hub.throttle = 8 << 20  # shard 1 takes longer than RESUME_EVERY_S (import.c)
        job = d.submit_import("hub/resume", "hf://org/resume")["id"]
        deadline = time.monotonic() + 60
        while (done := resume_done(d, job)) < 20 << 20:  # the first shard written and flushed
            assert time.monotonic() < deadline, d.job(job)
            assert d.job(job)["state"] in ("queued", "running"), d.job(job)
            if done:  # records are being kept: slow the rest down, so that a
                # poller that loses the CPU for a few seconds still sees the
                # record name the first shard before the job ends
                hub.throttle = 2 << 20
            time.sleep(0.05)
        d.kill9()
        d.start()
        hub.throttle = None
        hub.cdn_bytes.clear()
        j = d.import_ok("hub/resume", "hf://org/resume")
        res = j["result"]
        assert res["resumed_bytes"] >= 20 << 20, res
        check_published(d, "hub/resume", res["generation"], tensors_of(files))
        # what was resumed was not fetched again
        total = sum(len(v) for k, v in files.items() if k.endswith(".safetensors"))
        assert sum(hub.cdn_bytes.values()) <= total - res["resumed_bytes"] + (1 << 20), \
            (hub.cdn_bytes, res)
    finally:
        hub.throttle = None
        d.stop()


def test_local_mode_uses_its_own_environment(build_dir, hub, tmp_path):
    """tensorvault import --store: this process fetches, with HF_ENDPOINT and
    HF_TOKEN of its own environment, under the default redirect policy
    (https only: the local Hub's http:// CDN is refused once the gate let
    the token through); both the inline job and the direct importer."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    store = tmp_path / "s"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    env.update({"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_gate_secret_0123"})
    p = subprocess.run([exe, "store", "init", "--store", str(store), "--image",
                        str(tmp_path / "img"), "--size", "256M"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    for extra in ([], ["--chunk", "1M"]):
        p = subprocess.run([exe, "import", "--store", str(store), "hub/local", "hf://org/gated",
                            "--wait", *extra], capture_output=True, text=True, env=env,
                           timeout=60)
        assert p.returncode == 1 and "only https:// redirects" in p.stderr, (extra, p.stderr)
        assert "hf://org/gated@main" in p.stderr and "GatedRepo" not in p.stderr, p.stderr
