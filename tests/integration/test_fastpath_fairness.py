"""The fast path on a host shared by several users: what one local peer can
take from the others, end to end against build/tensorvaultd. Peers of
another uid are uid 65534 (a child connects as that uid and hands the
socket back, fastpath_util.connect_as_nobody), on a socket in a 0755
directory with mode 0666 (the uid checks are the daemon's own).

  - a refused connection (sessions full) reaches a real client program as
    TV_E_BUSY with the daemon's reason, not as a dropped connection;
  - sessions: a peer that may open no model is refused at connect and
    holds nothing, and one uid gets at most max_sessions_per_uid sessions,
    so neither can lock out the allowed workers of other users.

Every daemon runs with a 16-slot arena of 64 KiB slots and credit 8
(fastpath_util.py)."""
import os

import pytest

import fpwire as fp
from daemon import Daemon, set_args
from fastpath_util import (FASTPATH_SETTINGS, NOBODY, TIMEOUT, big_names, connect_as_nobody,
                           fastpath_checkpoint, reference, shared_socket, wait_sessions)

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
    # max_sessions_per_uid is 64: set here to 2 so that it binds)
    assert d.stop() == 0, d.log_text()
    d.start(extra_args=set_args({"access.m": f"uid:0 uid:{NOBODY}",
                                 "fastpath.max_sessions_per_uid": "2"}))
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
