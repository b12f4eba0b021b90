"""The dashboard served by tensorvaultd (server/http/static.c): GET and HEAD
of / and /ui/NAME answer the embedded web/ files and Debian's Chart.js under
/ui/vendor/ with their content type, the CSP and the other security headers,
an ETag that If-None-Match turns into 304, without credentials even where
anonymous reads are refused; traversal and other bad names are the API's
JSON 404; the page references only same-origin URLs and has no inline
script or style."""
import hashlib
import os
import re
import socket
import urllib.error
import urllib.request

import pytest

from harness.daemon import Daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = "/usr/share/javascript/chart.js/chart.min.js"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")


@pytest.fixture(scope="module")
def d(build_dir, tmp_path_factory):
    dm = Daemon(build_dir, tmp_path_factory.mktemp("daemon_web")).start()
    yield dm
    rc = dm.stop()
    assert rc == 0, dm.log_text()


def fetch(d, path, method="GET", headers=None):
    """urllib, as a browser would ask (no token). Returns (status, headers, body)."""
    req = urllib.request.Request(f"http://127.0.0.1:{d.port}{path}", method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def check_headers(h, ctype):
    assert h["content-type"] == ctype
    assert h["content-security-policy"] == CSP
    assert h["x-content-type-options"] == "nosniff"
    assert h["referrer-policy"] == "no-referrer"
    assert h["cache-control"] == "no-cache"
    assert re.fullmatch(r'"[0-9a-f]{32}"', h["etag"]), h["etag"]


def src(name):
    with open(os.path.join(ROOT, "web", name), "rb") as f:
        return f.read()


@pytest.mark.parametrize("path,name,ctype", [
    ("/", "index.html", "text/html; charset=utf-8"),
    ("/ui/index.html", "index.html", "text/html; charset=utf-8"),
    ("/ui/app.js", "app.js", "application/javascript"),
    ("/ui/app.css", "app.css", "text/css"),
])
def test_files(d, path, name, ctype):
    st, h, body = fetch(d, path)
    assert st == 200
    check_headers(h, ctype)
    assert body == src(name)
    assert h["etag"] == '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    assert int(h["content-length"]) == len(body)


def test_query_ignored(d):
    st, _, body = fetch(d, "/?tab=overview")
    assert st == 200 and body == src("index.html")


def test_chart(d):
    st, h, body = fetch(d, "/ui/vendor/chart.min.js")
    assert st == 200
    check_headers(h, "application/javascript")
    if os.path.exists(CHART):
        with open(CHART, "rb") as f:
            assert body == f.read()
        assert b"Chart.js v3." in body[:200]
    else:
        assert body == b"window.Chart = undefined;\n"


def test_head(d):
    st, h, body = fetch(d, "/", method="HEAD")
    assert st == 200 and body == b""
    check_headers(h, "text/html; charset=utf-8")
    assert int(h["content-length"]) == len(src("index.html"))
    st, h, body = fetch(d, "/ui/vendor/chart.min.js", method="HEAD")
    assert st == 200 and body == b""
    assert h["content-security-policy"] == CSP


def test_not_modified(d):
    for path in ("/", "/ui/app.js", "/ui/vendor/chart.min.js"):
        st, h, _ = fetch(d, path)
        etag = h["etag"]
        st, h2, body = fetch(d, path, headers={"If-None-Match": etag})
        assert st == 304 and body == b"", path
        assert h2["etag"] == etag
        assert h2["content-security-policy"] == CSP
        st, _, _ = fetch(d, path, headers={"If-None-Match": f'"other", W/{etag}'})
        assert st == 304
        st, _, body = fetch(d, path, headers={"If-None-Match": '"other"'})
        assert st == 200 and body
    # Different files, different tags.
    tags = {fetch(d, p)[1]["etag"] for p in ("/", "/ui/app.js", "/ui/app.css")}
    assert len(tags) == 3


def test_not_modified_framing(d):
    """On one keep-alive connection: a 304 (GET and HEAD) has no body and
    either no Content-Length or the 200's (RFC 9110 8.6), so the next
    answer on the connection starts right after its headers."""
    body = src("app.js")
    etag = fetch(d, "/ui/app.js")[1]["etag"]
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    try:
        s.sendall((f"GET /ui/app.js HTTP/1.1\r\nHost: localhost\r\nIf-None-Match: {etag}\r\n\r\n"
                   f"HEAD /ui/app.js HTTP/1.1\r\nHost: localhost\r\nIf-None-Match: W/{etag}\r\n\r\n"
                   "GET /ui/favicon.svg HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    finally:
        s.close()
    answers = []
    for _ in range(3):
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        h = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            h.setdefault(k.strip().lower(), []).append(v.strip())
        answers.append((lines[0], h))
        if lines[0].split()[1] == "200":
            n = int(h["content-length"][0])
            answers[-1] += (data[:n],)
            data = data[n:]
    for line, h in answers[:2]:
        assert line == "HTTP/1.1 304 Not Modified", answers
        assert h.get("content-length", [str(len(body))]) == [str(len(body))], h
        assert h["etag"] == [etag]
    assert answers[2][0] == "HTTP/1.1 200 OK" and answers[2][2] == src("favicon.svg"), answers
    assert data == b""


@pytest.mark.parametrize("path", [
    "/ui/", "/ui/..", "/ui/../index.html", "/ui/..%2findex.html", "/ui/%2e%2e/index.html",
    "/ui/vendor/../app.js", "/ui/a/b", "/ui/missing.js", "/ui/app.js/", "/ui/.app.js",
    "/index.html", "/ui/vendor/other.js", "/ui//app.js",
])
def test_bad_names_404(d, path):
    r = d.request("GET", path, token=None)
    assert r.status == 404, (path, r)
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "TV_E_NOT_FOUND" and err["message"], err
    assert "content-security-policy" not in r.headers


def test_other_methods_not_served(d):
    r = d.request("POST", "/ui/app.js", token=None, raw=b"")
    assert r.status in (404, 405)
    assert r.body != src("app.js")


def test_no_auth_needed(build_dir, tmp_path):
    dm = Daemon(build_dir, tmp_path, settings={"http.anonymous_reads": "never"}).start()
    try:
        assert dm.request("GET", "/v1/status", token=None).status == 401
        st, h, body = fetch(dm, "/")
        assert st == 200 and body == src("index.html")
        assert h["content-security-policy"] == CSP
        assert fetch(dm, "/ui/app.js")[0] == 200
    finally:
        assert dm.stop() == 0, dm.log_text()


def test_page_is_same_origin_without_inline_code():
    html = src("index.html").decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline script"
    assert "<style" not in html and not re.search(r"\sstyle=", html), "inline style"
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    for url in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert not re.match(r"(?:[a-z]+:)?//", url), url


def test_request_metrics(d):
    fetch(d, "/")
    fetch(d, "/ui/app.js")
    m = d.get("/metrics").body.decode()
    assert re.search(r'tensorvault_http_requests_total\{[^}]*route="GET /"[^}]*\} [1-9]', m), m
    assert re.search(r'route="GET /ui/\{name\}"', m)
