"""Uploads to the object store (fleet mode publishing a generation;
server/fleet/s3put.c, through tests/fleet/s3put_tool.c) against the `s3`
(moto, checking SigV4) and `origin` fixtures: a 20 MiB source in 5 MiB
parts (a 4-part multipart upload) and a 1 MiB one (one PUT) read back
byte-exact, HEAD giving the length (and 404 -> exists false); a wrong
secret -> TV_E_FORBIDDEN naming endpoint, bucket and key, never the
secret; bytes that do not hash to the given sha256 -> TV_E_HASH_MISMATCH,
no object and no multipart upload left (ListMultipartUploads); a part's
GET failing once -> retried, the object exact; a source whose length or
ETag moves under the copy, or that is gone -> TV_E_SOURCE_CHANGED and no
parts left; a tensorvaultd blob route behind a fleet token -> copied
exactly (and without the token refused); a stop (the options' cancel)
ends a copy whose source stalls, and a HEAD to a store that never
answers, within a second or so, and leaves no parts."""
import hashlib
import http.server
import json
import os
import re
import socket
import subprocess
import threading
import time
import types

import numpy as np
import pytest

from harness.daemon import Daemon, make_checkpoint
from harness.stall import StallOrigin

BUCKET = "tv-upload"
MIB = 1 << 20


@pytest.fixture(scope="module")
def store(s3):
    s3.bucket(BUCKET)
    return s3


@pytest.fixture(scope="module")
def tool(build_dir):
    p = os.path.join(os.path.abspath(build_dir), "tests", "s3put_tool")
    if not os.access(p, os.X_OK):
        pytest.fail(f"{p} not built (run scripts/build)")
    return p


def run_tool(tool, s3, *args, secret=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": s3.region,
                "AWS_ACCESS_KEY_ID": s3.access_key,
                "AWS_SECRET_ACCESS_KEY": secret or s3.secret_key})
    p = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    return p.returncode, p.stdout.strip(), p.stderr


def ok(tool, s3, *args):
    rc, out, err = run_tool(tool, s3, *args)
    assert rc == 0, (out, err)
    return json.loads(out)


def source(origin, name, n, seed):
    data = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()
    path = os.path.join(origin.root, "up", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return data, origin.url_of("up/" + name), hashlib.sha256(data).hexdigest()


def uploads_left(s3):
    st, _, body = s3.request("GET", f"/{BUCKET}?uploads=")  # SigV4 canonical form (curl 7.88 signs the query as given)
    assert st == 200, body
    return body.count(b"<Upload>")


def exists(tool, s3, key):
    return ok(tool, s3, "head", f"s3://{BUCKET}/{key}")


def test_multipart_and_single_put(tool, store, origin):
    for name, n, key, want_puts in (("big.bin", 20 * MIB, "gen/big.bin", 4),
                                    ("small.bin", 1 * MIB, "gen/small.bin", 0)):
        data, url, sha = source(origin, name, n, n)
        origin.reset_counters()
        doc = ok(tool, store, "copy", url, n, sha, f"s3://{BUCKET}/{key}", "--part-len", 5 * MIB)
        assert doc == {"copied": n}
        assert store.get(BUCKET, key) == data
        assert exists(tool, store, key) == {"exists": True, "length": n}
        gets = [r for r in origin.requests() if r[0] == "GET"]
        assert len(gets) == max(want_puts, 1), gets  # one Range GET per part
        assert origin.bytes_served() == n
    assert uploads_left(store) == 0
    # without a digest: copied as served
    data, url, _ = source(origin, "nodigest.bin", 7 * MIB + 3, 7)
    ok(tool, store, "copy", url, len(data), "-", f"s3://{BUCKET}/gen/nodigest.bin", "--part-len",
       5 * MIB)
    assert store.get(BUCKET, "gen/nodigest.bin") == data
    # an empty source is one empty PUT
    data, url, sha = source(origin, "empty.bin", 0, 0)
    ok(tool, store, "copy", url, 0, sha, f"s3://{BUCKET}/gen/empty.bin")
    assert exists(tool, store, "gen/empty.bin") == {"exists": True, "length": 0}
    # a key that is not there
    assert exists(tool, store, "gen/none.bin") == {"exists": False, "length": 0}


def test_wrong_secret_forbidden_without_the_secret(tool, store, origin):
    wrong = "tv-wrong-secret-ZYXWVUTSRQPONMLKJIHGFEDCBA"
    data, url, sha = source(origin, "sec.bin", 1 * MIB, 3)
    for args in (("head", f"s3://{BUCKET}/gen/sec.bin"),
                 ("copy", url, len(data), sha, f"s3://{BUCKET}/gen/sec.bin"),
                 ("copy", url, len(data), sha, f"s3://{BUCKET}/gen/sec.bin", "--part-len",
                  str(5 * MIB))):
        rc, out, err = run_tool(tool, store, *args, secret=wrong)
        assert rc == 1 and out.startswith("error TV_E_FORBIDDEN:"), out
        assert "403" in out and f"bucket '{BUCKET}'" in out and "gen/sec.bin" in out, out
        assert store.endpoint in out, out
        assert wrong not in out + err and store.secret_key not in out + err
    big, url, sha = source(origin, "sec-big.bin", 11 * MIB, 3)
    rc, out, err = run_tool(tool, store, "copy", url, len(big), sha, f"s3://{BUCKET}/gen/sec-big.bin",
                            "--part-len", 5 * MIB, secret=wrong)
    assert rc == 1 and out.startswith("error TV_E_FORBIDDEN:"), out
    assert wrong not in out + err
    assert not exists(tool, store, "gen/sec.bin")["exists"]


def test_hash_mismatch_leaves_nothing(tool, store, origin):
    for name, n in (("mm-big.bin", 20 * MIB), ("mm-small.bin", 1 * MIB)):
        data, url, _ = source(origin, name, n, 11)
        other = hashlib.sha256(data[:-1] + bytes([data[-1] ^ 1])).hexdigest()
        key = "gen/" + name
        rc, out, _ = run_tool(tool, store, "copy", url, n, other, f"s3://{BUCKET}/{key}",
                              "--part-len", 5 * MIB)
        assert rc == 1 and out.startswith("error TV_E_HASH_MISMATCH:"), out
        assert other in out and hashlib.sha256(data).hexdigest() in out, out
        assert exists(tool, store, key) == {"exists": False, "length": 0}
        assert uploads_left(store) == 0
    # a malformed digest is refused before anything is sent
    rc, out, _ = run_tool(tool, store, "copy", url, n, "abc", f"s3://{BUCKET}/gen/x.bin")
    assert out.startswith("error TV_E_INVALID_ARG:"), out
    # a part size below S3's minimum
    rc, out, _ = run_tool(tool, store, "copy", url, n, "-", f"s3://{BUCKET}/gen/x.bin",
                          "--part-len", 1 * MIB)
    assert out.startswith("error TV_E_INVALID_ARG:") and "5 MiB" in out, out


def test_failed_part_get_is_retried(tool, store, origin):
    data, url, sha = source(origin, "retry.bin", 16 * MIB, 21)
    origin.fail_next(1, 503, "up/retry.bin")
    ok(tool, store, "copy", url, len(data), sha, f"s3://{BUCKET}/gen/retry.bin", "--part-len",
       5 * MIB, "--retries", 2)
    assert store.get(BUCKET, "gen/retry.bin") == data
    # failing more often than the retries allow: the error names the URL and
    # the status, and no parts are left
    origin.fail_next(5, 503, "up/retry.bin")
    rc, out, _ = run_tool(tool, store, "copy", url, len(data), sha, f"s3://{BUCKET}/gen/retry2.bin",
                          "--part-len", 5 * MIB, "--retries", 1)
    origin.clear_faults()
    assert rc == 1 and out.startswith("error EIO:") and "503" in out and url in out, out
    assert "after 2 tries" in out, out
    assert uploads_left(store) == 0
    assert not exists(tool, store, "gen/retry2.bin")["exists"]


def test_source_changes(tool, store, origin):
    data, url, sha = source(origin, "moved.bin", 6 * MIB, 5)
    # the length the caller believes is not the source's
    rc, out, _ = run_tool(tool, store, "copy", url, len(data) - 1, "-", f"s3://{BUCKET}/gen/moved.bin",
                          "--part-len", 5 * MIB)
    assert rc == 1 and out.startswith("error TV_E_SOURCE_CHANGED:"), out
    # gone
    rc, out, _ = run_tool(tool, store, "copy", origin.url_of("up/absent.bin"), 10, "-",
                          f"s3://{BUCKET}/gen/absent.bin")
    assert rc == 1 and out.startswith("error TV_E_SOURCE_CHANGED:") and "404" in out, out
    assert uploads_left(store) == 0
    # nothing listening
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, _ = run_tool(tool, store, "copy", f"http://127.0.0.1:{port}/x.bin", 10, "-",
                          f"s3://{BUCKET}/gen/refused.bin", "--retries", 1)
    assert rc == 1 and out.startswith("error ECONNREFUSED:"), out


class _Moving(http.server.BaseHTTPRequestHandler):
    """Serves DATA by Range with a strong ETag that changes after the first
    answer (a file rewritten between two parts' reads)."""
    protocol_version = "HTTP/1.1"
    data = b""
    served = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        a, b = int(m.group(1)), int(m.group(2))
        cls = type(self)
        cls.served += 1
        body = self.data[a:b + 1]
        self.send_response(206)
        self.send_header("ETag", '"v1"' if cls.served == 1 else '"v2"')
        self.send_header("Content-Range", f"bytes {a}-{b}/{len(self.data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_etag_moving_under_the_copy(tool, store):
    _Moving.data = os.urandom(11 * MIB)
    _Moving.served = 0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Moving)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/moving.bin"
        rc, out, _ = run_tool(tool, store, "copy", url, len(_Moving.data), "-",
                              f"s3://{BUCKET}/gen/moving.bin", "--part-len", 5 * MIB,
                              "--parallel", 1)
        assert rc == 1 and out.startswith("error TV_E_SOURCE_CHANGED:"), out
        assert '"v2"' in out and '"v1"' in out, out
        assert not exists(tool, store, "gen/moving.bin")["exists"]
        assert uploads_left(store) == 0
    finally:
        srv.shutdown()
        srv.server_close()


def test_blob_route_with_fleet_token(tool, store, build_dir, tmp_path):
    d = Daemon(os.path.abspath(build_dir), tmp_path, settings={"store.image_size": "256M"}).start()
    try:
        rng = np.random.default_rng(17)
        path = make_checkpoint(os.path.join(d.workdir, "m", "model.safetensors"),
                               {"w": rng.standard_normal(3 * MIB).astype(np.float32)})
        d.import_ok("m", path)
        shard = d.ok("GET", "/v1/models/m/generations/1")["shards"][0]
        with open(path, "rb") as f:
            data = f.read()
        assert shard["file_bytes"] == len(data) > 10 * MIB
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        token = d.ok("POST", "/v1/tokens", status=201, body={"name": "up", "scope": "fleet"})["token"]
        url = f"http://127.0.0.1:{d.port}/v1/blobs/sha256:{shard['sha256']}"
        ok(tool, store, "copy", url, len(data), shard["sha256"], f"s3://{BUCKET}/blobs/m.bin",
           "--bearer", token, "--part-len", 5 * MIB)
        assert store.get(BUCKET, "blobs/m.bin") == data
        ok(tool, store, "copy", url, len(data), shard["sha256"], f"s3://{BUCKET}/blobs/m1.bin",
           "--bearer", token, "--part-len", 64 * MIB)
        assert store.get(BUCKET, "blobs/m1.bin") == data
        # without the token: refused by the source, nothing uploaded
        rc, out, err = run_tool(tool, store, "copy", url, len(data), shard["sha256"],
                                f"s3://{BUCKET}/blobs/m2.bin", "--part-len", 5 * MIB)
        assert rc == 1 and out.startswith("error TV_E_FORBIDDEN:") and "401" in out, out
        assert token not in out + err
        assert not exists(tool, store, "blobs/m2.bin")["exists"]
        assert uploads_left(store) == 0
    finally:
        d.stop()


def timed_tool(tool, s3, *args):
    t0 = time.monotonic()
    rc, out, err = run_tool(tool, s3, *args)
    return rc, out, time.monotonic() - t0


def test_a_stop_ends_a_stalled_copy_within_a_second(tool, store, tmp_path):
    """--cancel-after (what a stopping daemon does to its uploads) with a
    source that sends headers and 10 bytes, then nothing (harness.stall), and the
    default 60 s timeout: the copy ends TV_E_CANCELLED within a second or
    so of the stop, nothing is uploaded and the multipart upload is aborted
    (no parts left)."""
    src = StallOrigin(tmp_path / "stall", stall_from=6 * MIB).start()
    try:
        for name, n in (("stall-big.bin", 12 * MIB), ("stall-small.bin", 7 * MIB)):
            data = np.random.default_rng(n).integers(0, 256, size=n, dtype=np.uint8).tobytes()
            with open(os.path.join(src.root, name), "wb") as f:
                f.write(data)
            part = 5 * MIB if n > 10 * MIB else 8 * MIB  # 3 parts (2 stall), or one PUT
            rc, out, took = timed_tool(tool, store, "copy", f"{src.url}/{name}", n,
                                       hashlib.sha256(data).hexdigest(), f"s3://{BUCKET}/st/{name}",
                                       "--part-len", part, "--cancel-after", 500)
            assert rc == 1 and out.startswith("error TV_E_CANCELLED:"), out
            assert took < 2.5, f"the copy ended {took:.1f}s after its start (stop at 0.5 s)"
            assert not exists(tool, store, f"st/{name}")["exists"]
            assert uploads_left(store) == 0
        assert src.stalled() >= 2
    finally:
        src.stop()


def test_a_stop_ends_a_request_to_a_silent_store(tool):
    """An object store that takes the connection and never answers (a
    listening socket nobody reads): HEAD ends TV_E_CANCELLED within a second
    or so of the stop."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        silent = types.SimpleNamespace(endpoint=f"http://127.0.0.1:{srv.getsockname()[1]}",
                                       region="us-east-1", access_key="AKIDSILENT",
                                       secret_key="silent-secret")
        rc, out, took = timed_tool(tool, silent, "head", f"s3://{BUCKET}/gen/x.bin",
                                   "--cancel-after", 500)
    assert rc == 1 and out.startswith("error TV_E_CANCELLED:"), out
    assert took < 2.5, f"HEAD ended {took:.1f}s after its start (stop at 0.5 s)"
