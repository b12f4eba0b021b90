"""Imports from an HTTP origin (server/import/src_http.c): a single
file, a two-shard index and a directory URL, through REST and the CLI; the
bytes published equal the official safetensors loader's; the origin serves
about one copy; faults mid-shard are retried; persistent failures, a bad
header and a file replaced mid-import fail with nothing published and no
space used; import.origins and URLs with credentials are enforced."""
import json
import os
import shutil
import subprocess
import time
import urllib.parse

import pytest
from safetensors.numpy import load_file, save_file

from harness.daemon import Daemon
from harness.fleet import check_published, failed_job, sample_tensors

RANGE = 256 << 10  # import.http_range: several requests per shard


@pytest.fixture(scope="module")
def daemon(build_dir, origin, tmp_path_factory):
    work = tmp_path_factory.mktemp("httpsrc")
    d = Daemon(os.path.abspath(build_dir), work,
               settings={"store.image_size": "1G", "import.origins": origin.url + "/models/",
                         "import.http_range": str(RANGE), "import.http_retries": "4",
                         "import.http_timeout": "10"})
    d.start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def fresh(origin):
    origin.clear_faults()
    origin.reset_counters()
    yield origin
    origin.clear_faults()
    if "_log" in vars(origin):
        del origin._log


def put_single(origin, rel, seed):
    path = os.path.join(origin.root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(sample_tensors(seed), path)
    return path


def put_index(origin, reldir, seed):
    d = os.path.join(origin.root, reldir)
    os.makedirs(d, exist_ok=True)
    t = sample_tensors(seed, n=6)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:3],
              "model-00002-of-00002.safetensors": names[3:]}
    wm = {}
    for shard, keys in shards.items():
        save_file({k: t[k] for k in keys}, os.path.join(d, shard))
        wm.update({k: shard for k in keys})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    return d, [os.path.join(d, s) for s in shards]


def expected(paths):
    out = {}
    for p in paths:
        out.update(load_file(p))
    return out


def file_bytes(paths):
    return sum(os.path.getsize(p) for p in paths)


def on_first_data_range(origin, relpath, action):
    """Runs action() once, when the origin answers the first Range GET of
    relpath past its header (the import's first data range)."""
    orig = type(origin)._log.__get__(origin)
    fired = []
    path = "/" + relpath

    def hook(method, p, rng, status, sent):
        orig(method, p, rng, status, sent)
        if fired or method != "GET" or p != path or not rng or status != 206:
            return
        start = int(rng.split("=")[1].split("-")[0])
        if start >= 8 + 4096:  # past any header of these checkpoints
            fired.append(1)
            action()

    origin._log = hook
    return fired


def free_bytes(d):
    return d.device()["free_bytes"]


def test_single_file_rest(daemon, fresh):
    path = put_single(fresh, "models/one/model.safetensors", 1)
    url = fresh.url_of("models/one/model.safetensors")
    j = daemon.import_ok("http/one", url)
    assert j["source"] == url
    assert j["result"]["n_shards"] == 1
    check_published(daemon, "http/one", j["generation"], expected([path]))
    n = file_bytes([path])
    assert n <= fresh.bytes_served() <= 1.1 * n, (fresh.bytes_served(), n)
    gens = daemon.generations("http/one")
    assert gens[-1]["source"] == url
    # a HEAD, then Range GETs of at most import.http_range bytes, all 206
    reqs = [r for r in fresh.requests() if r[1] == "/models/one/model.safetensors"]
    assert reqs[0][0] == "HEAD" and reqs[0][3] == 200, reqs
    gets = [r for r in reqs if r[0] == "GET"]
    assert all(r[2] and r[3] == 206 and r[4] <= RANGE for r in gets), gets
    assert len(gets) >= n // RANGE, gets


def test_index_and_directory_rest(daemon, fresh):
    d, shards = put_index(fresh, "models/two", 2)
    url = fresh.url_of("models/two/model.safetensors.index.json")
    j = daemon.import_ok("http/two", url)
    assert j["result"]["n_shards"] == 2
    check_published(daemon, "http/two", j["generation"], expected(shards))
    n = file_bytes(shards) + os.path.getsize(os.path.join(d, "model.safetensors.index.json"))
    assert n <= fresh.bytes_served() <= 1.1 * n, (fresh.bytes_served(), n)
    # the directory form finds the index; the same bytes deduplicate
    fresh.reset_counters()
    j = daemon.import_ok("http/two", fresh.url + "/models/two/")
    assert j["result"]["n_shards"] == 2 and j["result"]["deduplicated_bytes"] > 0
    check_published(daemon, "http/two", j["generation"], expected(shards))
    # a directory with only model.safetensors
    path = put_single(fresh, "models/dir1/model.safetensors", 3)
    j = daemon.import_ok("http/dir1", fresh.url + "/models/dir1/")
    check_published(daemon, "http/dir1", j["generation"], expected([path]))


def test_cli_import(daemon, fresh, build_dir):
    path = put_single(fresh, "models/cli/a b.safetensors", 4)
    url = fresh.url_of("models/cli/a b.safetensors")
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    p = subprocess.run([exe, "import", "http/cli", url, "--wait", "--json", "--url",
                        f"http://127.0.0.1:{daemon.port}"], capture_output=True, text=True,
                       cwd=daemon.workdir, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    gen = doc.get("generation") or doc["result"]["generation"]
    check_published(daemon, "http/cli", gen, expected([path]))


@pytest.mark.parametrize("fault", ["fail500", "truncate"])
def test_mid_shard_faults_are_retried(daemon, fresh, fault):
    rel = f"models/retry-{fault}/model.safetensors"
    path = put_single(fresh, rel, 10 + len(fault))
    if fault == "fail500":
        fired = on_first_data_range(fresh, rel, lambda: fresh.fail_next(2, 500, rel))
    else:
        fired = on_first_data_range(fresh, rel,
                                    lambda: fresh.truncate_next(1, after=1000, path=rel))
    j = daemon.import_ok(f"http/retry-{fault}", fresh.url_of(rel))
    assert fired
    check_published(daemon, f"http/retry-{fault}", j["generation"], expected([path]))
    statuses = [r[3] for r in fresh.requests() if r[1] == "/" + rel]
    if fault == "fail500":
        assert statuses.count(500) == 2, statuses
    assert "trying again" in daemon.log_text()


def test_persistent_failure_fails_the_job(daemon, fresh):
    rel = "models/down/model.safetensors"
    put_single(fresh, rel, 20)
    free0 = free_bytes(daemon)
    fired = on_first_data_range(fresh, rel, lambda: fresh.fail_next(100, 503, rel))
    j = failed_job(daemon, "http/down", fresh.url_of(rel))
    assert fired
    msg = j["error"]["message"]
    assert fresh.url_of(rel) in msg and "503" in msg and "tries" in msg, msg
    assert free_bytes(daemon) == free0


def test_invalid_header_fails_before_writing(daemon, fresh):
    rel = "models/bad/model.safetensors"
    os.makedirs(os.path.join(fresh.root, "models/bad"), exist_ok=True)
    hdr = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]'  # no closing brace
    with open(os.path.join(fresh.root, rel), "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + bytes(16) + bytes(1 << 20))
    free0 = free_bytes(daemon)
    j = failed_job(daemon, "http/bad", fresh.url_of(rel))
    assert j["error"]["code"].startswith("TV_E_ST_"), j["error"]
    assert free_bytes(daemon) == free0
    # only the prefix and the header were read
    assert fresh.bytes_served() <= 8 + len(hdr), fresh.requests()


def test_replaced_mid_import_fails_changed(daemon, fresh):
    rel = "models/moving/model.safetensors"
    path = put_single(fresh, rel, 30)
    other = os.path.join(fresh.root, "models/moving/other")
    save_file(sample_tensors(31), other)  # same shapes, other bytes
    assert os.path.getsize(other) == os.path.getsize(path)
    free0 = free_bytes(daemon)

    def replace():
        time.sleep(0.01)
        os.replace(other, path)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    fired = on_first_data_range(fresh, rel, replace)
    j = failed_job(daemon, "http/moving", fresh.url_of(rel))
    assert fired
    assert j["error"]["code"] == "TV_E_SOURCE_CHANGED", j["error"]
    assert "changed" in j["error"]["message"], j["error"]
    assert free_bytes(daemon) == free0


def test_origins_and_credentials(daemon, fresh, build_dir, tmp_path):
    put_single(fresh, "other/x.safetensors", 40)
    r = daemon.request("POST", "/v1/imports",
                       body={"model": "x", "source": fresh.url_of("other/x.safetensors")})
    assert r.status == 403 and r.json()["error"]["code"] == "TV_E_OUTSIDE_ROOTS", r
    assert "import.origins" in r.json()["error"]["message"]
    # a prefix of the host name or port is not the origin
    u = urllib.parse.urlsplit(fresh.url)
    for bad in (f"http://{u.hostname}:{u.port}0/models/x.safetensors",
                f"https://{u.hostname}:{u.port}/models/x.safetensors",
                f"{fresh.url}/models/../other/x.safetensors",
                f"{fresh.url}/models/%2e%2e/other/x.safetensors"):
        r = daemon.request("POST", "/v1/imports", body={"model": "x", "source": bad})
        assert r.status in (400, 403), (bad, r)
    cred = f"http://user:pw@{u.hostname}:{u.port}/models/one/model.safetensors"
    r = daemon.request("POST", "/v1/imports", body={"model": "x", "source": cred})
    assert r.status == 400 and r.json()["error"]["code"] == "TV_E_BAD_REQUEST", r
    assert "pw" not in r.json()["error"]["message"]
    # a daemon without import.origins refuses every URL, naming the key
    d2 = Daemon(os.path.abspath(build_dir), tmp_path, settings={"store.image_size": "64M"})
    d2.start()
    try:
        r = d2.request("POST", "/v1/imports",
                       body={"model": "x", "source": fresh.url_of("models/one/model.safetensors")})
        assert r.status == 403 and "import.origins" in r.json()["error"]["message"], r
    finally:
        d2.stop()


def test_redirects_and_missing_files_fail(daemon, fresh):
    rel = "models/redir/model.safetensors"
    put_single(fresh, rel, 50)
    fresh.fail_next(1, 302, rel)
    j = failed_job(daemon, "http/redir", fresh.url_of(rel))
    assert "302" in j["error"]["message"] and "redirects are not followed" in \
        j["error"]["message"], j["error"]
    os.makedirs(os.path.join(fresh.root, "models/empty"), exist_ok=True)
    j = failed_job(daemon, "http/empty", fresh.url + "/models/empty/")
    assert j["error"]["code"] == "TV_E_CKPT_NOT_FOUND", j["error"]
    assert "model.safetensors.index.json" in j["error"]["message"], j["error"]
    # a shard the index names that is not there
    d, shards = put_index(fresh, "models/hole", 51)
    os.unlink(shards[1])
    j = failed_job(daemon, "http/hole", fresh.url_of("models/hole/model.safetensors.index.json"))
    assert "404" in j["error"]["message"], j["error"]
    # a URL that names neither a file kind nor a directory
    j = failed_job(daemon, "http/kind", fresh.url + "/models/hole/model.bin")
    assert j["error"]["code"] == "TV_E_BAD_REQUEST", j["error"]
