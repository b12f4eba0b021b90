"""Differential tests of the read engine: every tensor of generated
checkpoints read back through read_into, get_tensor and the batch API (both
engines) equals the official loader's bytes, dtype and shape; row ranges
equal numpy slicing; float32 conversion equals ml_dtypes/numpy bit for bit;
`tensorvault get` writes the exact bytes; a changed device is refused."""
import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import gen_checkpoints as gen
from storeutil import reference_tensors

F32_FROM = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory, build_dir):
    """A store holding a two-shard checkpoint with every dtype, unaligned
    offsets, a tensor larger than the read chunk and zero-size tensors."""
    tmp = tmp_path_factory.mktemp("read")
    rng = np.random.default_rng(5)
    tensors = gen.random_tensors(rng, 3 * len(gen.DTYPES), big_tensor_bytes=(3 << 20) + 12)
    # Every float format the converter knows, with all 256 byte values for
    # the 8-bit ones (NaNs and subnormals included).
    for code in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
        tensors[f"all.{code}"] = np.arange(256, dtype=np.uint8).view(gen.DTYPES[code]).reshape(16, 16)
    tensors["all.F16"] = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    tensors["all.BF16"] = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256)
    ck = gen.write_checkpoint(str(tmp / "ck"), tensors, 2)
    store = str(tmp / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp / "img"), "--size", "64M"],
                 ["import", "--store", store, "m", ck, "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    return store, ck, reference_tensors(ck)


def dump(build_dir, store, spec, mode, out, engine="auto"):
    os.makedirs(out, exist_ok=True)
    p = subprocess.run([os.path.join(build_dir, "tests", "tv_dump"), store, spec, mode, str(out),
                        engine], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(out, "index.json")) as f:
        return {t["name"]: (t, os.path.join(out, f"{t['index']}.bin")) for t in json.load(f)}


@pytest.mark.parametrize("engine", ["uring", "pread"])
@pytest.mark.parametrize("mode", ["into", "get", "batch"])
def test_every_tensor_equals_official_loader(build_dir, stored, tmp_path, mode, engine):
    store, _, ref = stored
    got = dump(build_dir, store, "m", mode, tmp_path / "out", engine)
    assert set(got) == set(ref)
    for name, (dtype, shape, data) in ref.items():
        meta, path = got[name]
        assert meta["dtype"] == dtype and meta["shape"] == shape, name
        with open(path, "rb") as f:
            assert f.read() == data, name


def test_float32_conversion_bit_exact(build_dir, stored, tmp_path):
    store, _, ref = stored
    got = dump(build_dir, store, "m@1", "f32", tmp_path / "f32")
    checked = set()
    for name, (dtype, shape, data) in ref.items():
        if dtype not in F32_FROM:
            assert name not in got or not os.path.exists(got[name][1])
            continue
        src = np.frombuffer(data, dtype=F32_FROM[dtype])
        want = src.astype(np.float32).view(np.uint32)
        with open(got[name][1], "rb") as f:
            mine = np.frombuffer(f.read(), dtype=np.uint32)
        assert mine.shape == want.shape, name
        diff = np.nonzero(mine != want)[0]
        assert diff.size == 0, f"{name}: {diff.size} mismatches, first at {diff[:3]} " \
            f"(src bytes {src.view(np.uint8)[diff[:3]] if src.itemsize == 1 else ''}) " \
            f"{mine[diff[:3]]} != {want[diff[:3]]}"
        checked.add(dtype)
    assert checked == set(F32_FROM)


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
