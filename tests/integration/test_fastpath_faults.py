"""The fast path's bad input and faults, end to end against
build/tensorvaultd through the Python codec and client (harness.wire):

  - malformed (bad magic, reserved bytes, unknown types, a client sending
    server types), truncated (shorter than a header, header only, body
    short, entries missing), oversized (65537 and 70000 bytes), out of
    order (OPEN/READ before HELLO, a second HELLO, READ before OPEN), an
    unknown version (in HELLO, and in a later header), descriptors sent by
    the client (closed at once), a slot released twice, a slot never
    acquired, an unknown handle, a duplicate req_id, more than max_requests
    outstanding: each gets ERROR{code, FATAL} then EOF, and afterwards a
    new, well-behaved session reads right and the HTTP side answers;
  - per-request errors (tensor out of range, range past the tensor or
    overflowing) and OPEN errors (a model that does not exist, a bad spec,
    a retired generation): an ERROR, not fatal, and the session goes on;
  - a denied peer (a client running as uid 65534, allowed another model
    only) gets TV_E_PEER_DENIED for the OPEN and nothing else; allowed after
    access.MODEL=uid:65534 (a peer allowed no model at all is refused at
    connect: test_fastpath_fairness.py);
  - a client that holds its whole credit and reads nothing from its socket
    while another reads the whole model: the other completes with the right
    bytes, the holder's held slots still hold its bytes afterwards, and the
    daemon's RSS stays bounded;
  - clients killed with SIGKILL mid-transfer while holding every slot of the
    group: their sessions leave GET /v1/sessions and their slots return (a
    new session reads the whole model through the same 16-slot group);
  - CLOSE with reads in flight: DONE TV_E_CANCELLED for each (no ERROR),
    then CLOSED, no slot left held, and the session goes on;
  - the daemon restarted under a connected client: the client sees EOF and
    a new connection to the new daemon reads right;
  - fan-out: four sessions loading the model together make the daemon read
    its objects about once; the limits (max_handles, max_sessions,
    max_groups) answer TV_E_BUSY; the metrics count the protocol errors.

Every daemon runs with a 16-slot arena of 64 KiB slots and credit 8
(harness.fastpath) so the models here span dozens of chunks."""
import hashlib
import json
import os
import select
import signal
import struct
import tempfile
import time

import pytest

import harness.wire as fp
from harness.daemon import SLOW, Daemon, set_args
from harness.fastpath import (CREDIT, FASTPATH_SETTINGS, GROUP_SLOTS, MAX_REQUESTS, NOBODY,
                              SLOT_LEN, TIMEOUT, big_names, check_healthy, fastpath_checkpoint,
                              reference, run_as_nobody, wait_sessions)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath_faults")


@pytest.fixture(scope="module")
def src(work):
    return fastpath_checkpoint(work, "ckpt1", seed=101)


@pytest.fixture(scope="module")
def ref(src):
    return reference(src)


@pytest.fixture(scope="module")
def d(build_dir, work, src):
    dm = Daemon(build_dir, work, settings=dict(FASTPATH_SETTINGS)).start()
    dm.wait_socket()
    dm.import_ok("m", src, activate=True)
    # r: generation 1 retired (2 active)
    dm.import_ok("r", fastpath_checkpoint(work, "ckpt_r1", seed=102, n_tensors=6, shards=1),
                 activate=True)
    dm.import_ok("r", fastpath_checkpoint(work, "ckpt_r2", seed=103, n_tensors=6, shards=1),
                 activate=True)
    dm.ok("POST", "/v1/models/r/generations/1/retire")
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


def session(d, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return fp.Session(d.socket_path, **kw)


def opened(d, **kw):
    """A session with m open: (session, handle)."""
    s = session(d, **kw)
    return s, s.open("m")


# -- the codec itself ------------------------------------------------------------


def test_codec_layout_and_round_trip():
    """Every message type encodes to wire.h's sizes and decodes back; the
    decoder refuses what the daemon must never send."""
    sizes = {fp.enc_hello(): 24, fp.enc_hello_ok(): 40, fp.enc_open(1, "m@prod"): 30,
             fp.enc_opened(): 64, fp.enc_close(3): 24, fp.enc_close(3, fp.CLOSED): 24,
             fp.enc_read(1, [(1, 2, 3, 4)] * 3): 16 + 8 + 96,
             fp.enc_chunk([(1, 1, 2, 3, 4, 5)]): 56, fp.enc_done([(1, 0, 1)] * 2): 56,
             fp.enc_release(1, [1, 2, 3]): 36, fp.enc_error(-1300, "x"): 41}
    for buf, n in sizes.items():
        assert len(buf) == n, buf
        assert struct.unpack_from("<I", buf)[0] == 0x50465654 and buf[:4] == b"TVFP"
        m = fp.decode(buf)
        assert m.len == n
    m = fp.decode(fp.enc_read(7, [(9, 2, 5, 11), (10, 3, 0, 0)]))
    assert m.type == fp.READ and m.f == {"handle": 7, "n": 2}
    assert m.entries[0] == {"req_id": 9, "tensor": 2, "flags": 0, "off": 5, "len": 11}
    m = fp.decode(fp.enc_chunk([(5, 1, 7, 100, 200, 300)]))
    assert m.entries == [{"req_id": 5, "handle": 1, "slot": 7, "slot_off": 100, "len": 200,
                          "dest_off": 300}]
    m = fp.decode(fp.enc_error(-1004, "no model", req_id=0, open_id=3))
    assert (m.f["code"], m.f["open_id"], m.text) == (-1004, 3, b"no model")
    m = fp.decode(fp.enc_opened(open_id=2, handle=3, generation=4, snap_len=5, arena_len=6,
                                slot_len=8192, n_slots=7, credit=8))
    assert m.f["generation"] == 4 and m.f["n_slots"] == 7 and m.f["credit"] == 8
    bad = [fp.enc_hello(magic=1), fp.enc_hello(reserved=1), fp.enc_hello(length=20),
           fp.message(12, b"\0" * 8), fp.enc_chunk([(1, 1, 1, 1, 0, 1)]),
           fp.enc_done([(1, 0, 1)], n=2), fp.enc_close(1, fp.CLOSED, reserved=1),
           fp.enc_error(1, "a\0b"), fp.enc_hello()[:12], fp.enc_hello(version=2)]
    for b in bad:
        with pytest.raises(fp.FpProtocolError):
            fp.decode(b)


# -- a well-behaved session --------------------------------------------------------


def test_session_reads_every_tensor_and_the_arena_is_sealed(d, ref):
    with session(d) as s:
        assert s.hello_ok["max_requests"] == MAX_REQUESTS and s.session_id >= 1
        h = s.open("m")
        assert h.generation == 1 and h.snap.model == "m"
        assert (h.slot_len, h.n_slots, h.credit) == (SLOT_LEN, GROUP_SLOTS, CREDIT)
        assert {t["name"] for t in h.tensors} == set(ref)
        # snapshot memfd: write, shrink, grow and seal sealed
        want = fp.fcntl.F_SEAL_WRITE | fp.fcntl.F_SEAL_SHRINK | fp.fcntl.F_SEAL_GROW | fp.fcntl.F_SEAL_SEAL
        assert h.snap_seals & want == want, hex(h.snap_seals)
        # arena: future-write (0x10), shrink, grow, seal: the client cannot map it writable
        want = 0x10 | fp.fcntl.F_SEAL_SHRINK | fp.fcntl.F_SEAL_GROW | fp.fcntl.F_SEAL_SEAL
        assert h.arena_seals & want == want, hex(h.arena_seals)
        with pytest.raises(OSError):
            fp.mmap.mmap(h.arena_fd, h.arena_len, fp.mmap.MAP_SHARED,
                         fp.mmap.PROT_READ | fp.mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.pwrite(h.snap_fd, b"x", 0)
        got = s.read_tensors(h)
        assert got == ref
        # ranges at odd offsets, across chunk boundaries, and len 0
        big = h.snap.by_name["big.f32"]
        n = big["nbytes"]
        cases = [(0, 1), (1, SLOT_LEN), (SLOT_LEN - 3, 7), (n - 5, 5), (12345, n - 12345 - 1),
                 (n, 0), (0, 0)]
        reqs = s.read(h, [(big["index"], off, ln) for off, ln in cases])
        for (off, ln), r in zip(cases, reqs):
            assert bytes(r.buf) == ref["big.f32"][off:off + ln], (off, ln)
        assert s.close_handle(h) == {}
        # a second open of the same spec in the same session: a new handle number
        h2 = s.open("m")
        assert h2.handle != h.handle
        assert s.read_tensors(h2, ["odd.u8"]) == {"odd.u8": ref["odd.u8"]}


_fresh = iter(range(1, 1 << 30))


def fresh_model(d, src):
    """A model name of its own holding the checkpoint src (a new import: no
    chunk of it is in the daemon's memory tier yet); its object bytes."""
    name = f"cold{next(_fresh)}"
    d.import_ok(name, src, activate=True)
    gen = d.ok("GET", f"/v1/models/{name}/generations/1")
    return name, sum(-(-sh["file_bytes"] // 65536) * 65536 for sh in gen["shards"])


def test_four_sessions_at_once_read_the_model_once(d, src, ref):
    """Fan-out: four sessions ask for the whole model together (one thread,
    whichever socket has something is served): every byte right, and the
    daemon reads the model's objects from the device about once (<= 1.1 x,
    where four separate loads would be 4 x), the rest shared. The model is
    a fresh import, so none of it is in the memory tier before."""
    name, objects = fresh_model(d, src)
    m0 = d.metrics()
    ss = [session(d) for _ in range(4)]
    try:
        hs = [s.open(name) for s in ss]
        reqs = [s.submit(h, [(t["index"], 0, t["nbytes"]) for t in h.tensors])
                for s, h in zip(ss, hs)]
        deadline = time.monotonic() + TIMEOUT
        while not all(r.done for rq in reqs for r in rq):
            ready, _, _ = select.select([s.sock for s in ss], [], [], TIMEOUT)
            assert ready and time.monotonic() < deadline, "the four sessions stalled"
            for s in ss:
                if s.sock in ready:
                    s.pump()
        for rq, h in zip(reqs, hs):
            for r, t in zip(rq, h.tensors):
                assert r.result == 0 and bytes(r.buf) == ref[t["name"]], t["name"]
    finally:
        for s in ss:
            s.close()
    wait_sessions(d, lambda ls: ls == [])
    m1 = d.metrics()
    dev = m1["tensorvault_fastpath_device_read_bytes_total"] - m0[
        "tensorvault_fastpath_device_read_bytes_total"]
    shared = m1["tensorvault_fastpath_shared_bytes_total"] - m0[
        "tensorvault_fastpath_shared_bytes_total"]
    assert 0 < dev <= 1.1 * objects, (dev, objects)
    assert shared >= 2 * sum(len(v) for v in ref.values()), shared


# -- fatal protocol errors ------------------------------------------------------------

P, V = fp.TV_E_PROTOCOL, fp.TV_E_VERSION


def hello_then(build):
    """A case sent after HELLO (the session negotiated version 1)."""
    return ("hello", build)


def open_then(build):
    """A case sent after HELLO and OPEN m: build(handle)."""
    return ("open", build)


def before_hello(build):
    return ("none", build)


def open2_then(build):
    """A case sent after HELLO 1..2 (version 2 negotiated) and OPEN m."""
    return ("open2", build)


FATAL_CASES = {
    # malformed
    "bad magic": (before_hello(lambda: fp.enc_hello(magic=0x50465655)), P),
    "header reserved": (before_hello(lambda: fp.message(fp.HELLO, fp.HELLO_B.pack(1, 1, 0),
                                                        reserved=1)), P),
    "hello reserved": (before_hello(lambda: fp.enc_hello(reserved=1)), P),
    "close reserved": (open_then(lambda h: fp.enc_close(h.handle, reserved=1)), P),
    "read flags": (open_then(lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1, 4)])), P),
    # the shard-header flag is version 2's: a reserved bit in version 1
    "read header flag in version 1": (open_then(
        lambda h: fp.enc_read(h.handle, [(1, 0, 0, 8, fp.READ_SHARD_HEADER)])), P),
    "read flags 0x2 in version 2": (open2_then(
        lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1, 2)], version=2)), P),
    "read flags 0x3 in version 2": (open2_then(
        lambda h: fp.enc_read(h.handle, [(1, 0, 0, 8, 3)], version=2)), P),
    "read with header version 1 in a version-2 session": (open2_then(
        lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1)], version=1)), V),
    "unknown type 0": (hello_then(lambda: fp.message(0, b"\0" * 8)), P),
    "unknown type 12": (hello_then(lambda: fp.message(12, b"\0" * 8)), P),
    "unknown type 0xffff": (hello_then(lambda: fp.message(0xffff)), P),
    "client sends HELLO_OK": (hello_then(lambda: fp.enc_hello_ok()), P),
    "client sends OPENED": (hello_then(lambda: fp.enc_opened()), P),
    "client sends CHUNK": (open_then(lambda h: fp.enc_chunk([(1, h.handle, 0, 0, 1, 0)])), P),
    "client sends DONE": (open_then(lambda h: fp.enc_done([(1, 0, h.handle)])), P),
    "client sends ERROR": (hello_then(lambda: fp.enc_error(-5, "x")), P),
    "client sends CLOSED": (open_then(lambda h: fp.enc_close(h.handle, fp.CLOSED)), P),
    "length field too large": (before_hello(lambda: fp.enc_hello(length=25)), P),
    "length field too small": (before_hello(lambda: fp.enc_hello(length=16)), P),
    "spec with NUL": (hello_then(lambda: fp.enc_open(1, b"m\0x")), P),
    "spec_len past the message": (hello_then(lambda: fp.enc_open(1, b"m", spec_len=9)), P),
    "spec of 513 bytes": (hello_then(lambda: fp.enc_open(1, b"m" * 513)), P),
    "read n 0": (open_then(lambda h: fp.enc_read(h.handle, [])), P),
    # truncated
    "7 bytes": (before_hello(lambda: fp.enc_hello()[:7]), P),
    "header only": (before_hello(lambda: fp.message(fp.HELLO)), P),
    "body short": (before_hello(lambda: fp.message(fp.HELLO, b"\1\0\1\0")), P),
    "open body short": (hello_then(lambda: fp.message(fp.OPEN, b"\1\0\0\0")), P),
    "read entries missing": (open_then(lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1)] * 2, n=3)), P),
    "read entry cut": (open_then(lambda h: fp.message(fp.READ, fp.LIST_B.pack(h.handle, 1) +
                                                      b"\0" * 27)), P),
    "release entries missing": (open_then(lambda h: fp.enc_release(h.handle, [0], n=2)), P),
    # out of order
    "OPEN before HELLO": (before_hello(lambda: fp.enc_open(1, "m")), P),
    "READ before HELLO": (before_hello(lambda: fp.enc_read(1, [(1, 0, 0, 1)])), P),
    "RELEASE before HELLO": (before_hello(lambda: fp.enc_release(1, [0])), P),
    "second HELLO": (hello_then(lambda: fp.enc_hello()), P),
    "second HELLO after OPEN": (open_then(lambda h: fp.enc_hello()), P),
    "READ before OPEN": (hello_then(lambda: fp.enc_read(1, [(1, 0, 0, 1)])), P),
    "RELEASE before OPEN": (hello_then(lambda: fp.enc_release(1, [0])), P),
    # unknown version
    "hello versions 4..5": (before_hello(lambda: fp.enc_hello(4, 5)), V),
    "hello versions 7..0xffff": (before_hello(lambda: fp.enc_hello(7, 0xffff)), V),
    "open with header version 2": (hello_then(lambda: fp.enc_open(1, "m", version=2)), V),
    "read with header version 2": (open_then(lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1)],
                                                                   version=2)), V),
    # 0 is no version at all; after HELLO it is also not the session's
    "read with header version 0": (open_then(lambda h: fp.enc_read(h.handle, [(1, 0, 0, 1)],
                                                                   version=0)), {P, V}),
    "hello header version 0": (before_hello(lambda: fp.enc_hello(version=0)), P),
    "hello min > max": (before_hello(lambda: fp.enc_hello(1, 0)), P),
    "open_id 0": (hello_then(lambda: fp.enc_open(0, "m")), P),
    # handles and slots
    "unknown handle READ": (open_then(lambda h: fp.enc_read(h.handle + 98, [(1, 0, 0, 1)])), P),
    "unknown handle RELEASE": (open_then(lambda h: fp.enc_release(h.handle + 98, [0])), P),
    "handle 0 READ": (open_then(lambda h: fp.enc_read(0, [(1, 0, 0, 1)])), P),
    "slot never acquired": (open_then(lambda h: fp.enc_release(h.handle, [0])), P),
    "slot out of range": (open_then(lambda h: fp.enc_release(h.handle, [h.n_slots])), P),
    "slot 0xffffffff": (open_then(lambda h: fp.enc_release(h.handle, [0xffffffff])), P),
    "duplicate req_id in one READ": (open_then(
        lambda h: fp.enc_read(h.handle, [(5, h.index("big.f32"), 0, 1_500_004)] * 2)), P),
    "more than max_requests": (open_then(
        lambda h: fp.enc_read(h.handle, [(i + 1, h.index("big.f32"), 0, 1_500_004)
                                         for i in range(MAX_REQUESTS + 1)])), P),
}


@pytest.mark.parametrize("case", sorted(FATAL_CASES))
def test_fatal_protocol_error(d, ref, case):
    (state, build), code = FATAL_CASES[case]
    s = session(d, hello=(state != "none"), auto_release=False,
                max_version=2 if state == "open2" else fp.VERSION)
    try:
        if state in ("open", "open2"):
            h = s.open("m")
            msg = build(h)
        else:
            msg = build()
        s.send(msg)
        text = s.expect_fatal(code)
        assert text.strip(), case
    finally:
        s.close()
    check_healthy(d, "m", ref)


def test_empty_datagram_closes_the_session(d, ref):
    """A zero-length datagram reads as EOF on SEQPACKET: the session ends
    (with or without an ERROR) and the daemon carries on."""
    with session(d) as s:
        s.send(b"")
        m = s.recv()
        if m is not None:
            assert m.type == fp.ERROR and m.f["flags"] & fp.ERROR_FATAL, m
            s.expect_eof()
    check_healthy(d, "m", ref)


@pytest.mark.parametrize("size", [65537, 70000])
def test_oversized_message(d, ref, size):
    """A datagram over 65536 bytes (a HELLO header claiming that length):
    ERROR PROTOCOL fatal then EOF; if the kernel refuses to send it
    (EMSGSIZE), the session is untouched and still works."""
    s = session(d, hello=False)
    try:
        msg = fp.enc_hello(length=size) + b"\0" * (size - 24)
        assert len(msg) == size
        try:
            s.send(msg)
            sent = True
        except OSError as e:
            assert e.errno == fp.errno.EMSGSIZE, e
            sent = False
        if sent:
            s.expect_fatal(P)
        else:
            s.hello()
            h = s.open("m")
            assert s.read_tensors(h, ["odd.i8"]) == {"odd.i8": ref["odd.i8"]}
    finally:
        s.close()
    check_healthy(d, "m", ref)


def test_slot_released_twice(d, ref):
    s, h = opened(d, auto_release=False)
    try:
        (r,) = s.read(h, [(h.index("odd.u8"), 0, len(ref["odd.u8"]))])
        assert bytes(r.buf) == ref["odd.u8"]
        assert len(s.held) == 1
        (hd, slot), = s.held
        s.release(hd, [slot])
        s.send(fp.enc_release(hd, [slot]))
        text = s.expect_fatal(P)
        assert str(slot) in text, text
    finally:
        s.close()
    check_healthy(d, "m", ref)


def test_slot_released_twice_in_one_message(d, ref):
    s, h = opened(d, auto_release=False)
    try:
        (r,) = s.read(h, [(h.index("odd.u8"), 0, len(ref["odd.u8"]))])
        (hd, slot), = s.held
        s.send(fp.enc_release(hd, [slot, slot]))
        s.expect_fatal(P)
    finally:
        s.close()
    check_healthy(d, "m", ref)


def pipe_closed_within(rfd, timeout):
    """True when every write end of the pipe is closed (read gives EOF)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([rfd], [], [], 0.1)
        if r and os.read(rfd, 1) == b"":
            return True
    return False


@pytest.mark.parametrize("when", ["before HELLO", "with a READ"])
def test_descriptors_from_the_client(d, ref, when):
    """A client message with SCM_RIGHTS descriptors: fatal PROTOCOL, and the
    daemon closes them at once (the pipe's write end we sent is gone)."""
    rfd, wfd = os.pipe()
    try:
        s = session(d, hello=(when != "before HELLO"))
        try:
            if when == "before HELLO":
                msg = fp.enc_hello()
            else:
                h = s.open("m")
                msg = fp.enc_read(h.handle, [(1, h.index("odd.u8"), 0, 3)])
            s.send(msg, fds=[wfd])
            os.close(wfd)
            wfd = -1
            text = s.expect_fatal(P)
            assert "descriptor" in text, text
        finally:
            s.close()
        assert pipe_closed_within(rfd, 10 * SLOW), "the daemon kept the descriptor it was sent"
    finally:
        os.close(rfd)
        if wfd >= 0:
            os.close(wfd)
    check_healthy(d, "m", ref)


# -- errors that are not fatal -----------------------------------------------------------


def test_request_errors_are_not_fatal(d, ref):
    with session(d) as s:
        h = s.open("m")
        n = len(h.tensors)
        big = h.snap.by_name["big.f32"]
        bad = [(n, 0, 1), (0xffffffff, 0, 1), (big["index"], big["nbytes"] - 1, 2),
               (big["index"], big["nbytes"], 1), (big["index"], 2 ** 64 - 1, 2),
               (big["index"], 1, 2 ** 64 - 1)]
        reqs = s.submit(h, bad)
        good = s.submit(h, [(big["index"], 0, 0), (h.index("odd.i8"), 0, len(ref["odd.i8"]))])
        s.wait(reqs + good)
        for r, b in zip(reqs, bad):
            assert r.result == fp.TV_E_INVALID_ARG, (b, r.result)
            assert r.error is not None and r.error.f["code"] == fp.TV_E_INVALID_ARG, b
            assert r.covered == 0, b
        assert good[0].result == 0 and good[0].ranges == [] and good[0].buf == b""
        assert good[1].result == 0 and bytes(good[1].buf) == ref["odd.i8"]
        # the session goes on
        assert s.read_tensors(h, big_names(ref)) == {k: ref[k] for k in big_names(ref)}


@pytest.mark.parametrize("spec,codes,words", [
    ("nosuchmodel", {fp.TV_E_NOT_FOUND}, ["nosuchmodel"]),
    ("m@7", {fp.TV_E_NOT_FOUND}, []),
    ("m@nosuchalias", {fp.TV_E_NOT_FOUND}, []),
    ("r@1", {fp.TV_E_NOT_FOUND}, ["retired"]),
    ("m@", {fp.TV_E_INVALID_ARG, fp.TV_E_NOT_FOUND, -1125}, []),
    ("bad name!", {fp.TV_E_INVALID_ARG, fp.TV_E_NOT_FOUND, -1125}, []),
])
def test_open_errors_are_not_fatal(d, ref, spec, codes, words):
    with session(d) as s:
        with pytest.raises(fp.FpError) as ei:
            s.open(spec)
        e = ei.value
        assert e.code in codes and not e.fatal, (spec, e)
        assert e.open_id == 1, e
        for w in words:
            assert w in e.text, (spec, e.text)
        h = s.open("m")
        assert s.read_tensors(h, ["odd.u8"]) == {"odd.u8": ref["odd.u8"]}
    # the retired generation's newer sibling opens
    with session(d) as s:
        h = s.open("r")
        assert h.generation == 2
        assert len(s.read_tensors(h)) == len(h.tensors)


# -- a denied peer ---------------------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as uid 65534")
def test_denied_peer_then_allowed(build_dir, work, src, ref):
    # The socket lives in a directory everyone may enter (the default's
    # parent is 0750), mode 0666: the uid check is the daemon's own. uid
    # 65534 may open another model ("other", not imported): it gets a
    # session, and its OPEN of m is what is refused.
    sockdir = tempfile.mkdtemp(prefix="tvfp-", dir="/tmp")
    os.chmod(sockdir, 0o755)
    sock = os.path.join(sockdir, "fp.sock")
    st = dict(FASTPATH_SETTINGS)
    st.update({"fastpath.socket": sock, "fastpath.mode": "0666", "access.other": f"uid:{NOBODY}"})
    dd = Daemon(build_dir, work, settings=st, store=str(work / "denied_store"), name="denied")
    try:
        dd.start()
        dd.wait_socket()
        assert os.stat(sock).st_mode & 0o777 == 0o666
        dd.import_ok("m", src, activate=True)
        out = run_as_nobody(sock, "m")
        assert out.get("uid") == NOBODY, out
        assert out.get("error") == fp.TV_E_PEER_DENIED and not out["fatal"], out
        assert str(NOBODY) in out["text"] and "'m'" in out["text"], out
        assert out["after"] is None, out
        m = dd.metrics()
        assert m.get("tensorvault_fastpath_refused_total", 0) >= 1, m
        check_healthy(dd, "m", ref)
        assert dd.stop() == 0, dd.log_text()

        # allowed: the model's rule names uid 65534 (--set, over the config file)
        dd.start(extra_args=set_args({"access.m": f"uid:{NOBODY}"}))
        dd.wait_socket()
        out = run_as_nobody(sock, "m")
        assert "error" not in out and "exception" not in out, out
        assert out["tensors"] == {k: hashlib.sha256(v).hexdigest() for k, v in ref.items()}
        # the daemon's own uid is no longer allowed m (the model's rule replaces default)
        with fp.Session(sock, timeout=TIMEOUT) as s:
            if os.getuid() != NOBODY:
                with pytest.raises(fp.FpError) as ei:
                    s.open("m")
                assert ei.value.code == fp.TV_E_PEER_DENIED and not ei.value.fatal
    finally:
        rc = dd.stop()
        try:
            os.rmdir(sockdir)
        except OSError:
            pass
    assert rc in (0, None), dd.log_text()


# -- a client that stops releasing ------------------------------------------------------------


def test_holder_stalls_only_itself_and_memory_stays_bounded(d, ref):
    """A session asks for every tensor, then neither reads its socket nor
    releases a slot: it holds at most its credit (8 of the group's 16
    slots). Meanwhile another session reads the whole model: it completes,
    its bytes are right. The holder's chunks, copied only afterwards, are
    still right (no slot it holds was reused), and once it releases it
    completes too. RSS bound: the daemon's memory is max_groups x
    group_slots x slot_len plus fixed per-session state (outboxes bounded by
    credit + max_requests entries); here one group of 16 x 64 KiB = 1 MiB is
    already mapped by the warm-up read, so the scenario may add no more
    than allocator slack: 16 MiB (64 MiB under ASan, whose quarantine keeps
    freed blocks)."""
    check_healthy(d, "m", ref, names=list(ref))  # warm-up: the group and its arena exist
    rss0 = d.rss_kib()
    holder = session(d, auto_release=False)
    try:
        hh = holder.open("m")
        names = list(ref)
        hreqs = holder.submit(hh, [(hh.index(n), 0, len(ref[n])) for n in names])
        time.sleep(0.5 * SLOW)  # let the daemon hand the holder its credit
        with session(d) as other:
            h = other.open("m")
            # the same generation: the same group, the same arena memfd
            assert os.fstat(h.arena_fd).st_ino == os.fstat(hh.arena_fd).st_ino
            for _ in range(3):
                assert other.read_tensors(h) == ref
        rss1 = d.rss_kib()
        print(f"daemon RSS {rss0} KiB before the holder, {rss1} KiB after")
        bound = (16 << 10) * (4 if SLOW > 1 else 1)
        assert rss1 - rss0 <= bound, f"daemon RSS grew {rss1 - rss0} KiB (bound {bound} KiB)"
        listing = {x["id"]: x for x in d.sessions()}
        assert listing[holder.session_id]["slots_held"] <= CREDIT, listing[holder.session_id]
        # the holder now reads what waited for it: at most credit references,
        # every copied byte right
        deadline = time.monotonic() + TIMEOUT
        while len(holder.held) < min(CREDIT, len(names)) and time.monotonic() < deadline:
            holder.pump(TIMEOUT)
        assert len(holder.held) <= CREDIT
        for r, n in zip(hreqs, names):
            for off, ln in r.ranges:
                assert bytes(r.buf[off:off + ln]) == ref[n][off:off + ln], n
        holder.auto_release = True
        holder.release_all()
        holder.wait(hreqs)
        for r, n in zip(hreqs, names):
            assert r.result == 0 and bytes(r.buf) == ref[n], n
    finally:
        holder.close()
    check_healthy(d, "m", ref)


# -- killed mid-transfer ----------------------------------------------------------------------


def holder_child(sock_path, wfd):
    """Child: opens m, asks for everything, takes its credit without
    releasing, reports its session id and waits to be killed."""
    try:
        s = fp.Session(sock_path, timeout=TIMEOUT, auto_release=False)
        h = s.open("m")
        s.submit(h, [(t["index"], 0, t["nbytes"]) for t in h.tensors])
        while len(s.held) < CREDIT:
            s.pump()
        os.write(wfd, json.dumps({"id": s.session_id, "held": len(s.held)}).encode() + b"\n")
        while True:
            time.sleep(1)
    finally:
        os._exit(1)


def test_clients_killed_mid_transfer(d, ref):
    """Two children hold 8 slots each, all 16 of the group, and are killed
    with SIGKILL: their sessions leave GET /v1/sessions and their slots come
    back (a new session can only read the model through the same group if
    they did)."""
    # keep the group open across the kills with an idle handle of our own
    keeper = session(d)
    kh = keeper.open("m")
    kids = []
    try:
        for _ in range(2):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(rfd)
                holder_child(d.socket_path, wfd)
            os.close(wfd)
            kids.append((pid, rfd))
        ids = {}
        for pid, rfd in kids:
            r, _, _ = select.select([rfd], [], [], TIMEOUT)
            assert r, "child did not get its credit"
            line = os.read(rfd, 4096)
            info = json.loads(line)
            assert info["held"] == CREDIT, info
            ids[pid] = info["id"]
        listing = {x["id"]: x for x in d.sessions()}
        for pid, sid in ids.items():
            assert listing[sid]["pid"] == pid and listing[sid]["slots_held"] == CREDIT, listing[sid]
            assert [x["model"] for x in listing[sid]["handles"]] == ["m"]
        for pid, rfd in kids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
        kids = []
        wait_sessions(d, lambda ls: not set(ids.values()) & {x["id"] for x in ls})
        # the same group (our handle kept it open): every slot must be back
        assert keeper.read_tensors(kh) == ref
        with session(d) as s:
            h = s.open("m")
            assert s.read_tensors(h) == ref
    finally:
        for pid, rfd in kids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
        keeper.close()
    check_healthy(d, "m", ref)


# -- CLOSE with reads in flight -----------------------------------------------------------------


def test_close_with_reads_in_flight(d, ref):
    s = session(d, auto_release=False)
    try:
        h = s.open("m")
        reqs = s.submit(h, [(t["index"], 0, t["nbytes"]) for t in h.tensors
                            if t["nbytes"] > 4 * SLOT_LEN])
        deadline = time.monotonic() + TIMEOUT
        while len(s.held) < CREDIT and time.monotonic() < deadline:
            s.pump(TIMEOUT)
        assert len(s.held) == CREDIT and not all(r.done for r in reqs)
        results = s.close_handle(h)  # every DONE came before CLOSED (checked there)
        assert results and set(results) <= {r.req_id for r in reqs}, results
        for r in reqs:
            if r.req_id in results:
                assert results[r.req_id] == fp.TV_E_CANCELLED, (r.req_id, results)
                assert r.error is None, r.error  # cancelled: a DONE, no ERROR
            else:
                assert r.result == 0 and r.covered == r.len, r.req_id
        me = [x for x in d.sessions() if x["id"] == s.session_id]
        assert me and me[0]["slots_held"] == 0 and me[0]["handles"] == [], me
        # the session goes on
        s.auto_release = True
        h2 = s.open("m")
        assert s.read_tensors(h2) == ref
    finally:
        s.close()
    check_healthy(d, "m", ref)


def test_session_eof_with_reads_in_flight(d, ref):
    """The client closes its socket while holding slots and waiting for
    chunks: the daemon drops all of it and carries on."""
    for _ in range(3):
        s = session(d, auto_release=False)
        h = s.open("m")
        s.submit(h, [(t["index"], 0, t["nbytes"]) for t in h.tensors])
        s.pump(TIMEOUT)
        sid = s.session_id
        s.close()
        wait_sessions(d, lambda ls: sid not in {x["id"] for x in ls})
    check_healthy(d, "m", ref, names=list(ref))


# -- the daemon restarted under a client -----------------------------------------------------------


def test_daemon_restart_under_a_connected_client(build_dir, work, src, ref):
    dd = Daemon(build_dir, work, settings=dict(FASTPATH_SETTINGS),
                store=str(work / "restart_store"), name="restart")
    try:
        dd.start()
        dd.wait_socket()
        dd.import_ok("m", src, activate=True)
        idle = fp.Session(dd.socket_path, timeout=TIMEOUT)
        busy = fp.Session(dd.socket_path, timeout=TIMEOUT, auto_release=False)
        ih = idle.open("m")
        bh = busy.open("m")
        busy.submit(bh, [(t["index"], 0, t["nbytes"]) for t in bh.tensors])
        busy.pump()
        assert dd.stop() == 0, dd.log_text()
        # both see EOF (at most messages already sent before it)
        for s in (idle, busy):
            deadline = time.monotonic() + TIMEOUT
            while True:
                m = s.recv(TIMEOUT)
                if m is None:
                    break
                assert m.type in (fp.CHUNK, fp.DONE, fp.ERROR), m
                assert time.monotonic() < deadline
            with pytest.raises(OSError):
                for _ in range(3):  # EPIPE once the peer is gone
                    s.send(fp.enc_close(ih.handle))
                    time.sleep(0.05)
            s.close()
        dd.start()
        dd.wait_socket()
        with fp.Session(dd.socket_path, timeout=TIMEOUT) as s:
            h = s.open("m")
            assert s.read_tensors(h) == ref
            wait_sessions(dd, lambda ls: [(x["id"], x["pid"]) for x in ls] ==
                          [(s.session_id, os.getpid())])
    finally:
        rc = dd.stop()
    assert rc in (0, None), dd.log_text()


# -- limits -------------------------------------------------------------------------------------


def test_handle_limit_is_busy_not_fatal(d, ref):
    """More OPENs than HELLO_OK's max_handles: ERROR TV_E_BUSY for that OPEN
    only; once a handle closes, the next OPEN works."""
    with session(d) as s:
        n = s.hello_ok["max_handles"]
        hs = [s.open("m") for _ in range(n)]
        assert len({h.handle for h in hs}) == n
        with pytest.raises(fp.FpError) as ei:
            s.open("m")
        assert ei.value.code == fp.TV_E_BUSY and not ei.value.fatal, ei.value
        s.close_handle(hs.pop())
        h = s.open("m")
        assert h.handle not in {x.handle for x in hs}
        assert s.read_tensors(h, ["odd.u8"]) == {"odd.u8": ref["odd.u8"]}
    check_healthy(d, "m", ref)


def test_session_and_group_limits(build_dir, work, src, ref):
    """max_sessions 2: a third connection gets ERROR{TV_E_BUSY, fatal} and
    EOF, and connects once one of the two left; max_groups 1: an OPEN of a
    second generation while the first is open is TV_E_BUSY, not fatal. (The
    sessions are all of one uid: max_sessions_per_uid, whose default would
    be 2 / 4, is raised past max_sessions.)"""
    st = dict(FASTPATH_SETTINGS)
    st.update({"fastpath.max_sessions": "2", "fastpath.max_sessions_per_uid": "3",
               "fastpath.max_groups": "1"})
    dd = Daemon(build_dir, work, settings=st, store=str(work / "limits_store"), name="limits")
    try:
        dd.start()
        dd.wait_socket()
        dd.import_ok("m", src, activate=True)
        dd.import_ok("m", fastpath_checkpoint(work, "ckpt_l2", seed=104, n_tensors=6, shards=1))
        wait_sessions(dd, lambda ls: ls == [])  # wait_socket's probe has gone
        a = fp.Session(dd.socket_path, timeout=TIMEOUT)
        b = fp.Session(dd.socket_path, timeout=TIMEOUT)
        c = fp.Session(dd.socket_path, timeout=TIMEOUT, hello=False)  # refused at connect
        assert "fastpath.max_sessions = 2" in c.expect_fatal(fp.TV_E_BUSY)
        c.close()
        h = a.open("m@1")
        with pytest.raises(fp.FpError) as ei:
            b.open("m@2")
        assert ei.value.code == fp.TV_E_BUSY and not ei.value.fatal, ei.value
        assert b.read_tensors(b.open("m@1"), ["odd.u8"]) == {"odd.u8": ref["odd.u8"]}
        assert a.read_tensors(h) == ref
        b.close()
        sid_b = b.session_id
        wait_sessions(dd, lambda ls: sid_b not in {x["id"] for x in ls})
        with fp.Session(dd.socket_path, timeout=TIMEOUT) as c2:
            assert c2.read_tensors(c2.open("m@1"), ["odd.i8"]) == {"odd.i8": ref["odd.i8"]}
        a.close()
        m = dd.metrics()
        assert m["tensorvault_fastpath_sessions_total"] >= 4, m
    finally:
        rc = dd.stop()
    assert rc in (0, None), dd.log_text()


def test_metrics_count_the_faults(d):
    """Last in this module: every fatal case above was a session closed for a
    protocol error, and no session is left."""
    wait_sessions(d, lambda ls: ls == [])
    m = d.metrics()
    n_protocol = sum(1 for (_, code) in FATAL_CASES.values() if code == P)
    assert m["tensorvault_fastpath_protocol_errors_total"] >= n_protocol, m
    assert m["tensorvault_fastpath_sessions"] == 0, m
    assert m["tensorvault_fastpath_sessions_total"] >= len(FATAL_CASES), m
    assert m["tensorvault_fastpath_device_read_bytes_total"] > 0, m
    assert m["tensorvault_fastpath_delivered_bytes_total"] >= m[
        "tensorvault_fastpath_shared_bytes_total"] > 0, m  # the holder test shared chunks
    assert m["tensorvault_fastpath_groups"] == 0, m
