"""Store-level agreement with the official safetensors parser: every case it
accepts either imports and reads back identical (through `tensors --json`
and `get`), or is refused by `import` with the same named error as
`inspect`, before anything is written. Also the Hugging Face hub cache
layout (models--ORG--NAME/snapshots/REV/* linking into blobs/)."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import safetensors

import harness.checkpoints as gen
from harness.store import reference_tensors

ACCEPTED = sorted(k for k, v in gen.AGREEMENT.items() if v[3] is None)
REFUSED = sorted(k for k, v in gen.AGREEMENT.items() if v[3] is not None)


def js(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def store(tv, tmp_path):
    s = str(tmp_path / "store")
    js(tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "64M", "--json"))
    return s


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    d = tmp_path_factory.mktemp("agreement")
    gen.agreement(str(d))
    idx = gen.agreement_index(str(d / "index"))
    return d, idx


def used(tv, store):
    p = tv("devices", "--store", store, "--json")
    return sum(d["used_bytes"] for d in json.loads(p.stdout)["devices"])


def assert_reads_back(tv, store, model, ref, tmp_path, shards=None):
    """tensors --json names every reference tensor with its dtype and shape,
    and `get` returns its exact bytes."""
    doc = js(tv("tensors", "--store", store, model, "--json"))
    got = {t["name"]: t for t in doc["tensors"]}
    assert set(got) == set(ref)
    for i, (name, (dtype, shape, data)) in enumerate(sorted(ref.items())):
        t = got[name]
        assert (t["dtype"], t["shape"], t["nbytes"]) == (dtype, shape, len(data)), name
        if shards is not None:
            assert t["shard"] == shards[name], name
        out = tmp_path / f"get{i}.bin"
        tv("get", "--store", store, model, name, "-o", out, check=True)
        assert out.read_bytes() == data, name
    return doc


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted_case_round_trips(tv, store, cases, case, tmp_path):
    d, _ = cases
    path = d / case
    ref = reference_tensors(str(path))
    js(tv("import", "--store", store, "m", path, "--activate", "--json"))
    assert_reads_back(tv, store, "m", ref, tmp_path, {n: case for n in ref})
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0


@pytest.mark.parametrize("case", ["idx_total_size_above_int64_max", "idx_total_size_above_u64_max"])
def test_accepted_index_round_trips(tv, store, cases, case, tmp_path):
    _, idx = cases
    assert idx[case] is None
    d = cases[0] / "index" / case
    ref = reference_tensors(str(d))
    js(tv("import", "--store", store, "m", d, "--activate", "--json"))
    assert_reads_back(tv, store, "m", ref, tmp_path,
                      {"a": "s1.safetensors", "b": "s2.safetensors"})


def test_refused_cases_write_nothing(tv, store, cases):
    d, idx = cases
    refused = {c: gen.AGREEMENT[c][3] for c in REFUSED}
    refused.update({f"index/{c}": e for c, e in idx.items() if e})
    assert len(refused) >= 15
    for case, err in refused.items():
        # inspect and import refuse alike, and import writes nothing.
        pi = tv("inspect", d / case)
        assert pi.returncode == 1 and err in pi.stderr, (case, pi.stderr)
        p = tv("import", "--store", store, "m", d / case, "--activate")
        assert p.returncode == 1 and err in p.stderr, (case, p.stderr)
        assert used(tv, store) == 0, case
    assert js(tv("models", "--store", store, "--json"))["models"] == []


# ---- the Hugging Face hub cache layout ----

def hub_layout(src_dir, cache, repo="models--org--name", rev="0f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6"):
    """Moves every file of src_dir into cache/repo/blobs/<sha256> and links
    it from cache/repo/snapshots/rev/<name> with a relative link, exactly as
    huggingface_hub does. Returns the snapshot directory."""
    root = os.path.join(cache, repo)
    blobs = os.path.join(root, "blobs")
    snap = os.path.join(root, "snapshots", rev)
    os.makedirs(blobs, exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(rev)
    for name in sorted(os.listdir(src_dir)):
        with open(os.path.join(src_dir, name), "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()
        shutil.move(os.path.join(src_dir, name), os.path.join(blobs, h))
        link = os.path.join(snap, name)
        os.symlink(os.path.relpath(os.path.join(blobs, h), snap), link)
        assert os.readlink(link) == f"../../blobs/{h}"
    return snap


@pytest.mark.parametrize("shards", [1, 3])
def test_hub_cache_layout_imports(tv, store, tmp_path, shards):
    rng = np.random.default_rng(40 + shards)
    tensors = gen.random_tensors(rng, 30)
    src = tmp_path / "src"
    gen.write_checkpoint(str(src), tensors, shards, metadata={"format": "np"})
    names = sorted(os.listdir(src))
    snap = hub_layout(str(src), str(tmp_path / "hub"))
    shard_files = [os.path.join(snap, n) for n in names if n.endswith(".safetensors")]
    ref = reference_tensors(snap)
    assert set(ref) == set(tensors)
    where = {}
    for p in shard_files:
        with open(p, "rb") as f:
            for name, _ in safetensors.deserialize(f.read()):
                where[name] = os.path.basename(p)
    # inspect: shard names are the link names, paths the blobs.
    doc = js(tv("inspect", "--json", snap))
    assert sorted(s["name"] for s in doc["shards"]) == sorted(set(where.values()))
    assert all("/blobs/" in s["path"] for s in doc["shards"])
    assert {t["name"]: t["shard"] for t in doc["tensors"]} == where
    if shards > 1:
        assert doc["index"] == os.path.join(os.path.realpath(snap), "model.safetensors.index.json")
    # import: every tensor reads back identical under its link-named shard.
    js(tv("import", "--store", store, "m", snap, "--activate", "--json"))
    assert_reads_back(tv, store, "m", ref, tmp_path, where)
    assert js(tv("verify", "--store", store, "--json"))["n_failed"] == 0


def test_hub_cache_escape_writes_nothing(tv, store, tmp_path):
    rng = np.random.default_rng(50)
    src = tmp_path / "src"
    gen.write_checkpoint(str(src), gen.random_tensors(rng, 12), 2)
    snap = hub_layout(str(src), str(tmp_path / "hub"))
    # One shard now links out of the repository's blobs.
    victim = os.path.join(snap, "model-00002-of-00002.safetensors")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(os.path.realpath(victim), outside)
    os.unlink(victim)
    os.symlink(os.path.relpath(outside, snap), victim)
    for cmd in (("inspect", snap), ("import", "--store", store, "m", snap)):
        p = tv(*cmd)
        assert p.returncode == 1 and "TV_E_IDX_SHARD_ESCAPE" in p.stderr, p.stderr
    assert used(tv, store) == 0
    assert js(tv("models", "--store", store, "--json"))["models"] == []
