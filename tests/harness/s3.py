"""A moto S3 endpoint for the tests (the fleet suite's `s3` fixture, the
fleet benchmark): S3 starts this module as a server program
(`python -m harness.s3`) on a free port
and talks to it with `curl --aws-sigv4`, the mechanism of libcurl's
CURLOPT_AWS_SIGV4. Two things S3 needs from such a client (and so from the
C side): an `x-amz-content-sha256` header (curl 7.88 does not add it and
signs it when given; without it moto's signature differs), and a body sent
as an upload (`-T` / CURLOPT_UPLOAD), not as form data (moto then stores
an empty object).

The server program (main): moto checks signatures only for access keys of
IAM users it knows, and only once its "initial no-auth action count" is
used up. Before serving, it creates the IAM user `tensorvault` with the
given key pair (fixed, so a restarted server accepts the same credentials)
and an inline policy that allows everything, then sets the count to 0:
from the first request on, a wrong secret is SignatureDoesNotMatch (403),
an unknown key InvalidAccessKeyId (403) and an unsigned request
AccessDenied (403)."""
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET

from harness import python_env
from harness.logs import tail
from harness.net import free_port

class S3Error(RuntimeError):
    def __init__(self, status, body):
        super().__init__(f"S3 answered {status}: {body[:300]!r}")
        self.status, self.body = status, body


class S3:
    """A moto server checking SigV4 for access_key/secret_key. Helpers go
    through curl --aws-sigv4; request() returns (status, headers, body) for
    any request, signed with secret (default: the right one)."""

    access_key = "AKIATVFLEETTEST00001"
    secret_key = "tv-fleet-secret-0123456789abcdefghijklmn"
    region = "us-east-1"

    def __init__(self, base):
        self.base = base
        self.host = "127.0.0.1"
        self.bind = self.host  # what moto listens on (bind_all: 0.0.0.0)
        self.port = free_port()
        self.logfile = os.path.join(base, "moto.log")
        self.proc = None

    @property
    def endpoint(self):
        return f"http://{self.host}:{self.port}"

    def start(self):
        log = open(self.logfile, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.s3", "--host", self.bind,
             "--port", str(self.port), "--access-key", self.access_key,
             "--secret-key", self.secret_key, "--region", self.region],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=python_env())
        log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto exited {self.proc.returncode}:\n{tail(self.logfile)}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    pass
                st, _, _ = self.request("GET", "/")
                if st == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto not answering on {self.endpoint}:\n{tail(self.logfile)}")
            time.sleep(0.1)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, keep=True):
        """Stop and start on the same port with the same credentials. moto
        keeps everything in memory: with keep, every bucket and object is read
        out before and written back after (fine for test-sized data)."""
        saved = []
        if keep:
            for b in self.buckets():
                saved.append((b, [(k, self.get(b, k)) for k in self.keys(b)]))
        self.stop()
        self.start()
        for b, objs in saved:
            self.bucket(b)
            for k, data in objs:
                self.put(b, k, data)

    def endpoint_on(self, host):
        """The endpoint with another host (e.g. the fleet bridge's address)."""
        return f"http://{host}:{self.port}"

    def bind_all(self):
        """Listens on every address (moto binds one; the nodes of the fleet
        network reach it at the bridge's, the tests still at 127.0.0.1):
        restart(keep=True) bound to 0.0.0.0. Once."""
        if self.bind != "0.0.0.0":
            self.bind = "0.0.0.0"
            self.restart(keep=True)

    def request(self, method, path, data=None, headers=None, secret=None, access_key=None,
                sign=True, payload_hash=None):
        """One request with curl; path is "/bucket/key?query". data: bytes
        uploaded as the body (-T, like CURLOPT_UPLOAD). payload_hash: the
        x-amz-content-sha256 value (default: the body's SHA-256; S3 also
        takes UNSIGNED-PAYLOAD; moto does not compare it with the body)."""
        argv = ["curl", "-sS", "-X", method, "-D", "-", "--max-time", "30"]
        if sign:
            if payload_hash is None:
                payload_hash = hashlib.sha256(data if data is not None else b"").hexdigest()
            argv += ["--aws-sigv4", f"aws:amz:{self.region}:s3",
                     "--user", f"{access_key or self.access_key}:{secret or self.secret_key}",
                     "-H", "x-amz-content-sha256: " + payload_hash]
        for k, v in (headers or {}).items():
            argv += ["-H", f"{k}: {v}"]
        if data is not None:
            argv += ["-T", "-"]
        argv.append(self.endpoint + path)
        r = subprocess.run(argv, input=data if data is not None else b"", capture_output=True,
                           timeout=60)
        if r.returncode != 0:
            raise OSError(f"curl {method} {path} exited {r.returncode}: {r.stderr.decode()}")
        return _split_response(r.stdout)

    def _ok(self, method, path, data=None, headers=None):
        st, hdrs, body = self.request(method, path, data=data, headers=headers)
        if st // 100 != 2:
            raise S3Error(st, body)
        return hdrs, body

    def bucket(self, name):
        st, _, body = self.request("PUT", "/" + name)
        if st != 200 and b"BucketAlreadyOwnedByYou" not in body:
            raise S3Error(st, body)
        return name

    def put(self, bucket, key, data):
        hdrs, _ = self._ok("PUT", f"/{bucket}/{urllib.parse.quote(key)}", data=bytes(data))
        return hdrs.get("etag")

    def get(self, bucket, key, range=None):  # noqa: A002 - the HTTP header's name
        _, body = self._ok("GET", f"/{bucket}/{urllib.parse.quote(key)}",
                           headers={"Range": range} if range else None)
        return body

    def delete(self, bucket, key):
        self._ok("DELETE", f"/{bucket}/{urllib.parse.quote(key)}")

    def buckets(self):
        _, body = self._ok("GET", "/")
        return [e.text for e in ET.fromstring(body).iter() if e.tag.endswith("}Name")]

    def keys(self, bucket):
        out, token = [], None
        while True:
            q = "?list-type=2" + ("&continuation-token=" + urllib.parse.quote(token, safe="")
                                  if token else "")
            _, body = self._ok("GET", f"/{bucket}{q}")
            root = ET.fromstring(body)
            out += [e.text for e in root.iter() if e.tag.endswith("}Key")]
            nxt = [e.text for e in root.iter() if e.tag.endswith("}NextContinuationToken")]
            if not nxt:
                return out
            token = nxt[0]


def _split_response(raw):
    """curl -D - output: the last header block (after any 100 Continue), then
    the body."""
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise OSError(f"no HTTP response in curl's output: {raw[:200]!r}")
        lines = head.decode("iso-8859-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status == 100:
            raw = rest
            continue
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return status, hdrs, rest


POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def main():
    """The server program: python -m harness.s3 --port P --access-key AK
    --secret-key SK [--host H] [--region R] (what S3.start runs)."""
    import argparse

    from moto import settings
    import moto.server
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    ap.add_argument("--region", default="us-east-1")
    a = ap.parse_args()

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(a.region, "tensorvault")
    key = iam.create_access_key("tensorvault")
    key.access_key_id = a.access_key
    key.secret_access_key = a.secret_key
    iam.put_user_policy("tensorvault", "all", json.dumps(POLICY))
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    moto.server.main(["-H", a.host, "-p", str(a.port)])


if __name__ == "__main__":
    sys.exit(main())
