"""The raw store: init, import, generations, gc, verify, dedup, replicas,
bad input and faults, through the tensorvault CLI on file images."""
import fcntl
import json
import os
import pty
import subprocess
import sys

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.store import assert_store_matches, read_at, reference_tensors


def js(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def ckpt(tmp_path):
    rng = np.random.default_rng(11)
    tensors = gen.random_tensors(rng, 40, big_tensor_bytes=3 << 20)
    return gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)


@pytest.fixture
def ckpt_b(tmp_path):
    rng = np.random.default_rng(12)
    tensors = gen.random_tensors(rng, 25, big_tensor_bytes=1 << 20)
    return gen.write_checkpoint(str(tmp_path / "ckb"), tensors, 2)


@pytest.fixture
def store(tv, tmp_path):
    s = str(tmp_path / "store")
    js(tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "256M", "--json"))
    return s


def objects(tv, store):
    """devices --json; exits 1 (with the JSON) when a device is unhealthy."""
    p = tv("devices", "--store", store, "--json")
    doc = json.loads(p.stdout)["devices"]
    assert p.returncode == (0 if all(d["status"] == "ok" for d in doc) else 1), p.stderr
    return doc


def test_init_import_verify_activate_gc(tv, store, ckpt, ckpt_b):
    dev = objects(tv, store)[0]
    assert dev["status"] == "ok" and dev["region_offset"] > 0 and dev["used_bytes"] == 0
    assert dev["data_offset"] % dev["object_align"] == 0
    r = js(tv("import", "--store", store, "m", ckpt, "--activate", "--json"))
    assert r["generation"] == 1 and r["active"] and r["deduplicated_bytes"] == 0
    assert_store_matches(tv, store, "m", ckpt)
    assert_store_matches(tv, store, "m@1", ckpt)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    # A second generation with other content; activation switches, rollback returns.
    r2 = js(tv("import", "--store", store, "m", ckpt_b, "--json"))
    assert r2["generation"] == 2
    assert js(tv("models", "--store", store, "--json"))["models"][0]["active_generation"] == 1
    js(tv("activate", "--store", store, "m", "2", "--json"))
    assert_store_matches(tv, store, "m", ckpt_b)
    js(tv("activate", "--store", store, "m", "1", "--json"))
    assert_store_matches(tv, store, "m", ckpt)
    # The active generation cannot be retired; an inactive one can, and gc frees it.
    assert "TV_E_STATE" in tv("retire", "--store", store, "m", "1").stderr
    used_before = objects(tv, store)[0]["used_bytes"]
    js(tv("retire", "--store", store, "m", "2", "--json"))
    g = js(tv("gc", "--store", store, "--json"))
    assert g["n_objects_freed"] == 2 and g["freed_bytes"] > 0
    assert objects(tv, store)[0]["used_bytes"] == used_before - g["freed_bytes"]
    assert_store_matches(tv, store, "m", ckpt)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    gens = js(tv("generations", "--store", store, "m", "--json"))["generations"]
    assert [(x["generation"], x["state"], x["active"]) for x in gens] == \
        [(1, "ready", True), (2, "retired", False)]


def test_objects_are_aligned_padded_and_disjoint(tv, store, ckpt, ckpt_b):
    tv("import", "--store", store, "a", ckpt, "--activate", check=True)
    tv("import", "--store", store, "b", ckpt_b, "--activate", check=True)
    dev = objects(tv, store)[0]
    # Space accounting: objects plus free space fill the data region exactly
    # (every extent is object_align aligned), and the largest hole fits in it.
    data_len = dev["region_offset"] + dev["region_bytes"] - dev["data_offset"]
    assert dev["used_bytes"] + dev["free_bytes"] == data_len - data_len % dev["object_align"]
    assert 0 < dev["largest_free_bytes"] <= dev["free_bytes"] and dev["n_objects"] == 4
    v = js(tv("verify", "--store", store, "--json"))["objects"]
    extents = sorted((o["device_offset"], o["canonical_bytes"]) for o in v)
    for (off, n), nxt in zip(extents, extents[1:] + [None]):
        assert off % dev["object_align"] == 0 and off >= dev["data_offset"]
        padded = -(-n // dev["object_align"]) * dev["object_align"]
        if nxt:
            assert off + padded <= nxt[0]
        # Padding after the canonical bytes is zero.
        assert read_at(dev["path"], off + n, padded - n) == bytes(padded - n)


def test_same_checkpoint_is_deduplicated(tv, store, ckpt):
    r1 = js(tv("import", "--store", store, "m", ckpt, "--json"))
    used = objects(tv, store)[0]["used_bytes"]
    r2 = js(tv("import", "--store", store, "m2", ckpt, "--json"))
    assert r2["written_bytes"] == 0 and r2["deduplicated_bytes"] == r1["total_bytes"]
    assert objects(tv, store)[0]["used_bytes"] == used
    assert_store_matches(tv, store, "m2@1", ckpt)


def test_strict_import(tv, store, ckpt):
    r = js(tv("import", "--store", store, "m", ckpt, "--strict", "--activate", "--json"))
    assert r["generation"] == 1
    assert_store_matches(tv, store, "m", ckpt)


def test_replicas(tv, store, ckpt, tmp_path):
    tv("store", "init", "--store", store, "--image", tmp_path / "img2", "--size", "128M", check=True)
    devs = objects(tv, store)
    assert len(devs) == 2
    tv("import", "--store", store, "m", ckpt, "--activate", "--replicas",
          f"{devs[0]['id']},{devs[1]['path']}", check=True)
    assert_store_matches(tv, store, "m", ckpt, replicas=2)
    assert js(tv("verify", "--store", store, "--json"))["n_objects"] == 4


def test_invalid_checkpoint_writes_nothing(tv, store, tmp_path):
    d = tmp_path / "bad"
    expect = gen.malformed(str(d))
    for name, err in expect.items():
        p = tv("import", "--store", store, "m", d / name)
        assert p.returncode == 1 and err in p.stderr, (name, p.stderr)
    assert objects(tv, store)[0]["used_bytes"] == 0
    assert js(tv("models", "--store", store, "--json"))["models"] == []


def test_region_full(tv, tmp_path, ckpt):
    s = str(tmp_path / "small")
    tv("store", "init", "--store", s, "--image", tmp_path / "small.img", "--size", "4M", check=True)
    p = tv("import", "--store", s, "m", ckpt)
    assert p.returncode == 1 and "TV_E_NO_SPACE" in p.stderr, p.stderr
    assert objects(tv, s)[0]["used_bytes"] == 0
    assert js(tv("models", "--store", s, "--json"))["models"] == []


def test_unreadable_and_missing_source(tv, store, tmp_path):
    p = tv("import", "--store", store, "m", tmp_path / "nope")
    assert p.returncode == 1 and "ENOENT" in p.stderr
    d = tmp_path / "fifo"
    d.mkdir()
    os.mkfifo(d / "model.safetensors")
    p = tv("import", "--store", store, "m", d / "model.safetensors")
    assert p.returncode == 1
    assert objects(tv, store)[0]["used_bytes"] == 0


def test_device_resized_is_refused(tv, store, ckpt, tmp_path):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    img = objects(tv, store)[0]["path"]
    os.truncate(img, os.path.getsize(img) + (1 << 20))
    d = objects(tv, store)[0]
    assert d["status"] == "mismatch" and "size" in d["message"]
    p = tv("import", "--store", store, "m", ckpt)
    assert p.returncode == 1 and "TV_E_DEVICE_MISMATCH" in p.stderr
    assert tv("verify", "--store", store).returncode == 1
    os.truncate(img, os.path.getsize(img) - (1 << 20))
    assert objects(tv, store)[0]["status"] == "ok"


def test_device_label_corrupt_or_swapped(tv, store, ckpt, tmp_path):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    dev = objects(tv, store)[0]
    img = dev["path"]
    # Swapped: another store's image (same size) at the same path.
    other = str(tmp_path / "other")
    tv("store", "init", "--store", other, "--image", tmp_path / "other.img", "--size", "256M", check=True)
    os.rename(img, img + ".orig")
    os.rename(tmp_path / "other.img", img)
    d = objects(tv, store)[0]
    assert d["status"] == "mismatch" and "uuid" in d["message"].lower()
    assert "TV_E_DEVICE_MISMATCH" in tv("import", "--store", store, "m", ckpt).stderr
    os.rename(img, tmp_path / "other.img")
    os.rename(img + ".orig", img)
    # Corrupted label byte: checksum mismatch.
    with open(img, "r+b") as f:
        f.seek(dev["region_offset"] + 20)
        b = f.read(1)
        f.seek(dev["region_offset"] + 20)
        f.write(bytes([b[0] ^ 0xFF]))
    d = objects(tv, store)[0]
    assert d["status"] == "mismatch"
    assert tv("verify", "--store", store).returncode == 1


def test_store_lock_keeps_second_writer_out(tv, store, ckpt):
    with open(os.path.join(store, "lock"), "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        p = tv("import", "--store", store, "m", ckpt)
        assert p.returncode == 1 and "TV_E_LOCKED" in p.stderr and "locked" in p.stderr
        # Readers are not blocked.
        assert tv("models", "--store", store).returncode == 0
    assert tv("import", "--store", store, "m", ckpt).returncode == 0


CRASH_POINTS = ["reserve", "write", "flush", "publish"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_leaves_active_generation_intact(tv, tv_crash, store, ckpt, ckpt_b, point):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    used = objects(tv, store)[0]["used_bytes"]
    p = tv_crash("import", "--store", store, "m", ckpt_b, "--activate", crash_at=point)
    assert p.returncode == -9, (point, p.returncode, p.stderr)
    # Readers see the old state; the next writer reclaims the reservation.
    gens = js(tv("generations", "--store", store, "m", "--json"))["generations"]
    assert [(g["generation"], g["active"]) for g in gens] == [(1, True)]
    assert_store_matches(tv, store, "m", ckpt)
    js(tv("gc", "--store", store, "--json"))
    assert objects(tv, store)[0]["used_bytes"] == used
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    # And the store still works.
    r = js(tv("import", "--store", store, "m", ckpt_b, "--activate", "--json"))
    assert r["generation"] == 2
    assert_store_matches(tv, store, "m", ckpt_b)


def test_shipped_binary_has_no_crash_hook(tv, build_dir, store, ckpt):
    """Crash points are hooks of the test build only: the shipped binary
    neither contains nor obeys TV_TEST_CRASH_AT."""
    with open(os.path.join(build_dir, "tensorvault"), "rb") as f:
        assert b"TV_TEST_CRASH_AT" not in f.read()
    with open(os.path.join(build_dir, "tests", "tensorvault_crashtest"), "rb") as f:
        assert b"TV_TEST_CRASH_AT" in f.read()
    env = dict(os.environ, TV_TEST_CRASH_AT="reserve")
    p = tv("import", "--store", store, "m", ckpt, "--activate", env=env)
    assert p.returncode == 0, p.stderr


def test_crash_points_of_activate_retire_gc(tv, tv_crash, store, ckpt, ckpt_b, tmp_path):
    """Every writer command reaches its named crash points in order, and a
    kill -9 at each leaves a store that opens, verifies, reads back the
    generation the registry reports active and frees all space at gc."""
    trace = tmp_path / "trace"
    assert tv_crash("import", "--store", store, "m", ckpt, "--activate",
                    trace=trace).returncode == 0
    used_a = objects(tv, store)[0]["used_bytes"]
    assert tv_crash("import", "--store", store, "m", ckpt_b, trace=trace).returncode == 0
    used_b = objects(tv, store)[0]["used_bytes"] - used_a
    assert tv_crash("activate", "--store", store, "m", 2, trace=trace).returncode == 0
    assert tv_crash("retire", "--store", store, "m", 1, trace=trace).returncode == 0
    assert tv_crash("gc", "--store", store, trace=trace).returncode == 0
    points = trace.read_text().split()
    for want in [["reserve", "write", "flush", "publish", "import.commit"],
                 ["activate.snapshot", "activate.pointer", "activate.commit"], ["retire.commit"],
                 ["gc.snapshot_unlink", "gc.commit"]]:
        at = [points.index(w) for w in want]
        assert at == sorted(at), (want, points)

    def check(active, ck):
        assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
        models = js(tv("models", "--store", store, "--json"))["models"]
        assert [m["active_generation"] for m in models] == [active]
        assert_store_matches(tv, store, f"m@{active}", ck)

    # kill -9 at each point of activate, retire and gc: what was committed
    # stays, what was not never happened.
    tv("import", "--store", store, "m", ckpt, check=True)  # generation 3
    p = tv_crash("activate", "--store", store, "m", 3, crash_at="activate.commit")
    assert p.returncode == -9, p.stderr
    check(3, ckpt)
    p = tv_crash("activate", "--store", store, "m", 2, crash_at="activate.pointer")
    assert p.returncode == -9, p.stderr
    check(2, ckpt_b)
    p = tv_crash("retire", "--store", store, "m", 3, crash_at="retire.commit")
    assert p.returncode == -9, p.stderr
    check(2, ckpt_b)
    p = tv_crash("gc", "--store", store, crash_at="gc.snapshot_unlink")
    assert p.returncode == -9, p.stderr
    check(2, ckpt_b)
    p = tv_crash("gc", "--store", store, crash_at="gc.commit")
    assert p.returncode == -9, p.stderr
    check(2, ckpt_b)
    # The next gc frees the rest: only generation 2's bytes stay allocated.
    js(tv("gc", "--store", store, "--json"))
    check(2, ckpt_b)
    assert objects(tv, store)[0]["used_bytes"] == used_b
    gens = js(tv("generations", "--store", store, "m", "--json"))["generations"]
    assert [(g["generation"], g["state"]) for g in gens] == [(1, "retired"), (2, "ready"),
                                                             (3, "retired")]


def test_progress_bar_only_on_a_terminal(tv, build_dir, store, ckpt, ckpt_b):
    p = tv("import", "--store", store, "quiet", ckpt_b)
    assert p.returncode == 0 and p.stderr == ""
    master, slave = pty.openpty()
    proc = subprocess.Popen([os.path.join(build_dir, "tensorvault"), "import", "--store", store,
                             "loud", ckpt, "--activate"], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait()
    os.close(master)
    assert proc.returncode == 0
    text = out.decode()
    assert "100.0%" in text and "MB/s" in text and "ETA" in text


def test_usage_errors(tv, store):
    assert tv("import", "--store", store, "m").returncode == 2
    assert tv("store", "init", "--store", store).returncode == 2
    assert tv("store", "init", "--store", store, "--image", "x", "--size", "12Q").returncode == 2
    assert tv("tensors", "--store", store, "m@01").returncode == 2
    assert tv("tensors", "--store", store, "m@_x").returncode == 2  # not an alias name either
    # No --store and no daemon at the URL: one clear error naming both ways out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    p = tv("models", "--url", "http://127.0.0.1:1", env=env)
    assert p.returncode == 1 and "TV_E_NO_DAEMON" in p.stderr, p.stderr
    assert "http://127.0.0.1:1" in p.stderr and "--store" in p.stderr and "scripts/run" in p.stderr
    p = tv("models", "--store", "/nonexistent/store")
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr


# ---- device claims, store files, read-only registry ------------------------

def test_claim_other_stores_image_is_refused_without_force(tv, store, ckpt, tmp_path):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    img = objects(tv, store)[0]["path"]
    before = read_at(img, 0, 4 << 20)
    other = str(tmp_path / "other")
    for args in (["--device", img], ["--image", img, "--size", "256M"]):
        p = tv("store", "init", "--store", other, *args)
        assert p.returncode == 1 and "TV_E_DEVICE_IN_USE" in p.stderr, p.stderr
        assert "label of tensorvault store" in p.stderr and "--force" in p.stderr
        assert not os.path.exists(other)  # nothing left behind
    assert read_at(img, 0, 4 << 20) == before
    assert_store_matches(tv, store, "m", ckpt)
    # The usage line documents --force, and --force overwrites.
    assert "--force" in tv("store").stderr
    js(tv("store", "init", "--store", other, "--device", img, "--force", "--json"))
    assert objects(tv, store)[0]["status"] == "mismatch"


def test_claim_same_image_by_identity_not_path(tv, store, tmp_path):
    img = objects(tv, store)[0]["path"]
    os.link(img, tmp_path / "hard.img")
    os.symlink(img, tmp_path / "sym.img")
    for alias in ("hard.img", "sym.img"):
        p = tv("store", "init", "--store", store, "--device", tmp_path / alias, "--force")
        assert p.returncode == 1 and "EEXIST" in p.stderr and "already device 1" in p.stderr, \
            p.stderr
    assert len(objects(tv, store)) == 1


def test_claim_data_in_region_is_refused(tv, tmp_path):
    img = tmp_path / "used.img"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
        f.seek(100 << 20)
        f.write(b"precious")
    s = str(tmp_path / "s")
    p = tv("store", "init", "--store", s, "--image", img, "--size", "256M")
    assert p.returncode == 1 and "TV_E_DEVICE_IN_USE" in p.stderr, p.stderr
    assert f"non-zero data at offset {100 << 20}" in p.stderr
    assert read_at(img, 100 << 20, 8) == b"precious" and not os.path.exists(s)
    # An existing all-zero image of the asked size is used as it is.
    clean = tmp_path / "clean.img"
    with open(clean, "wb") as f:
        f.truncate(64 << 20)
    js(tv("store", "init", "--store", s, "--image", clean, "--size", "64M", "--json"))


def test_store_dir_mode_and_wide_dir_warning(tv, tmp_path):
    s = tmp_path / "s"
    old = os.umask(0)
    try:
        js(tv("store", "init", "--store", s, "--image", tmp_path / "i", "--size", "64M", "--json"))
    finally:
        os.umask(old)
    assert os.stat(s).st_mode & 0o777 == 0o700
    w = tmp_path / "wide"
    w.mkdir()
    os.chmod(w, 0o755)
    p = tv("store", "init", "--store", w, "--image", tmp_path / "j", "--size", "64M")
    assert p.returncode == 0 and "mode 0755" in p.stderr, p.stderr


def test_failed_init_leaves_nothing(tv, tmp_path):
    s = tmp_path / "s"
    p = tv("store", "init", "--store", s, "--device", tmp_path / "missing")
    assert p.returncode == 1 and "ENOENT" in p.stderr
    assert not s.exists()
    s.mkdir()
    p = tv("store", "init", "--store", s, "--image", tmp_path / "tiny", "--size", "1M")
    assert p.returncode == 1
    assert os.listdir(s) == [] and not (tmp_path / "tiny").exists()


def test_lock_fifo_or_symlink_is_refused_not_followed(tv, store, ckpt, tmp_path):
    lock = os.path.join(store, "lock")
    os.unlink(lock)
    os.mkfifo(lock)
    p = tv("import", "--store", store, "m", ckpt, timeout=20)  # never blocks on the FIFO
    assert p.returncode == 1 and "not a regular file" in p.stderr and lock in p.stderr, p.stderr
    os.unlink(lock)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.symlink(victim, lock)
    p = tv("import", "--store", store, "m", ckpt)
    assert p.returncode == 1 and "symlink" in p.stderr, p.stderr
    assert victim.read_bytes() == b"keep me"
    assert tv("models", "--store", store).returncode == 0


def test_readers_never_create_or_rewrite_the_registry(tv, store, tmp_path):
    empty = tmp_path / "notastore"
    empty.mkdir()
    for cmd in ("models", "devices", "verify"):
        p = tv(cmd, "--store", empty)
        assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    assert os.listdir(empty) == []
    # A valid SQLite file without the schema is not migrated by a reader.
    import sqlite3
    other = tmp_path / "noschema"
    other.mkdir()
    con = sqlite3.connect(other / "registry.db")
    con.execute("CREATE TABLE x (a)")
    con.commit()
    con.close()
    p = tv("models", "--store", other)
    assert p.returncode == 1 and "no tensorvault schema" in p.stderr, p.stderr
    con = sqlite3.connect(other / "registry.db")
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    version = con.execute("PRAGMA user_version").fetchone()[0]
    con.close()
    assert tables == ["x"] and version == 0
    reg = os.path.join(store, "registry.db")
    st = os.stat(reg)
    for cmd in (["models"], ["devices"], ["verify"], ["generations", "m"]):
        tv(*cmd, "--store", store)
    st2 = os.stat(reg)
    assert (st.st_size, st.st_mtime_ns) == (st2.st_size, st2.st_mtime_ns)


@pytest.mark.parametrize("damage", ["empty", "corrupt", "missing"])
def test_damaged_registry_is_a_clear_error(tv, store, ckpt, damage):
    reg = os.path.join(store, "registry.db")
    if damage == "missing":
        os.unlink(reg)
    else:
        with open(reg, "r+b") as f:
            f.truncate(0)
            if damage == "corrupt":
                f.write(b"\x5a" * 8192)
    size = os.path.getsize(reg) if damage != "missing" else None
    for cmd in (["models"], ["import", "m", ckpt], ["store", "init", "--image",
                                                   store + ".img2", "--size", "64M"]):
        args = [cmd[0], "--store", store, *cmd[1:]] if cmd[0] != "store" else \
            ["store", "init", "--store", store, *cmd[2:]]
        p = tv(*args)
        assert p.returncode == 1 and "TV_E_REGISTRY" in p.stderr and reg in p.stderr, \
            (cmd, p.stderr)
        assert {"empty": "empty", "corrupt": "corrupt", "missing": "missing"}[damage] in p.stderr
    # Never silently re-created.
    assert (os.path.getsize(reg) if os.path.exists(reg) else None) == size


def test_read_only_mount_lists_and_reads(tv, tmp_path, ckpt):
    if os.geteuid() != 0:
        pytest.skip("needs root to loop-mount an ext4 image")
    fs = tmp_path / "fs.img"
    with open(fs, "wb") as f:
        f.truncate(192 << 20)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = subprocess.run(["mkfs.ext4", "-q", "-F", str(fs)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {p.stderr.strip()}")
    p = subprocess.run(["mount", "-o", "loop", str(fs), str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {p.stderr.strip()}")
    try:
        s = str(mnt / "store")
        tv("store", "init", "--store", s, "--image", mnt / "dev.img", "--size", "96M", check=True)
        tv("import", "--store", s, "m", ckpt, "--activate", check=True)
        r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(os.path.join(s, "registry.db-shm"))
        assert js(tv("models", "--store", s, "--json"))["models"][0]["active_generation"] == 1
        assert js(tv("generations", "--store", s, "m", "--json"))["generations"][0]["state"] == \
            "ready"
        assert js(tv("devices", "--store", s, "--json"))["devices"][0]["status"] == "ok"
        assert js(tv("verify", "--store", s, "--json"))["n_failed"] == 0
        assert_store_matches(tv, s, "m", ckpt)
        ref = reference_tensors(ckpt)
        name = sorted(ref)[0]
        tv("get", "--store", s, "m", name, "-o", tmp_path / "t.bin", check=True)
        assert (tmp_path / "t.bin").read_bytes() == ref[name][2]
        # Writers fail cleanly, naming the problem.
        p = tv("import", "--store", s, "m2", ckpt)
        assert p.returncode == 1 and "Read-only" in p.stderr, p.stderr
        # A writer that died left a WAL (and -shm) with a committed change:
        # readers on the read-only mount see it (no immutable=1 then).
        r = subprocess.run(["mount", "-o", "remount,rw", str(mnt)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        code = ("import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                "c.execute('PRAGMA wal_autocheckpoint = 0'); "
                "c.execute(\"UPDATE models SET name = 'renamed'\"); c.commit(); os._exit(0)")
        subprocess.run([sys.executable, "-c", code, os.path.join(s, "registry.db")], check=True)
        assert os.path.getsize(os.path.join(s, "registry.db-wal")) > 0
        r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert [m["name"] for m in js(tv("models", "--store", s, "--json"))["models"]] == \
            ["renamed"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_image_replaced_by_symlink_is_not_followed(tv, store, ckpt, tmp_path):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    img = objects(tv, store)[0]["path"]
    name = sorted(reference_tensors(ckpt))[0]
    os.rename(img, tmp_path / "elsewhere.img")
    os.symlink(tmp_path / "elsewhere.img", img)
    p = tv("get", "--store", store, "m", name, "-o", tmp_path / "x")
    assert p.returncode == 1 and "symlink" in p.stderr, p.stderr
    assert "symlink" in objects(tv, store)[0]["message"]
    assert tv("import", "--store", store, "m2", ckpt).returncode == 1
    os.unlink(img)
    os.rename(tmp_path / "elsewhere.img", img)
    tv("get", "--store", store, "m", name, "-o", tmp_path / "x", check=True)


# ---- names, source immutability, verify reports -------------------------------


def store_state(store):
    """Every file of the store directory with its bytes: a command that
    must write nothing leaves this unchanged."""
    out = {}
    for root, _, files in os.walk(store):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, store)] = fh.read()
    return out


BAD_NAMES = ["x@1", "x@prod", "a b", "org/-x", ".hidden", "../up", "a/../b", "a//b", "/abs",
             "tab\tname", "caf\u00e9", "a:b", "x" * 129]


def test_import_bad_name_writes_nothing(tv, store, ckpt):
    used = objects(tv, store)[0]["used_bytes"]  # a reader: SQLite makes its -wal/-shm here
    before = store_state(store)
    for name in BAD_NAMES:
        p = tv("import", "--store", store, name, ckpt, "--activate", "--json")
        assert p.returncode == 1, (name, p.stderr)
        assert "TV_E_NAME" in p.stderr and "model name" in p.stderr, (name, p.stderr)
        assert json.loads(p.stdout)["error"]["code"] == "TV_E_NAME", name
    assert store_state(store) == before
    assert objects(tv, store)[0]["used_bytes"] == used
    assert js(tv("models", "--store", store, "--json"))["models"] == []
    # Hugging Face repo ids are names as they are, and NAME@GEN reads them.
    js(tv("import", "--store", store, "meta-llama/Llama-3-8B", ckpt, "--activate", "--json"))
    assert_store_matches(tv, store, "meta-llama/Llama-3-8B@1", ckpt)
    assert [m["name"] for m in js(tv("models", "--store", store, "--json"))["models"]] == \
        ["meta-llama/Llama-3-8B"]


WRITER = r"""
import os, sys, time
path, start = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
size = os.fstat(fd).st_size
print("ready", flush=True)
i = 0
while True:  # rewrite data bytes in place, same size, until killed
    os.pwrite(fd, bytes([i & 0xFF]) * 4096, start + (i * 65536) % (size - start - 4096))
    i += 1
    time.sleep(0.001)
"""


def test_import_with_a_concurrent_writer_publishes_nothing(tv, store, tmp_path):
    """A real second process rewrites a shard's data bytes (same size, same
    header) while it is imported: TV_E_SOURCE_CHANGED naming the shard, no
    generation, no space used, verify clean."""
    import sys
    rng = np.random.default_rng(21)
    tensors = gen.random_tensors(rng, 10, big_tensor_bytes=48 << 20)
    path = gen.write_checkpoint(str(tmp_path / "big"), tensors, 1)
    with open(path, "rb") as f:
        data_off = 8 + int.from_bytes(f.read(8), "little")
    w = subprocess.Popen([sys.executable, "-c", WRITER, path, str(data_off)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        p = tv("import", "--store", store, "m", path, "--activate", "--chunk", "1M")
    finally:
        w.kill()
        w.wait()
    assert p.returncode == 1, p.stderr
    assert "TV_E_SOURCE_CHANGED" in p.stderr and "model.safetensors" in p.stderr, p.stderr
    assert "changed" in p.stderr
    assert js(tv("models", "--store", store, "--json"))["models"] == []
    assert objects(tv, store)[0]["used_bytes"] == 0
    assert js(tv("verify", "--store", store, "--json"))["n_objects"] == 0
    # Once the writer is gone the same file imports.
    assert js(tv("import", "--store", store, "m", path, "--json"))["generation"] == 1


def test_verify_failure_names_model_generation_and_shard(tv, store, ckpt, ckpt_b):
    """A corrupted object is reported with every model, generation and shard
    that uses it (two models share it by deduplication), on stderr and in
    --json, not only by object id."""
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    tv("import", "--store", store, "other", ckpt, "--activate", check=True)  # deduplicated
    tv("import", "--store", store, "b", ckpt_b, "--activate", check=True)
    res = js(tv("verify", "--store", store, "--json"))["objects"]
    shard = "model-00002-of-00002.safetensors"
    target = [r for r in res if any(u["shard"] == shard and u["model"] == "m"
                                    for u in r["used_by"])]
    assert len(target) == 1
    obj = target[0]
    assert sorted((u["model"], u["generation"], u["shard"], u["active"])
                  for u in obj["used_by"]) == [("m", 1, shard, True), ("other", 1, shard, True)]
    dev = objects(tv, store)[0]
    with open(dev["path"], "r+b") as f:  # flip one byte in the middle of the object
        f.seek(obj["device_offset"] + obj["canonical_bytes"] // 2)
        b = f.read(1)
        f.seek(obj["device_offset"] + obj["canonical_bytes"] // 2)
        f.write(bytes([b[0] ^ 0x5A]))
    p = tv("verify", "--store", store)
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if "TV_E_HASH_MISMATCH" in ln]
    assert len(lines) == 1, p.stderr
    assert f"model 'm' generation 1 (active) shard '{shard}'" in lines[0]
    assert f"model 'other' generation 1 (active) shard '{shard}'" in lines[0]
    assert f"object {obj['object_id']}" in lines[0]
    p = tv("verify", "--store", store, "--json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["n_failed"] == 1
    bad = [r for r in doc["objects"] if r["status"] != "ok"]
    assert [r["object_id"] for r in bad] == [obj["object_id"]] and bad[0]["status"] == "mismatch"
    assert bad[0]["message"], bad[0]
    assert {(u["model"], u["generation"], u["shard"], u["state"]) for u in bad[0]["used_by"]} == \
        {("m", 1, shard, "ready"), ("other", 1, shard, "ready")}
    assert "model 'm' generation 1" in p.stderr
    # Objects nobody corrupted still verify, and name their users too.
    assert all(r["used_by"] for r in doc["objects"])


LEASE_WRITER = r"""
import os, sys, time
path = sys.argv[1]
ino = os.stat(path).st_ino
print("ready", flush=True)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:  # wait for the importer's read lease
    with open("/proc/locks") as f:
        if any(l.split()[1:2] == ["LEASE"] and l.split()[-3].endswith(":%d" % ino)
               if len(l.split()) >= 6 else False for l in f):
            break
    time.sleep(0.0002)
else:
    sys.exit(3)
fd = os.open(path, os.O_WRONLY)  # waits until the importer lets the lease go
os.close(fd)                     # opened for writing, nothing written
print("opened", flush=True)
"""


def test_import_lease_sees_a_writer_open(tv, store, tmp_path):
    """Where the kernel grants the importer a read lease, another process
    opening the shard for writing (even without writing a byte) fails the
    import, and the writer's open waits only until the importer lets go."""
    import sys
    rng = np.random.default_rng(22)
    path = gen.write_checkpoint(str(tmp_path / "big"),
                                gen.random_tensors(rng, 4, big_tensor_bytes=64 << 20), 1)
    F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
    probe = os.open(path, os.O_RDONLY)
    try:  # would the kernel grant this process (so the importer) a lease here?
        fcntl.fcntl(probe, F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(probe, F_SETLEASE, fcntl.F_UNLCK)
    except OSError as e:
        pytest.skip(f"no read lease on this filesystem ({e}); the stamp checks still apply")
    finally:
        os.close(probe)
    for attempt in range(5):
        w = subprocess.Popen([sys.executable, "-c", LEASE_WRITER, path],
                             stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().strip() == "ready"
        p = tv("import", "--store", store, "m", path, "--chunk", "256K")
        out, _ = w.communicate(timeout=30)
        assert w.returncode != 3, "the importer never held a read lease on the shard"
        assert w.returncode == 0 and "opened" in out
        if p.returncode == 0:
            continue  # the import finished before the writer saw the lease: again
        assert "TV_E_SOURCE_CHANGED" in p.stderr and "opened for writing" in p.stderr, p.stderr
        assert "model.safetensors" in p.stderr
        break
    else:
        pytest.fail("the writer never caught the import reading")
    # Only the attempts the writer missed published a generation.
    models = js(tv("models", "--store", store, "--json"))["models"]
    assert sum(m["n_generations"] for m in models) == attempt, models
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
