"""Resumable remote imports and fleet pulls (migrations/0005_job_resume.sql,
import.h "Resume"): an import from an HTTP origin that is killed (SIGKILL)
or loses its origin half-way keeps its reservations and, in its job row,
how far each one is written and flushed; the same import again re-hashes
those bytes from the device and fetches only the rest. The bytes published
equal the official loader's; an origin whose file changed in between (a new
ETag) is fetched whole and the stale reservations are released. A fleet pull
(its job's source fleet:MODEL@N) is resumed the same way by the pull the
restarted node starts: its peers are asked only for the rest."""
import hashlib
import json
import os
import sqlite3
import subprocess
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from harness.daemon import Daemon
from harness.fleet import check_published
from harness.wait import wait_for

SHARD_MB = 24
RATE = 4 << 20  # bytes/s the origin sends while the test wants the import half-way


@pytest.fixture
def daemon(build_dir, origin, tmp_path):
    (tmp_path / "node").mkdir()
    d = Daemon(os.path.abspath(build_dir), tmp_path / "node",
               settings={"store.image_size": "512M", "import.origins": origin.url + "/models/",
                         "import.http_retries": "1", "import.http_timeout": "10"})
    d.start()
    yield d
    origin.throttle(None)
    origin.clear_faults()
    d.stop()


def put_model(origin, name, seed, shard_mb=SHARD_MB):
    """Two shards of SHARD_MB MiB of float32 plus an index; returns the URL
    of the index and the tensors as the official loader reads them."""
    d = os.path.join(origin.root, "models", name)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = shard_mb * (1 << 20) // 4 // 2
    wm, paths = {}, []
    for i in (1, 2):
        shard = f"model-0000{i}-of-00002.safetensors"
        t = {f"s{i}.a": rng.standard_normal(n, dtype=np.float32),
             f"s{i}.b": rng.standard_normal(n, dtype=np.float32).reshape(-1, 64)}
        save_file(t, os.path.join(d, shard))
        wm.update({k: shard for k in t})
        paths.append(os.path.join(d, shard))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    want = {}
    for p in paths:
        want.update(load_file(p))
    return origin.url_of(f"models/{name}/model.safetensors.index.json"), want, paths


def registry(d):
    con = sqlite3.connect(f"file:{os.path.join(d.store, 'registry.db')}?mode=ro", uri=True,
                          timeout=10)
    con.row_factory = sqlite3.Row
    return con


def resume_done(d, job_id):
    """Bytes the job's resume record says are written and flushed (0: none)."""
    with registry(d) as con:
        row = con.execute("SELECT resume FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if not row or not row["resume"]:
        return 0
    return sum(o["done"] for o in json.loads(row["resume"])["objects"])


def writing_objects(d):
    with registry(d) as con:
        return con.execute("SELECT count(*) FROM objects WHERE state = 'writing'").fetchone()[0]


def records(d):
    with registry(d) as con:
        return con.execute("SELECT count(*) FROM jobs WHERE resume IS NOT NULL").fetchone()[0]


def half_way(d, origin, model, url):
    """Starts the import throttled and returns its job id once a record
    names at least one chunk written and flushed, well before the end."""
    origin.throttle(RATE)
    job = d.submit_import(model, url)["id"]
    wait_for(lambda: resume_done(d, job) >= 8 << 20, timeout=60, what="a resume record")
    assert d.job(job)["state"] == "running"
    return job


def test_killed_mid_import_resumes(daemon, origin, tmp_path):
    url, want, paths = put_model(origin, "crash", 1)
    total = sum(os.path.getsize(p) for p in paths)
    first = half_way(daemon, origin, "crash", url)
    daemon.kill9()
    daemon.start()
    assert "kept" in daemon.log_text() and "reservations for interrupted imports" in \
        daemon.log_text(), daemon.log_text()
    j = daemon.job(first)
    assert j["state"] == "failed" and "interrupted" in j["error"]["message"], j
    assert writing_objects(daemon) >= 1 and records(daemon) == 1
    origin.throttle(None)
    origin.reset_counters()
    job = daemon.import_ok("crash", url)
    res = job["result"]
    assert res["resumed_bytes"] >= 8 << 20, res
    assert res["resumed_bytes"] < total
    # the origin sent the rest (and the headers again), not the whole model
    served = origin.bytes_served()
    assert served <= total - res["resumed_bytes"] + (1 << 20), (served, res)
    check_published(daemon, "crash", res["generation"], want)
    assert writing_objects(daemon) == 0 and records(daemon) == 0
    assert "resumed from the device" in daemon.log_text()


def test_origin_lost_mid_import_resumes(daemon, origin):
    # shards of three 16 MiB chunks: requests not yet sent when the origin goes
    url, want, paths = put_model(origin, "lost", 2, shard_mb=48)
    total = sum(os.path.getsize(p) for p in paths)
    first = half_way(daemon, origin, "lost", url)
    origin.fail_next(100000, 503)  # the origin is gone: every range fails
    j = daemon.wait_job(first, timeout=120)
    assert j["state"] == "failed" and j["error"]["code"] == "EIO", j
    assert writing_objects(daemon) >= 1 and records(daemon) == 1
    assert "the same import again resumes" in daemon.log_text()
    origin.clear_faults()
    origin.throttle(None)
    origin.reset_counters()
    res = daemon.import_ok("lost", url)["result"]
    assert res["resumed_bytes"] >= 8 << 20, res
    assert origin.bytes_served() <= total - res["resumed_bytes"] + (1 << 20)
    check_published(daemon, "lost", res["generation"], want)
    assert writing_objects(daemon) == 0 and records(daemon) == 0


def test_changed_origin_is_fetched_whole(daemon, origin):
    url, _, paths = put_model(origin, "changed", 3)
    first = half_way(daemon, origin, "changed", url)
    daemon.kill9()
    daemon.start()
    assert records(daemon) == 1
    # the same names and lengths, other bytes: a new ETag on every shard
    _, want, _ = put_model(origin, "changed", 4)
    origin.throttle(None)
    res = daemon.import_ok("changed", url)["result"]
    assert res["resumed_bytes"] == 0, res
    check_published(daemon, "changed", res["generation"], want)
    # the interrupted import's reservations are gone with its record
    assert writing_objects(daemon) == 0 and records(daemon) == 0
    assert daemon.job(first)["state"] == "failed"


# ---------------------------------------------------------------- fleet pulls

PULL_TOKEN = "fleet-resume-secret-0123456789"
PULL_MB = 768  # two 384 MiB shards of 16 MiB pipeline chunks: a kill loses a few
PULL_RATE = "800mbit"  # 100 MB/s on the puller's link: the pull takes about 8 s


def pull_model(root, seed, mb):
    """About mb MiB of F32 tensors (64 MiB each: one random block, each
    tensor XORed with its number, so no two chunks are alike) in two shards
    with an index: (directory, bytes of its shards)."""
    rng = np.random.default_rng(seed)
    block = rng.integers(0, 1 << 32, size=16 << 20, dtype=np.uint32)
    root.mkdir(parents=True, exist_ok=True)
    n = mb // 64
    wm, total = {}, 0
    for s in (1, 2):
        fname = f"model-0000{s}-of-00002.safetensors"
        t = {f"layers.{i}.weight": (block ^ np.uint32(i * 0x9E3779B1 & 0xFFFFFFFF)).view(np.float32)
             for i in range((s - 1) * n // 2, s * n // 2)}
        save_file(t, str(root / fname))
        wm.update({k: fname for k in t})
        total += (root / fname).stat().st_size
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {},
                                                                   "weight_map": wm}))
    return root, total


def blob_bytes_served(node):
    """Bytes node's blob route sent so far (its /metrics)."""
    m = node.metrics()
    return int(m.get('tensorvault_read_bytes_total{route="GET /v1/blobs/{digest}"}', 0))


def test_pull_killed_a_third_in_resumes(build_dir, fleet_nodes, fleet_net, tmp_path):
    """A node SIGKILLed a third into a pull (by the bytes its peer served)
    and started again takes its interrupted pull over: what was written and
    flushed is re-hashed from the device, the peer is asked only for the
    rest (<= 0.75x of the model), and the bytes are the publisher's."""
    if not fleet_net.available:
        pytest.skip(f"the pull test throttles a link: {fleet_net.reason}")
    from .test_rollout import local_alias, move
    n1, n2 = fleet_nodes(2, fleet_token=PULL_TOKEN, store_image_size="2G")
    src, model_bytes = pull_model(tmp_path / "n1" / "big", 31, PULL_MB)
    gen = n1.import_ok("big", str(src))["generation"]
    wait_for(lambda: any(g["model"] == "big" and g["holders"] == ["n1"]
                         for g in n1.ok("GET", "/v1/fleet")["generations"]),
             what="n1 holds big in the catalog")
    n2.shape(PULL_RATE, latency="50ms")  # a short queue: what n1 sent, n2 got
    served0 = blob_bytes_served(n1)
    assert move(n1, "big", "prod", gen, 0).status == 200
    t0 = time.monotonic()
    wait_for(lambda: blob_bytes_served(n1) - served0 >= model_bytes / 3, timeout=60, interval=0.02,
             what="n1 to serve a third of the model")
    assert n2.kill() == -9
    t_kill = time.monotonic() - t0
    served1 = blob_bytes_served(n1)
    print(f"n2 killed {t_kill:.1f} s into the pull, n1 had served "
          f"{(served1 - served0) / model_bytes:.2f}x of the model")
    # n2's last report before the kill (the catalog keeps it)
    stale = placed(n1, "big", "prod", "n2").get("bytes_done", 0)
    n2.start()
    # the fleet table while n2 pulls the rest (past its last report before
    # the kill): the model's bytes as total (the unit of a ready row), and
    # the current rate
    seen = wait_for(lambda: (lambda e: e if e.get("state") == "pulling" and e["rate_bps"] > 0
                             and e["bytes_done"] > stale else None)(placed(n1, "big", "prod", "n2")),
                    timeout=30, interval=0.2, what="n2 pulling at a rate > 0 in n1's GET /v1/fleet")
    print(f"n1 shows n2 {seen}")
    assert seen["bytes_total"] == model_bytes and 0 < seen["bytes_done"] <= model_bytes, seen
    assert seen["rate_bps"] < 200e6, seen  # the link carries 100 MB/s
    # and so does `tensorvault fleet`: n2's TOTAL is the generation's SIZE
    row, size = wait_for(lambda: cli_pull_row(build_dir, n1, 100 * stale / model_bytes),
                         timeout=20, interval=0.2,
                         what="n2 pulling at a rate > 0 in tensorvault fleet")
    print(f"tensorvault fleet: {' '.join(row)} / generation size {size}")
    assert " ".join(row[4:6]) == size, (row, size)
    wait_for(lambda: local_alias(n2, "big", "prod") == gen, timeout=60, what="n2 switched")
    ready = wait_for(lambda: (lambda e: e if e.get("state") == "ready" else None)(
        placed(n1, "big", "prod", "n2")), what="n2 ready in n1's GET /v1/fleet")
    assert ready["bytes_total"] == ready["bytes_done"] == model_bytes, ready
    jobs = n2_jobs(n2, "big")
    assert sorted(j["state"] for j in jobs) == ["failed", "succeeded"], jobs
    done = next(j for j in jobs if j["state"] == "succeeded")
    res = n2.ok("GET", f"/v1/jobs/{done['id']}")["result"]
    again = blob_bytes_served(n1) - served1
    print(f"after the restart: resumed {res['resumed_bytes']} bytes "
          f"({res['resumed_bytes'] / model_bytes:.2f}x), n1 served "
          f"{again / model_bytes:.2f}x of the model")
    assert res["resumed_bytes"] > 0, res
    assert again <= 0.75 * model_bytes, (again, model_bytes, res)
    assert "resumed from the device" in n2.log_text()
    # where it came from: the catalog's name and the peer, never n1's path
    assert done["source"] == f"fleet:big@{gen}", done
    g = n2.ok("GET", f"/v1/models/big/generations/{gen}")
    assert g["source"] == f"fleet:big@{gen} from n1", g["source"]
    assert str(src) not in json.dumps(g) and str(src) not in json.dumps(jobs)
    # the bytes are the publisher's: every shard read back from n2's device
    n2.unshape()
    for sh in g["shards"]:
        with open(os.path.join(src, sh["name"]), "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        body = n2.request("GET", f"/v1/blobs/sha256:{sh['sha256']}").body
        assert len(body) == sh["file_bytes"] and hashlib.sha256(body).hexdigest() == want, sh


def cli_pull_row(build_dir, node, past_pct):
    """(n2's row, the generation's SIZE) in `tensorvault fleet` against
    node while n2 pulls big past past_pct % at a rate > 0 (its % and MIB/S
    columns); None else."""
    tok = os.path.join(node.workdir, "cli.token")
    with open(tok, "w") as f:
        f.write(node.admin_token + "\n")
    p = subprocess.run([os.path.join(build_dir, "tensorvault"), "fleet", "--url", node.url,
                        "--token-file", tok], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    lines = [ln.split() for ln in p.stdout.splitlines()]
    # NODE STATE DONE TOTAL % MIB/S ...: sizes are two words ("1.5 GiB")
    row = next((w for w in lines if w[:2] == ["n2", "pulling"] and float(w[7]) > 0
                and float(w[6].rstrip("%")) > past_pct), None)
    gen = next((w for w in lines if w[:2] == ["big", "1"]), None)
    return (row, " ".join(gen[2:4])) if row and gen else None


def placed(node, model, alias, name):
    """name's entry under model@alias in node's GET /v1/fleet ({}: none)."""
    for a in node.ok("GET", "/v1/fleet")["aliases"]:
        if a["model"] == model and a["alias"] == alias:
            return next((x for x in a["nodes"] if x["node"] == name), {})
    return {}


def n2_jobs(node, model):
    return [j for j in node.ok("GET", "/v1/jobs")["jobs"] if j["model"] == model]
