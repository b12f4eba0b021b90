"""Smoke test of build/tensorvaultd (the daemon helper's; the full daemon
suite is test_daemon_*.py): it starts on a random loopback port with a temp
store and config, creates the store and a 0600 admin token on first start,
answers /healthz and /metrics, passes the raw path to the api, bounds
bodies and headers (413), refuses a second daemon on the same store
naming the lock holder, exits 0 on SIGTERM, reuses store and token on the
next start, and refuses a bad configuration naming FILE:LINE."""
import http.client
import os
import signal
import socket
import stat
import subprocess
import time

import pytest


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=5, method="GET", body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
    finally:
        c.close()


@pytest.fixture
def daemon_exe(build_dir):
    exe = os.path.abspath(os.path.join(build_dir, "tensorvaultd"))
    if not os.path.exists(exe):
        pytest.fail(f"tensorvaultd not built in {build_dir} (run scripts/build)")
    return exe


def write_config(path, store, port):
    with open(path, "w") as f:
        f.write(f"[http]\nlisten = 127.0.0.1:{port}\nthreads = 2\n"
                f"[store]\ndir = {store}\nimage_size = 256M\n"
                f"[import]\nworkers = 1\n")


def start(exe, tmp_path, store, name="d"):
    """Starts a daemon and waits for /healthz; returns (proc, port, log path)."""
    log = tmp_path / f"{name}.log"
    for _ in range(3):
        port = free_port()
        cfg = tmp_path / f"{name}.ini"
        write_config(cfg, store, port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
        with open(log, "wb") as lf:
            p = subprocess.Popen([exe, "--config", str(cfg)], cwd=tmp_path, stdout=lf,
                                 stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            try:
                if get(port, "/healthz", timeout=2)[0] == 200:
                    return p, port, log
            except OSError:
                time.sleep(0.05)
        if p.poll() is None:
            p.kill()
            p.wait()
            raise AssertionError("no /healthz answer:\n" + log.read_text())
        if "in use" not in log.read_text():
            raise AssertionError(f"exited {p.returncode}:\n" + log.read_text())
    raise AssertionError("no free port")


def stop(p, sig=signal.SIGTERM):
    p.send_signal(sig)
    try:
        return p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError("tensorvaultd ignored the signal")


def test_start_health_lock_sigterm_restart(daemon_exe, tmp_path):
    store = tmp_path / "var"
    p, port, log = start(daemon_exe, tmp_path, store)
    try:
        status, headers, body = get(port, "/healthz")
        assert status == 200
        assert headers["content-type"].startswith("application/json")
        assert body == b'{"status":"ok"}'
        text = log.read_text()
        assert f"tensorvaultd: listening on http://127.0.0.1:{port} (admin token in {store}/admin.token)" in text
        tok = store / "admin.token"
        assert stat.S_IMODE(os.stat(tok).st_mode) == 0o600
        secret = tok.read_text()
        assert secret.startswith("tvk_") and secret.endswith("\n") and len(secret) == 69
        assert (store / "store.img").stat().st_size == 256 << 20

        status, headers, body = get(port, "/metrics")
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4"
        m = body.decode()
        assert 'tensorvault_build_info{version="' in m
        assert 'tensorvault_http_requests_total{route="GET /healthz",status="200"}' in m
        assert "tensorvault_device_capacity_bytes{device=\"1\"" in m

        # The transport: the raw path reaches the api (%2F does not split),
        # bodies and headers are bounded (413 with an error document).
        status, _, body = get(port, "/v1/models/a%2Fb")
        assert status == 404 and b"model 'a/b'" in body, body
        auth = {"Authorization": "Bearer " + secret.strip()}
        status, _, body = get(port, "/v1/imports", method="POST", body=b"x" * (65 << 10),
                              headers=auth)
        assert status == 413 and b"TV_E_TOO_LARGE" in body
        status, _, body = get(port, "/healthz", headers={"X-Big": "b" * 9000})
        assert status == 413 and b"TV_E_TOO_LARGE" in body
        assert get(port, "/healthz")[0] == 200  # still serving

        # A second daemon on the same store: exit 1 naming the holder.
        cfg2 = tmp_path / "second.ini"
        write_config(cfg2, store, free_port())
        q = subprocess.run([daemon_exe, "--config", str(cfg2)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 1
        assert "locked" in q.stderr and str(p.pid) in q.stderr, q.stderr
        assert p.poll() is None  # the first one is untouched
    finally:
        rc = stop(p)
    assert rc == 0, log.read_text()
    assert "stopped" in log.read_text()

    # Restart: the same store and token, nothing re-created.
    p, port, log = start(daemon_exe, tmp_path, store, name="again")
    try:
        assert (store / "admin.token").read_text() == secret
        assert get(port, "/healthz")[0] == 200
        assert "created store" not in log.read_text()
    finally:
        assert stop(p, signal.SIGINT) == 0


def test_bad_config_and_flags(daemon_exe, tmp_path):
    cfg = tmp_path / "bad.ini"
    cfg.write_text("[http]\nlisten = 127.0.0.1:1\n[import]\nworkers = many\n")
    q = subprocess.run([daemon_exe, "--config", str(cfg)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert q.returncode == 2
    assert f"{cfg}:4: import.workers: 'many'" in q.stderr
    q = subprocess.run([daemon_exe, "--bogus"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=30)
    assert q.returncode == 2 and "--bogus" in q.stderr
    q = subprocess.run([daemon_exe, "--help"], capture_output=True, text=True, timeout=30)
    assert q.returncode == 0 and "--config FILE" in q.stdout and "--set" in q.stdout
    q = subprocess.run([daemon_exe, "--version"], capture_output=True, text=True, timeout=30)
    assert q.returncode == 0 and q.stdout.startswith("tensorvaultd ")
    assert not (tmp_path / "var").exists()  # nothing was created
