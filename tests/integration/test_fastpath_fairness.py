"""The fast path on a host shared by several users: what one local peer can
take from the others, end to end against build/tensorvaultd. Peers of
another uid are uid 65534 (a child connects as that uid and hands the
socket back, fastpath_util.connect_as_nobody), on a socket in a 0755
directory with mode 0666 (the uid checks are the daemon's own).

  - a refused connection (sessions full) reaches a real client program as
    TV_E_BUSY with the daemon's reason, not as a dropped connection.

Every daemon runs with a 16-slot arena of 64 KiB slots and credit 8
(fastpath_util.py)."""
import os

import pytest

import fpwire as fp
from daemon import Daemon
from fastpath_util import (FASTPATH_SETTINGS, TIMEOUT, fastpath_checkpoint, reference,
                           shared_socket, wait_sessions)

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
