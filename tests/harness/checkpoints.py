#!/usr/bin/env python3
"""Test-data generator: writes safetensors checkpoints with the official
`safetensors` package (random shapes and dtypes, single file or sharded with
model.safetensors.index.json), and malformed fixtures for error tests.

Invariant: every valid checkpoint here is produced by the official writer, so
whatever tensorvault reads back is compared against the reference format, not
against our own understanding of it.

Usage (a program too; it imports nothing of the harness):
  tests/harness/checkpoints.py random OUT_DIR [--seed N] [--tensors N] [--shards N]
  tests/harness/checkpoints.py demo OUT_DIR
  tests/harness/checkpoints.py malformed OUT_DIR     (one file per named error)
"""
import argparse
import json
import os
import struct
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

# numpy dtype for every dtype the official writer accepts from numpy.
DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64),
    "C64": np.dtype(np.complex64),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}


def random_array(rng, dt, shape):
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dt == np.bool_:
        return rng.integers(0, 2, size=n).astype(np.bool_).reshape(shape)
    raw = rng.bytes(n * dt.itemsize)
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def random_tensors(rng, n_tensors, big_tensor_bytes=0):
    """n_tensors tensors over every dtype; includes a rank-0, a zero-size and
    odd-length byte tensors so offsets are unaligned."""
    names = list(DTYPES)
    out = {}
    for i in range(n_tensors):
        code = names[i % len(names)] if i < len(names) else names[rng.integers(len(names))]
        dt = DTYPES[code]
        kind = i % 7
        if kind == 0:
            shape = ()
        elif kind == 1 and i > 0:
            shape = (int(rng.integers(0, 4)), 0)
        else:
            rank = int(rng.integers(1, 5))
            shape = tuple(int(rng.integers(1, 8)) for _ in range(rank))
        out[f"model.layers.{i // 4}.t{i}.{code.lower()}"] = random_array(rng, dt, shape)
    # Odd-length 1-byte tensors make BEGINs non-multiples of 8 for the rest.
    out["odd.u8"] = random_array(rng, DTYPES["U8"], (3,))
    out["odd.i8"] = random_array(rng, DTYPES["I8"], (5,))
    if big_tensor_bytes:
        out["big.f32"] = random_array(rng, DTYPES["F32"], (big_tensor_bytes // 4,))
    return out


def write_checkpoint(out_dir, tensors, n_shards, metadata=None):
    """Writes one file (n_shards == 1: model.safetensors) or HF shards plus
    model.safetensors.index.json. Returns the path to open."""
    os.makedirs(out_dir, exist_ok=True)
    if n_shards <= 1:
        path = os.path.join(out_dir, "model.safetensors")
        save_file(tensors, path, metadata=metadata)
        return path
    names = sorted(tensors)
    weight_map = {}
    total = 0
    for s in range(n_shards):
        part = {k: tensors[k] for k in names[s::n_shards]}
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(part, os.path.join(out_dir, fname), metadata=metadata)
        for k, v in part.items():
            weight_map[k] = fname
            total += v.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    path = os.path.join(out_dir, "model.safetensors.index.json")
    with open(path, "w") as f:
        json.dump(index, f, indent=2)
    return path


def raw_shard(header, data=b""):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _t(dt, shape, b, e):
    return {"dtype": dt, "shape": shape, "data_offsets": [b, e]}


def _hdr(text):
    """Header text with ' for " (so the cases read naturally)."""
    return text.replace("'", '"').encode()


W = "'w':{'dtype':'U8','shape':[3],'data_offsets':[0,3]}"

# Cases where tensorvault and the official parser (safetensors.deserialize /
# safe_open) must be compared: {file: (header, data, official accepts?,
# tensorvault's error or None)}. An entry the official parser accepts and
# tensorvault refuses is a deliberate difference (docs/formats.md, "Deliberate
# differences from the official parser"); every other entry must agree.
AGREEMENT = {
    # Element count overflows before the zero: the official product is
    # checked in shape order.
    "ovf_before_zero.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[4294967296,4294967296,0],'data_offsets':[0,0]}," + W + "}"), b"abc", False, "TV_E_ST_OVERFLOW"),
    "zero_before_ovf.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[0,4294967296,4294967296],'data_offsets':[3,3]}," + W + "}"), b"abc", True, None),
    "negzero_dim.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[-0],'data_offsets':[3,3]}," + W + "}"), b"abc", False, "TV_E_ST_SHAPE"),
    "negzero_offset.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[0],'data_offsets':[-0,0]}}"), b"", False, "TV_E_ST_OFFSETS"),
    "negzero_end.safetensors": (_hdr("{" + W + ",'a':{'dtype':'U8','shape':[0],'data_offsets':[3,-0]}}"), b"abc", False, "TV_E_ST_OFFSETS"),
    "metadata_null.safetensors": (_hdr("{'__metadata__':null," + W + "}"), b"abc", True, None),
    "metadata_null_only.safetensors": (_hdr("{'__metadata__':null}"), b"", True, None),
    "metadata_null_twice.safetensors": (_hdr("{'__metadata__':null,'__metadata__':{'a':'b'}," + W + "}"), b"abc", False, "TV_E_ST_DUPLICATE_KEY"),
    "dim_int64_max.safetensors": (_hdr("{'a':{'dtype':'F32','shape':[9223372036854775807,0],'data_offsets':[3,3]}," + W + "}"), b"abc", True, None),
    # Deliberate differences: accepted by the official parser, refused here.
    "nul_name.safetensors": (_hdr("{'a\\u0000b':{'dtype':'U8','shape':[0],'data_offsets':[3,3]}," + W + "}"), b"abc", True, "TV_E_ST_NUL"),
    "nul_metadata_key.safetensors": (_hdr("{'__metadata__':{'k\\u0000':'v'}," + W + "}"), b"abc", True, "TV_E_ST_NUL"),
    "nul_metadata_value.safetensors": (_hdr("{'__metadata__':{'k':'v\\u0000'}," + W + "}"), b"abc", True, "TV_E_ST_NUL"),
    "dim_above_int64_max.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[9223372036854775808,0],'data_offsets':[3,3]}," + W + "}"), b"abc", True, "TV_E_ST_INT_RANGE"),
    "dim_u64_max.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[0,18446744073709551615],'data_offsets':[3,3]}," + W + "}"), b"abc", True, "TV_E_ST_INT_RANGE"),
    "empty_name.safetensors": (_hdr("{'':{'dtype':'U8','shape':[0],'data_offsets':[3,3]}," + W + "}"), b"abc", True, "TV_E_ST_NAME_EMPTY"),
    "rank_17.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,0],'data_offsets':[3,3]}," + W + "}"), b"abc", True, "TV_E_ST_RANK"),
    "extra_field.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[0],'data_offsets':[3,3],'x':1}," + W + "}"), b"abc", True, "TV_E_ST_TENSOR_FIELDS"),
    "deep_extra_field.safetensors": (_hdr("{'a':{'dtype':'U8','shape':[0],'data_offsets':[3,3],'x':[[[[[[[[[[]]]]]]]]]]}," + W + "}"), b"abc", True, "TV_E_ST_TOO_DEEP"),
    "dup_tensor.safetensors": (_hdr("{" + W + ",'z':{'dtype':'U8','shape':[0],'data_offsets':[3,3]},'z':{'dtype':'U8','shape':[0],'data_offsets':[3,3]}}"), b"abc", True, "TV_E_ST_DUPLICATE_KEY"),
    "dup_metadata_key.safetensors": (_hdr("{'__metadata__':{'k':'a','k':'b'}," + W + "}"), b"abc", True, "TV_E_ST_DUPLICATE_KEY"),
    "leading_space.safetensors": (_hdr(" {" + W + "}"), b"abc", True, "TV_E_ST_HEADER_START"),
}


def agreement(out_dir):
    """Writes the AGREEMENT shards; returns {file: (official accepts?, error or None)}."""
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for name, (hdr, data, official, err) in AGREEMENT.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(raw_shard(hdr, data))
        out[name] = (official, err)
    return out


def agreement_index(out_dir):
    """Sharded checkpoints whose index the official tools (json.load) read:
    {dir: error or None}. total_size is never enforced, so a huge one is
    accepted (and not reported); weight_map follows the shard name rules."""
    os.makedirs(out_dir, exist_ok=True)
    a = {"a": np.arange(4, dtype=np.float32)}
    b = {"b": np.arange(3, dtype=np.int16)}
    wm = {"a": "s1.safetensors", "b": "s2.safetensors"}
    cases = {
        "idx_total_size_above_int64_max": ('{"metadata":{"total_size":9223372036854775808},"weight_map":%s}' % json.dumps(wm), None),
        "idx_total_size_above_u64_max": ('{"metadata":{"total_size":18446744073709551616},"weight_map":%s}' % json.dumps(wm), None),
        "idx_empty_tensor_name": ('{"weight_map":{"":"s1.safetensors"}}', "TV_E_ST_NAME_EMPTY"),
        "idx_nul_tensor_name": ('{"weight_map":{"a\\u0000":"s1.safetensors"}}', "TV_E_ST_NUL"),
    }
    out = {}
    for dname, (index, err) in cases.items():
        d = os.path.join(out_dir, dname)
        os.makedirs(d, exist_ok=True)
        save_file(a, os.path.join(d, "s1.safetensors"))
        save_file(b, os.path.join(d, "s2.safetensors"))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(index)
        out[dname] = err
    return out


def malformed(out_dir):
    """One fixture per named error; returns {filename: expected error name}."""
    os.makedirs(out_dir, exist_ok=True)
    t = lambda dt, shape, b, e: {"dtype": dt, "shape": shape, "data_offsets": [b, e]}
    cases = {
        "short.safetensors": (b"\x01\x00", "TV_E_FILE_SHORT"),
        "empty_header.safetensors": (struct.pack("<Q", 0), "TV_E_ST_HEADER_EMPTY"),
        "huge_header.safetensors": (struct.pack("<Q", 100_000_001) + b"{}", "TV_E_ST_HEADER_TOO_LARGE"),
        "past_eof.safetensors": (struct.pack("<Q", 64) + b"{}", "TV_E_ST_HEADER_PAST_EOF"),
        "not_brace.safetensors": (raw_shard(b'["a"]'), "TV_E_ST_HEADER_START"),
        "bad_utf8.safetensors": (raw_shard(b'{"a\xff":1}'), "TV_E_ST_UTF8"),
        "bad_json.safetensors": (raw_shard(b'{"a": }'), "TV_E_ST_JSON"),
        "dup_key.safetensors": (raw_shard(b'{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"), "TV_E_ST_DUPLICATE_KEY"),
        "too_deep.safetensors": (raw_shard(b'{"a":' + b"[" * 20 + b"]" * 20 + b"}"), "TV_E_ST_TOO_DEEP"),
        "bad_metadata.safetensors": (raw_shard({"__metadata__": {"k": 1}}), "TV_E_ST_METADATA"),
        "missing_field.safetensors": (raw_shard({"a": {"dtype": "U8", "shape": [1]}}, b"x"), "TV_E_ST_TENSOR_FIELDS"),
        "unknown_dtype.safetensors": (raw_shard({"a": t("F128", [1], 0, 1)}, b"x"), "TV_E_ST_DTYPE"),
        "negative_dim.safetensors": (raw_shard({"a": t("U8", [-1], 0, 1)}, b"x"), "TV_E_ST_SHAPE"),
        "rank.safetensors": (raw_shard({"a": t("U8", [1] * 17, 0, 1)}, b"x"), "TV_E_ST_RANK"),
        "overflow.safetensors": (raw_shard({"a": t("F32", [2**32, 2**32, 2], 0, 4)}, b"xxxx"), "TV_E_ST_OVERFLOW"),
        "end_before_begin.safetensors": (raw_shard({"a": t("U8", [0], 4, 2)}, b"xxxx"), "TV_E_ST_OFFSETS"),
        "length.safetensors": (raw_shard({"a": t("F32", [2], 0, 4)}, b"xxxx"), "TV_E_ST_LENGTH"),
        "subbyte_odd.safetensors": (raw_shard({"a": t("F4", [3], 0, 2)}, b"xx"), "TV_E_ST_LENGTH"),
        "overlap.safetensors": (raw_shard({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 2, 6)}, b"x" * 6), "TV_E_ST_OVERLAP"),
        "hole.safetensors": (raw_shard({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 4, 6)}, b"x" * 6), "TV_E_ST_HOLE"),
        "trailing.safetensors": (raw_shard({"a": t("U8", [2], 0, 2)}, b"x" * 5), "TV_E_ST_TRAILING"),
        "truncated.safetensors": (raw_shard({"a": t("U8", [8], 0, 8)}, b"x" * 5), "TV_E_ST_TRUNCATED"),
    }
    # Every refusal of the agreement cases is a malformed fixture too.
    for name, (hdr, data, _, err) in AGREEMENT.items():
        if err:
            cases[name] = (raw_shard(hdr, data), err)
    expect = {}
    for name, (blob, err) in cases.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)
        expect[name] = err

    def index_case(dname, index_obj, shards, err):
        d = os.path.join(out_dir, dname)
        os.makedirs(d, exist_ok=True)
        for fname, tensors in shards.items():
            save_file(tensors, os.path.join(d, fname))
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(index_obj if isinstance(index_obj, str) else json.dumps(index_obj))
        expect[dname] = err

    a = {"a": np.arange(4, dtype=np.float32)}
    b = {"b": np.arange(3, dtype=np.int16)}
    index_case("idx_missing", {"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}},
               {"s1.safetensors": a}, "TV_E_IDX_MISSING_TENSOR")
    index_case("idx_unlisted", {"weight_map": {"a": "s1.safetensors"}},
               {"s1.safetensors": {**a, **b}}, "TV_E_IDX_UNLISTED_TENSOR")
    index_case("idx_two_shards", {"weight_map": {"a": "s1.safetensors"}},
               {"s1.safetensors": a, "s2.safetensors": a}, "TV_E_IDX_DUPLICATE_TENSOR")
    # The duplicate case needs both shards listed: point b's shard at s2 too.
    with open(os.path.join(out_dir, "idx_two_shards", "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}}, f)
    index_case("idx_absolute", {"weight_map": {"a": "/etc/passwd"}}, {}, "TV_E_IDX_SHARD_NAME")
    index_case("idx_dotdot", {"weight_map": {"a": "../s1.safetensors"}}, {}, "TV_E_IDX_SHARD_NAME")
    index_case("idx_backslash", {"weight_map": {"a": "a\\b.safetensors"}}, {}, "TV_E_IDX_SHARD_NAME")
    index_case("idx_weight_map", {"weight_map": {"a": 3}}, {}, "TV_E_IDX_WEIGHT_MAP")
    index_case("idx_no_weight_map", {"metadata": {}}, {}, "TV_E_IDX_WEIGHT_MAP")
    index_case("idx_bad_json", '{"weight_map": {', {}, "TV_E_IDX_JSON")
    # A shard that is a symlink escaping the directory.
    esc = os.path.join(out_dir, "idx_escape")
    os.makedirs(esc, exist_ok=True)
    outside = os.path.join(out_dir, "outside.safetensors")
    save_file(a, outside)
    link = os.path.join(esc, "s1.safetensors")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(outside), link)
    with open(os.path.join(esc, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "s1.safetensors"}}, f)
    expect["idx_escape"] = "TV_E_IDX_SHARD_ESCAPE"
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expect, f, indent=1, sort_keys=True)
    return expect


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["random", "demo", "malformed"])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tensors", type=int, default=40)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--big-bytes", type=int, default=0, help="add a F32 tensor of this size")
    args = ap.parse_args()
    if args.what == "malformed":
        malformed(args.out)
    elif args.what == "demo":
        rng = np.random.default_rng(20261130)
        tensors = random_tensors(rng, 48, big_tensor_bytes=1 << 20)
        print(write_checkpoint(args.out, tensors, 2, metadata={"format": "np", "demo": "tensorvault"}))
    else:
        rng = np.random.default_rng(args.seed)
        tensors = random_tensors(rng, args.tensors, args.big_bytes)
        print(write_checkpoint(args.out, tensors, args.shards, metadata={"seed": str(args.seed)}))


if __name__ == "__main__":
    sys.exit(main())
