"""Fast-path leases (docs/fastpath.md), end to end against
build/tensorvaultd through the Python client (harness.wire):

  - a session opens m (active generation 1), m@prod and m@1; then
    generation 2 is activated and the alias moved: the open handles still
    read generation 1's bytes, a new OPEN gets generation 2's;
  - GET /v1/sessions lists the session with pid, uid, gid, connection time,
    bytes delivered (per handle, exactly what the client was sent),
    requests done and slots held, and `tensorvault sessions --json` prints
    the same document (its table one line per handle, `-` for none);
  - POST /v1/gc frees nothing of generation 1 while it is open, even once
    retired, and another import then cannot overwrite it: the open handle
    rereads it right from the device (the 16-slot cache holds a third of
    the model); once the handles close, gc frees it;
  - a client killed with SIGKILL releases its lease: gc frees what it held."""
import json
import os
import re
import select
import signal
import subprocess
import time

import pytest

import harness.wire as fp
from harness.daemon import Daemon
from harness.fastpath import (FASTPATH_SETTINGS, TIMEOUT, fastpath_checkpoint, reference,
                              wait_sessions)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fastpath_leases")


@pytest.fixture(scope="module")
def d(build_dir, work):
    dm = Daemon(build_dir, work, settings=dict(FASTPATH_SETTINGS)).start()
    dm.wait_socket()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


def shard_bytes(path):
    """Bytes of the checkpoint's shard files (what gc frees at least)."""
    if path.endswith(".json"):
        with open(path) as f:
            files = set(json.load(f)["weight_map"].values())
        return sum(os.path.getsize(os.path.join(os.path.dirname(path), s)) for s in files), len(files)
    return os.path.getsize(path), 1


def gc_until(d, n_objects, timeout=TIMEOUT):
    """POST /v1/gc until it has freed n_objects in all (a lease is released on
    the daemon's loop thread just after the client's CLOSE or exit);
    returns the total freed bytes."""
    deadline = time.monotonic() + timeout
    n, freed = 0, 0
    while True:
        g = d.ok("POST", "/v1/gc")
        n += g["n_objects_freed"]
        freed += g["freed_bytes"]
        if n >= n_objects:
            assert n == n_objects, (n, n_objects)
            return freed
        assert time.monotonic() < deadline, f"gc freed {n} of {n_objects} objects"
        time.sleep(0.1)


def cli(build_dir, d, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    env["TENSORVAULT_TOKEN"] = d.token
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    p = subprocess.run([exe, *args, "--url", f"http://127.0.0.1:{d.port}"], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p.stdout


def check_listing(d, build_dir, s, handles, specs):
    """GET /v1/sessions has exactly s, with these handles (in open order) and
    the bytes this client counted; the CLI's --json is the same document
    and its table has one line per handle."""
    doc = d.ok("GET", "/v1/sessions")
    (me,) = [x for x in doc["sessions"] if x["id"] == s.session_id]
    assert (me["pid"], me["uid"], me["gid"]) == (os.getpid(), os.getuid(), os.getgid()), me
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", me["connected"]), me
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert me["connected"] <= t, (me["connected"], t)
    assert me["slots_held"] == len(s.held) == 0, me
    done = sum(1 for r in s.reqs.values() if r.done)
    assert me["requests_done"] == done, (me, done)
    got = [(x["handle"], x["model"], x["spec"], x["generation"], x["bytes_delivered"])
           for x in me["handles"]]
    want = [(h.handle, "m", spec, h.generation, h.bytes_delivered) for h, spec in zip(handles, specs)]
    assert got == want, (got, want)
    # the session's figure is the sum over its open handles (fastpath.h)
    assert me["bytes_delivered"] == sum(h.bytes_delivered for h in handles), me
    assert json.loads(cli(build_dir, d, "sessions", "--json")) == doc
    table = cli(build_dir, d, "sessions")
    lines = table.strip().splitlines()
    assert lines[0].split()[:6] == ["ID", "PID", "UID", "MODEL", "GEN", "DELIVERED"], table
    mine = [ln.split() for ln in lines[1:] if ln.split()[:2] == [str(s.session_id), str(os.getpid())]]
    if handles:
        assert [(x[3], x[4]) for x in mine] == [("m", str(h.generation)) for h in handles], table
    else:
        assert len(mine) == 1 and mine[0][3] == "-", table
    return me


def test_open_handles_keep_their_generation_gc_waits_for_the_lease(d, work, build_dir):
    src1 = fastpath_checkpoint(work, "g1", seed=201)
    src2 = fastpath_checkpoint(work, "g2", seed=202)
    ref1, ref2 = reference(src1), reference(src2)
    assert ref1 != ref2
    d.import_ok("m", src1, activate=True)
    d.import_ok("m", src2)
    d.ok("PUT", "/v1/models/m/aliases/prod", body={"generation": 1})

    s = fp.Session(d.socket_path, timeout=TIMEOUT)
    try:
        specs = ["m", "m@prod", "m@1"]
        hs = [s.open(spec) for spec in specs]
        assert [h.generation for h in hs] == [1, 1, 1]
        assert len({os.fstat(h.arena_fd).st_ino for h in hs}) == 1  # one group
        assert len({h.handle for h in hs}) == 3 and min(h.handle for h in hs) >= 1
        check_listing(d, build_dir, s, hs, specs)

        # activate 2 and move the alias: the open handles keep generation 1
        d.ok("POST", "/v1/models/m/generations/2/activate")
        assert d.ok("PUT", "/v1/models/m/aliases/prod", body={"generation": 2})["generation"] == 2
        assert s.read_tensors(hs[0]) == ref1
        assert s.read_tensors(hs[1]) == ref1
        small = sorted(ref1, key=lambda k: len(ref1[k]))[:5]
        assert s.read_tensors(hs[2], small) == {k: ref1[k] for k in small}
        with fp.Session(d.socket_path, timeout=TIMEOUT) as s2:
            n1, n2 = s2.open("m"), s2.open("m@prod")
            assert (n1.generation, n2.generation) == (2, 2)
            assert os.fstat(n1.arena_fd).st_ino != os.fstat(hs[0].arena_fd).st_ino
            assert s2.read_tensors(n1) == ref2
            sid2 = s2.session_id
        wait_sessions(d, lambda ls: sid2 not in {x["id"] for x in ls})
        check_listing(d, build_dir, s, hs, specs)

        # retired while open: gc keeps generation 1's objects
        used = d.device()["used_bytes"]
        g = d.ok("POST", "/v1/models/m/generations/1/retire")
        assert g["state"] == "retired"
        assert d.ok("POST", "/v1/gc") == {"n_objects_freed": 0, "freed_bytes": 0}
        assert d.device()["used_bytes"] == used
        # an import now cannot take generation 1's extents; the open handle
        # rereads them from the device (more than the slot cache holds)
        d.import_ok("other", fastpath_checkpoint(work, "o1", seed=203), activate=True)
        assert s.read_tensors(hs[0]) == ref1
        # a new OPEN of the retired generation is refused, not fatal
        with pytest.raises(fp.FpError) as ei:
            s.open("m@1")
        assert ei.value.code == fp.TV_E_NOT_FOUND and not ei.value.fatal, ei.value
        check_listing(d, build_dir, s, hs, specs)

        # the last handle closes: the lease goes, gc frees generation 1
        for h in hs:
            assert s.close_handle(h) == {}
        nbytes, nfiles = shard_bytes(src1)
        assert gc_until(d, nfiles) >= nbytes
        check_listing(d, build_dir, s, [], [])
        with pytest.raises(fp.FpError) as ei:
            s.open("m@1")
        assert ei.value.code == fp.TV_E_NOT_FOUND
        h = s.open("m")
        assert h.generation == 2 and s.read_tensors(h) == ref2
    finally:
        s.close()


def test_killed_client_releases_its_lease(d, work):
    src1 = fastpath_checkpoint(work, "k1", seed=211, n_tensors=8, shards=1)
    src2 = fastpath_checkpoint(work, "k2", seed=212, n_tensors=8, shards=1)
    ref1 = reference(src1)
    d.import_ok("k", src1, activate=True)
    d.import_ok("k", src2)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            s = fp.Session(d.socket_path, timeout=TIMEOUT)
            h = s.open("k@1")
            ok = s.read_tensors(h) == ref1
            os.write(wfd, json.dumps({"id": s.session_id, "ok": ok}).encode())
            while True:
                time.sleep(1)
        finally:
            os._exit(1)
    os.close(wfd)
    try:
        r, _, _ = select.select([rfd], [], [], TIMEOUT)
        assert r, "child did not open k@1"
        info = json.loads(os.read(rfd, 4096))
        assert info["ok"], info
        d.ok("POST", "/v1/models/k/generations/2/activate")
        d.ok("POST", "/v1/models/k/generations/1/retire")
        assert d.ok("POST", "/v1/gc")["n_objects_freed"] == 0
        (me,) = [x for x in d.sessions() if x["id"] == info["id"]]
        assert me["pid"] == pid and [(x["model"], x["generation"]) for x in me["handles"]] == [("k", 1)]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(rfd)
    wait_sessions(d, lambda ls: info["id"] not in {x["id"] for x in ls})
    assert gc_until(d, 1) >= os.path.getsize(src1)
