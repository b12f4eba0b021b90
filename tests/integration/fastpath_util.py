"""Shared helpers of the fast-path integration tests (test_fastpath_faults.py,
test_fastpath_leases.py): checkpoints that span many arena slots, a daemon
with a small staging arena, and the "still healthy" check every fault test
ends with.

Invariant: every daemon here runs with 64 KiB slots, 16 slots per group and
a credit of 8 (group_slots = 2 x credit, the smallest the daemon allows), so
a model of a few MiB needs dozens of chunks: a client that holds its credit
holds half of a group's slots, and rereads of the model miss the slot cache."""
import os
import time

import numpy as np

import gen_checkpoints as gen
from daemon import SLOW
from fpwire import Session
from storeutil import reference_tensors

SLOT_LEN = 65536
GROUP_SLOTS = 16
CREDIT = 8
MAX_REQUESTS = 64

FASTPATH_SETTINGS = {
    "fastpath.enabled": "true",
    "fastpath.slot_len": str(SLOT_LEN),
    "fastpath.group_slots": str(GROUP_SLOTS),
    "fastpath.credit": str(CREDIT),
    "fastpath.max_requests": str(MAX_REQUESTS),
}
TIMEOUT = 30 * SLOW


def fastpath_checkpoint(root, name, seed, n_tensors=30, shards=2):
    """A checkpoint under root/name: gen_checkpoints' every-dtype tensors
    (rank 0, zero-size, odd lengths: unaligned offsets) plus three tensors
    over several 64 KiB chunks (one of odd length). About 3 MiB. Returns the
    path to import."""
    rng = np.random.default_rng(seed)
    tensors = gen.random_tensors(rng, n_tensors, big_tensor_bytes=1_500_004)
    tensors["mid.u8"] = np.frombuffer(rng.bytes(700_001), dtype=np.uint8).copy()
    tensors["wide.i16"] = np.frombuffer(rng.bytes(2 * 150_001), dtype=np.int16).copy()
    out = os.path.join(str(root), name)
    return gen.write_checkpoint(out, tensors, shards)


def reference(path):
    """{name: bytes} of the official loader."""
    return {k: v[2] for k, v in reference_tensors(path).items()}


def big_names(ref, n=3):
    return sorted(ref, key=lambda k: -len(ref[k]))[:n]


def check_healthy(d, spec, ref, names=None):
    """A new, well-behaved session reads tensors of spec (the three largest by
    default: they span several chunks and both shards) and they equal the
    reference; /healthz and /v1/status answer; the daemon runs."""
    assert d.alive(), d.log_text()
    names = names or big_names(ref)
    with Session(d.socket_path, timeout=TIMEOUT) as s:
        h = s.open(spec)
        got = s.read_tensors(h, names)
        s.close_handle(h)
    for n in names:
        assert got[n] == ref[n], f"{n}: fast-path bytes differ from the official loader's"
    assert d.get("/healthz", token=None).status == 200
    assert d.get("/v1/status").status == 200


def wait_sessions(d, pred, timeout=TIMEOUT):
    """Polls GET /v1/sessions until pred(listing) holds (sessions end on the
    daemon's loop thread, a moment after the client's close); returns the
    listing."""
    deadline = time.monotonic() + timeout
    while True:
        ls = d.sessions()
        if pred(ls):
            return ls
        assert time.monotonic() < deadline, f"GET /v1/sessions never matched: {ls}"
        time.sleep(0.05)

