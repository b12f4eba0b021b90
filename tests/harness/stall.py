"""A stalling HTTP origin in the test process: serves the files under a
directory over HTTP/1.1 (HEAD, single-range GET with 206 and
Content-Range, an ETag), and stalls: a GET whose range reaches byte
stall_from (or past it) sends its headers and 10 body bytes, then nothing until
release() (which lets every stalled answer finish and stops stalling) or
stop(). A path-style S3 request (ENDPOINT/BUCKET/KEY, signed or not) is
served the same way from root/BUCKET/KEY, so the origin also stands in
for an `s3.endpoint` that stopped sending.

stalled() counts the answers stalled so far; wait_stalled() waits for the
first (or the next) one."""
import http.server
import os
import re
import threading
import time
import urllib.parse

_RANGE = re.compile(r"^bytes=(\d+)-(\d+)$")
SENT_BEFORE_STALL = 10


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tv-stall-origin/1"

    def log_message(self, fmt, *args):
        pass

    def do_HEAD(self):
        self._serve(False)

    def do_GET(self):
        self._serve(True)

    def _serve(self, body):
        o = self.server.origin
        rel = os.path.normpath(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/"))
        fs = os.path.join(o.root, rel)
        if rel.startswith("..") or not os.path.isfile(fs):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        st = os.stat(fs)
        size = st.st_size
        start, end, status = 0, size - 1, 200
        m = _RANGE.match(self.headers.get("Range") or "")
        if m:
            start, end, status = int(m.group(1)), min(int(m.group(2)), size - 1), 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("ETag", f'"{st.st_ino:x}-{size:x}-{st.st_mtime_ns:x}"')
        self.send_header("Content-Length", str(end - start + 1 if size else 0))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not body:
            return
        with open(fs, "rb") as f:
            f.seek(start)
            data = f.read(end - start + 1)
        try:
            if o._should_stall(end):
                self.wfile.write(data[:SENT_BEFORE_STALL])
                self.wfile.flush()
                o._stall()
                data = data[SENT_BEFORE_STALL:]
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class StallOrigin:
    def __init__(self, root, stall_from=0):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.stall_from = stall_from
        self._cv = threading.Condition()
        self._stalling = True
        self._n_stalled = 0
        self._srv = None

    def start(self):
        self._srv = _Server(("127.0.0.1", 0), _Handler)
        self._srv.origin = self
        threading.Thread(target=self._srv.serve_forever, name="tv-stall", daemon=True).start()
        return self

    def stop(self):
        self.release()
        if self._srv is not None:
            self._srv.shutdown()
            self._srv.server_close()
            self._srv = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self._srv.server_address[1]}"

    def release(self):
        with self._cv:
            self._stalling = False
            self._cv.notify_all()

    def stalled(self):
        with self._cv:
            return self._n_stalled

    def wait_stalled(self, n=1, timeout=30):
        """Waits until n answers stalled in all; fails after timeout s."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._n_stalled < n:
                left = deadline - time.monotonic()
                assert left > 0, f"no answer stalled in {timeout}s ({self._n_stalled} of {n})"
                self._cv.wait(left)

    def _should_stall(self, last):
        with self._cv:
            return self._stalling and last >= self.stall_from

    def _stall(self):
        with self._cv:
            self._n_stalled += 1
            self._cv.notify_all()
            while self._stalling:
                self._cv.wait()
