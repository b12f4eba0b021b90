"""The daemon on a shared host, seen from HTTP clients it did not write:
curl and Python run as another user (uid 65534 through setpriv), over TCP
from loopback and from a non-loopback address, and over the daemon's UNIX
socket.

- one access policy: with `access.default = uid:0`, uid 65534 gets no byte,
  no tensor metadata, no job, session or extent of any model by any route
  (HTTP data and metadata routes, listings, the UNIX socket, the fast
  path), and cannot even learn whether a model exists; the daemon's own
  user still reads everything without a token (the README's demo);
- the same rules name tokens (`token:NAME`, `token:*`) and unidentified
  clients (`anonymous`, with `http.anonymous_reads = always`);
- DNS rebinding: a Host that is not one of the daemon's names is 421;
- slowloris: one local user trickling headers on hundreds of connections
  neither keeps another user from being answered nor holds its
  connections past `http.header_timeout_s`."""
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import harness.wire as fp
from harness.daemon import SLOW, Daemon, make_checkpoint, seg

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to run clients as uid 65534")

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def curl(args, nobody=True, timeout=30):
    """Runs curl (as uid 65534 unless nobody=False); returns (status, body)."""
    cmd = (AS_NOBODY if nobody else []) + ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}",
                                           "--max-time", str(timeout), *args]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout + 10)
    body, _, code = p.stdout.rpartition(b"\n")
    return int(code or 0), body


def error_code(body):
    return json.loads(body)["error"]["code"]


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path  # under the daemon's import root
    rng = np.random.default_rng(22)
    tensors = {"w.0": rng.standard_normal((64, 33)).astype(np.float32),
               "b.1": rng.integers(0, 255, size=(4097,), dtype=np.uint8)}
    return make_checkpoint(root / "m" / "model.safetensors", tensors), tensors


@pytest.fixture
def sockdir():
    """A directory every user may enter, for sockets other uids must reach
    (the defaults' parent is 0750)."""
    d = tempfile.mkdtemp(prefix="tvsec-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    for f in os.listdir(d):
        try:
            os.unlink(os.path.join(d, f))
        except OSError:
            pass
    os.rmdir(d)


def start(build_dir, work, sockdir, **settings):
    st = {"access.default": "uid:0",
          "http.socket": os.path.join(sockdir, "http.sock"), "http.socket_mode": "0666",
          "fastpath.socket": os.path.join(sockdir, "fp.sock"), "fastpath.mode": "0666"}
    st.update(settings)
    return Daemon(build_dir, work, settings=st, name="sec").start()


def nobody_fastpath(build_dir, sock, spec, tensor):
    """Reads tensor of spec through the fast path as uid 65534 with the CLI
    (the C client library): its exit status and error line."""
    p = subprocess.run(AS_NOBODY + [os.path.join(os.path.abspath(build_dir), "tensorvault"), "get",
                                    spec, tensor, "--fastpath", sock, "-o", "/dev/null"],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def test_denied_user_gets_nothing_of_any_model_by_any_route(build_dir, tmp_path, sockdir, ckpt):
    src, tensors = ckpt
    d = start(build_dir, tmp_path, sockdir)
    try:
        d.import_ok("m", src, activate=True)
        base = f"http://127.0.0.1:{d.port}"
        data = f"/v1/models/m/generations/active/tensors/{seg('w.0')}/data"
        # the daemon's own user: every route, no token (the README's demo)
        st, body = curl([base + data], nobody=False)
        assert st == 200 and body == tensors["w.0"].tobytes()
        st, body = curl([base + "/v1/models"], nobody=False)
        assert [m["name"] for m in json.loads(body)["models"]] == ["m"]

        # uid 65534 over loopback TCP, no token: refused before the registry is read
        for path in ["/v1/models/m", "/v1/models/m/generations", "/v1/models/m/generations/1",
                     "/v1/models/m/aliases", "/v1/models/m/generations/active/tensors",
                     f"/v1/models/m/generations/1/tensors/{seg('w.0')}", data]:
            st, body = curl([base + path])
            assert st == 403 and error_code(body) == "TV_E_PEER_DENIED", (path, st, body)
            assert b"uid 65534" in body and b"'m'" in body, body
        st, body = curl(["-r", "0-3", base + data])
        assert st == 403
        # ... and cannot tell a model that exists from one that does not
        st, body = curl([base + "/v1/models/no-such-model"])
        assert st == 403 and error_code(body) == "TV_E_PEER_DENIED"
        # listings leave the model out
        st, body = curl([base + "/v1/models"])
        assert st == 200 and json.loads(body)["models"] == []
        st, body = curl([base + "/v1/status"])
        doc = json.loads(body)
        assert doc["n_models"] == 0
        assert doc["peer"] == {"kind": "local", "uid": NOBODY, "token": None, "transport": "tcp",
                               "scope": "read"}, doc
        st, body = curl([base + "/v1/jobs"])
        assert st == 200 and json.loads(body)["jobs"] == []
        job_id = d.ok("GET", "/v1/jobs")["jobs"][0]["id"]
        st, body = curl([base + f"/v1/jobs/{job_id}"])
        assert st == 404, body
        ext = json.loads(curl([base + "/v1/devices/1/extents"])[1])["extents"]
        objs = [e for e in ext if e["kind"] == "object"]
        assert objs and all(e["users"] == [] and e["sha256"] is None for e in objs), objs
        own = d.ok("GET", "/v1/devices/1/extents", token=None)["extents"]
        assert any(e["kind"] == "object" and e["users"] for e in own)
        # blobs are for fleet and admin tokens only
        sha = [e for e in own if e["kind"] == "object"][0]["sha256"]
        st, body = curl([base + f"/v1/blobs/sha256:{sha}"])
        assert st == 401, body

        # the UNIX socket names the user by SO_PEERCRED: the same answer
        sock = os.path.join(sockdir, "http.sock")
        st, body = curl(["--unix-socket", sock, "http://localhost" + data])
        assert st == 403 and error_code(body) == "TV_E_PEER_DENIED", body
        st, body = curl(["--unix-socket", sock, "http://localhost/v1/status"])
        assert json.loads(body)["peer"]["transport"] == "unix"
        assert json.loads(body)["peer"]["uid"] == NOBODY
        st, body = curl(["--unix-socket", sock, "http://localhost" + data], nobody=False)
        assert st == 200 and body == tensors["w.0"].tobytes()

        # sessions: a root worker holds the model open on the fast path; uid
        # 65534 sees no session (not its own), root sees it
        with fp.Session(os.path.join(sockdir, "fp.sock"), timeout=30) as s:
            s.open("m")
            assert len(d.ok("GET", "/v1/sessions", token=None)["sessions"]) == 1
            st, body = curl([base + "/v1/sessions"])
            assert st == 200 and json.loads(body)["sessions"] == []
        # the fast path refuses it too (at connect: uid 65534 may open no model)
        rc, err = nobody_fastpath(build_dir, os.path.join(sockdir, "fp.sock"), "m", "w.0")
        assert rc == 1 and "TV_E_PEER_DENIED" in err and "uid 65534" in err, err
    finally:
        d.stop()

    # allowed by a rule of its own: the same bytes as the official loader
    d = start(build_dir, tmp_path, sockdir, **{"access.m": f"uid:{NOBODY}"})
    try:
        st, body = curl([f"http://127.0.0.1:{d.port}" + data])
        assert st == 200 and body == tensors["w.0"].tobytes()
        st, body = curl([f"http://127.0.0.1:{d.port}/v1/models"])
        assert [m["name"] for m in json.loads(body)["models"]] == ["m"]
    finally:
        d.stop()


def test_token_and_anonymous_rules(build_dir, tmp_path, sockdir, ckpt):
    src, tensors = ckpt
    d = start(build_dir, tmp_path, sockdir, **{"access.m": "uid:0 token:ci",
                                               "http.anonymous_reads": "always",
                                               "http.listen": "0.0.0.0:0"})
    try:
        d.import_ok("m", src, activate=True)
        data = f"/v1/models/m/generations/active/tensors/{seg('b.1')}/data"
        ci = d.ok("POST", "/v1/tokens", 201, body={"name": "ci", "scope": "read"})["token"]
        other = d.ok("POST", "/v1/tokens", 201, body={"name": "other", "scope": "read"})["token"]
        r = d.request("GET", data, token=ci)
        assert r.status == 200 and r.body == tensors["b.1"].tobytes()
        r = d.request("GET", data, token=other)
        assert r.status == 403 and "token 'other'" in r.json()["error"]["message"], r
        assert [m["name"] for m in d.ok("GET", "/v1/models", token=other)["models"]] == []
        # the admin token is not subject to [access]
        assert d.request("GET", data).status == 200

        # a client from a non-loopback address of this host, without a token, is
        # anonymous: m does not name anonymous
        addr = non_loopback_address()
        st, body = curl([f"http://{addr}:{d.port}" + data], nobody=False)
        assert st == 403 and b"anonymous" in body, body
        st, body = curl([f"http://{addr}:{d.port}/v1/status"], nobody=False)
        assert json.loads(body)["peer"]["kind"] == "anonymous"
    finally:
        d.stop()
    d = start(build_dir, tmp_path, sockdir, **{"access.m": "anonymous",
                                               "http.anonymous_reads": "always",
                                               "http.listen": "0.0.0.0:0"})
    try:
        st, body = curl([f"http://{addr}:{d.port}" + data], nobody=False)
        assert st == 200 and body == tensors["b.1"].tobytes()
        # anonymous is not "any local user"
        st, body = curl([f"http://127.0.0.1:{d.port}" + data])
        assert st == 403
    finally:
        d.stop()
    # anonymous_reads = loopback (the default): an unidentified client needs a token
    d = start(build_dir, tmp_path, sockdir, **{"access.m": "anonymous",
                                               "http.listen": "0.0.0.0:0"})
    try:
        st, body = curl([f"http://{addr}:{d.port}" + data], nobody=False)
        assert st == 401, body
    finally:
        d.stop()


def non_loopback_address():
    """An IPv4 address of this host that is not loopback (connecting to it
    from here, the client's address is not loopback either)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    pytest.fail("this host has no non-loopback IPv4 address: " + out)


def test_dns_rebinding_host_is_refused(build_dir, tmp_path, sockdir, ckpt):
    src, tensors = ckpt
    d = start(build_dir, tmp_path, sockdir)
    try:
        d.import_ok("m", src, activate=True)
        base = f"http://127.0.0.1:{d.port}"
        for path in ["/v1/models", "/", f"/v1/models/m/generations/1/tensors/{seg('w.0')}/data"]:
            # what a page on evil.example, resolved to 127.0.0.1, makes the browser send
            st, body = curl(["-H", f"Host: evil.example:{d.port}", base + path], nobody=False)
            assert st == 421, (path, st, body)
        st, _ = curl(["-H", "Host:", base + "/v1/models"], nobody=False)  # none on HTTP/1.1
        assert st == 400
        st, _ = curl(["-H", f"Host: localhost:{d.port}", base + "/v1/models"], nobody=False)
        assert st == 200
    finally:
        d.stop()


TRICKLE = r'''
import socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
conns, refused = [], 0
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        conns.append(s)
    except OSError:
        refused += 1
t0 = time.monotonic()
closed = 0
while conns and time.monotonic() - t0 < seconds:
    alive = []
    for s in conns:
        try:
            s.sendall(b"X")  # one header byte at a time, never the end
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            s.setblocking(True)
            alive.append(s)
        except OSError:
            closed += 1
    conns = alive
    time.sleep(0.2)
print(refused, closed, len(conns), round(time.monotonic() - t0, 1))
'''


def test_slowloris_of_one_user_starves_nobody_else(build_dir, tmp_path, sockdir):
    """uid 65534 opens 300 connections and trickles header bytes on them:
    root's requests are answered all along, and the daemon closes the
    trickling connections after http.header_timeout_s."""
    d = start(build_dir, tmp_path, sockdir, **{"http.header_timeout_s": "3",
                                               "http.per_uid_connections": "64"})
    try:
        p = subprocess.Popen(AS_NOBODY + [sys.executable, "-c", TRICKLE, str(d.port), "300",
                                          str(12 * SLOW)], stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        # root's requests all along the attack: until the trickler has seen
        # every connection closed (or its 12 * SLOW s are up), at least one
        worst = 0.0
        t_end = time.monotonic() + 6 * SLOW
        while True:
            t0 = time.monotonic()
            r = d.request("GET", "/healthz", token=None, timeout=10)
            worst = max(worst, time.monotonic() - t0)
            assert r.status == 200
            if p.poll() is not None or time.monotonic() >= t_end:
                break
            time.sleep(0.2)
        out, _ = p.communicate(timeout=60)
        refused, closed, alive, secs = out.split()
        # all 300 connected or were refused; none outlived the deadline
        assert int(alive) == 0, out
        assert int(closed) + int(refused) >= 300 - 0, out
        assert worst < 2 * SLOW, worst
        assert "sent no whole request" in d.log_text() or "over their peer's cap" in d.log_text()
    finally:
        d.stop()
