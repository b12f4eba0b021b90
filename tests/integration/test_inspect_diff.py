"""Differential test: `tensorvault inspect --json` agrees with the official
safetensors package on every tensor's name, dtype, shape, absolute offset and
length, and on __metadata__; every malformed fixture fails with its named
error and a non-zero exit."""
import json
import os
import re

import numpy as np
import pytest
import safetensors
from safetensors import safe_open

import harness.checkpoints as gen

SEEDS = range(12)


def reference(shard_path):
    """What the official package says about one shard file."""
    with open(shard_path, "rb") as f:
        blob = f.read()
    ref = {}
    # deserialize() is the official loader's byte view, for every dtype.
    for name, t in safetensors.deserialize(blob):
        ref[name] = {"dtype": t["dtype"], "shape": list(t["shape"]), "data": bytes(t["data"])}
    with safe_open(shard_path, framework="numpy") as f:
        meta = f.metadata()
        for name in f.keys():
            sl = f.get_slice(name)
            assert ref[name]["dtype"] == sl.get_dtype()
            assert ref[name]["shape"] == list(sl.get_shape())
            if sl.get_dtype() in gen.DTYPES and sl.get_dtype() in (
                    "BOOL", "U8", "I8", "I16", "U16", "F16", "I32", "U32", "F32", "F64", "I64",
                    "U64", "C64") and max(sl.get_shape(), default=0) < 2**31:
                # (numpy refuses huge dimensions even of an empty array)
                arr = f.get_tensor(name)
                assert arr.tobytes() == ref[name]["data"]
    return ref, meta, blob


def check_against_reference(tv, path):
    p = tv("inspect", "--json", path, check=True)
    doc = json.loads(p.stdout)
    by_shard = {}
    for t in doc["tensors"]:
        by_shard.setdefault(t["shard"], []).append(t)
    assert len(doc["shards"]) == len(by_shard) or any(s["n_tensors"] == 0 for s in doc["shards"])
    seen = 0
    for s in doc["shards"]:
        ref, meta, blob = reference(s["path"])
        assert s["metadata"] == meta
        assert s["file_size"] == len(blob)
        mine = {t["name"]: t for t in by_shard.get(s["name"], [])}
        assert set(mine) == set(ref), f"tensor names differ in {s['name']}"
        for name, r in ref.items():
            t = mine[name]
            assert t["dtype"] == r["dtype"], name
            assert t["shape"] == r["shape"], name
            assert t["length"] == len(r["data"]), name
            assert blob[t["offset"]:t["offset"] + t["length"]] == r["data"], name
            seen += 1
        # Iteration is in file order within a shard.
        in_order = [t["offset"] for t in by_shard.get(s["name"], [])]
        assert in_order == sorted(in_order)
    assert seen == doc["n_tensors"] == len(doc["tensors"])
    return doc


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_inspect_matches_official_loader(tv, tmp_path, seed, shards):
    rng = np.random.default_rng(seed)
    tensors = gen.random_tensors(rng, 20 + 7 * seed)
    path = gen.write_checkpoint(str(tmp_path / "ck"), tensors, shards, metadata={"seed": str(seed)})
    doc = check_against_reference(tv, path)
    assert doc["n_tensors"] == len(tensors)
    if shards > 1:
        assert doc["total_size"] == sum(v.nbytes for v in tensors.values())
        # Opening the directory picks the index.
        assert json.loads(tv("inspect", "--json", str(tmp_path / "ck"), check=True).stdout) == doc


def test_two_shard_checkpoint_every_dtype(tv, tmp_path):
    rng = np.random.default_rng(7)
    tensors = gen.random_tensors(rng, 2 * len(gen.DTYPES))
    path = gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)
    doc = check_against_reference(tv, path)
    assert {t["dtype"] for t in doc["tensors"]} >= set(gen.DTYPES)
    assert any(t["offset"] % 8 for t in doc["tensors"]), "expected unaligned offsets"
    assert any(t["length"] == 0 for t in doc["tensors"]), "expected a zero-size tensor"
    assert any(t["shape"] == [] for t in doc["tensors"]), "expected a rank-0 tensor"


def test_text_output_lists_every_tensor(tv, tmp_path):
    rng = np.random.default_rng(3)
    tensors = gen.random_tensors(rng, 10)
    path = gen.write_checkpoint(str(tmp_path / "ck"), tensors, 2)
    out = tv("inspect", path, check=True).stdout
    for name in tensors:
        assert name in out
    assert f"{len(tensors)} tensors, 2 shards" in out


@pytest.fixture(scope="module")
def malformed_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("malformed")
    return d, gen.malformed(str(d))


def test_malformed_fixture_count(malformed_dir):
    _, expect = malformed_dir
    assert len(expect) >= 30


@pytest.mark.parametrize("json_mode", [False, True])
def test_malformed_fixtures_fail_with_named_error(tv, malformed_dir, json_mode):
    d, expect = malformed_dir
    for name, err in sorted(expect.items()):
        args = ["inspect", "--json", d / name] if json_mode else ["inspect", d / name]
        p = tv(*args)
        assert p.returncode == 1, f"{name}: exit {p.returncode}"
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        assert len(lines) == 1, f"{name}: expected one error line, got {lines}"
        assert err in lines[0], f"{name}: expected {err}, got {lines[0]}"
        if json_mode:
            assert json.loads(p.stdout)["error"]["code"] == err
        else:
            assert p.stdout == ""


def test_missing_path(tv, tmp_path):
    p = tv("inspect", tmp_path / "nope.safetensors")
    assert p.returncode == 1 and "ENOENT" in p.stderr


def test_usage_errors(tv):
    assert tv("inspect").returncode == 2
    assert tv("inspect", "--bogus", "x").returncode == 2
    assert tv("nosuchcommand").returncode == 2


# ---- agreement with the official parser, case by case ----

def official_accepts(path):
    with open(path, "rb") as f:
        blob = f.read()
    try:
        safetensors.deserialize(blob)
    except Exception:  # the official parser raises SafetensorError
        return False
    with safe_open(str(path), framework="numpy"):
        pass
    return True


def documented_differences():
    """The error codes named in docs/formats.md's "Deliberate differences
    from the official parser" list."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "formats.md")) as f:
        text = f.read()
    part = text.split("Deliberate differences from the official parser", 1)[1]
    part = part.split("\n#", 1)[0]
    return set(re.findall(r"TV_E_[A-Z0-9_]+", part))


@pytest.fixture(scope="module")
def agreement_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("agreement")
    return d, gen.agreement(str(d)), gen.agreement_index(str(d / "index"))


@pytest.mark.parametrize("case", sorted(gen.AGREEMENT))
def test_agreement_case(tv, agreement_dir, case):
    d, cases, _ = agreement_dir
    official, err = cases[case]
    path = d / case
    assert official_accepts(path) == official, "the official parser changed its mind"
    if err is None:
        doc = check_against_reference(tv, str(path))
        p = tv("inspect", "--json", path, check=True)
        assert json.loads(p.stdout) == doc
        return
    p = tv("inspect", "--json", path)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == err, p.stderr
    if official:
        # Accepted by the official parser, refused here: a documented difference.
        assert err in documented_differences(), f"{case}: {err} missing from docs/formats.md's list"


def test_documented_differences_are_tested():
    """docs/formats.md's list holds exactly the codes of the cases the official
    parser accepts and tensorvault refuses."""
    refused = {err for _, _, official, err in gen.AGREEMENT.values() if official and err}
    assert documented_differences() == refused


@pytest.mark.parametrize("case", ["idx_total_size_above_int64_max", "idx_total_size_above_u64_max",
                                  "idx_empty_tensor_name", "idx_nul_tensor_name"])
def test_agreement_index_case(tv, agreement_dir, case):
    d, _, cases = agreement_dir
    err = cases[case]
    path = d / "index" / case
    if err is None:
        doc = check_against_reference(tv, str(path))
        assert doc["total_size"] is None  # never enforced; not representable: not reported
        assert doc["n_tensors"] == 2
    else:
        p = tv("inspect", "--json", path)
        assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == err, p.stderr
