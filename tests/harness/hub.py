"""A local Hugging Face Hub for the hf:// import tests (server/import/src_hub.c),
speaking the parts of the Hub's HTTP API the importer uses, as the Hub
documents and huggingface_hub's file_download reads them:

- `GET /api/models/{repo}/revision/{rev}[?blobs=true]`: `{"id", "sha",
  "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size",
  "pointerSize"}}]}` (size/lfs only with blobs=true); 404 with
  `X-Error-Code: RepoNotFound` or `RevisionNotFound`.
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: an LFS file (every
  `*.safetensors`) answers 302 to the CDN, a second server on another
  address (127.0.0.2), with `X-Linked-Etag` (the quoted SHA-256),
  `X-Linked-Size`, `X-Repo-Commit` and `ETag`; a file kept in git answers
  200 with `ETag` = its git blob SHA-1 (quoted) and `X-Repo-Commit`; 404
  `EntryNotFound` / `RevisionNotFound`; a gated repository answers 401
  `X-Error-Code: GatedRepo` without `Authorization: Bearer TOKEN`.
- the CDN: `HEAD|GET /blobs/{sha256}?X-Sig=...` with single Range support
  (206 + Content-Range), `ETag` = the quoted SHA-256.

Switches: `corrupt` (a set of file names whose bytes, from the CDN or the
resolve route, have one byte flipped), `cut_once` (file names: the first data Range GET past the header
is cut after half its body, once), `expired` (file names whose CDN data
Range GETs past the header answer 403, as an expired presigned URL does),
`loop` (the CDN answers 302 to itself forever), `throttle` (CDN body bytes per second). The CDN is http:// on
another address: a daemon must allow http:// and private hops to use it
(import.hf_redirect_http, import.hf_redirect_private), which tests the
policy's refusals too. Counters: `cdn_bytes` (body bytes the CDN sent, per
file), `cdn_auth` (Authorization headers the CDN saw), `requests` (method,
host, path, status)."""
import hashlib
import http.server
import json
import socket
import threading
import time
import urllib.parse


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, gated_token=None):
        self.commits = {}  # commit -> {path: bytes}
        self.refs = {}  # branch or tag -> commit
        self.gated_token = gated_token

    def commit(self, files, refs=("main",)):
        h = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest())
                                     for k, v in files.items())).encode()).hexdigest()
        self.commits[h] = dict(files)
        for r in refs:
            self.refs[r] = h
        return h

    def resolve(self, rev):
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


def is_lfs(path):
    return path.endswith(".safetensors")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def send(self, status, body=b"", headers=(), ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server.hub._log(self.command, self.server.name, self.path, status)

    def error(self, status, code, msg):
        self.send(status, json.dumps({"error": msg}).encode(),
                  [("X-Error-Code", code), ("X-Error-Message", msg)], "application/json")


class _HubHandler(_Base):
    def do_GET(self):
        self.route()

    def do_HEAD(self):
        self.route()

    def route(self):
        hub = self.server.hub
        u = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in u.path.split("/")[1:]]
        q = urllib.parse.parse_qs(u.query)
        if len(parts) >= 5 and parts[0] == "api" and parts[1] == "models" \
                and parts[-2] == "revision":
            return self.listing("/".join(parts[2:-2]), parts[-1], q.get("blobs") == ["true"])
        if "resolve" in parts:
            i = parts.index("resolve")
            return self.file("/".join(parts[:i]), parts[i + 1] if i + 1 < len(parts) else "",
                             "/".join(parts[i + 2:]))
        self.error(404, "EntryNotFound", "no such route")

    def listing(self, name, rev, blobs):
        hub = self.server.hub
        hub.listings += 1
        repo = hub.repos.get(name)
        if repo is None:
            return self.error(404, "RepoNotFound", f"Repository Not Found for url: {name}")
        commit = repo.resolve(rev)
        if commit is None:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        sib = []
        for path, data in sorted(repo.commits[commit].items()):
            e = {"rfilename": path}
            if blobs:
                e["size"] = len(data)
                e["blobId"] = git_blob_sha1(data)
                if is_lfs(path):
                    e["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            sib.append(e)
        body = json.dumps({"id": name, "sha": commit, "siblings": sib}).encode()
        self.send(200, body, ctype="application/json")

    def file(self, name, rev, path):
        hub = self.server.hub
        repo = hub.repos.get(name)
        if repo is None:
            return self.error(404, "RepoNotFound", f"Repository Not Found for url: {name}")
        if repo.gated_token is not None and \
                self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            return self.error(401, "GatedRepo",
                              f"Access to model {name} is restricted. You must have access to it "
                              "and be authenticated to access it. Please log in.")
        commit = repo.resolve(rev)
        if commit is None:
            return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        hub.resolved_revs.append(rev)
        data = repo.commits[commit].get(path)
        if data is None:
            return self.error(404, "EntryNotFound", f"{path} does not exist at {commit}")
        if is_lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            hub.blobs[sha] = (path, data)
            loc = f"{hub.cdn_scheme}://{hub.cdn_host}:{hub.cdn_port}/blobs/{sha}?X-Sig=abc%3D"
            return self.send(302, b"", [("Location", loc), ("X-Linked-Etag", f'"{sha}"'),
                                        ("X-Linked-Size", str(len(data))),
                                        ("X-Repo-Commit", commit), ("ETag", f'"{sha}"')])
        etag = f'"{git_blob_sha1(data)}"'
        if path in hub.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        self.send(200, data, [("ETag", etag), ("X-Repo-Commit", commit)])


class _CdnHandler(_Base):
    def do_GET(self):
        self.serve()

    def do_HEAD(self):
        self.serve()

    def serve(self):
        hub = self.server.hub
        if self.headers.get("Authorization"):
            hub.cdn_auth.append(self.headers["Authorization"])
        u = urllib.parse.urlsplit(self.path)
        if hub.loop:
            n = int(urllib.parse.parse_qs(u.query).get("n", ["0"])[0]) + 1
            return self.send(302, b"", [("Location", f"{u.path}?n={n}")])
        sha = u.path.rsplit("/", 1)[-1]
        if sha not in hub.blobs:
            return self.send(404, b"no such blob\n")
        path, data = hub.blobs[sha]
        if path in hub.corrupt:
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        start, end, status = 0, len(data) - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, b = rng[6:].split("-")
            start, end, status = int(a), min(int(b), len(data) - 1), 206
        if path in hub.expired and start > 4096:
            return self.send(403, b"<Error><Code>AccessDenied</Code>Request has expired</Error>")
        body = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{sha}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            hub._log(self.command, "cdn", self.path, status)
            return
        if path in hub.cut_once and start > 4096 and self.command == "GET":
            hub.cut_once.discard(path)
            half = body[:len(body) // 2]
            self.wfile.write(half)
            hub._count(path, len(half))
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            hub._log(self.command, "cdn-cut", self.path, status)
            return
        try:
            hub._send_body(self.wfile, path, body)
        except OSError:  # the importer went away (a killed daemon)
            self.close_connection = True
        hub._log(self.command, "cdn", self.path, status)


class Hub:
    """The hub on 127.0.0.1, its CDN on 127.0.0.2 (another host for the
    importer: the bearer must not follow)."""

    def __init__(self):
        self.repos = {}
        self.blobs = {}
        self.corrupt = set()
        self.cut_once = set()
        self.expired = set()
        self.loop = False
        self.throttle = None  # CDN body bytes per second, all transfers together (None: no cap)
        self.cdn_scheme = "http"
        self.cdn_host = "127.0.0.2"
        self.cdn_auth = []
        self.cdn_bytes = {}
        self.requests = []
        self.resolved_revs = []
        self.listings = 0
        self._lock = threading.Lock()
        self._next = 0.0

    def _log(self, method, host, path, status):
        with self._lock:
            self.requests.append((method, host, path, status))

    def _send_body(self, w, path, body):
        step = (64 << 10) if self.throttle else (1 << 20)
        for i in range(0, len(body), step):
            piece = body[i:i + step]
            if self.throttle:  # one budget for every transfer together
                with self._lock:
                    now = time.monotonic()
                    self._next = max(self._next, now) + len(piece) / self.throttle
                    wait = self._next - now
                time.sleep(wait)
            w.write(piece)
            self._count(path, len(piece))

    def _count(self, path, n):
        with self._lock:
            self.cdn_bytes[path] = self.cdn_bytes.get(path, 0) + n

    def reset(self):
        self.corrupt.clear()
        self.cut_once.clear()
        self.expired.clear()
        self.loop = False
        self.throttle = None
        self.cdn_auth.clear()
        self.cdn_bytes.clear()
        self.requests.clear()
        self.resolved_revs.clear()

    def start(self):
        self._hub = _Server(("127.0.0.1", 0), _HubHandler)
        self._cdn = _Server((self.cdn_host, 0), _CdnHandler)
        for s, name in ((self._hub, "hub"), (self._cdn, "cdn")):
            s.hub, s.name = self, name
            threading.Thread(target=s.serve_forever, daemon=True).start()
        self.port = self._hub.server_address[1]
        self.cdn_port = self._cdn.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self):
        for s in (self._hub, self._cdn):
            s.shutdown()
            s.server_close()
