"""Import sources are opened once, when POST /v1/imports checks them, and
the job reads through what was opened: a rename or symlink swap under
import.roots while the job waits in the queue never makes it import a
file outside the roots.

With import.workers = 1 and a first import stuck on a stalling origin
(harness.stall) keeping the worker busy, imports of paths under the roots are
queued; then, before the worker is released (the first job cancelled):
  - ROOTS/x.safetensors is renamed away and replaced by a symlink to a
    checkpoint outside the roots;
  - the directory ROOTS/xdir likewise (a symlink to a directory outside);
  - inside ROOTS/ydir, model.safetensors is replaced by such a symlink;
  - in ROOTS/zidx (an index named directly), one shard likewise.
Each job either imports the original bytes (compared with the official
safetensors loader's values) or fails with a clear error (the files
swapped inside a directory: TV_E_OUTSIDE_ROOTS); none publishes the
outside checkpoint. Also: a Hugging Face cache snapshot under a root (files
that are relative symlinks into ../../blobs) imports, as a directory and
by its index; the descriptors queued jobs hold are closed once they end."""
import json
import os
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from harness.daemon import SLOW, Daemon, seg
from harness.stall import StallOrigin

_started = []


@pytest.fixture(autouse=True)
def reaper():
    yield
    while _started:
        d = _started.pop()
        if d.alive():
            d.kill9()


@pytest.fixture
def origin(tmp_path):
    rng = np.random.default_rng(5)
    os.makedirs(tmp_path / "origin" / "models")
    path = str(tmp_path / "origin" / "models" / "busy.safetensors")
    save_file({"w": rng.standard_normal(1 << 16, dtype=np.float32)}, path)
    o = StallOrigin(tmp_path / "origin", stall_from=4096).start()
    yield o
    o.stop()


def tensors(seed, n=3):
    rng = np.random.default_rng(seed)
    return {f"layer.{i}": rng.standard_normal(4096 + i, dtype=np.float32) for i in range(n)}


def write(path, t):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    save_file(t, str(path))
    return str(path)


def index_dir(d, t):
    """t in two shards with an index under d; returns {shard name: its tensors}."""
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:2],
              "model-00002-of-00002.safetensors": names[2:]}
    wm = {}
    for shard, keys in shards.items():
        write(os.path.join(d, shard), {k: t[k] for k in keys})
        wm.update({k: shard for k in keys})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    return shards


def stored(d, model, gen, names):
    base = f"/v1/models/{seg(model)}/generations/{gen}/tensors"
    return {n: d.ok("GET", f"{base}/{seg(n)}/data") for n in names}


def same(got, want):
    return got == {k: v.tobytes() for k, v in want.items()}


def daemon(build_dir, tmp_path, origin, **extra):
    (tmp_path / "work").mkdir(exist_ok=True)
    s = {"store.image_size": "256M", "import.roots": str(tmp_path / "roots"),
         "import.workers": "1", "import.origins": f"{origin.url}/models/"}
    s.update(extra)
    d = Daemon(build_dir, tmp_path / "work", settings=s)
    _started.append(d)
    return d.start()


def busy_worker(d, origin):
    """The one worker stuck on the stalling origin: its job."""
    n = origin.stalled()
    job = d.submit_import("busy", f"{origin.url}/models/busy.safetensors")
    origin.wait_stalled(n + 1, timeout=30 * SLOW)
    return job


def test_swaps_while_queued_never_import_outside_files(build_dir, tmp_path, origin):
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    orig, evil = tensors(1), tensors(2)
    write(roots / "x.safetensors", orig)
    write(roots / "xdir" / "model.safetensors", orig)
    write(roots / "ydir" / "model.safetensors", orig)
    index_dir(roots / "zidx", orig)
    evil_file = write(outside / "model.safetensors", evil)
    evil_shards = index_dir(outside / "idx", evil)
    d = daemon(build_dir, tmp_path, origin)
    try:
        busy = busy_worker(d, origin)
        jobs = {name: d.submit_import(name, str(src))["id"] for name, src in (
            ("x", roots / "x.safetensors"), ("xdir", roots / "xdir"), ("ydir", roots / "ydir"),
            ("zidx", roots / "zidx" / "model.safetensors.index.json"))}
        for i in jobs.values():
            assert d.job(i)["state"] == "queued"
        # the swaps, while the jobs wait
        os.rename(roots / "x.safetensors", roots / "x.old")
        os.symlink(evil_file, roots / "x.safetensors")
        os.rename(roots / "xdir", roots / "xdir.old")
        os.symlink(outside, roots / "xdir", target_is_directory=True)
        os.unlink(roots / "ydir" / "model.safetensors")
        os.symlink(evil_file, roots / "ydir" / "model.safetensors")
        shard = "model-00002-of-00002.safetensors"
        os.unlink(roots / "zidx" / shard)
        os.symlink(outside / "idx" / shard, roots / "zidx" / shard)
        assert evil_shards  # the outside index's shards are the same names
        # the worker is released
        d.ok("POST", f"/v1/jobs/{busy['id']}/cancel")
        done = {name: d.wait_job(i) for name, i in jobs.items()}
        for name, j in done.items():
            if j["state"] == "succeeded":
                got = stored(d, name, j["result"]["generation"], orig)
                assert not same(got, evil), f"{name}: the outside checkpoint was imported"
                assert same(got, orig), f"{name}: neither the original nor the outside bytes"
            else:
                assert j["state"] == "failed" and j["error"]["message"], (name, j)
        # what was opened when the request was checked is what is read
        assert done["x"]["state"] == "succeeded", done["x"]
        assert done["xdir"]["state"] == "succeeded", done["xdir"]
        # a file swapped inside an opened directory is refused by the roots
        for name in ("ydir", "zidx"):
            assert done[name]["state"] == "failed", done[name]
            assert done[name]["error"]["code"] == "TV_E_OUTSIDE_ROOTS", done[name]
            assert str(outside) in done[name]["error"]["message"], done[name]
            assert [g for g in d.generations(name) if g["state"] == "ready"] == []
    finally:
        origin.release()
        assert d.stop() == 0, d.log_text()


def hub_cache(root, t):
    """root/hub/models--org--name: blobs named by their SHA-256, and a
    snapshot whose files are relative symlinks ../../blobs/HASH, as
    huggingface_hub lays them out. Returns the snapshot directory."""
    import hashlib
    import shutil
    repo = root / "hub" / "models--org--name"
    snap = repo / "snapshots" / "0123abcd"
    tmp = root / "hubtmp"
    index_dir(tmp, t)
    os.makedirs(repo / "blobs")
    os.makedirs(snap)
    for name in sorted(os.listdir(tmp)):
        with open(tmp / name, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        shutil.move(str(tmp / name), str(repo / "blobs" / sha))
        os.symlink(f"../../blobs/{sha}", snap / name)
    os.rmdir(tmp)
    return snap


def test_hub_cache_snapshot_under_a_root_imports(build_dir, tmp_path, origin):
    t = tensors(3, n=4)
    snap = hub_cache(tmp_path / "roots", t)
    d = daemon(build_dir, tmp_path, origin)
    try:
        for model, src in (("hub-dir", snap), ("hub-index", snap / "model.safetensors.index.json"),
                           ("hub-shard", snap / "model-00001-of-00002.safetensors")):
            j = d.import_ok(model, str(src))
            want = t if model != "hub-shard" else load_file(str(src))
            assert same(stored(d, model, j["result"]["generation"], want), want), model
    finally:
        assert d.stop() == 0, d.log_text()


def open_fds(d):
    return len(os.listdir(f"/proc/{d.pid}/fd"))


def test_queued_jobs_hold_few_descriptors_and_release_them(build_dir, tmp_path, origin):
    roots = tmp_path / "roots"
    index_dir(roots / "idx", tensors(4))
    write(roots / "one.safetensors", tensors(5))
    d = daemon(build_dir, tmp_path, origin, **{"import.queue": "12"})
    try:
        busy = busy_worker(d, origin)
        time.sleep(0.2)
        base = open_fds(d)
        ids = [d.submit_import(f"q{i}", str(roots / ("idx" if i % 2 else "one.safetensors")))["id"]
               for i in range(12)]
        held = open_fds(d) - base
        assert 0 <= held <= 2 * len(ids), held  # at most a directory and a file each
        for i in ids[:6]:  # cancelled while queued: closed at once
            assert d.ok("POST", f"/v1/jobs/{i}/cancel")["state"] == "cancelled"
        assert open_fds(d) - base <= 2 * 6
        d.ok("POST", f"/v1/jobs/{busy['id']}/cancel")
        for i in ids[6:]:
            assert d.wait_job(i)["state"] == "succeeded"
        deadline = time.monotonic() + 10 * SLOW
        while open_fds(d) > base:
            assert time.monotonic() < deadline, (open_fds(d), base)
            time.sleep(0.05)
    finally:
        origin.release()
        assert d.stop() == 0, d.log_text()
