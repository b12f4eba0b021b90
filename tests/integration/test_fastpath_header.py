"""Shard headers over the fast path (protocol version 2, READ flag
READ_SHARD_HEADER): against build/tensorvaultd serving a three-shard
checkpoint with __metadata__ and a single file without, every shard's
header read through the Python codec (fpwire.py, a version-2 session) and
through the library (tests/tools/tv_dump --fastpath ... headers, guard bytes
around every destination) is the source file's first 8 + header_len bytes, byte for
byte; parts of a header read right; a bad shard index or a range past the
header is that request's ERROR + DONE TV_E_INVALID_ARG (the session goes
on); version negotiation picks the highest common version, and a version-1
session reads tensors as before while the flag is fatal in it."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

import harness.checkpoints as gen
import harness.wire as fp
from harness.daemon import serving
from harness.store import reference_tensors

META = {"format": "pt", "note": "tensorvault shard headers"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("fphdr")
    rng = np.random.default_rng(21)
    sharded = gen.write_checkpoint(str(tmp / "ck3"), gen.random_tensors(rng, 12), 3,
                                   metadata=META)
    single = gen.write_checkpoint(str(tmp / "ck1"), gen.random_tensors(rng, 5), 1)
    with serving(build_dir, tmp, {"m": sharded, "one": single}) as d:
        yield {"d": d, "sock": d.socket_path,
               "dirs": {"m": os.path.dirname(sharded), "one": os.path.dirname(single)},
               "ref": {"m": reference_tensors(sharded), "one": reference_tensors(single)}}


def file_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return struct.pack("<Q", n) + f.read(n)


def source_headers(served, model, snap):
    """{shard index: the source file's first 8 + header_len bytes}."""
    return {s["index"]: file_header(os.path.join(served["dirs"][model], s["name"]))
            for s in snap.shards}


@pytest.mark.parametrize("model", ["m", "one"])
def test_every_shard_header_over_fpwire_v2(served, model):
    with fp.Session(served["sock"], max_version=2) as s:
        assert s.version == 2
        h = s.open(model)
        want = source_headers(served, model, h.snap)
        assert len(want) == (3 if model == "m" else 1)
        got = s.read_headers(h)
        assert got == want
        for i, b in got.items():
            assert len(b) == h.snap.shards[i]["data_off"]
            meta = json.loads(b[8:]).get("__metadata__")
            assert meta == (META if model == "m" else None), meta
        # parts of a header, mixed with tensor reads in one READ
        t = h.snap.tensors[0]
        last = h.snap.shards[-1]
        reqs = s.read(h, [(last["index"], 8, 16, fp.READ_SHARD_HEADER),
                          (t["index"], 0, t["nbytes"]),
                          (0, 3, 1, fp.READ_SHARD_HEADER),
                          (last["index"], last["data_off"], 0, fp.READ_SHARD_HEADER)])
        assert bytes(reqs[0].buf) == want[last["index"]][8:24]
        assert bytes(reqs[1].buf) == served["ref"][model][t["name"]][2]
        assert bytes(reqs[2].buf) == want[0][3:4]
        assert reqs[3].len == 0 and reqs[3].result == 0
        s.close_handle(h)


def test_bad_shard_or_range_is_not_fatal(served):
    with fp.Session(served["sock"], max_version=2) as s:
        h = s.open("m")
        n = len(h.snap.shards)
        end = h.snap.shards[1]["data_off"]
        for shard, off, ln, text in ((n, 0, 8, f"shard index {n} out of range ({n} shards)"),
                                     (0xffffffff, 0, 8, "shard index 4294967295 out of range"),
                                     (1, 0, end + 1, "shard 1: header range of"),
                                     (1, end, 1, f"past its {end} header bytes"),
                                     (0, 2 ** 64 - 1, 2, "shard 0: header range")):
            (r,) = s.submit(h, [(shard, off, ln, fp.READ_SHARD_HEADER)])
            s.wait([r])
            assert r.result == fp.TV_E_INVALID_ARG, (shard, off, ln)
            assert r.error is not None and not r.error.f["flags"] & fp.ERROR_FATAL
            msg = r.error.text.decode()
            assert text in msg and "model 'm' generation 1" in msg, msg
        # the session goes on
        assert s.read_headers(h, [1]) == {1: source_headers(served, "m", h.snap)[1]}
        s.close_handle(h)


def test_tv_dump_headers_through_the_daemon(build_dir, served, tmp_path):
    for model in ("m", "one"):
        out = tmp_path / model
        os.makedirs(out)
        p = subprocess.run([os.path.join(build_dir, "tests", "tv_dump"), "--fastpath",
                            served["sock"], model, "headers", str(out)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        rows = [json.loads(x) for x in p.stdout.splitlines()]
        with fp.Session(served["sock"]) as s:
            snap = s.open(model).snap
        want = source_headers(served, model, snap)
        assert [r["shard"] for r in rows] == sorted(want)
        for r in rows:
            sh = snap.shards[r["shard"]]
            assert r["name"] == sh["name"] and r["header_len"] == sh["header_len"]
            assert r["file_len"] == sh["file_len"]
            with open(r["file"], "rb") as f:
                assert f.read() == want[r["shard"]], r


@pytest.mark.parametrize("lo,hi,want", [(1, 1, 1), (1, 2, 2), (2, 2, 2), (1, 0xffff, 3),
                                        (2, 9, 3), (3, 3, 3)])
def test_negotiation_picks_the_highest_common_version(served, lo, hi, want):
    with fp.Session(served["sock"], hello=False) as s:
        s.send(fp.enc_hello(lo, hi))
        m = s.wait_reply({fp.HELLO_OK})
        assert m.f["version"] == want and m.version == want
        s.version = want
        s.hello_ok = m.f
        h = s.open("one")  # every later message carries the negotiated version
        got = s.read_tensors(h)
        assert got == {k: v[2] for k, v in served["ref"]["one"].items()}
        s.close_handle(h)


def test_version_1_session_unchanged(served):
    """A version-1 client (HELLO 1..1) reads as before; the header flag is a
    reserved bit there: fatal TV_E_PROTOCOL."""
    with fp.Session(served["sock"], max_version=1) as s:
        assert s.version == 1
        h = s.open("m")
        assert s.read_tensors(h) == {k: v[2] for k, v in served["ref"]["m"].items()}
        s.send(fp.enc_read(h.handle, [(99, 0, 0, 8, fp.READ_SHARD_HEADER)]))
        text = s.expect_fatal(fp.TV_E_PROTOCOL)
        assert "flags 0x1 must be 0" in text, text
