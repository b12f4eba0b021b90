"""Shared helpers of the fast-path integration tests (test_fastpath_faults.py,
test_fastpath_leases.py, test_fastpath_fairness.py): checkpoints that span
many arena slots, a daemon with a small staging arena, the "still healthy"
check every fault test ends with, and peers of another uid (65534): a
socket directory other uids can reach, a child that reads as that uid, and
a connection made by that uid that this process then speaks on.

Invariant: every daemon here runs with 64 KiB slots, 16 slots per group and
a credit of 8 (group_slots = 2 x credit, the smallest the daemon allows), so
a model of a few MiB needs dozens of chunks: a client that holds its credit
holds half of a group's slots, and rereads of the model miss the slot cache."""
import contextlib
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time

import numpy as np

import harness.checkpoints as gen
import harness.wire as fp
from harness.daemon import SLOW
from harness.store import reference_tensors
from harness.wire import Session

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
    """A checkpoint under root/name: harness.checkpoints' every-dtype tensors
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



# -- peers of another uid ------------------------------------------------------------------------

NOBODY = 65534


@contextlib.contextmanager
def shared_socket():
    """A fast-path socket path other uids can reach and the settings that put
    the daemon's socket there: its directory is 0755 (the default's parent
    is 0750) and the socket 0666, so the uid check is the daemon's own.
    Yields (socket path, settings)."""
    sockdir = tempfile.mkdtemp(prefix="tvfp-", dir="/tmp")
    os.chmod(sockdir, 0o755)
    sock = os.path.join(sockdir, "fp.sock")
    try:
        yield sock, {"fastpath.socket": sock, "fastpath.mode": "0666"}
    finally:
        shutil.rmtree(sockdir, ignore_errors=True)


def drop_to_nobody():
    """This process becomes uid and gid 65534 with no supplementary groups
    (a forked child: there is no way back)."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def as_nobody(fn):
    """Runs fn() in a forked child as uid/gid 65534 (no groups) and returns
    what it returned (JSON over a pipe); an exception in the child fails
    the caller's assertion with its repr."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        out = None
        try:
            os.close(rfd)
            drop_to_nobody()
            out = fn()
            code = 0
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            out = {"exception": repr(e)}
        finally:
            try:
                os.write(wfd, json.dumps(out).encode())
            finally:
                os._exit(code)
    os.close(wfd)
    data = b""
    while part := os.read(rfd, 1 << 16):
        data += part
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return json.loads(data)


def run_as_nobody(sock_path, spec):
    """as_nobody: connects, opens spec and reads every tensor; returns
    {"error": code, "text", "fatal", "after"} or {"tensors": {name: sha256}}
    (with "uid" and, when opened, "generation")."""
    def read():
        out = {"uid": os.getuid()}
        s = fp.Session(sock_path, timeout=TIMEOUT)
        try:
            h = s.open(spec)
            out["generation"] = h.generation
            out["tensors"] = {k: hashlib.sha256(v).hexdigest()
                              for k, v in s.read_tensors(h).items()}
        except fp.FpError as e:
            out.update(error=e.code, text=e.text, fatal=e.fatal)
            # nothing else follows a refused OPEN: the session is alive and idle
            try:
                m = s.recv(timeout=0.5)
                out["after"] = repr(m)
            except TimeoutError:
                out["after"] = None
        s.close()
        return out
    return as_nobody(read)


def connect_as_nobody(sock_path, n=1):
    """n sockets connected to sock_path by a child running as uid/gid 65534
    (no groups) and handed to this process (SCM_RIGHTS), in connection
    order: the daemon knows a peer by the credentials of its connect
    (SO_PEERCRED, SO_PEERGROUPS), so this process then speaks as uid 65534
    on them (fp.Session(path, sock=...)). Nothing is sent on them yet."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            parent.close()
            drop_to_nobody()
            socks = [fp.connect(sock_path, TIMEOUT) for _ in range(n)]
            socket.send_fds(child, [b"ok"], [x.fileno() for x in socks])
            code = 0
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            try:
                child.sendall(repr(e).encode())
            except OSError:
                pass
        finally:
            os._exit(code)
    child.close()
    try:
        parent.settimeout(TIMEOUT)
        msg, fds, _, _ = socket.recv_fds(parent, 4096, n)
    finally:
        parent.close()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and msg == b"ok" and len(fds) == n, msg
    return [socket.socket(fileno=fd) for fd in fds]
