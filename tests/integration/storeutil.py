"""Helpers for store tests: a store on a file image or block device, and the
reference bytes of every tensor from the official safetensors loader."""
import json
import os

import safetensors


def reference_tensors(ckpt_path):
    """{name: (dtype, shape, bytes)} from the official loader, for a file,
    an index or a directory."""
    if os.path.isdir(ckpt_path):
        idx = os.path.join(ckpt_path, "model.safetensors.index.json")
        ckpt_path = idx if os.path.exists(idx) else os.path.join(ckpt_path, "model.safetensors")
    if ckpt_path.endswith(".json"):
        with open(ckpt_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        paths = [os.path.join(os.path.dirname(ckpt_path), s) for s in files]
    else:
        paths = [ckpt_path]
    out = {}
    for p in paths:
        with open(p, "rb") as f:
            for name, t in safetensors.deserialize(f.read()):
                out[name] = (t["dtype"], list(t["shape"]), bytes(t["data"]))
    return out


def read_at(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def stored_tensors(tv, store, spec):
    doc = json.loads(tv("tensors", "--store", store, spec, "--json", check=True).stdout)
    return doc


def assert_store_matches(tv, store, spec, ckpt_path, replicas=1):
    """Every tensor's bytes, read from the device at its recorded offset on
    every replica, equal the official loader's bytes; dtype and shape too."""
    ref = reference_tensors(ckpt_path)
    doc = stored_tensors(tv, store, spec)
    got = {t["name"]: t for t in doc["tensors"]}
    assert set(got) == set(ref)
    for name, (dtype, shape, data) in ref.items():
        t = got[name]
        assert t["dtype"] == dtype, name
        assert t["shape"] == shape, name
        assert t["length"] == len(data), name
        assert len(t["replicas"]) == replicas, name
        for r in t["replicas"]:
            assert read_at(r["device"], r["device_offset"], len(data)) == data, \
                f"{name} on device {r['device_id']}"
    return doc
