"""The raw store on a real block device: a loop device with 4096-byte
sectors over a sparse image. Import (plain and strict), verify, byte-exact
reads at the recorded device offsets, generations, gc, a crash during the
write phase, a re-attach with another sector size (device mismatch), and
the claim checks of store init (a loop device is the same device as its
backing file; a symlink or second node with the same st_rdev too).

Needs root and a working `losetup`; otherwise every test is skipped with the
reason. Loop devices are always detached and images deleted, even when a
test fails."""
import json
import os
import stat
import subprocess
import time

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.store import assert_store_matches

IMAGE_SIZE = 512 << 20


def js(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _losetup(*args):
    try:
        return subprocess.run(["losetup", *map(str, args)], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:  # not installed, hung
        return subprocess.CompletedProcess(["losetup", *args], 127, "", str(e))


class Loop:
    """A sparse image and the loop device it is attached to (at most one)."""

    def __init__(self, image):
        self.image = image
        self.dev = None

    def attach(self, sector_size, dev=None):
        """Attaches the image; dev=None lets losetup pick a free device,
        else re-attaches at that exact path (the registry knows it by path).
        Returns the CompletedProcess of the last attempt."""
        assert self.dev is None
        args = ["--sector-size", sector_size]
        args += ["--find", "--show", self.image] if dev is None else [dev, self.image]
        for _ in range(20):  # a just-detached device can be busy for a moment
            p = _losetup(*args)
            if p.returncode == 0:
                self.dev = p.stdout.strip() if dev is None else dev
                break
            if dev is None:
                break
            time.sleep(0.1)
        return p

    def detach(self):
        if self.dev is None:
            return
        dev, self.dev = self.dev, None
        for _ in range(20):
            if _losetup("-d", dev).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"losetup -d {dev} failed")

    def sector_size(self):
        with open(f"/sys/block/{os.path.basename(self.dev)}/queue/logical_block_size") as f:
            return int(f.read())


@pytest.fixture
def loop(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("loop-device tests need root (losetup)")
    img = str(tmp_path / "loop.img")
    with open(img, "wb") as f:
        f.truncate(IMAGE_SIZE)  # sparse
    lp = Loop(img)
    try:
        p = lp.attach(4096)
        if p.returncode != 0:
            pytest.skip(f"losetup --find --show --sector-size 4096 failed "
                        f"(rc {p.returncode}): {p.stderr.strip()}")
        assert lp.dev.startswith("/dev/loop"), lp.dev
        assert lp.sector_size() == 4096
        yield lp
    finally:
        try:
            lp.detach()
        finally:
            os.unlink(img)


@pytest.fixture
def ckpt(tmp_path):
    rng = np.random.default_rng(21)
    tensors = gen.random_tensors(rng, 40, big_tensor_bytes=3 << 20)
    return gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)


@pytest.fixture
def ckpt_b(tmp_path):
    rng = np.random.default_rng(22)
    tensors = gen.random_tensors(rng, 25, big_tensor_bytes=2 << 20)
    return gen.write_checkpoint(str(tmp_path / "ckb"), tensors, 2)


@pytest.fixture
def store(tv, tmp_path, loop):
    s = str(tmp_path / "store")
    r = js(tv("store", "init", "--store", s, "--device", loop.dev, "--json"))
    assert r["kind"] == "block" and r["path"] == loop.dev
    return s


def devices(tv, store):
    """devices --json; exits 1 (with the JSON) when a device is unhealthy."""
    p = tv("devices", "--store", store, "--json")
    doc = json.loads(p.stdout)["devices"]
    assert p.returncode == (0 if all(d["status"] == "ok" for d in doc) else 1), p.stderr
    return doc


def test_loop_geometry(tv, store, loop):
    (d,) = devices(tv, store)
    assert d["kind"] == "block" and d["path"] == loop.dev
    assert d["lba_size"] == 4096 and d["io_align"] == 4096
    assert d["object_align"] % 65536 == 0
    assert d["size_bytes"] == IMAGE_SIZE
    assert d["status"] == "ok" and d["used_bytes"] == 0
    assert d["region_offset"] > 0 and d["region_offset"] % 4096 == 0
    assert d["data_offset"] % d["object_align"] == 0


def test_loop_import_verify_generations_gc(tv, store, loop, ckpt, ckpt_b):
    r = js(tv("import", "--store", store, "m", ckpt, "--activate", "--json"))
    assert r["generation"] == 1 and r["active"] and r["total_bytes"] > 3 << 20
    doc = assert_store_matches(tv, store, "m", ckpt)
    paths = {d["id"]: d["path"] for d in devices(tv, store)}
    assert all(paths[rep["device_id"]] == loop.dev for t in doc["tensors"] for rep in t["replicas"])
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    # Second generation, strict (read back and compare), then activated.
    r2 = js(tv("import", "--store", store, "m", ckpt_b, "--strict", "--json"))
    assert r2["generation"] == 2 and not r2["active"] and r2["written_bytes"] > 2 << 20
    assert_store_matches(tv, store, "m@2", ckpt_b)
    assert_store_matches(tv, store, "m", ckpt)
    js(tv("activate", "--store", store, "m", "2", "--json"))
    assert_store_matches(tv, store, "m", ckpt_b)
    # Retire the old generation; gc frees its objects and nothing else.
    used_before = devices(tv, store)[0]["used_bytes"]
    js(tv("retire", "--store", store, "m", "1", "--json"))
    g = js(tv("gc", "--store", store, "--json"))
    assert g["n_objects_freed"] == 2 and g["freed_bytes"] > 3 << 20
    assert devices(tv, store)[0]["used_bytes"] == used_before - g["freed_bytes"]
    v = js(tv("verify", "--store", store, "--json"))
    assert v["n_failed"] == 0 and v["n_objects"] == 2
    assert_store_matches(tv, store, "m", ckpt_b)
    gens = js(tv("generations", "--store", store, "m", "--json"))["generations"]
    assert [(x["generation"], x["state"], x["active"]) for x in gens] == \
        [(1, "retired", False), (2, "ready", True)]


def test_loop_strict_import_activate(tv, store, ckpt):
    r = js(tv("import", "--store", store, "m", ckpt, "--strict", "--activate", "--json"))
    assert r["generation"] == 1 and r["active"]
    assert_store_matches(tv, store, "m", ckpt)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0


def test_loop_crash_at_write_leaves_active_generation_intact(tv, tv_crash, store, ckpt, ckpt_b):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    used = devices(tv, store)[0]["used_bytes"]
    p = tv_crash("import", "--store", store, "m", ckpt_b, "--activate", crash_at="write")
    assert p.returncode == -9, (p.returncode, p.stderr)
    gens = js(tv("generations", "--store", store, "m", "--json"))["generations"]
    assert [(g["generation"], g["active"]) for g in gens] == [(1, True)]
    assert_store_matches(tv, store, "m", ckpt)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    js(tv("gc", "--store", store, "--json"))
    assert devices(tv, store)[0]["used_bytes"] == used
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0
    r = js(tv("import", "--store", store, "m", ckpt_b, "--activate", "--json"))
    assert r["generation"] == 2
    assert_store_matches(tv, store, "m", ckpt_b)


def test_loop_sector_size_change_is_refused(tv, store, loop, ckpt, ckpt_b):
    tv("import", "--store", store, "m", ckpt, "--activate", check=True)
    dev = loop.dev
    loop.detach()
    p = loop.attach(512, dev)
    if p.returncode != 0 and "busy" in p.stderr.lower():
        # Another process took the freed loop device: the registry knows the
        # store by this path, so the check cannot go on.
        pytest.skip(f"{dev} was taken by another process before re-attach: {p.stderr.strip()}")
    assert p.returncode == 0, f"re-attach at {dev}: {p.stderr}"
    assert loop.sector_size() == 512
    (d,) = devices(tv, store)
    assert d["status"] == "mismatch", d
    assert "lba size" in d["message"] and "512" in d["message"], d["message"]
    p = tv("import", "--store", store, "m", ckpt_b)
    assert p.returncode == 1 and "TV_E_DEVICE_MISMATCH" in p.stderr, p.stderr
    assert tv("verify", "--store", store).returncode == 1
    # Back at 4096-byte sectors the store is whole again.
    loop.detach()
    p = loop.attach(4096, dev)
    assert p.returncode == 0, f"re-attach at {dev}: {p.stderr}"
    assert devices(tv, store)[0]["status"] == "ok"
    assert_store_matches(tv, store, "m", ckpt)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0


# ---- a loop device is recognised by its backing file ------------------------

def test_loop_over_registered_image_is_refused(tv, tmp_path):
    """A store on a file image; a loop device over that same file is the same
    device (LOOP_GET_STATUS64 backing inode), refused even with --force."""
    if os.geteuid() != 0:
        pytest.skip("loop-device tests need root (losetup)")
    s = str(tmp_path / "s")
    img = str(tmp_path / "s.img")
    js(tv("store", "init", "--store", s, "--image", img, "--size", "64M", "--json"))
    lp = Loop(img)
    try:
        p = lp.attach(4096)
        if p.returncode != 0:
            pytest.skip(f"losetup --find --show failed (rc {p.returncode}): {p.stderr.strip()}")
        before = open(img, "rb").read(4 << 20)
        p = tv("store", "init", "--store", s, "--device", lp.dev, "--force")
        assert p.returncode == 1 and "EEXIST" in p.stderr and "already device 1" in p.stderr, \
            p.stderr
        assert open(img, "rb").read(4 << 20) == before
        # Another store may not take it without --force either (it holds our label).
        other = str(tmp_path / "o")
        p = tv("store", "init", "--store", other, "--device", lp.dev)
        assert p.returncode == 1 and "TV_E_DEVICE_IN_USE" in p.stderr, p.stderr
        assert not os.path.exists(other)
    finally:
        lp.detach()


def test_image_over_registered_loop_device_is_refused(tv, store, loop, tmp_path):
    """The other way round: the store has the loop device; its backing file
    given as an image or device is the same storage, and so are a symlink
    (as in /dev/disk/by-*) and a second device node with the same st_rdev."""
    alias = tmp_path / "by-id-alias"
    os.symlink(loop.dev, alias)
    node = tmp_path / "node"
    os.mknod(node, 0o600 | stat.S_IFBLK, os.stat(loop.dev).st_rdev)
    for args in (["--device", loop.image], ["--image", loop.image, "--size", str(IMAGE_SIZE)],
                 ["--device", alias], ["--device", node]):
        p = tv("store", "init", "--store", store, *args, "--force")
        assert p.returncode == 1 and "EEXIST" in p.stderr and "already device 1" in p.stderr, \
            p.stderr
    assert len(devices(tv, store)) == 1
