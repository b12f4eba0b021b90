"""The fast path's memory tier and the sharing rules of a read group (the
sessions of one model generation), end to end against build/tensorvaultd
through the Python codec (harness.wire: version-1 sessions copy out of a
legacy arena, version-3 sessions read the tier itself) and the C library
(tensorvault._native: tv_read_batch, and views):

  - members that start 0..500 ms apart (4, at random, of either version)
    cost the device about one copy of the model (<= 1.1 x its objects, from
    the metrics), every byte right;
  - a member that joins after the others are done, and a worker restarted
    in a new process, read no device byte: every chunk comes from memory
    (tensorvault_tier_hits_total grows, the device counter does not);
  - views (tv_tensor_view_batch) equal the official safetensors loader,
    are read-only, pin their bytes (tensorvault_tier_view_bytes) until
    released, and outlive the model they came from;
  - specs naming one generation (NAME, NAME@GEN, NAME@ALIAS) share one
    group and one memfd;
  - under a tiny cache.bytes: a member that takes nothing while the memory
    kept for it is needed is left behind after fastpath.share_wait_ms (the
    others finish; it gets its bytes when it goes on); chunks a session
    references (copies not released, views) are never evicted nor
    rewritten while other models are loaded through the tier, whose
    resident bytes stay within its bound; a view past the budget is refused
    (TV_E_BUSY naming cache.bytes);
  - cache.view_bytes_per_uid counts a chunk once however many handles of
    the uid view it, and refuses a view past it (TV_E_BUSY naming the key);
  - a member killed with SIGKILL while holding views gives its pins back;
  - tensorvault.safe_open(..., views=True): read-only numpy arrays over the
    tier, pinned while an array lives; a store copies; torch refuses it.

Every daemon runs with the fast path's test settings (harness.fastpath: 64
KiB slots, 16-slot staging, credit 8); the checkpoints are about 3 MiB, so a
model spans dozens of chunks."""
import ctypes
import hashlib
import json
import os
import random
import select
import signal
import shutil
import subprocess
import sys
import threading
import time

import pytest

import harness.wire as fp
from harness.daemon import SLOW, Daemon
from harness.fastpath import (CREDIT, FASTPATH_SETTINGS, NOBODY, SLOT_LEN, TIMEOUT, as_nobody,
                              fastpath_checkpoint, reference, shared_socket, wait_sessions)

SHARE_WAIT_MS = 300
TINY_CACHE = 512 << 10  # cache.bytes of the tiny daemon: a sixth of a model


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath_tier")


@pytest.fixture(scope="module")
def src(work):
    return fastpath_checkpoint(work, "ckpt1", seed=301)


@pytest.fixture(scope="module")
def src2(work):
    return fastpath_checkpoint(work, "ckpt2", seed=302)


@pytest.fixture(scope="module")
def ref(src):
    return reference(src)


@pytest.fixture(scope="module")
def ref2(src2):
    return reference(src2)


@pytest.fixture(scope="module")
def d(build_dir, work):
    dm = Daemon(build_dir, work, settings=dict(FASTPATH_SETTINGS), name="d").start()
    dm.wait_socket()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


@pytest.fixture(scope="module")
def tiny(build_dir, work):
    """A daemon whose tier keeps at most TINY_CACHE bytes beyond the open
    groups' staging, and leaves a member behind after SHARE_WAIT_MS."""
    st = {**FASTPATH_SETTINGS, "cache.bytes": str(TINY_CACHE),
          "fastpath.share_wait_ms": str(SHARE_WAIT_MS)}
    dm = Daemon(build_dir, work, settings=st, store=str(work / "tiny_store"), name="tiny").start()
    dm.wait_socket()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


_fresh = iter(range(1, 1 << 30))


def fresh_model(d, src):
    """A model name of its own holding checkpoint src (a new import: no chunk
    of it is in the tier yet); (name, its objects' bytes)."""
    name = f"t{next(_fresh)}"
    d.import_ok(name, src, activate=True)
    gen = d.ok("GET", f"/v1/models/{name}/generations/1")
    return name, sum(-(-sh["file_bytes"] // 65536) * 65536 for sh in gen["shards"])


def delta(d, m0, key):
    return d.metrics()[key] - m0[key]


DEV = "tensorvault_fastpath_device_read_bytes_total"


def load(sock, spec, version, delay=0.0, names=None):
    """A worker: waits delay seconds, connects with protocol version
    `version`, reads every tensor (or names) of spec; {name: bytes}."""
    time.sleep(delay)
    with fp.Session(sock, timeout=TIMEOUT, max_version=version) as s:
        assert s.version == version
        h = s.open(spec)
        got = s.read_tensors(h, names)
        s.close_handle(h)
    return got


def in_threads(fns):
    """Runs the callables together; returns their results (raises the
    first exception)."""
    out, errs = [None] * len(fns), []

    def run(i, f):
        try:
            out[i] = f()
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(TIMEOUT * 2)
    if errs:
        raise errs[0]
    return out


# -- sharing that survives skew ---------------------------------------------------------


@pytest.mark.parametrize("versions", [(1, 1, 1, 1), (3, 3, 3, 3), (1, 3, 1, 3)],
                         ids=["v1", "v3", "mixed"])
def test_skewed_start_reads_the_model_once(d, src, ref, versions):
    """Four workers of one model generation start 0..500 ms apart (at
    random) and each reads the whole model: every byte right, and the device
    reads about one copy of the model (the late ones find the chunks in
    memory), never four."""
    name, objects = fresh_model(d, src)
    rng = random.Random(hash(versions) & 0xffff)
    delays = sorted(rng.uniform(0, 0.5) for _ in versions)
    m0 = d.metrics()
    got = in_threads([lambda v=v, t=t: load(d.socket_path, name, v, t)
                      for v, t in zip(versions, delays)])
    for g in got:
        assert g == ref
    wait_sessions(d, lambda ls: ls == [])
    dev = delta(d, m0, DEV)
    print(f"delays {['%.3f' % t for t in delays]}: device {dev} bytes, {dev / objects:.3f} x")
    assert 0 < dev <= 1.1 * objects, (dev, objects)


def test_late_member_is_served_from_memory(d, src, ref):
    """A member that opens the generation after another read it (the other
    still open, then closed): no device byte, every chunk a tier hit."""
    name, objects = fresh_model(d, src)
    with fp.Session(d.socket_path, timeout=TIMEOUT, max_version=3) as first:
        h = first.open(name)
        assert first.read_tensors(h) == ref
        m0 = d.metrics()
        assert load(d.socket_path, name, 3) == ref  # joins while `first` is open
        assert load(d.socket_path, name, 1) == ref  # a version-1 copy of the same memory
        assert delta(d, m0, DEV) == 0
        assert delta(d, m0, "tensorvault_tier_hits_total") > 0
        assert delta(d, m0, "tensorvault_tier_misses_total") == 0
    wait_sessions(d, lambda ls: ls == [])
    m0 = d.metrics()
    assert load(d.socket_path, name, 3) == ref  # the generation stayed after its last handle
    assert delta(d, m0, DEV) == 0


WORKER = r"""
import ctypes, hashlib, json, sys, time
import tensorvault._native as N
sock, spec, mode = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
err = N.tv_error()
c, h = ctypes.c_void_p(), ctypes.c_void_p()
t0 = time.perf_counter()
N.raise_for(N.lib.tv_client_connect(sock.encode(), None, ctypes.byref(c), err), err)
N.raise_for(N.lib.tv_model_open_daemon(c, spec, None, ctypes.byref(h), err), err)
n = N.lib.tv_model_n_tensors(h)
names, out = [], {}
for i in range(n):
    d = N.tv_tensor_desc()
    N.lib.tv_model_tensor(h, i, ctypes.byref(d))
    names.append((ctypes.string_at(d.name, d.name_len).decode(), d.nbytes))
if mode == "views":
    vs = N.views(h, list(range(n)))
    t1 = time.perf_counter()
    for (nm, _), v in zip(names, vs):
        if isinstance(v, Exception):
            raise v
        out[nm] = hashlib.sha256(v.buffer()).hexdigest()
    if len(sys.argv) > 4:  # hold the views: report, then wait to be killed
        print(json.dumps({"held": True}), flush=True)
        time.sleep(3600)
    for v in vs:
        v.release()
else:
    bufs = [ctypes.create_string_buffer(max(nb, 1)) for _, nb in names]
    reqs = (N.tv_read_req * max(n, 1))()
    for i, ((nm, nb), b) in enumerate(zip(names, bufs)):
        reqs[i].index, reqs[i].dest, reqs[i].dest_len = i, ctypes.cast(b, ctypes.c_void_p), nb
    N.raise_for(N.lib.tv_read_batch(h, reqs, n, err), err)
    t1 = time.perf_counter()
    for (nm, nb), b in zip(names, bufs):
        out[nm] = hashlib.sha256(b.raw[:nb]).hexdigest()
N.lib.tv_model_close(h)
N.lib.tv_client_close(c)
print(json.dumps({"seconds": t1 - t0, "sha": out}))
"""


def worker(sock, spec, mode="copy"):
    """A new process that connects, opens spec and loads every tensor with
    the C library (tv_read_batch, or views): {"seconds", "sha": {name: hex}}."""
    p = subprocess.run([sys.executable, "-c", WORKER, sock, spec, mode], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def sha(ref):
    return {k: hashlib.sha256(v).hexdigest() for k, v in ref.items()}


def test_restarted_worker_reads_no_device_byte(d, src, ref):
    """A worker loads the model, exits, and is started again (a new process,
    a new session, open, every tensor): the second load reads no device
    byte; copies and views both equal the official loader's bytes."""
    name, objects = fresh_model(d, src)
    m0 = d.metrics()
    first = worker(d.socket_path, name)
    assert first["sha"] == sha(ref)
    assert 0 < delta(d, m0, DEV) <= 1.1 * objects
    m1 = d.metrics()
    again = worker(d.socket_path, name)
    views = worker(d.socket_path, name, "views")
    assert again["sha"] == sha(ref) and views["sha"] == sha(ref)
    assert delta(d, m1, DEV) == 0
    print(f"first load {first['seconds']:.4f} s, restarted {again['seconds']:.4f} s, "
          f"restarted with views {views['seconds']:.4f} s")


# -- views ------------------------------------------------------------------------


class Model:
    """A model opened through the daemon with the C library (in-process)."""

    def __init__(self, sock, spec):
        import tensorvault._native as N
        self.N = N
        self.err = N.tv_error()
        self.c, self.h = ctypes.c_void_p(), ctypes.c_void_p()
        N.raise_for(N.lib.tv_client_connect(sock.encode(), None, ctypes.byref(self.c), self.err),
                    self.err)
        N.raise_for(N.lib.tv_model_open_daemon(self.c, spec.encode(), None, ctypes.byref(self.h),
                                               self.err), self.err)

    def close_model(self):
        if self.h:
            self.N.lib.tv_model_close(self.h)
            self.h = None

    def close(self):
        self.close_model()
        if self.c:
            self.N.lib.tv_client_close(self.c)
            self.c = None


def test_views_equal_the_official_loader(d, src, ref):
    """Views of every tensor: the official loader's bytes, read-only, pinned
    (tier view bytes) until released, alive after their model is closed
    (its handle stays open at the daemon until the last view goes)."""
    name, _ = fresh_model(d, src)
    m = Model(d.socket_path, name)
    try:
        names = list(ref)
        vs = m.N.views(m.h, names)
        for n, v in zip(names, vs):
            assert not isinstance(v, Exception), (n, v)
            assert bytes(v.buffer()) == ref[n], n
        big = max(zip(names, vs), key=lambda x: x[1].nbytes)[1]
        with pytest.raises(TypeError):
            big.buffer()[0:1] = b"x"
        assert d.metrics()["tensorvault_tier_view_bytes"] > 0
        m.close_model()  # views outlive their model
        for n, v in zip(names, vs):
            assert bytes(v.buffer()) == ref[n], n
        listing = [x for x in d.sessions() if x["view_bytes"]]
        assert len(listing) == 1 and listing[0]["handles"][0]["view_bytes"] > 0, listing
        for v in vs:
            v.release()
        assert d.metrics()["tensorvault_tier_view_bytes"] == 0
        wait_sessions(d, lambda ls: all(not x["handles"] for x in ls))
    finally:
        m.close()


def test_views_need_version_3(d, src, ref):
    """Views of a model opened in-process (a store) or through a version-2
    session: TV_E_NOT_SUPPORTED, nothing read."""
    name, _ = fresh_model(d, src)
    from harness.daemon import SLOW as _  # noqa: F401 - the same harness as above
    import tensorvault._native as N
    err = N.tv_error()
    h = ctypes.c_void_p()
    N.raise_for(N.lib.tv_model_open(d.store.encode(), name.encode(), None, ctypes.byref(h), err),
                err)
    try:
        v = N.views(h, [next(iter(ref))])
        assert isinstance(v[0], N.Error) and v[0].code == N.TV_E_NOT_SUPPORTED, v
        assert "tv_model_open_daemon" in v[0].message
    finally:
        N.lib.tv_model_close(h)


def test_one_group_for_every_spec_of_a_generation(d, src, ref):
    """NAME, NAME@1 and NAME@ALIAS opened in three sessions at once: one read
    group (the same memfd), one copy of the model read."""
    name, objects = fresh_model(d, src)
    d.ok("PUT", f"/v1/models/{name}/aliases/prod", body={"generation": 1})
    m0 = d.metrics()
    ss = [fp.Session(d.socket_path, timeout=TIMEOUT, max_version=3) for _ in range(3)]
    try:
        hs = [s.open(spec) for s, spec in zip(ss, (name, f"{name}@1", f"{name}@prod"))]
        assert len({os.fstat(h.arena_fd).st_ino for h in hs}) == 1
        assert d.metrics()["tensorvault_fastpath_groups"] - m0["tensorvault_fastpath_groups"] == 1
        got = in_threads([lambda s=s, h=h: s.read_tensors(h) for s, h in zip(ss, hs)])
        assert all(g == ref for g in got)
    finally:
        for s in ss:
            s.close()
    wait_sessions(d, lambda ls: ls == [])
    assert 0 < delta(d, m0, DEV) <= 1.1 * objects


# -- a member that stalls, or dies ---------------------------------------------------------


def test_member_that_stalls_is_left_behind(tiny, src, ref):
    """The tier keeps a sixth of the model: a member that opened the
    generation and then takes nothing has every chunk read since owed to
    it, and those fill the tier; after fastpath.share_wait_ms the daemon
    stops keeping memory for it (a member stall), the other member finishes
    with every byte right, and the stalled one, going on, gets its bytes."""
    name, _ = fresh_model(tiny, src)
    m0 = tiny.metrics()
    with fp.Session(tiny.socket_path, timeout=TIMEOUT, max_version=3) as slow:
        hs = slow.open(name)
        first = [min((n for n in ref if ref[n]), key=lambda n: len(ref[n]))]
        assert slow.read_tensors(hs, first) == {k: ref[k] for k in first}
        t0 = time.monotonic()
        assert load(tiny.socket_path, name, 3) == ref
        took = time.monotonic() - t0
        assert delta(tiny, m0, "tensorvault_fastpath_member_stalls_total") >= 1
        listing = {x["id"]: x for x in tiny.sessions()}
        assert listing[slow.session_id]["handles"][0]["stalled"] is True
        print(f"the other member read the model in {took:.2f} s")
        assert slow.read_tensors(hs) == ref  # it goes on, rereading what it missed
        listing = {x["id"]: x for x in tiny.sessions()}
        assert listing[slow.session_id]["handles"][0]["stalled"] is False
    wait_sessions(tiny, lambda ls: ls == [])
    t = tiny.get("/v1/status").json()["tier"]
    assert t["resident_bytes"] <= TINY_CACHE + (1 << 20), t  # no group open: the budget


def test_member_that_dies_gives_its_pins_back(d, src, ref):
    """A worker holding views of every tensor is killed (SIGKILL): its
    session ends, its pins go (tier view bytes back to what they were), and
    a new worker reads the model right."""
    name, _ = fresh_model(d, src)
    before = d.metrics()["tensorvault_tier_view_bytes"]
    p = subprocess.Popen([sys.executable, "-c", WORKER, d.socket_path, name, "views", "hold"],
                         stdout=subprocess.PIPE, text=True)
    try:
        r, _, _ = select.select([p.stdout], [], [], TIMEOUT)
        assert r and json.loads(p.stdout.readline()) == {"held": True}
        assert d.metrics()["tensorvault_tier_view_bytes"] > before
        assert any(x["pid"] == p.pid and x["view_bytes"] > 0 for x in d.sessions())
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    wait_sessions(d, lambda ls: all(x["pid"] != p.pid for x in ls))
    assert d.metrics()["tensorvault_tier_view_bytes"] == before
    assert worker(d.socket_path, name)["sha"] == sha(ref)


# -- eviction under a tiny budget ----------------------------------------------------------


def object_bytes(srcdir, snap, chunk, slot_len):
    """The bytes of chunk `chunk` of a generation as the tier lays it out
    (shard by shard, each cut in slot_len chunks): (offset in the tier,
    the shard file's bytes there)."""
    first = 0
    for sh in snap.shards:
        n = -(-sh["file_len"] // slot_len)
        if chunk < first + n:
            off = (chunk - first) * slot_len
            with open(os.path.join(srcdir, sh["name"]), "rb") as f:
                f.seek(off)
                return chunk * slot_len, f.read(min(slot_len, sh["file_len"] - off))
        first += n
    raise AssertionError(f"no chunk {chunk}")


def test_referenced_chunks_survive_eviction(tiny, src, src2, ref, ref2):
    """Under a tiny cache.bytes: a session holds its credit of copy
    references (not released) and another holds a view, both of model A,
    while model B is read whole twice through the same tier (evicting):
    the referenced chunks still hold A's bytes (never evicted nor
    rewritten), evictions happened, the tier stayed within its bound, and
    a view larger than the budget is refused (TV_E_BUSY naming cache.bytes)."""
    a, _ = fresh_model(tiny, src)
    b, _ = fresh_model(tiny, src2)
    srcdir = os.path.dirname(src)
    m0 = tiny.metrics()
    holder = fp.Session(tiny.socket_path, timeout=TIMEOUT, max_version=3, auto_release=False)
    m = Model(tiny.socket_path, a)
    try:
        ha = holder.open(a)
        holder.submit(ha, [(t["index"], 0, t["nbytes"]) for t in ha.tensors
                           if t["nbytes"] >= SLOT_LEN])
        deadline = time.monotonic() + TIMEOUT
        while len(holder.held) < CREDIT and time.monotonic() < deadline:
            holder.pump(TIMEOUT)
        held = sorted({s for _, s in holder.held})
        assert held
        small = min((n for n in ref if 0 < len(ref[n]) <= SLOT_LEN), key=lambda n: -len(ref[n]))
        [v] = m.N.views(m.h, [small])
        assert not isinstance(v, Exception), v
        [big] = m.N.views(m.h, [max(ref, key=lambda n: len(ref[n]))])
        assert isinstance(big, m.N.Error) and big.code == -1203, big  # TV_E_BUSY
        assert "cache.bytes" in big.message, big.message
        for _ in range(2):
            assert load(tiny.socket_path, b, 3) == ref2
            assert load(tiny.socket_path, b, 1) == ref2
        # resident and bound are two counters the fast-path loop publishes
        # one after the other (a group's close drops its floor, then evicts):
        # read them once the loop has settled
        deadline = time.monotonic() + TIMEOUT
        while True:
            t = tiny.get("/v1/status").json()["tier"]
            if t["resident_bytes"] <= t["bound_bytes"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert t["resident_bytes"] <= t["bound_bytes"], t
        assert delta(tiny, m0, "tensorvault_tier_evictions_total") > 0
        assert bytes(v.buffer()) == ref[small]
        for c in held:
            at, want = object_bytes(srcdir, ha.snap, c, ha.slot_len)
            assert bytes(ha.view[at:at + len(want)]) == want, c
        v.release()
        holder.auto_release = True
        holder.release_all()
    finally:
        holder.close()
        m.close()
    wait_sessions(tiny, lambda ls: ls == [])
    assert load(tiny.socket_path, a, 3) == ref


def views_as_nobody(sock, spec, names):
    """As uid 65534 (a forked child): views of names of spec in one handle,
    given back; {"granted": n, "refused": [text]}."""
    def take():
        m = Model(sock, spec)
        vs = m.N.views(m.h, names)
        out = {"granted": sum(not isinstance(v, Exception) for v in vs),
               "refused": [v.message for v in vs if isinstance(v, Exception)]}
        for v in vs:
            if not isinstance(v, Exception):
                v.release()
        m.close()
        return out
    return as_nobody(take)


def test_views_of_one_uid_pin_each_chunk_once(build_dir, work, src, src2, ref, ref2, caplog):
    """cache.view_bytes_per_uid bounds the tier memory one uid pins with
    views, each chunk counted once: three handles of the uid (three
    sessions, as three workers of one user) viewing every tensor of one
    model are all granted and pin it once; a view of a second model past
    the bound is refused (TV_E_BUSY naming the key), while another uid
    (65534, in a child) has a bound of its own and is granted it;
    tensorvault.safe_open(..., views=True) then copies the tensors refused
    (saying so once) and lends the rest, every byte right; once the first
    model's views are given back, the second model's are granted."""
    size = sum(os.path.getsize(os.path.join(os.path.dirname(src), f))
               for f in os.listdir(os.path.dirname(src)) if f.endswith(".safetensors"))
    bound = size * 3 // 2  # one model's chunks, not two
    with shared_socket() as (sock, shared):
        st = {**FASTPATH_SETTINGS, **shared, "cache.view_bytes_per_uid": str(bound),
              "access.shared": "uid:0 uid:65534"}
        dm = Daemon(build_dir, work, settings=st, store=str(work / "peruid_store"),
                    name="peruid").start()
        dm.wait_socket()
        uid_views_bound(dm, src, src2, ref, ref2, size, bound, caplog)


def uid_views_bound(dm, src, src2, ref, ref2, size, bound, caplog):
    """The body of test_views_of_one_uid_pin_each_chunk_once on its daemon
    dm (stopped at the end)."""
    import gc
    import logging

    import tensorvault
    import torch
    models, held = [], []
    try:
        a, _ = fresh_model(dm, src)
        b = "shared"  # uid 65534 may open it too
        dm.import_ok(b, src2, activate=True)
        for _ in range(3):
            m = Model(dm.socket_path, a)
            models.append(m)
            vs = m.N.views(m.h, list(ref))
            for n, v in zip(ref, vs):
                assert not isinstance(v, Exception), (n, v)
                assert bytes(v.buffer()) == ref[n], n
            held += vs
        pinned = dm.metrics()["tensorvault_tier_view_bytes"]
        assert size <= pinned <= bound, (pinned, size)
        mb = Model(dm.socket_path, b)
        models.append(mb)
        vb = mb.N.views(mb.h, list(ref2))
        refused = [v for v in vb if isinstance(v, mb.N.Error)]
        assert refused, "a second model's views passed cache.view_bytes_per_uid"
        for e in refused:
            assert e.code == -1203 and "cache.view_bytes_per_uid" in e.message, e.message
        for v in vb:
            if not isinstance(v, Exception):
                v.release()
        other = views_as_nobody(dm.socket_path, b, list(ref2))
        assert other == {"granted": len(ref2), "refused": []}, other
        raw = lambda t: t.reshape(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
        with caplog.at_level(logging.WARNING, logger="tensorvault"):
            with tensorvault.safe_open(b, "pt", socket=dm.socket_path, views=True) as f:
                got = f.get_tensors()
                one = f.get_tensor(max(ref2, key=lambda n: len(ref2[n])))
        assert set(got) == set(ref2)
        for n, t in got.items():
            assert raw(t) == ref2[n], n
        assert raw(one) == ref2[max(ref2, key=lambda n: len(ref2[n]))]
        said = [r for r in caplog.records if "cache.view_bytes_per_uid" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        del got, one, f
        gc.collect()
        for v in held:
            v.release()
        held = []
        vb = mb.N.views(mb.h, list(ref2))
        for n, v in zip(ref2, vb):
            assert not isinstance(v, Exception), (n, v)
            assert bytes(v.buffer()) == ref2[n], n
            v.release()
        assert dm.metrics()["tensorvault_tier_view_bytes"] == 0
    finally:
        for v in held:
            v.release()
        for m in models:
            m.close()
        rc = dm.stop()
    assert rc == 0, dm.log_text()


def test_safe_open_views_are_read_only_arrays_of_the_tier(d, src, ref):
    """tensorvault.safe_open(..., views=True) on the numpy framework: every
    tensor is a read-only array over the daemon's memory tier, equal to the
    official loader's bytes, pinned (tier view bytes) while an array over it
    lives and given back when the last one is collected; the same keyword on
    a store (no tier) copies, and torch (no read-only tensor) refuses it."""
    import gc

    import numpy as np
    import tensorvault

    name, _ = fresh_model(d, src)
    with tensorvault.safe_open(name, "np", socket=d.socket_path, views=True) as f:
        got = f.get_tensors()
        one = f.get_tensor(next(iter(ref)))
    assert set(got) == set(ref)
    for n, a in got.items():
        assert a.tobytes() == ref[n], n
        assert not a.flags.writeable, n
        if a.size:
            with pytest.raises(ValueError):
                a.reshape(-1)[0] = a.reshape(-1)[0]
            with pytest.raises(ValueError):
                a.flags.writeable = True
    assert one.tobytes() == ref[next(iter(ref))] and not one.flags.writeable
    assert d.metrics()["tensorvault_tier_view_bytes"] > 0
    keep = got[max(got, key=lambda n: got[n].nbytes)]
    del got, one, f, a
    gc.collect()
    assert d.metrics()["tensorvault_tier_view_bytes"] > 0  # the array kept still pins its view
    snapshot = keep.copy()
    del keep
    gc.collect()
    assert d.metrics()["tensorvault_tier_view_bytes"] == 0
    assert snapshot.tobytes() in ref.values()

    with tensorvault.safe_open(name, "np", store=d.store, views=True) as f:
        copies = f.get_tensors()
    assert {n: a.tobytes() for n, a in copies.items()} == ref
    assert all(a.flags.writeable for a in copies.values())
    assert isinstance(copies[next(iter(ref))], np.ndarray)

    with pytest.raises(tensorvault.Error) as e:
        tensorvault.safe_open(name, "pt", "cuda:0", socket=d.socket_path, views=True)
    assert e.value.name == "TV_E_INVALID_ARG" and "host memory" in e.value.message


def test_safe_open_torch_views_are_private_copy_on_write(d, src, ref):
    """views=True on torch: every tensor lies over the daemon's memory tier
    (no copy: the tier's view bytes count them), equal to the official
    loader's bytes and writable; a write stays in this process (the page is
    copied privately): the next view of the same tensor, another process
    and a copy through the daemon still read the model's bytes. The pins
    go with the last tensor over them."""
    import gc

    import tensorvault
    torch = pytest.importorskip("torch")

    name, _ = fresh_model(d, src)
    with tensorvault.safe_open(name, "pt", socket=d.socket_path, views=True) as f:
        got = f.get_tensors()
    assert set(got) == set(ref)
    raw = lambda t: t.reshape(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
    for n, t in got.items():
        assert raw(t) == ref[n], n
    assert d.metrics()["tensorvault_tier_view_bytes"] > 0
    big = max(got, key=lambda n: got[n].nbytes)
    w = got[big]
    w.reshape(-1).view(torch.uint8).fill_(0xA5)  # writable, in place
    assert set(raw(w)) == {0xA5}
    with tensorvault.safe_open(name, "pt", socket=d.socket_path, views=True) as f:
        again = f.get_tensor(big)
    assert raw(again) == ref[big]
    with tensorvault.safe_open(name, "np", socket=d.socket_path) as f:
        assert f.get_tensor(big).tobytes() == ref[big]
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, tensorvault\n"
         "with tensorvault.safe_open(sys.argv[1], 'np', socket=sys.argv[2], views=True) as f:\n"
         "    sys.stdout.write(f.get_tensor(sys.argv[3]).tobytes().hex())",
         name, d.socket_path, big], capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert bytes.fromhex(out.stdout) == ref[big]
    del got, w, again, t, f
    gc.collect()
    assert d.metrics()["tensorvault_tier_view_bytes"] == 0


# -- cache.dir: the tier's files on a tmpfs of the operator's ----------------------


def huge_tmpfs(path):
    """Mounts a tmpfs with huge=within_size at path (root only); False when
    this machine cannot."""
    if os.geteuid() != 0:
        return False
    os.makedirs(path, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=within_size,size=256m,mode=0700",
                        "tvtier", str(path)], capture_output=True, text=True)
    return p.returncode == 0


def pmd_mapped_kib(pid, prefix):
    """ShmemPmdMapped kB of the mappings of pid whose file lies under prefix
    (an unnamed file shows as PREFIX/#INODE (deleted))."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and head[5].startswith(prefix + "/")
            elif inside and line.startswith("ShmemPmdMapped:"):
                total += int(line.split()[1])
    return total


def test_cache_dir_on_a_huge_tmpfs_maps_huge_pages(build_dir, work, src, ref):
    """cache.dir on a tmpfs mounted huge=within_size: the tier's generations
    are unnamed files there (the directory stays empty), on transparent
    huge pages (the daemon maps them 2 MiB at a time), whatever the
    system's shmem_enabled says for memfds; clients accept the unsealable
    files; copies, numpy views and torch views equal the official loader,
    also for a worker of another uid (65534), which can map the tier only
    read-only. A tmpfs smaller than cache.bytes stops the daemon at start."""
    import tensorvault
    mnt = work / "huge_tier"
    if not huge_tmpfs(mnt):
        pytest.skip("mounting a tmpfs needs root (mount -t tmpfs -o huge=within_size)")
    with shared_socket() as (sock, shared):
        try:
            huge_tier_daemon(build_dir, work, src, ref, mnt, shared)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)


def nobody_loads(sock, spec, mnt):
    """As uid 65534 (a forked child, which cannot reach mnt by its path):
    spec's tensors copied and as numpy views through the daemon, the
    SHA-256 of each, the tier descriptors it held while the views lived
    (under mnt) and how many of them it could map writable."""
    def run():
        import mmap

        import tensorvault
        out = {"tier_fds": 0, "writable": 0}
        with tensorvault.safe_open(spec, "np", socket=sock) as f:
            out["copies"] = {n: hashlib.sha256(f.get_tensor(n).tobytes()).hexdigest()
                             for n in f.keys()}
        with tensorvault.safe_open(spec, "np", socket=sock, views=True) as f:
            views = f.get_tensors()
            out["views"] = {n: hashlib.sha256(a.tobytes()).hexdigest() for n, a in views.items()}
            for fd in map(int, os.listdir("/proc/self/fd")):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if not target.startswith(str(mnt) + "/"):
                    continue
                out["tier_fds"] += 1
                try:
                    mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE).close()
                    out["writable"] += 1
                except OSError:
                    pass
            del views
        return out
    return as_nobody(run)


def huge_tier_daemon(build_dir, work, src, ref, mnt, shared):
    """The body of test_cache_dir_on_a_huge_tmpfs_maps_huge_pages."""
    import tensorvault
    small = Daemon(build_dir, work, name="hugesmall", store=str(work / "hugesmall_store"),
                   settings={**FASTPATH_SETTINGS, "cache.dir": str(mnt), "cache.bytes": "512M"})
    assert small.spawn().wait(timeout=TIMEOUT) != 0
    assert "its tmpfs holds 268435456 bytes, less than cache.bytes" in small.log_text(), \
        small.log_text()
    st = {**FASTPATH_SETTINGS, **shared, "cache.dir": str(mnt), "cache.bytes": "64M",
          "access.h": f"uid:0 uid:{NOBODY}"}
    dm = Daemon(build_dir, work, settings=st, store=str(work / "huge_store"), name="huge").start()
    try:
        dm.wait_socket()
        assert "transparent huge pages of 2097152 bytes" in dm.log_text(), dm.log_text()
        dm.import_ok("h", src, activate=True)
        with tensorvault.safe_open("h", "np", socket=dm.socket_path) as f:
            copies = {n: f.get_tensor(n).tobytes() for n in f.keys()}
        assert copies == ref
        with tensorvault.safe_open("h", "np", socket=dm.socket_path, views=True) as f:
            views = f.get_tensors()
            assert {n: a.tobytes() for n, a in views.items()} == ref
            assert not next(iter(views.values())).flags.writeable
            del views
        torch = pytest.importorskip("torch")
        with tensorvault.safe_open("h", "pt", socket=dm.socket_path, views=True) as f:
            got = f.get_tensors()
        raw = lambda t: t.reshape(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
        assert {n: raw(t) for n, t in got.items()} == ref
        del got
        want = {n: hashlib.sha256(b).hexdigest() for n, b in ref.items()}
        other = nobody_loads(dm.socket_path, "h", mnt)
        assert "exception" not in other, other
        assert other["copies"] == want and other["views"] == want
        assert other["tier_fds"] >= 1 and other["writable"] == 0, other
        print(f"uid {NOBODY}: {len(other['views'])} views, {other['tier_fds']} tier descriptors, "
              f"none writable")
        assert os.listdir(mnt) == []
        assert pmd_mapped_kib(dm.pid, str(mnt)) >= 2048, "no 2 MiB mapping of the tier"
    finally:
        assert dm.stop() == 0, dm.log_text()


def test_cache_dir_as_large_as_the_budget_serves_larger_models(build_dir, work, src, ref):
    """cache.dir on a tmpfs that holds exactly cache.bytes, and a model three
    times that: the tier never makes more resident than the tmpfs holds
    (the groups' staging included), so every load, the first and the
    next, equals the official loader instead of failing its device reads
    on a full tmpfs."""
    import tensorvault
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = work / "exact_tier"
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tvexact", str(mnt)],
                   check=True)
    try:
        st = {**FASTPATH_SETTINGS, "cache.dir": str(mnt), "cache.bytes": "1M"}
        dm = Daemon(build_dir, work, settings=st, store=str(work / "exact_store"),
                    name="exact").start()
        try:
            dm.wait_socket()
            dm.import_ok("x", src, activate=True)
            assert sum(map(len, ref.values())) > 2 * (1 << 20)
            for _ in range(2):
                with tensorvault.safe_open("x", "np", socket=dm.socket_path) as f:
                    assert {n: f.get_tensor(n).tobytes() for n in f.keys()} == ref
            assert shutil.disk_usage(mnt).used <= 1 << 20
        finally:
            assert dm.stop() == 0, dm.log_text()
    finally:  # lazily: a failed assertion's traceback may still hold a mapping
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_cache_dir_must_be_a_tmpfs(build_dir, work):
    """A cache.dir that is not on a tmpfs stops the daemon at start with the
    reason, before it serves anything."""
    dm = Daemon(build_dir, work, settings={**FASTPATH_SETTINGS, "cache.dir": "/proc"},
                store=str(work / "notmpfs_store"), name="notmpfs")
    p = dm.spawn()
    assert p.wait(timeout=TIMEOUT) != 0
    assert "cache.dir '/proc' is not on a tmpfs" in dm.log_text(), dm.log_text()
