"""Differential tests of the read API: every tensor of generated
checkpoints read back through tv_read_into, tv_get_tensor, tv_read_batch and
tv_read_rows equals the official loader's bytes, dtype and shape, with the
model opened either way: in-process from the store (both engines) and
through a tensorvaultd serving that same store (tv_model_open_daemon), the
same calls (tests/tools/tv_dump); float32 conversion equals ml_dtypes/numpy
bit for bit both ways; row ranges equal numpy slicing; `tensorvault get`
writes the exact bytes; a changed device is refused."""
import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import Daemon
from harness.store import reference_tensors


@pytest.fixture(scope="module")
def stored(tmp_path_factory, build_dir, every_float_value):
    """A store holding a two-shard checkpoint with every dtype, unaligned
    offsets, a tensor larger than the read chunk and zero-size tensors."""
    tmp = tmp_path_factory.mktemp("read")
    rng = np.random.default_rng(5)
    tensors = gen.random_tensors(rng, 3 * len(gen.DTYPES), big_tensor_bytes=(3 << 20) + 12)
    tensors.update(every_float_value)
    ck = gen.write_checkpoint(str(tmp / "ck"), tensors, 2)
    store = str(tmp / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp / "img"), "--size", "64M"],
                 ["import", "--store", store, "m", ck, "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    return store, ck, reference_tensors(ck)


@contextlib.contextmanager
def daemon_on(build_dir, workdir, store):
    """tensorvaultd serving the store directory `store`; yields the path of
    its fast-path socket once it accepts."""
    d = Daemon(build_dir, workdir, store=store)
    d.start()
    try:
        d.wait_socket()
        yield d.socket_path
    finally:
        d.stop()


@pytest.fixture(scope="module")
def stored_sock(tmp_path_factory, build_dir, stored):
    """The fast-path socket of a tensorvaultd serving `stored`'s store."""
    with daemon_on(build_dir, tmp_path_factory.mktemp("readd"), stored[0]) as sock:
        yield sock


def dump(build_dir, store, spec, mode, out, engine="auto", sock=None):
    """Runs tests/tools/tv_dump (every tensor of SPEC with one read call,
    guard bytes checked) into OUT, the model opened in-process from store,
    or through the daemon at sock when given: returns {name: (its
    index.json entry, the path of its bytes)}."""
    os.makedirs(out, exist_ok=True)
    where = ["--fastpath", sock] if sock else [store]
    p = subprocess.run([os.path.join(build_dir, "tests", "tv_dump"), *where, spec, mode, str(out),
                        *([] if sock else [engine])], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(out, "index.json")) as f:
        return {t["name"]: (t, os.path.join(out, f"{t['index']}.bin")) for t in json.load(f)}


# How a test opens the model: in-process from the store with an engine, or
# through the daemon serving the same store.
OPENINGS = ["store:uring", "store:pread", "daemon"]


def dump_opened(build_dir, stored, stored_sock, opening, spec, mode, out):
    if opening == "daemon":
        return dump(build_dir, None, spec, mode, out, sock=stored_sock)
    return dump(build_dir, stored[0], spec, mode, out, opening.split(":")[1])


@pytest.mark.parametrize("opening", OPENINGS)
@pytest.mark.parametrize("mode", ["into", "get", "batch", "rows"])
def test_every_tensor_equals_official_loader(build_dir, stored, stored_sock, tmp_path, mode,
                                             opening):
    _, _, ref = stored
    got = dump_opened(build_dir, stored, stored_sock, opening, "m", mode, tmp_path / "out")
    assert set(got) == set(ref)
    for name, (dtype, shape, data) in ref.items():
        meta, path = got[name]
        assert meta["dtype"] == dtype and meta["shape"] == shape, name
        with open(path, "rb") as f:
            assert f.read() == data, name


@pytest.mark.parametrize("opening", ["store:uring", "daemon"])
def test_float32_conversion_bit_exact(build_dir, f32_from, stored, stored_sock, tmp_path, opening):
    _, _, ref = stored
    got = dump_opened(build_dir, stored, stored_sock, opening, "m@1", "f32", tmp_path / "f32")
    checked = set()
    for name, (dtype, shape, data) in ref.items():
        if dtype not in f32_from:
            assert name not in got or not os.path.exists(got[name][1])
            continue
        src = np.frombuffer(data, dtype=f32_from[dtype])
        want = src.astype(np.float32).view(np.uint32)
        with open(got[name][1], "rb") as f:
            mine = np.frombuffer(f.read(), dtype=np.uint32)
        assert mine.shape == want.shape, name
        diff = np.nonzero(mine != want)[0]
        assert diff.size == 0, f"{name}: {diff.size} mismatches, first at {diff[:3]} " \
            f"(src bytes {src.view(np.uint8)[diff[:3]] if src.itemsize == 1 else ''}) " \
            f"{mine[diff[:3]]} != {want[diff[:3]]}"
        checked.add(dtype)
    assert checked == set(f32_from)


def test_get_cli_rows_and_bytes(tv, stored, tmp_path):
    store, _, ref = stored
    rng = np.random.default_rng(1)
    n_rows = 0
    for name, (dtype, shape, data) in sorted(ref.items()):
        out = tmp_path / "t.bin"
        tv("get", "--store", store, "m", name, "-o", out, check=True)
        assert out.read_bytes() == data, name
        if not shape or shape[0] == 0:
            continue
        r0 = int(rng.integers(0, shape[0]))
        r1 = int(rng.integers(r0, shape[0] + 1))
        tv("get", "--store", store, "m", name, "--rows", f"{r0}:{r1}", "-o", out, check=True)
        row_len = len(data) // shape[0]
        # numpy slicing of the official tensor, as bytes.
        rows = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], row_len)[r0:r1]
        assert out.read_bytes() == rows.tobytes(), (name, r0, r1)
        n_rows += 1
    assert n_rows > 10


def test_get_errors(tv, stored, tmp_path):
    store, _, ref = stored
    p = tv("get", "--store", store, "m", "no.such.tensor", "-o", tmp_path / "x")
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr
    scalar = next(n for n, (_, s, _) in ref.items() if s == [])
    p = tv("get", "--store", store, "m", scalar, "--rows", "0:1", "-o", tmp_path / "x")
    assert p.returncode == 1 and "TV_E_INVALID_ARG" in p.stderr
    big = "big.f32"
    p = tv("get", "--store", store, "m", big, "--rows", "5:2", "-o", tmp_path / "x")
    assert p.returncode == 2 and "'5:2'" in p.stderr  # R0 > R1: a usage error
    p = tv("get", "--store", store, "m@9", big, "-o", tmp_path / "x")
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr


def test_bench_reads_everything(tv, stored):
    store, _, ref = stored
    for engine in ("uring", "pread"):
        doc = json.loads(tv("bench", "--store", store, "m", "--engine", engine, "--json",
                            check=True).stdout)
        assert doc["bytes"] == sum(len(d) for _, _, d in ref.values())
        assert doc["tensors"] == len(ref)


def test_changed_device_refused_before_any_read(tv, tmp_path):
    rng = np.random.default_rng(2)
    ck = gen.write_checkpoint(str(tmp_path / "ck"), gen.random_tensors(rng, 10), 1)
    store, img = str(tmp_path / "s"), tmp_path / "img"
    tv("store", "init", "--store", store, "--image", img, "--size", "16M", check=True)
    tv("import", "--store", store, "m", ck, "--activate", check=True)
    name = next(iter(reference_tensors(ck)))
    tv("get", "--store", store, "m", name, "-o", tmp_path / "ok", check=True)
    os.truncate(img, os.path.getsize(img) + 4096)
    p = tv("get", "--store", store, "m", name, "-o", tmp_path / "bad")
    assert p.returncode == 1 and "TV_E_DEVICE_MISMATCH" in p.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("engine", ["uring", "pread"])
def test_replicated_generation_reads_identical(tv, build_dir, tmp_path, engine):
    """A generation with a copy on two devices: reads (split across the
    replicas for large batches) give the official bytes."""
    rng = np.random.default_rng(9)
    tensors = gen.random_tensors(rng, 30, big_tensor_bytes=(2 << 20) + 20)
    ck = gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)
    store = str(tmp_path / "s")
    tv("store", "init", "--store", store, "--image", tmp_path / "a.img", "--size", "32M", check=True)
    tv("store", "init", "--store", store, "--image", tmp_path / "b.img", "--size", "32M", check=True)
    tv("import", "--store", store, "m", ck, "--activate", "--replicas", "1,2", check=True)
    ref = reference_tensors(ck)
    for mode in ("batch", "into"):
        got = dump(build_dir, store, "m", mode, tmp_path / f"out-{mode}", engine)
        assert set(got) == set(ref)
        for name, (dtype, shape, data) in ref.items():
            with open(got[name][1], "rb") as f:
                assert f.read() == data, (mode, name)


LABEL_OFF = 1 << 20  # default region start: the label block


def _replicated_store(tv, tmp_path, n_dev=3):
    rng = np.random.default_rng(11)
    tensors = gen.random_tensors(rng, 20, big_tensor_bytes=(2 << 20) + 36)
    ck = gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)
    store = str(tmp_path / "s")
    imgs = [tmp_path / f"d{i}.img" for i in range(n_dev)]
    for img in imgs:
        tv("store", "init", "--store", store, "--image", img, "--size", "32M", check=True)
    ids = ",".join(str(i + 1) for i in range(n_dev))
    tv("import", "--store", store, "m", ck, "--activate", "--replicas", ids, check=True)
    return store, imgs, reference_tensors(ck)


def _damage(tv, tmp_path, img, how):
    """Makes one device image invalid the way an operator might."""
    if how == "deleted":
        os.unlink(img)
    elif how == "grown":
        os.truncate(img, os.path.getsize(img) + 4096)
    elif how == "shrunk":
        os.truncate(img, os.path.getsize(img) // 2)
    elif how == "label-zeroed":
        with open(img, "r+b") as f:
            f.seek(LABEL_OFF)
            f.write(b"\0" * 512)
    elif how == "other-store-label":
        other = tmp_path / f"other-{os.path.basename(img)}"
        tv("store", "init", "--store", other, "--image", str(other) + ".img", "--size", "32M",
           check=True)
        with open(str(other) + ".img", "rb") as f:
            f.seek(LABEL_OFF)
            label = f.read(4096)
        with open(img, "r+b") as f:
            f.seek(LABEL_OFF)
            f.write(label)
    else:
        raise ValueError(how)


WHY = {"deleted": "ENOENT", "grown": "resized", "shrunk": "resized",
       "label-zeroed": "magic", "other-store-label": "store uuid"}


@pytest.mark.parametrize("engine", ["uring", "pread"])
@pytest.mark.parametrize("how", sorted(WHY))
def test_replica_failover_cli(tv, build_dir, tmp_path, engine, how):
    """One of three replicas missing, resized or relabelled: `get`, `bench`
    and the batch API still read every tensor byte-identical, and warn
    naming the excluded device and why."""
    store, imgs, ref = _replicated_store(tv, tmp_path)
    bad = imgs[len(imgs) // 2 if how != "deleted" else 0]
    _damage(tv, tmp_path, bad, how)
    out = tmp_path / "t.bin"
    by_size = sorted(ref.items(), key=lambda kv: len(kv[1][2]))
    for name, (_, _, data) in by_size[:2] + by_size[-2:]:
        p = tv("get", "--store", store, "m", name, "-o", out, "--engine", engine, check=True)
        assert out.read_bytes() == data, name
        assert "excluded" in p.stderr and str(bad) in p.stderr and WHY[how] in p.stderr, p.stderr
    got = dump(build_dir, store, "m", "batch", tmp_path / "all", engine)
    assert set(got) == set(ref)
    for name, (_, _, data) in ref.items():
        with open(got[name][1], "rb") as f:
            assert f.read() == data, name
    p = tv("bench", "--store", store, "m", "--engine", engine, "--json", check=True)
    doc = json.loads(p.stdout)
    assert doc["bytes"] == sum(len(d) for _, _, d in ref.values())
    assert doc["tensors"] == len(ref)
    assert str(bad) in p.stderr
    # a second device lost as well: the last replica still serves everything
    second = imgs[-1] if bad != imgs[-1] else imgs[0]
    _damage(tv, tmp_path, second, "label-zeroed")
    name, (_, _, data) = max(ref.items(), key=lambda kv: len(kv[1][2]))
    tv("get", "--store", store, "m", name, "-o", out, "--engine", engine, check=True)
    assert out.read_bytes() == data


@pytest.mark.parametrize("engine", ["uring", "pread"])
def test_no_valid_replica_cli(tv, tmp_path, engine):
    """Every replica invalid: `get` and `bench` fail, naming each device and
    its reason, and write nothing."""
    store, imgs, ref = _replicated_store(tv, tmp_path, n_dev=2)
    _damage(tv, tmp_path, imgs[0], "other-store-label")
    _damage(tv, tmp_path, imgs[1], "deleted")
    name = next(iter(ref))
    p = tv("get", "--store", store, "m", name, "-o", tmp_path / "bad", "--engine", engine)
    assert p.returncode == 1, p.stderr
    assert "TV_E_DEVICE_MISMATCH" in p.stderr and "no shard has a valid replica" in p.stderr
    for img in imgs:
        assert str(img) in p.stderr
    assert "store uuid" in p.stderr and "No such file" in p.stderr
    assert not (tmp_path / "bad").exists()
    p = tv("bench", "--store", store, "m", "--engine", engine)
    assert p.returncode == 1 and "no shard has a valid replica" in p.stderr


@pytest.mark.parametrize("chunk", ["4611686018427387904", "9223372036854775808",
                                   "18446744073709551615", "1073741825"])
def test_huge_chunk_refused_by_library(tv, stored, tmp_path, chunk):
    """Chunk sizes near 2^62 and 2^64 are refused with a clear error naming
    the value (they used to corrupt the heap or loop)."""
    store, _, ref = stored
    name = next(iter(ref))
    for cmd in (["get", "--store", store, "m", name, "-o", tmp_path / "x"],
                ["bench", "--store", store, "m"]):
        p = tv(*cmd, "--chunk", chunk, timeout=60)
        assert p.returncode in (1, 2), p.stderr
        if p.returncode == 1:  # the CLI passed it on: the library refused it
            assert "TV_E_INVALID_ARG" in p.stderr and chunk in p.stderr, p.stderr
    assert not (tmp_path / "x").exists()


def test_staging_cap(tv, stored, tmp_path):
    """queue depth x chunk over TV_READ_MAX_STAGING (1 GiB) is refused,
    naming both values (the CLI refuses it as a usage error before the
    library would; test_model.c covers the library's own refusal); below it
    reads work."""
    store, _, ref = stored
    name, (_, _, data) = next(iter(sorted(ref.items())))
    p = tv("get", "--store", store, "m", name, "-o", tmp_path / "x", "--qd", "32", "--chunk", "1G")
    assert p.returncode == 2, p.stderr
    assert "staging" in p.stderr and "32" in p.stderr and "1073741824" in p.stderr
    assert not (tmp_path / "x").exists()
    tv("get", "--store", store, "m", name, "-o", tmp_path / "ok", "--qd", "4", "--chunk", "4M",
       check=True)
    assert (tmp_path / "ok").read_bytes() == data



FIRST_USE_CHILD = r"""
import ctypes as C, json, sys
lib_path, snap_path, ref_path, bad = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ref = json.load(open(ref_path))
lib = C.CDLL(lib_path)

class TvError(C.Structure):
    _fields_ = [("code", C.c_int), ("msg", C.c_char * 512)]

class Desc(C.Structure):
    _fields_ = [("name", C.c_char_p), ("name_len", C.c_size_t), ("dtype", C.c_int),
                ("rank", C.c_uint32), ("shape", C.POINTER(C.c_uint64)),
                ("nbytes", C.c_uint64), ("n_elements", C.c_uint64), ("shard", C.c_uint32)]

lib.tv_model_open_snapshot.argtypes = [C.c_char_p, C.c_size_t, C.c_void_p,
                                       C.POINTER(C.c_void_p), C.POINTER(TvError)]
lib.tv_model_n_tensors.restype = C.c_size_t
lib.tv_model_n_tensors.argtypes = [C.c_void_p]
lib.tv_model_tensor.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(Desc)]
lib.tv_read_into.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p, C.c_size_t, C.POINTER(TvError)]
lib.tv_model_close.argtypes = [C.c_void_p]
lib.tv_err_name.restype = C.c_char_p
lib.tv_err_name.argtypes = [C.c_int]
img = open(snap_path, "rb").read()
m, err = C.c_void_p(), TvError()
rc = lib.tv_model_open_snapshot(img, len(img), None, C.byref(m), C.byref(err))
assert rc == 0, err.msg
n = lib.tv_model_n_tensors(m)
d = Desc()
rc = lib.tv_model_tensor(m, bad, C.byref(d))
assert lib.tv_err_name(rc) == b"TV_E_SNAPSHOT", rc
assert d.name == b"" and d.nbytes == 0 and d.rank == 0
checked = 0
for i in range(n):
    if i == bad:
        continue
    assert lib.tv_model_tensor(m, i, C.byref(d)) == 0
    name = C.string_at(d.name, d.name_len)
    buf = C.create_string_buffer(max(1, d.nbytes))
    assert lib.tv_read_into(m, name, buf, d.nbytes, C.byref(err)) == 0, err.msg
    want_shape, want_hex = ref[name.decode()]
    assert buf.raw[:d.nbytes].hex() == want_hex, name
    assert [d.shape[k] for k in range(d.rank)] == want_shape, name
    checked += 1
assert checked == n - 1, (checked, n)
lib.tv_model_close(m)
print("ok", checked)
"""


def snapshot_checksum(img):
    """The snapshot header's 32-byte checksum field (docs/formats.md): XXH3-128
    of the image with the field zeroed, canonical (big-endian), then 16 zero
    bytes. img must have the field zeroed already."""
    import ctypes as C

    class H128(C.Structure):
        _fields_ = [("low64", C.c_uint64), ("high64", C.c_uint64)]

    xxh = C.CDLL("libxxhash.so.0")
    xxh.XXH3_128bits.restype = H128
    xxh.XXH3_128bits.argtypes = [C.c_char_p, C.c_size_t]
    h = xxh.XXH3_128bits(img, len(img))
    return h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big") + bytes(16)


def test_tensor_records_decoded_on_first_use(build_dir, stored, tmp_path):
    """Opening does no per-tensor work: a snapshot whose tensor record is
    invalid (an unknown dtype, with the checksum recomputed so the image
    passes its header checks) still opens; that tensor alone reports
    TV_E_SNAPSHOT from tv_model_tensor (with an empty description), while
    the others read their exact bytes and shapes. Runs the library through
    ctypes in a child (with the sanitizer runtime preloaded for the ASan
    build, whose library expects it)."""
    import struct

    store, _, ref = stored
    with open(os.path.join(store, "snapshots", "m", "1.tvsnap"), "rb") as f:
        img = bytearray(f.read())
    n_tensors, = struct.unpack_from("<I", img, 76)
    off_tensors, = struct.unpack_from("<Q", img, 128)
    bad = n_tensors // 2
    struct.pack_into("<I", img, off_tensors + 40 * bad + 8, 0xFFFF)  # dtype
    img[24:56] = bytes(32)
    img[24:56] = snapshot_checksum(bytes(img))
    snap = tmp_path / "forged.tvsnap"
    snap.write_bytes(bytes(img))
    refj = tmp_path / "ref.json"
    refj.write_text(json.dumps({k: (v[1], v[2].hex()) for k, v in ref.items()}))
    lib = os.path.join(build_dir, "core", "libtensorvault.so")
    env = dict(os.environ)
    syms = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True,
                          text=True).stdout
    if "__asan_" in syms:
        rt = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"],
                            capture_output=True, text=True).stdout.strip()
        assert os.path.exists(rt), f"ASan runtime not found for {lib}"
        env["LD_PRELOAD"] = rt
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    p = subprocess.run([sys.executable, "-c", FIRST_USE_CHILD, lib, str(snap), str(refj),
                        str(bad)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["ok", str(n_tensors - 1)]
