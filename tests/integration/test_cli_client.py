"""The CLI's remote mode against a scripted HTTP server (no daemon needed):
the requests it sends (method, percent-encoded path, query, body, bearer
token from each source) and how it renders the answers (cursor following,
error objects, jobs followed to their end with --wait)."""
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Fake:
    """routes: {(method, raw_path): [answer, ...]} where an answer is
    (status, doc), or (None, None) to drop the connection unanswered; the
    last answer of a route repeats."""

    def __init__(self):
        self.routes = {}
        self.seen = []  # (method, raw path with query, headers, body)

    def on(self, method, path, *answers):
        self.routes[(method, path)] = list(answers)


@pytest.fixture
def fake():
    f = Fake()

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def handle_one(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            f.seen.append((self.command, self.path, dict(self.headers), body))
            path = self.path.split("?")[0]
            answers = f.routes.get((self.command, path)) or f.routes.get((self.command, self.path))
            if not answers:
                status, doc = 404, {"error": {"code": "TV_E_NOT_FOUND", "errno": -1004,
                                              "message": f"no route {self.command} {path}"}}
            else:
                status, doc = answers[0] if len(answers) == 1 else answers.pop(0)
            if status is None:  # drop the connection without an answer
                self.close_connection = True
                return
            out = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PUT = do_DELETE = handle_one

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    f.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield f
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def tv(build_dir):
    """The CLI by absolute path (these tests run it from other directories)."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))

    def run(*args, **kw):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, **kw)

    return run


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    return e


def model(name, active=None):
    return {"name": name, "active_generation": active, "aliases": {}, "n_generations": 1,
            "created_at": 1}


def test_models_follow_cursors(tv, fake, env, tmp_path):
    fake.on("GET", "/v1/models", (200, {"models": [model("a", 1)], "next_cursor": "c/1"}),
            (200, {"models": [model("b")], "next_cursor": None}))
    p = tv("models", "--url", fake.url, "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [m["name"] for m in doc["models"]] == ["a", "b"] and doc["next_cursor"] is None
    assert [s[1] for s in fake.seen] == ["/v1/models", "/v1/models?cursor=c%2F1"]
    # No token anywhere: no Authorization header.
    assert all("Authorization" not in s[2] for s in fake.seen)


def test_text_is_rendered_from_the_json(tv, fake, env, tmp_path):
    fake.on("GET", "/v1/models", (200, {"models": [model("org/m", 3)], "next_cursor": None}))
    p = tv("models", "--url", fake.url, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "ACTIVE", "GENERATIONS", "ALIASES"]
    assert lines[1].split() == ["org/m", "3", "1", "-"]


def test_path_segments_are_percent_encoded(tv, fake, env, tmp_path):
    t = {"name": "a/b c%\u00e9", "dtype": "F32", "shape": [1], "shard": "s", "shard_index": 0,
         "data_offsets": [0, 4], "nbytes": 4, "file_offset": 100, "replicas": []}
    fake.on("GET", "/v1/models/org%2Fm/generations/prod/tensors/a%2Fb%20c%25%C3%A9", (200, t))
    p = tv("tensor", "--url", fake.url, "org/m@prod", "a/b c%\u00e9", "--json", env=env,
           cwd=tmp_path)
    assert p.returncode == 0, (p.stderr, fake.seen)
    assert json.loads(p.stdout)["file_offset"] == 100
    fake.on("GET", "/v1/models/m/generations/active/tensors",
            (200, {"model": "m", "generation": 1, "tensors": [t], "next_cursor": None}))
    p = tv("tensors", "--url", fake.url, "m", "--prefix", "h.0/x y", "--order", "name",
           env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert fake.seen[-1][1] == "/v1/models/m/generations/active/tensors?prefix=h.0%2Fx%20y&order=name"
    # --order size is the API's order=size, sent as it is.
    p = tv("tensors", "--url", fake.url, "m", "--order", "size", "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert fake.seen[-1][1] == "/v1/models/m/generations/active/tensors?order=size"
    assert json.loads(p.stdout)["tensors"][0]["name"] == t["name"]
    p = tv("tensors", "--url", fake.url, "m@7", "--limit", "5", env=env, cwd=tmp_path)
    assert p.returncode == 1  # no such route on the fake: its 404 is reported
    assert fake.seen[-1][1] == "/v1/models/m/generations/7/tensors?limit=5"


def test_token_sources(tv, fake, env, tmp_path):
    fake.on("GET", "/v1/status", (200, {"version": "0.1.0", "store": "/s", "uptime_seconds": 1,
                                        "n_models": 0, "n_devices": 1,
                                        "jobs": {"queued": 0, "running": 0},
                                        "anonymous_reads": True}))
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "admin.token").write_text("tvk_default\n")
    (tmp_path / "tf").write_text("  tvk_file  \n")
    for extra, e, want in ((["--token-file", tmp_path / "tf"], {"TENSORVAULT_TOKEN": "tvk_env"},
                            "tvk_file"),
                           ([], {"TENSORVAULT_TOKEN": "tvk_env"}, "tvk_env"),
                           ([], {}, "tvk_default")):
        p = tv("status", "--url", fake.url, *extra, env={**env, **e}, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert fake.seen[-1][2].get("Authorization") == f"Bearer {want}"
    assert "anonymous_reads: yes" in p.stdout
    p = tv("status", "--url", fake.url, "--token-file", tmp_path / "missing", env=env,
           cwd=tmp_path)
    assert p.returncode == 1 and "missing" in p.stderr


def test_error_object_is_the_result(tv, fake, env, tmp_path):
    err = {"error": {"code": "TV_E_STATE", "errno": -1103,
                     "message": "generation 1 of 'm' is active"}}
    fake.on("POST", "/v1/models/m/generations/1/retire", (409, err))
    p = tv("retire", "--url", fake.url, "m", "1", "--json", env=env, cwd=tmp_path)
    assert p.returncode == 1
    assert json.loads(p.stdout) == err
    assert "TV_E_STATE" in p.stderr and "generation 1 of 'm' is active" in p.stderr
    assert fake.seen[-1][0] == "POST"


def test_mutations_send_their_bodies(tv, fake, env, tmp_path):
    fake.on("PUT", "/v1/models/m/aliases/prod",
            (200, {"model": "m", "alias": "prod", "generation": 2}))
    p = tv("alias", "set", "--url", fake.url, "m", "prod", "2", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "m@prod -> generation 2\n"
    assert json.loads(fake.seen[-1][3]) == {"generation": 2}
    fake.on("POST", "/v1/tokens", (201, {"id": 4, "name": "ci", "scope": "read", "created_at": 1,
                                         "revoked_at": None, "token": "tvk_" + "0" * 64}))
    p = tv("token", "create", "--url", fake.url, "ci", env=env, cwd=tmp_path)
    assert p.returncode == 0 and "tvk_" + "0" * 64 in p.stdout
    assert json.loads(fake.seen[-1][3]) == {"name": "ci", "scope": "read"}
    fake.on("POST", "/v1/models/m/generations/canary/activate",
            (200, {"model": "m", "generation": 3, "active": True}))
    p = tv("activate", "--url", fake.url, "m", "canary", env=env, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == "activated generation 3 of m\n", p.stderr
    # The text says which generation was active before (read just before);
    # --json is the API's Generation as it is, with no extra request.
    fake.on("GET", "/v1/models/m", (200, model("m", 2)))
    p = tv("activate", "--url", fake.url, "m", "canary", env=env, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == "activated generation 3 of m (was 2)\n", p.stderr
    assert [s[:2] for s in fake.seen[-2:]] == [("GET", "/v1/models/m"),
                                               ("POST", "/v1/models/m/generations/canary/activate")]
    n = len(fake.seen)
    p = tv("activate", "--url", fake.url, "m", "canary", "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout)["generation"] == 3
    assert len(fake.seen) == n + 1
    # Usage errors are found before anything is sent.
    n = len(fake.seen)
    for args in (["alias", "set", "m", "prod", "0"], ["activate", "m", "_x"],
                 ["token", "create", "x", "--scope", "root"], ["jobs", "--state", "done"],
                 ["tensors", "m", "--order", "bogus"], ["tensors", "m", "--limit", "0"],
                 ["job", "01"], ["alias", "frob", "m"]):
        p = tv(args[0], *args[1:], "--url", fake.url, env=env, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
    assert len(fake.seen) == n


def job(state, **kw):
    j = {"id": 7, "kind": "import", "state": state, "model": "m", "source": "/x",
         "activate": False, "alias": None, "strict": False, "step": None, "bytes_done": 0,
         "bytes_total": 100, "rate_bytes_per_s": 0, "eta_seconds": None, "error": None,
         "generation": None, "created_at": 1, "started_at": None, "finished_at": None,
         "result": None}
    j.update(kw)
    return j


RESULT = {"model": "m", "generation": 2, "active": True, "aliases": ["prod"], "n_shards": 1,
          "n_tensors": 3, "total_bytes": 100, "written_bytes": 100, "deduplicated_bytes": 0,
          "seconds": 0.1}


def test_import_wait_follows_the_job(tv, fake, env, tmp_path):
    fake.on("POST", "/v1/imports", (202, job("queued")))
    fake.on("GET", "/v1/jobs/7", (200, job("running", step="write", bytes_done=50)),
            (200, job("succeeded", bytes_done=100, result=RESULT)))
    (tmp_path / "ck").mkdir()
    p = tv("import", "--url", fake.url, "m", "ck", "--activate", "--alias", "prod", "--wait",
           "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == RESULT
    body = json.loads(fake.seen[0][3])
    assert body == {"model": "m", "source": str(tmp_path / "ck"), "activate": True,
                    "strict": False, "alias": "prod"}
    assert [s[1] for s in fake.seen[1:]] == ["/v1/jobs/7", "/v1/jobs/7"]


def test_import_without_wait_prints_the_job(tv, fake, env, tmp_path):
    fake.on("POST", "/v1/imports", (202, job("queued")))
    p = tv("import", "--url", fake.url, "m", "/abs/ck", "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["state"] == "queued"
    assert len(fake.seen) == 1 and json.loads(fake.seen[0][3])["source"] == "/abs/ck"


def test_failed_job_fails_the_command(tv, fake, env, tmp_path):
    fake.on("POST", "/v1/imports", (202, job("running")))
    fake.on("GET", "/v1/jobs/7", (200, job("failed", error={
        "code": "TV_E_ST_JSON", "errno": -1016, "message": "shard 'x': bad header"})))
    p = tv("import", "--url", fake.url, "m", "/abs/ck", "--wait", env=env, cwd=tmp_path)
    assert p.returncode == 1
    assert "TV_E_ST_JSON" in p.stderr and "shard 'x': bad header" in p.stderr


def test_verify_waits_and_reports_failures(tv, fake, env, tmp_path):
    res = {"n_objects": 2, "n_failed": 1, "verified_bytes": 10, "objects": [
        {"object_id": 5, "device_id": 1, "device_offset": 0, "canonical_bytes": 5,
         "sha256": "00", "status": "mismatch", "message": "sha256 differs",
         "used_by": [{"model": "m", "generation": 1, "state": "ready", "active": True,
                      "shard": "a.safetensors", "shard_index": 0}]},
        {"object_id": 6, "device_id": 1, "device_offset": 8, "canonical_bytes": 5,
         "sha256": "11", "status": "ok", "message": "", "used_by": []}]}
    fake.on("POST", "/v1/verify", (202, job("queued", kind="verify")))
    fake.on("GET", "/v1/jobs/7", (200, job("succeeded", kind="verify", result=res)))
    p = tv("verify", "--url", fake.url, "--device", "1", env=env, cwd=tmp_path)
    assert p.returncode == 1
    assert p.stdout == "verify: 2 objects, 10 B, 1 failed\n"
    assert "object 5 on device 1" in p.stderr and "model 'm' generation 1 (active)" in p.stderr
    assert "object 6" not in p.stderr
    # A daemon is asked first (any answer will do), then the job is posted.
    assert [(m, pth) for m, pth, _, _ in fake.seen[:2]] == [("GET", "/healthz"),
                                                              ("POST", "/v1/verify")]
    assert json.loads(fake.seen[1][3]) == {"device_id": 1}


def test_no_daemon_falls_back_to_the_store(tv, env, tmp_path):
    s = tmp_path / "s"
    p = tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "16M", env=env)
    assert p.returncode == 0, p.stderr
    # Nothing listens on port 1: $TENSORVAULT_STORE serves the command.
    e = {**env, "TENSORVAULT_URL": "http://127.0.0.1:1", "TENSORVAULT_STORE": str(s)}
    p = tv("models", "--json", env=e, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"models": [], "next_cursor": None}
    p = tv("devices", "--json", env=e, cwd=tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout)["devices"][0]["status"] == "ok"
    # --url given explicitly: no fallback.
    p = tv("models", "--url", "http://127.0.0.1:1", env=e, cwd=tmp_path)
    assert p.returncode == 1 and "TV_E_NO_DAEMON" in p.stderr and "127.0.0.1:1" in p.stderr
    # No store to fall back on: the error says how to start a daemon or name a store.
    e.pop("TENSORVAULT_STORE")
    p = tv("models", "--json", env=e, cwd=tmp_path)
    assert p.returncode == 1
    err = json.loads(p.stdout)["error"]
    assert err["code"] == "TV_E_NO_DAEMON" and err["errno"] == -1208
    assert "scripts/run" in err["message"] and "--store" in err["message"]


def test_only_http_urls(tv, env, tmp_path):
    for url in ("file:///etc/passwd", "ftp://127.0.0.1:1", "127.0.0.1:8470"):
        for e in ({}, {"TENSORVAULT_URL": url}):
            args = ["models", "--json"] + ([] if e else ["--url", url])
            p = tv(*args, env={**env, **e}, cwd=tmp_path)
            assert p.returncode == 1, (url, p.stderr)
            assert json.loads(p.stdout)["error"]["code"] == "TV_E_INVALID_ARG", p.stdout
            assert url in p.stderr and "http://" in p.stderr


def test_a_dropped_get_is_sent_again_a_post_is_not(tv, fake, env, tmp_path):
    fake.on("GET", "/v1/models", (None, None),
            (200, {"models": [model("a")], "next_cursor": None}))
    p = tv("models", "--url", fake.url, "--json", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert [s[1] for s in fake.seen] == ["/v1/models", "/v1/models"]
    fake.on("POST", "/v1/gc", (None, None), (200, {"n_objects_freed": 0, "freed_bytes": 0}))
    p = tv("gc", "--url", fake.url, env=env, cwd=tmp_path)
    assert p.returncode == 1 and "/v1/gc" in p.stderr
    assert [s[1] for s in fake.seen].count("/v1/gc") == 1
