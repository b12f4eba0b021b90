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
    """`tensors SPEC --json`: the list form (no replicas)."""
    doc = json.loads(tv("tensors", "--store", store, spec, "--json", check=True).stdout)
    return doc


def device_paths(tv, store):
    """{device id: path} from `devices --json` (exits 1 when a device is
    unhealthy, with the JSON all the same)."""
    p = tv("devices", "--store", store, "--json")
    return {d["id"]: d["path"] for d in json.loads(p.stdout)["devices"]}


def assert_store_matches(tv, store, spec, ckpt_path, replicas=1):
    """Every tensor's bytes, read from the device at its recorded offset on
    every replica (`tensor SPEC NAME --json`), equal the official loader's
    bytes; dtype, shape and nbytes too. Returns the list document with each
    tensor replaced by its single-tensor document (file_offset, replicas)."""
    ref = reference_tensors(ckpt_path)
    doc = stored_tensors(tv, store, spec)
    paths = device_paths(tv, store)
    got = {t["name"]: t for t in doc["tensors"]}
    assert set(got) == set(ref)
    detailed = []
    for name, (dtype, shape, data) in ref.items():
        t = got[name]
        assert t["dtype"] == dtype, name
        assert t["shape"] == shape, name
        assert t["nbytes"] == len(data), name
        assert t["data_offsets"][1] - t["data_offsets"][0] == len(data), name
        one = json.loads(tv("tensor", "--store", store, spec, name, "--json", check=True).stdout)
        assert {k: one[k] for k in t} == t, name  # the list form is the one form, less two fields
        assert len(one["replicas"]) == replicas, name
        for r in one["replicas"]:
            assert read_at(paths[r["device_id"]], r["device_offset"], len(data)) == data, \
                f"{name} on device {r['device_id']}"
        detailed.append(one)
    doc["tensors"] = detailed
    return doc
