"""The fleet harness itself: each server the fleet tests rely on works as
they expect, and each fault switch does what it says."""
import http.client
import os
import subprocess
import urllib.request

import pytest


# --------------------------------------------------------------- PostgreSQL

def test_postgres_tcp_password_and_socket(postgres):
    assert postgres.dsn == (f"postgresql://tensorvault:{postgres.password}@127.0.0.1:"
                            f"{postgres.port}/tensorvault")
    # over TCP as the application role, with its password
    out = postgres.psql("SELECT current_user, current_database(), inet_server_port()", as_app=True)
    assert out.strip() == f"tensorvault|tensorvault|{postgres.port}"
    # over the UNIX socket as the superuser (inet_server_port is NULL there)
    out = postgres.psql("SELECT current_user, inet_server_port() IS NULL")
    assert out.strip() == "postgres|t"
    assert os.path.exists(os.path.join(postgres.sockdir, f".s.PGSQL.{postgres.port}"))


def test_postgres_wrong_password_refused(postgres):
    bad = postgres.dsn.replace(postgres.password, "wrong")
    r = subprocess.run([os.path.join(postgres.bindir, "psql"), bad, "-X", "-c", "SELECT 1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "password authentication failed" in r.stderr


def test_postgres_restart_keeps_data(postgres):
    postgres.psql("CREATE TABLE harness_t (id int PRIMARY KEY, v text);"
                  "INSERT INTO harness_t VALUES (1, 'one'), (2, 'two')", as_app=True)
    port = postgres.port
    postgres.restart()
    assert postgres.port == port and postgres.running
    assert postgres.psql("SELECT v FROM harness_t ORDER BY id", as_app=True).split() == ["one", "two"]
    # while stopped nothing answers; after start it does again
    postgres.stop()
    r = postgres.psql("SELECT 1", as_app=True, check=False)
    assert r.returncode != 0
    postgres.start()
    assert postgres.psql("SELECT count(*) FROM harness_t", as_app=True).strip() == "2"
    postgres.psql("DROP TABLE harness_t", as_app=True)


# ----------------------------------------------------------------------- S3

def test_s3_put_get_with_sigv4(s3):
    s3.bucket("harness")
    data = os.urandom(300_000)
    etag = s3.put("harness", "models/a b.bin", data)
    assert etag
    assert s3.get("harness", "models/a b.bin") == data
    assert "models/a b.bin" in s3.keys("harness")
    assert "harness" in s3.buckets()


def test_s3_unsigned_payload_upload(s3):
    s3.bucket("harness")
    data = os.urandom(70_000)
    st, _, _ = s3.request("PUT", "/harness/u.bin", data=data, payload_hash="UNSIGNED-PAYLOAD")
    assert st == 200
    assert s3.get("harness", "u.bin") == data


def test_s3_range_get(s3):
    s3.bucket("harness")
    data = bytes(range(256)) * 40
    s3.put("harness", "r.bin", data)
    st, hdrs, body = s3.request("GET", "/harness/r.bin", headers={"Range": "bytes=1000-1999"})
    assert st == 206
    assert body == data[1000:2000]
    assert hdrs["content-range"] == f"bytes 1000-1999/{len(data)}"
    st, _, body = s3.request("GET", "/harness/r.bin", headers={"Range": "bytes=-10"})
    assert st == 206 and body == data[-10:]


def test_s3_signature_enforced(s3):
    s3.bucket("harness")
    s3.put("harness", "secret.bin", b"x" * 100)
    st, _, body = s3.request("GET", "/harness/secret.bin", secret="not-the-secret")
    assert st == 403 and b"SignatureDoesNotMatch" in body
    st, _, body = s3.request("PUT", "/harness/other.bin", data=b"y", secret="not-the-secret")
    assert st == 403
    st, _, body = s3.request("GET", "/harness/secret.bin", access_key="AKIAUNKNOWN000000000")
    assert st == 403 and b"InvalidAccessKeyId" in body
    st, _, _ = s3.request("GET", "/harness/secret.bin", sign=False)
    assert st == 403
    assert "other.bin" not in s3.keys("harness")


def test_s3_restart_keeps_objects_and_credentials(s3):
    s3.bucket("harness-restart")
    s3.put("harness-restart", "k", b"persist me")
    port = s3.port
    s3.restart()
    assert s3.port == port
    assert s3.get("harness-restart", "k") == b"persist me"
    st, _, _ = s3.request("GET", "/harness-restart/k", secret="wrong")
    assert st == 403


# ------------------------------------------------------------------- origin

def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def blob(origin):
    data = os.urandom(1 << 20)
    os.makedirs(os.path.join(origin.root, "m"), exist_ok=True)
    with open(os.path.join(origin.root, "m", "blob.bin"), "wb") as f:
        f.write(data)
    origin.reset_counters()
    origin.clear_faults()
    yield data
    origin.clear_faults()


def test_origin_full_and_ranges(origin, blob):
    url = origin.url_of("m/blob.bin")
    st, h, body = _get(url)
    assert st == 200 and body == blob and h["Accept-Ranges"] == "bytes"
    st, h, body = _get(url, {"Range": "bytes=100-199"})
    assert st == 206 and body == blob[100:200]
    assert h["Content-Range"] == f"bytes 100-199/{len(blob)}"
    st, h, body = _get(url, {"Range": "bytes=1048000-"})
    assert st == 206 and body == blob[1048000:]
    st, h, body = _get(url, {"Range": "bytes=-4096"})
    assert st == 206 and body == blob[-4096:]
    assert h["Content-Range"] == f"bytes {len(blob) - 4096}-{len(blob) - 1}/{len(blob)}"
    st, h, body = _get(url, {"Range": "bytes=0-99999999"})  # end clamped
    assert st == 206 and body == blob
    st, h, _ = _get(url, {"Range": f"bytes={len(blob)}-"})
    assert st == 416 and h["Content-Range"] == f"bytes */{len(blob)}"
    st, _, _ = _get(url, {"Range": "bytes=-0"})
    assert st == 416
    st, _, body = _get(url, {"Range": "bytes=0-1,5-6"})  # multi-range: ignored
    assert st == 200 and body == blob
    # If-Range with a stale validator: the whole file
    st, _, body = _get(url, {"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert st == 200 and body == blob
    etag = _get(url, {"Range": "bytes=0-0"})[1]["ETag"]
    st, _, body = _get(url, {"Range": "bytes=0-9", "If-Range": etag})
    assert st == 206 and body == blob[:10]
    st, _, _ = _get(origin.url_of("m/missing.bin"))
    assert st == 404
    st, _, _ = _get(origin.url + "/../../etc/passwd")
    assert st == 404


def test_origin_byte_counters(origin, blob):
    url = origin.url_of("m/blob.bin")
    _get(url)
    _get(url, {"Range": "bytes=0-999"})
    _get(url, {"Range": "bytes=-24"})
    _get(url, {"Range": f"bytes={len(blob)}-"})  # 416: no body bytes
    assert origin.bytes_served("m/blob.bin") == len(blob) + 1000 + 24
    assert origin.bytes_served("/m/blob.bin") == origin.bytes_served()
    assert [r[3] for r in origin.requests()] == [200, 206, 206, 416]
    # HEAD sends no body
    conn = http.client.HTTPConnection(origin.host, origin.port, timeout=10)
    conn.request("HEAD", "/m/blob.bin")
    r = conn.getresponse()
    assert r.status == 200 and int(r.getheader("Content-Length")) == len(blob) and r.read() == b""
    conn.close()
    assert origin.bytes_served() == len(blob) + 1024


def test_origin_keepalive(origin, blob):
    conn = http.client.HTTPConnection(origin.host, origin.port, timeout=10)
    for i in range(3):
        conn.request("GET", "/m/blob.bin", headers={"Range": f"bytes={i * 10}-{i * 10 + 9}"})
        r = conn.getresponse()
        assert r.status == 206 and r.read() == blob[i * 10:i * 10 + 10]
    conn.close()


def test_origin_fail_next(origin, blob):
    url = origin.url_of("m/blob.bin")
    origin.fail_next(2, status=503)
    assert _get(url)[0] == 503
    assert _get(url, {"Range": "bytes=0-9"})[0] == 503
    st, _, body = _get(url, {"Range": "bytes=0-9"})
    assert st == 206 and body == blob[:10]
    # only for one path
    other = os.path.join(origin.root, "m", "other.bin")
    with open(other, "wb") as f:
        f.write(b"other")
    origin.fail_next(1, status=500, path="m/other.bin")
    assert _get(url)[0] == 200
    assert _get(origin.url_of("m/other.bin"))[0] == 500
    assert _get(origin.url_of("m/other.bin"))[2] == b"other"


def test_origin_truncate_next(origin, blob):
    origin.truncate_next(after=1000)
    conn = http.client.HTTPConnection(origin.host, origin.port, timeout=10)
    conn.request("GET", "/m/blob.bin")
    r = conn.getresponse()
    assert r.status == 200 and int(r.getheader("Content-Length")) == len(blob)
    with pytest.raises(http.client.IncompleteRead) as e:
        r.read()
    assert len(e.value.partial) == 1000
    conn.close()
    assert origin.bytes_served() == 1000
    # healthy again
    st, _, body = _get(origin.url_of("m/blob.bin"))
    assert st == 200 and body == blob
