"""The fast path on a host shared by several users: what one local peer can
take from the others, end to end against build/tensorvaultd. Peers of
another uid are uid 65534 (a child connects as that uid and hands the
socket back, harness.fastpath.connect_as_nobody), on a socket in a 0755
directory with mode 0666 (the uid checks are the daemon's own).

  - a refused connection (sessions full) reaches a real client program as
    TV_E_BUSY with the daemon's reason, not as a dropped connection;
  - sessions: a peer that may open no model is refused at connect and
    holds nothing, and one uid gets at most max_sessions_per_uid sessions,
    so neither can lock out the allowed workers of other users;
  - slots: sessions that take their credit of a group's slots and stop
    releasing are closed (TV_E_TIMEOUT) once another session of the group
    waits for a slot and they released nothing for fastpath.hold_timeout_ms;
    a holder that blocks no one is left alone;
  - read groups: one uid may have handles on at most max_groups_per_uid
    model generations, and one model at most max_groups_per_model
    generations open, so a peer allowed one model cannot take every group;
  - access rules from the environment: TENSORVAULT_ACCESS_<MODEL> names the
    model exactly as written (a mixed-case model's rule is enforced), and a
    rule naming no model of the registry is warned about at start.

Every daemon runs with a 16-slot arena of 64 KiB slots and credit 8
(harness.fastpath)."""
import hashlib
import os
import time

import pytest

import harness.wire as fp
from harness.daemon import SLOW, Daemon, set_args
from harness.fastpath import (CREDIT, FASTPATH_SETTINGS, NOBODY, SLOT_LEN, TIMEOUT, big_names,
                              connect_as_nobody, fastpath_checkpoint, reference, run_as_nobody,
                              shared_socket, wait_sessions)

HOLD_MS = 1000  # fastpath.hold_timeout_ms of the slot tests: short, so they take seconds

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run a peer as uid 65534")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath_fairness")


@pytest.fixture(scope="module")
def src(work):
    return fastpath_checkpoint(work, "ckpt1", seed=201)


@pytest.fixture(scope="module")
def ref(src):
    return reference(src)


@pytest.fixture
def daemon(build_dir, work, request):
    """daemon(settings, name): a started daemon with the fast path's test
    settings plus these, its socket where uid 65534 may connect; stopped (and
    checked to exit 0) after the test."""
    started = []

    def start(settings=None, name=None, env=None):
        name = name or request.node.name
        ctx = shared_socket()
        sock, st = ctx.__enter__()
        st = {**FASTPATH_SETTINGS, **st, **(settings or {})}
        d = Daemon(build_dir, work, settings=st, store=str(work / f"{name}_store"), name=name,
                   env=env)
        started.append((d, ctx))
        d.start()
        d.wait_socket()
        return d

    yield start
    for d, ctx in started:
        rc = d.stop()
        ctx.__exit__(None, None, None)
        assert rc in (0, None), d.log_text()


def first_reply(s):
    """Sends HELLO on session s (made with hello=False) and returns the
    first message back: HELLO_OK, or the ERROR of a refused connection (a
    HELLO that fails with EPIPE is fine: the ERROR waits all the same)."""
    try:
        s.send(fp.enc_hello())
    except BrokenPipeError:
        pass
    m = s.recv()
    assert m is not None, "EOF without a reply to HELLO"
    return m


def nobody_sessions(d, n):
    """n sessions whose peer is uid 65534, connected in order, then each
    sends HELLO: [(session, first reply)]."""
    ss = [fp.Session(d.socket_path, timeout=TIMEOUT, hello=False, sock=x)
          for x in connect_as_nobody(d.socket_path, n)]
    return [(s, first_reply(s)) for s in ss]


def root_reads(d, ref):
    """A session of this process's uid opens m and reads its largest
    tensors right."""
    names = big_names(ref)
    with fp.Session(d.socket_path, timeout=TIMEOUT) as s:
        got = s.read_tensors(s.open("m"), names)
    for n in names:
        assert got[n] == ref[n], n


# -- a refused connection is reported as such ----------------------------------------------------


def test_busy_reaches_the_client_program(daemon, work, src, tv):
    """Protects the refusal at connect: with every session taken, the daemon
    answers a new connection ERROR{TV_E_BUSY, fatal} before the client's
    HELLO is read, then closes. `tensorvault get --fastpath` and `bench
    --fastpath` (the C client library, as the Python package uses it) must
    report TV_E_BUSY with the daemon's reason, whatever the order of their
    HELLO and the daemon's close (a HELLO the daemon never read makes Linux
    report a reset before the queued ERROR; a HELLO sent after the close
    fails with EPIPE); they used to report TV_E_DISCONNECTED."""
    d = daemon({"fastpath.max_sessions": "1"})
    d.import_ok("m", src, activate=True)
    wait_sessions(d, lambda ls: ls == [])  # wait_socket's probe has gone
    out = str(work / "busy.bin")
    with fp.Session(d.socket_path, timeout=TIMEOUT) as held:
        held.open("m")
        for _ in range(5):  # each try races its HELLO against the daemon's close
            p = tv("get", "m", "big.f32", "--fastpath", d.socket_path, "-o", out)
            assert p.returncode != 0, p
            assert "TV_E_BUSY" in p.stderr and "fastpath.max_sessions" in p.stderr, p.stderr
        p = tv("bench", "m", "--fastpath", d.socket_path)
        assert p.returncode != 0, p
        assert "TV_E_BUSY" in p.stderr and "fastpath.max_sessions" in p.stderr, p.stderr
        # the daemon's side, for any client: the ERROR is the first thing
        # read, then EOF, never a reset (it drains the HELLO before closing)
        for _ in range(5):
            with fp.connect(d.socket_path, TIMEOUT) as s:
                try:
                    s.send(fp.enc_hello())
                except BrokenPipeError:
                    pass  # the daemon hung up first: the ERROR waits all the same
                m = fp.decode(s.recv(fp.MAX_MSG + 1))
                assert m.type == fp.ERROR and m.f["code"] == fp.TV_E_BUSY, m
                assert m.f["flags"] & fp.ERROR_FATAL, m
                assert s.recv(fp.MAX_MSG + 1) == b""
    # the session came free: the same command reads
    wait_sessions(d, lambda ls: ls == [])
    p = tv("get", "m", "big.f32", "--fastpath", d.socket_path, "-o", out)
    assert p.returncode == 0, p.stderr


# -- sessions: a peer allowed nothing, a uid over its share ----------------------------------------


@needs_root
def test_session_exhaustion(daemon, src, ref, tv):
    """Protects the allowed workers from session exhaustion: (1) a peer
    whose uid and groups pass no [access] list (it may open no model) used
    to take a session per connection, max_sessions of them locking every
    worker out; it is now refused at connect with ERROR{TV_E_PEER_DENIED,
    fatal} and holds nothing, also through the C client (`tensorvault get
    --fastpath` run as uid 65534). (2) A uid allowed a model gets at most
    fastpath.max_sessions_per_uid sessions (ERROR{TV_E_BUSY, fatal} naming
    the uid and the key past them): filling its own share does not lock
    another uid out."""
    d = daemon({"fastpath.max_sessions": "8"})
    d.import_ok("m", src, activate=True)
    wait_sessions(d, lambda ls: ls == [])
    # (1) uid 65534 passes no list (the default is the daemon's own uid)
    nobody = nobody_sessions(d, 8)
    try:
        root_reads(d, ref)
        for s, m in nobody:
            assert m.type == fp.ERROR and m.f["code"] == fp.TV_E_PEER_DENIED, m
            assert m.f["flags"] & fp.ERROR_FATAL, m
            assert f"uid {NOBODY} (gid {NOBODY}) may open no model on this daemon" in \
                m.text.decode(), m
            assert s.expect_eof()
        assert all(x["uid"] != NOBODY for x in d.sessions()), d.sessions()
    finally:
        for s, _ in nobody:
            s.close()
    p = tv("get", "m", "big.f32", "--fastpath", d.socket_path, "-o", "/dev/null",
           user=NOBODY, group=NOBODY, extra_groups=[])
    assert p.returncode != 0, p
    assert "TV_E_PEER_DENIED" in p.stderr and "may open no model" in p.stderr, p.stderr

    # (2) uid 65534 allowed m: its share is 2 of the 8 sessions (the default
    # max_sessions_per_uid: max_sessions / 4)
    assert d.stop() == 0, d.log_text()
    d.start(extra_args=set_args({"access.m": f"uid:0 uid:{NOBODY}"}))
    d.wait_socket()
    wait_sessions(d, lambda ls: ls == [])
    nobody = nobody_sessions(d, 8)
    try:
        got = [m for _, m in nobody]
        assert [m.type for m in got[:2]] == [fp.HELLO_OK] * 2, got
        for m in got[2:]:
            assert m.type == fp.ERROR and m.f["code"] == fp.TV_E_BUSY, m
            assert m.f["flags"] & fp.ERROR_FATAL, m
            text = m.text.decode()
            assert f"uid {NOBODY} has 2" in text and "fastpath.max_sessions_per_uid" in text, m
        # another uid still gets a session and reads; so do the uid's own two
        root_reads(d, ref)
        for s, m in nobody[:2]:
            s.version, s.hello_ok = m.f["version"], m.f
            assert s.read_tensors(s.open("m"), ["odd.u8"]) == {"odd.u8": ref["odd.u8"]}
        assert sorted(x["uid"] for x in d.sessions()) == [NOBODY, NOBODY], d.sessions()
    finally:
        for s, _ in nobody:
            s.close()


# -- slots: sessions that stop releasing -----------------------------------------------------------


def take_credit(d, name):
    """A session that asks for tensor name of m (more chunks than its
    credit: each reference it gets is on a slot of its own), takes its
    credit of slot references and then releases nothing: (session, its
    request)."""
    s = fp.Session(d.socket_path, timeout=TIMEOUT, auto_release=False)
    h = s.open("m")
    t = h.snap.by_name[name]
    assert t["nbytes"] > CREDIT * SLOT_LEN, t
    reqs = s.submit(h, [(t["index"], 0, t["nbytes"])])
    deadline = time.monotonic() + TIMEOUT
    while len(s.held) < CREDIT:
        assert time.monotonic() < deadline, f"the holder got {len(s.held)} of {CREDIT} slots"
        s.pump(TIMEOUT)
    return s, reqs


def test_slot_starvation(daemon, src, ref):
    """Protects a session of a model generation from the other sessions of
    that generation: with group_slots = 2 x credit, two sessions that take
    their credit and stop releasing hold every slot of the group. A third
    session used to wait for a slot forever (credit bounds each session,
    not their sum, and the wait had no deadline). Now, once it waits and
    they released nothing for fastpath.hold_timeout_ms, both get
    ERROR{TV_E_TIMEOUT, fatal} naming the model, the slots held and the
    key, their slots return, and the third reads the whole model right."""
    d = daemon({"fastpath.hold_timeout_ms": str(HOLD_MS)})
    d.import_ok("m", src, activate=True)
    # two tensors, so the holders' slots are distinct: 2 x 8 = every slot
    holders = [take_credit(d, name)[0] for name in ("big.f32", "mid.u8")]
    try:
        assert sorted(x["slots_held"] for x in d.sessions()) == [CREDIT, CREDIT]
        # both have held theirs longer than the hold timeout when the third
        # comes: both are closed at once (one closed alone would free enough
        # slots, and the other, harming no one then, would be left alone)
        time.sleep(HOLD_MS / 1000 + 0.2)
        t0 = time.monotonic()
        # bounded: the hold timeout, then a generous margin for a loaded machine
        with fp.Session(d.socket_path, timeout=HOLD_MS / 1000 + 10 * SLOW) as w:
            got = w.read_tensors(w.open("m"))
        print(f"the waiting session read the model in {time.monotonic() - t0:.2f} s")
        assert got == ref
        for h in holders:
            with pytest.raises(fp.FpClosed):
                while True:
                    h.pump(TIMEOUT)
            assert h.fatal is not None, h.log[-5:]
            assert h.fatal.f["code"] == fp.TV_E_TIMEOUT, h.fatal
            text = h.fatal.text.decode()
            assert "model 'm' generation 1" in text and f"{CREDIT} slots" in text, text
            assert "fastpath.hold_timeout_ms = 1000" in text, text
    finally:
        for h in holders:
            h.close()
    wait_sessions(d, lambda ls: ls == [])


def test_holder_that_blocks_no_one_is_left_alone(daemon, src, ref):
    """Protects a slow client from the hold timeout when it harms no one: a
    session holds its credit (half the group's slots) without releasing for
    several hold timeouts while another reads the model (never short of a
    slot): the holder is not closed, and completes once it releases."""
    d = daemon({"fastpath.hold_timeout_ms": str(HOLD_MS)})
    d.import_ok("m", src, activate=True)
    holder, reqs = take_credit(d, "big.f32")
    try:
        with fp.Session(d.socket_path, timeout=TIMEOUT) as other:
            h = other.open("m")
            for _ in range(2):
                assert other.read_tensors(h) == ref
        time.sleep(3 * HOLD_MS / 1000)
        listing = {x["id"]: x for x in d.sessions()}
        assert listing[holder.session_id]["slots_held"] == CREDIT, listing
        holder.auto_release = True
        holder.release_all()
        holder.wait(reqs)
        assert reqs[0].result == 0 and bytes(reqs[0].buf) == ref["big.f32"]
    finally:
        holder.close()


# -- read groups: many generations of one model ------------------------------------------------------


def nobody_opens(s, spec):
    """OPEN spec on session s: the handle, or the FpError of its refusal."""
    try:
        return s.open(spec)
    except fp.FpError as e:
        assert not e.fatal, e
        return e


@needs_root
def test_group_exhaustion(daemon, work, src, ref):
    """Protects the read groups (max_groups model generations open at once,
    each with its staging arena) from one peer: uid 65534, allowed model g
    only, opened one generation of g after another until every group was
    taken, and every other model's OPEN got TV_E_BUSY. Now a model has at
    most fastpath.max_groups_per_model generations open and a uid handles on
    at most fastpath.max_groups_per_uid generations (defaults: max_groups / 4
    and / 2, here 1 and 2 of 4): further OPENs get ERROR{TV_E_BUSY} naming
    the key, not fatal, and another peer's OPEN of another model works."""
    d = daemon({"fastpath.max_groups": "4",
                "access.g": f"uid:{NOBODY}", "access.h": f"uid:{NOBODY}",
                "access.k": f"uid:{NOBODY}"})
    small = {}
    for gen in range(1, 5):
        path = fastpath_checkpoint(work, f"ckpt_g{gen}", seed=300 + gen, n_tensors=3, shards=1)
        d.import_ok("g", path)
        small.setdefault("g", reference(path))
    for name, seed in (("h", 310), ("k", 311)):
        d.import_ok(name, fastpath_checkpoint(work, f"ckpt_{name}", seed=seed, n_tensors=3,
                                              shards=1), activate=True)
    d.import_ok("m", src, activate=True)
    wait_sessions(d, lambda ls: ls == [])
    (s, hello), = nobody_sessions(d, 1)
    try:
        assert hello.type == fp.HELLO_OK, hello
        s.version, s.hello_ok = hello.f["version"], hello.f
        # every generation of g: the first opens, the others are over g's share
        got = [nobody_opens(s, f"g@{gen}") for gen in range(1, 5)]
        # another peer, another model: a group is still there for it
        root_reads(d, ref)
        assert isinstance(got[0], fp.Handle), got[0]
        assert s.read_tensors(got[0], ["odd.u8"]) == {"odd.u8": small["g"]["odd.u8"]}
        for e in got[1:]:
            assert isinstance(e, fp.FpError) and e.code == fp.TV_E_BUSY, e
            assert "model 'g' has 1 generations open" in e.text, e.text
            assert "fastpath.max_groups_per_model = 1" in e.text, e.text
        # another model: the uid's second group; a third is over its share
        assert isinstance(nobody_opens(s, "h"), fp.Handle)
        e = nobody_opens(s, "k")
        assert isinstance(e, fp.FpError) and e.code == fp.TV_E_BUSY, e
        assert f"uid {NOBODY} has handles on 2 model generations" in e.text, e.text
        assert "fastpath.max_groups_per_uid = 2" in e.text, e.text
        # a generation it already has a handle on is no new group: it opens
        assert isinstance(nobody_opens(s, "g@1"), fp.Handle)
        root_reads(d, ref)
    finally:
        s.close()


# -- access rules from the environment -----------------------------------------------------------


@needs_root
def test_env_access_rule_of_a_mixed_case_model(daemon, src, ref):
    """Protects the rules given in the environment: TENSORVAULT_ACCESS_Llama
    used to set access.llama (the key lower-cased), so model 'Llama' silently
    fell back to the default list and its rule was not enforced. The model
    name after TENSORVAULT_ACCESS_ is now taken as written: uid 65534, which
    only that rule allows, reads 'Llama'. A rule naming no model of the
    registry (a typo, or the wrong case) is warned about at start."""
    d = daemon({"access.ghost": "*"},
               env={"TENSORVAULT_ACCESS_Llama": f"uid:0 uid:{NOBODY}"})
    d.import_ok("Llama", src, activate=True)
    # the start-up check sees the registry as it is at start: restart
    assert d.stop() == 0, d.log_text()
    mark = len(d.log_text())
    d.start()
    d.wait_socket()
    out = run_as_nobody(d.socket_path, "Llama")
    assert "error" not in out and "exception" not in out, out
    assert out["tensors"] == {k: hashlib.sha256(v).hexdigest() for k, v in ref.items()}
    log = d.log_text()[mark:]
    assert ("access rule for model 'ghost': no such model in the registry "
            "(model names are case-sensitive)") in log, log
    assert "access rule for model 'Llama'" not in log, log
