"""Imports from an S3-compatible object store (s3:// sources of
server/import/src_http.c) against the `s3` fixture (moto, checking SigV4):
a single file, a two-shard index and a directory prefix through REST and
the CLI, the bytes equal the official safetensors loader's; a wrong secret
fails the job with a 403 naming bucket and key, never the secret; a
missing key fails naming it; a bucket or prefix outside import.origins is
refused at submit; credentials and endpoint from the AWS_* environment."""
import json
import os
import subprocess
import tempfile

import pytest
from safetensors.numpy import load_file, save_file

from harness.daemon import Daemon
from harness.fleet import check_published, failed_job, sample_tensors

BUCKET = "tv-import"
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
NO_AWS_ENV = {k: None for k in AWS_VARS}  # what the runner's environment holds stays out


def s3_settings(s3, secret=None):
    return {"store.image_size": "1G", "import.origins": f"s3://{BUCKET}/models/",
            "import.http_range": str(256 << 10), "import.http_retries": "1",
            "import.http_timeout": "10", "s3.endpoint": s3.endpoint, "s3.region": s3.region,
            "s3.access_key_id": s3.access_key, "s3.secret_access_key": secret or s3.secret_key}


@pytest.fixture(scope="module")
def store(s3):
    s3.bucket(BUCKET)
    return s3


@pytest.fixture(scope="module")
def daemon(build_dir, store, tmp_path_factory):
    d = Daemon(os.path.abspath(build_dir), tmp_path_factory.mktemp("s3src"),
               settings=s3_settings(store), env=NO_AWS_ENV)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def upload(s3, key, t):
    """Saves t with the official writer, uploads it as key; returns what the
    official loader reads back from the same bytes."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.safetensors")
        save_file(t, p)
        with open(p, "rb") as f:
            s3.put(BUCKET, key, f.read())
        return load_file(p)


def put_single(s3, key, seed):
    return upload(s3, key, sample_tensors(seed))


def put_index(s3, prefix, seed):
    t = sample_tensors(seed, n=6)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:3],
              "model-00002-of-00002.safetensors": names[3:]}
    want, wm = {}, {}
    for shard, keys in shards.items():
        want.update(upload(s3, f"{prefix}/{shard}", {k: t[k] for k in keys}))
        wm.update({k: shard for k in keys})
    s3.put(BUCKET, f"{prefix}/model.safetensors.index.json",
           json.dumps({"metadata": {}, "weight_map": wm}).encode())
    return want


def test_single_index_and_prefix_rest(daemon, store):
    want = put_single(store, "models/one/model.safetensors", 1)
    url = f"s3://{BUCKET}/models/one/model.safetensors"
    j = daemon.import_ok("s3/one", url)
    assert j["source"] == url and j["result"]["n_shards"] == 1
    check_published(daemon, "s3/one", j["generation"], want)
    assert daemon.generations("s3/one")[-1]["source"] == url
    # a directory prefix with only model.safetensors
    j = daemon.import_ok("s3/one", f"s3://{BUCKET}/models/one/")
    check_published(daemon, "s3/one", j["generation"], want)

    want = put_index(store, "models/two", 2)
    j = daemon.import_ok("s3/two", f"s3://{BUCKET}/models/two/model.safetensors.index.json")
    assert j["result"]["n_shards"] == 2
    check_published(daemon, "s3/two", j["generation"], want)
    # the prefix form finds the index; the same bytes deduplicate
    j = daemon.import_ok("s3/two", f"s3://{BUCKET}/models/two/")
    assert j["result"]["n_shards"] == 2 and j["result"]["deduplicated_bytes"] > 0
    check_published(daemon, "s3/two", j["generation"], want)
    # the secret never reaches the log
    assert store.secret_key not in daemon.log_text()


def test_cli_import(daemon, store, build_dir):
    want = put_single(store, "models/cli/a b.safetensors", 4)
    url = f"s3://{BUCKET}/models/cli/a%20b.safetensors"
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    p = subprocess.run([exe, "import", "s3/cli", url, "--wait", "--json", "--url",
                        f"http://127.0.0.1:{daemon.port}"], capture_output=True, text=True,
                       cwd=daemon.workdir, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    check_published(daemon, "s3/cli", doc.get("generation") or doc["result"]["generation"], want)


def test_wrong_secret_fails_403_without_the_secret(build_dir, store, tmp_path):
    put_single(store, "models/sec/model.safetensors", 5)
    wrong = "tv-wrong-secret-ZYXWVUTSRQPONMLKJIHGFEDCBA"
    d = Daemon(os.path.abspath(build_dir), tmp_path, settings=s3_settings(store, wrong),
               env=NO_AWS_ENV)
    d.start()
    try:
        j = failed_job(d, "s3/sec", f"s3://{BUCKET}/models/sec/model.safetensors")
        msg = j["error"]["message"]
        assert j["error"]["code"] == "TV_E_FORBIDDEN", j["error"]
        assert "403" in msg and f"bucket '{BUCKET}'" in msg, msg
        assert "models/sec/model.safetensors" in msg, msg
        text = json.dumps(j)
        assert wrong not in text and store.secret_key not in text
        assert wrong not in d.log_text() and store.secret_key not in d.log_text()
    finally:
        d.stop()
    assert wrong not in d.log_text()


def test_missing_key_fails_naming_it(daemon, store):
    j = failed_job(daemon, "s3/missing", f"s3://{BUCKET}/models/nothing/here.safetensors")
    assert j["error"]["code"] == "TV_E_CKPT_NOT_FOUND", j["error"]
    assert f"/{BUCKET}/models/nothing/here.safetensors" in j["error"]["message"], j["error"]
    assert "404" in j["error"]["message"], j["error"]
    # a prefix holding neither file
    j = failed_job(daemon, "s3/missing", f"s3://{BUCKET}/models/nothing/")
    assert j["error"]["code"] == "TV_E_CKPT_NOT_FOUND", j["error"]
    assert "model.safetensors.index.json" in j["error"]["message"], j["error"]
    # a shard the index names that is not there
    put_index(store, "models/hole", 6)
    store.delete(BUCKET, "models/hole/model-00002-of-00002.safetensors")
    j = failed_job(daemon, "s3/hole", f"s3://{BUCKET}/models/hole/model.safetensors.index.json")
    assert "model-00002-of-00002.safetensors" in j["error"]["message"], j["error"]


def test_outside_origins_refused_at_submit(daemon, store):
    store.bucket("tv-other")
    store.put("tv-other", "models/x.safetensors", b"\0" * 16)
    for bad in ("s3://tv-other/models/x.safetensors",  # another bucket
                f"s3://{BUCKET}/modelsx/x.safetensors",  # not on a '/' boundary
                f"s3://{BUCKET}/x.safetensors",
                f"{store.endpoint}/{BUCKET}/models/one/model.safetensors"):  # http, not s3
        r = daemon.request("POST", "/v1/imports", body={"model": "x", "source": bad})
        assert r.status == 403, (bad, r)
        err = r.json()["error"]
        assert err["code"] == "TV_E_OUTSIDE_ROOTS" and "import.origins" in err["message"], err
        assert bad in err["message"], err
    for bad in ("s3://Tv-Import/models/x.safetensors", "s3://key:secret@tv-import/models/x",
                f"s3://{BUCKET}/models/../x.safetensors"):
        r = daemon.request("POST", "/v1/imports", body={"model": "x", "source": bad})
        assert r.status == 400, (bad, r)
        assert "secret" not in r.json()["error"]["message"]


def test_credentials_from_the_environment(build_dir, store, tmp_path):
    want = put_single(store, "models/env/model.safetensors", 7)
    env = dict(NO_AWS_ENV, AWS_ENDPOINT_URL=store.endpoint, AWS_REGION=store.region,
               AWS_ACCESS_KEY_ID=store.access_key, AWS_SECRET_ACCESS_KEY=store.secret_key)
    d = Daemon(os.path.abspath(build_dir), tmp_path,
               settings={"store.image_size": "256M", "import.origins": f"s3://{BUCKET}/models/"},
               env=env)
    d.start()
    try:
        j = d.import_ok("s3/env", f"s3://{BUCKET}/models/env/model.safetensors")
        check_published(d, "s3/env", j["generation"], want)
        assert store.secret_key not in d.log_text()
    finally:
        d.stop()
