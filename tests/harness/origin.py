"""An HTTP origin for the fleet tests: serves the files under a directory
over real HTTP/1.1 (keep-alive) with single-range Range support, counts the
body bytes it sent per path, and injects faults on request.

Range: `bytes=A-B`, `bytes=A-` and `bytes=-N` give 206 with Content-Range;
a range starting at or past the end (or `-0`) gives 416 with
`Content-Range: bytes */SIZE`; a multi-range or malformed header is ignored
(200 with the whole file, as RFC 9110 allows). `If-Range` with a different
ETag gives the whole file. HEAD answers the headers only.

Faults (each applies to the next N matching requests, then the origin is
healthy again): `fail_next(n, status)` answers `status` with a short body;
`truncate_next(n, after)` sends the full headers but closes the connection
after `after` body bytes (default half of the body).

throttle(rate) caps the body bytes of all responses together at rate bytes
per second (None: no cap), so that a test can act while an import is
half-way.

bytes_served() counts body bytes handed to the socket (a client that
disconnects early may not have read them all)."""
import http.server
import os
import re
import threading
import time
import urllib.parse

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Fault:
    def __init__(self, kind, n, path, status=500, after=None):
        self.kind, self.n, self.path, self.status, self.after = kind, n, path, status, after


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tv-fleet-origin/1"

    def log_message(self, fmt, *args):  # keep pytest's output clean
        pass

    def do_GET(self):
        self._serve(body=True)

    def do_HEAD(self):
        self._serve(body=False)

    def _send_simple(self, status, text, extra=()):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _serve(self, body):
        origin = self.server.origin
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rng = self.headers.get("Range")
        fault = origin._take_fault(path)
        if fault is not None and fault.kind == "fail":
            origin._log(self.command, path, rng, fault.status, 0)
            self._send_simple(fault.status, f"injected fault {fault.status}\n")
            return
        fs = origin._resolve(path)
        if fs is None:
            origin._log(self.command, path, rng, 404, 0)
            self._send_simple(404, "not found\n")
            return
        st = os.stat(fs)
        size = st.st_size
        etag = f'"{st.st_ino:x}-{size:x}-{st.st_mtime_ns:x}"'
        start, end, status = 0, size - 1, 200
        if rng is not None and self.headers.get("If-Range") not in (None, etag):
            rng = None  # the client's copy is stale: send everything
        m = _RANGE.match(rng.strip()) if rng else None
        if m and (m.group(1) or m.group(2)):
            a, b = m.group(1), m.group(2)
            if a == "":  # suffix: the last N bytes
                n = int(b)
                if n == 0 or size == 0:
                    status = 416
                else:
                    start, end, status = max(0, size - n), size - 1, 206
            else:
                start = int(a)
                end = min(int(b), size - 1) if b else size - 1
                if start >= size:
                    status = 416
                elif b and int(b) < start:
                    status = 200  # invalid range: ignored
                    start, end = 0, size - 1
                else:
                    status = 206
        if status == 416:
            origin._log(self.command, path, rng, 416, 0)
            self._send_simple(416, "range not satisfiable\n", [("Content-Range", f"bytes */{size}")])
            return
        length = end - start + 1 if size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        limit = length if body else 0
        if body and fault is not None and fault.kind == "truncate":
            limit = min(length, length // 2 if fault.after is None else fault.after)
        # logged and counted before the bytes go out, so that a client that
        # has them sees the counters already include them
        origin._log(self.command, path, rng, status, limit)
        sent = 0
        with open(fs, "rb") as f:
            f.seek(start)
            while sent < limit:
                chunk = f.read(min(origin._piece(), limit - sent))
                if not chunk:
                    break
                origin._pace(len(chunk))
                origin._count(path, len(chunk))
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(chunk)
        if not body:
            return
        if sent < length:
            self.close_connection = True
            self.wfile.flush()
            self.connection.shutdown(2)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Origin:
    """Started by start(); url is http://HOST:PORT (files under root are at
    url + "/" + their relative path)."""

    def __init__(self, root, host="127.0.0.1", port=0):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.host, self._port = host, port
        self._lock = threading.Lock()
        self._bytes = {}
        self._requests = []
        self._faults = []
        self._rate = None
        self._next_t = 0.0
        self._srv = None
        self._thread = None

    # lifecycle
    def start(self):
        self._srv = _Server((self.host, self._port), _Handler)
        self._srv.origin = self
        self._port = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, name="tv-origin", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._srv is not None:
            self._srv.shutdown()
            self._srv.server_close()
            self._thread.join(10)
            self._srv = None

    @property
    def port(self):
        return self._port

    @property
    def url(self):
        return f"http://{self.host}:{self._port}"

    def url_of(self, relpath):
        return self.url + "/" + urllib.parse.quote(relpath.lstrip("/"))

    # counters
    def bytes_served(self, path=None):
        """Body bytes sent: for one URL path ("/a/b.bin"; a relative path is
        taken from the root), or in total when path is None."""
        with self._lock:
            if path is None:
                return sum(self._bytes.values())
            return self._bytes.get("/" + path.lstrip("/"), 0)

    def bytes_by_path(self):
        with self._lock:
            return dict(self._bytes)

    def requests(self):
        """[(method, path, Range header or None, status, body bytes it
        sends)], in the order the requests were answered."""
        with self._lock:
            return list(self._requests)

    def reset_counters(self):
        with self._lock:
            self._bytes.clear()
            self._requests.clear()

    # faults
    def fail_next(self, n=1, status=500, path=None):
        """The next n requests (for path only, when given) answer status."""
        with self._lock:
            self._faults.append(_Fault("fail", n, self._norm(path), status=status))

    def truncate_next(self, n=1, after=None, path=None):
        """The next n requests that carry a body stop after `after` body bytes
        (default: half) and the connection is closed."""
        with self._lock:
            self._faults.append(_Fault("truncate", n, self._norm(path), after=after))

    def clear_faults(self):
        with self._lock:
            self._faults.clear()

    def throttle(self, rate):
        """Caps all responses' body bytes together at rate bytes/s (None: off)."""
        with self._lock:
            self._rate = rate
            self._next_t = time.monotonic()

    def _piece(self):
        return 1 << 20 if self._rate is None else 64 << 10

    def _pace(self, n):
        with self._lock:
            if self._rate is None:
                return
            now = time.monotonic()
            t = max(now, self._next_t)
            self._next_t = t + n / self._rate
        if t > now:
            time.sleep(t - now)

    # internals
    @staticmethod
    def _norm(path):
        return None if path is None else "/" + path.lstrip("/")

    def _take_fault(self, path):
        with self._lock:
            for f in self._faults:
                if f.path is None or f.path == path:
                    f.n -= 1
                    if f.n <= 0:
                        self._faults.remove(f)
                    return f
        return None

    def _resolve(self, urlpath):
        rel = os.path.normpath(urlpath.lstrip("/"))
        if rel.startswith("..") or os.path.isabs(rel):
            return None
        fs = os.path.join(self.root, rel)
        return fs if os.path.isfile(fs) else None

    def _count(self, path, n):
        with self._lock:
            self._bytes[path] = self._bytes.get(path, 0) + n

    def _log(self, method, path, rng, status, sent):
        with self._lock:
            self._requests.append((method, path, rng, status, sent))
