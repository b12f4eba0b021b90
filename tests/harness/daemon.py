"""Helpers for the daemon tests: start build/tensorvaultd ($TV_BUILD_DIR, like
the build_dir fixture's other binaries) on a free loopback port with a temp store dir
and a config file, the import root being the test's directory; read its
admin token; talk HTTP to it (raw, percent-encoded paths); stop it with
SIGTERM or kill -9 it; write checkpoints with the official writer.

Invariant: every request goes through http.client with the path exactly as
given (no normalisation), so the tests see what the router sees."""
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse

import numpy as np
from safetensors.numpy import save_file

from harness.net import free_port  # noqa: F401 - part of this module's interface

ADMIN = object()  # token= sentinel: the daemon's admin token

# Slower under ASan+UBSan: every wait scales with this.
SLOW = 4 if "asan" in os.environ.get("TV_BUILD_DIR", "") else 1


def seg(name):
    """One percent-encoded path segment: every byte outside unreserved."""
    if isinstance(name, int):
        name = str(name)
    return urllib.parse.quote(name.encode("utf-8") if isinstance(name, str) else name, safe="")


class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # {lower-case name: value}
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


class Daemon:
    """One tensorvaultd. settings: {"section.key": value} written to the INI
    file on top of the defaults below. env: variables added to (None as a
    value: removed from) the environment it starts with."""

    def __init__(self, build_dir, workdir, settings=None, store=None, name="d", env=None):
        self.exe = os.path.abspath(os.path.join(build_dir, "tensorvaultd"))  # it runs in workdir
        self.workdir = str(workdir)
        self.store = str(store or os.path.join(self.workdir, "var"))
        self.config = os.path.join(self.workdir, f"{name}.ini")
        self.log = os.path.join(self.workdir, f"{name}.log")
        self.settings = {
            "store.dir": self.store,
            "store.image_size": "4G",
            "import.roots": self.workdir,
            "import.workers": "2",
            "log.level": "info",
        }
        self.settings.update(settings or {})
        self.env = dict(env or {})
        self.proc = None
        self.port = None
        self._token = None

    # -- life cycle ----------------------------------------------------------

    def write_config(self):
        sections = {}
        for k, v in self.settings.items():
            sec, key = k.split(".", 1)
            sections.setdefault(sec, []).append(f"{key} = {v}")
        with open(self.config, "w") as f:
            for sec, lines in sections.items():
                f.write(f"[{sec}]\n" + "\n".join(lines) + "\n")

    def spawn(self, extra_args=(), port=None):
        """Starts the process without waiting for it to answer."""
        self.port = port or free_port()
        # a settings' http.listen chooses the host (0.0.0.0: every address); the port is ours
        host = self.settings.get("http.listen", "127.0.0.1:0").rsplit(":", 1)[0]
        self.settings["http.listen"] = f"{host}:{self.port}"
        self.write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen([self.exe, "--config", self.config, *extra_args],
                                     cwd=self.workdir, stdout=logf, stderr=subprocess.STDOUT,
                                     env=env)
        logf.close()
        return self.proc

    def start(self, extra_args=(), timeout=30):
        """Starts and waits until /healthz answers 200 (a port taken in the
        meantime by someone else is retried on another)."""
        for _ in range(3):
            self.spawn(extra_args)
            deadline = time.monotonic() + timeout * SLOW
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    if self.request("GET", "/healthz", token=None, timeout=2).status == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"tensorvaultd did not answer /healthz in {timeout * SLOW}s:\n"
                                     f"{self.log_text()}")
            if "in use" not in self.log_text():
                raise AssertionError(f"tensorvaultd exited {self.proc.returncode}:\n"
                                     f"{self.log_text()}")
        raise AssertionError(f"tensorvaultd found no free port:\n{self.log_text()}")

    def log_text(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends sig and returns the exit status (kill -9 after timeout)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout * SLOW)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tensorvaultd ignored signal {sig} for {timeout * SLOW}s:\n"
                                 f"{self.log_text()}")

    def kill9(self):
        self.proc.kill()
        return self.proc.wait()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- fast path ----------------------------------------------------------

    @property
    def socket_path(self):
        """The fast-path socket: fastpath.socket, else the embedded default
        <store.dir>/run/tensorvault.sock."""
        return self.settings.get("fastpath.socket") or os.path.join(self.store, "run",
                                                                    "tensorvault.sock")

    @property
    def pid(self):
        return self.proc.pid

    def wait_socket(self, timeout=30):
        """Waits until the fast-path socket accepts (a connection opened and
        closed at once: one session in sessions_total)."""
        deadline = time.monotonic() + timeout * SLOW
        while True:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                    s.settimeout(2)
                    s.connect(self.socket_path)
                return self
            except OSError:
                if not self.alive() or time.monotonic() > deadline:
                    raise AssertionError(f"no fast-path socket at {self.socket_path}:\n"
                                         f"{self.log_text()}")
                time.sleep(0.05)

    def sessions(self):
        """GET /v1/sessions' list."""
        return self.ok("GET", "/v1/sessions")["sessions"]

    def rss_kib(self):
        """VmRSS of the daemon from /proc/PID/status."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError(f"no VmRSS in /proc/{self.proc.pid}/status")

    def metrics(self):
        """{name or name{labels}: value} of /metrics."""
        out = {}
        for line in self.get("/metrics").body.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                out[k] = float(v)
        return out

    @property
    def token(self):
        if self._token is None:
            with open(os.path.join(self.store, "admin.token")) as f:
                self._token = f.read().strip()
        return self._token

    # -- HTTP ----------------------------------------------------------------

    def request(self, method, path, body=None, token=ADMIN, headers=None, raw=None, timeout=60):
        """body: a JSON value (sent as application/json); raw: bytes sent as
        is (headers decide the type). Returns Resp."""
        h = dict(headers or {})
        if token is ADMIN:
            token = self.token
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout * SLOW)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in h.items():
                conn.putheader(k, v)
            if "Content-Length" not in h and (data is not None or method in ("POST", "PUT")):
                conn.putheader("Content-Length", str(len(data or b"")))
            conn.endheaders(data)
            r = conn.getresponse()
            out = Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()
        return out

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def ok(self, method, path, status=200, **kw):
        """The JSON of a request that must answer status."""
        r = self.request(method, path, **kw)
        assert r.status == status, (method, path, r)
        return r.json() if r.body and r.headers.get("content-type", "").startswith(
            "application/json") else r.body

    # -- domain helpers ------------------------------------------------------

    def submit_import(self, model, source, **opts):
        body = {"model": model, "source": str(source), **opts}
        r = self.request("POST", "/v1/imports", body=body)
        assert r.status == 202, r
        job = r.json()
        assert r.headers.get("location") == f"/v1/jobs/{job['id']}", r.headers
        return job

    def job(self, job_id):
        return self.ok("GET", f"/v1/jobs/{job_id}")

    def wait_job(self, job_id, timeout=120):
        deadline = time.monotonic() + timeout * SLOW
        while True:
            j = self.job(job_id)
            if j["state"] in ("succeeded", "failed", "cancelled"):
                return j
            assert time.monotonic() < deadline, f"job {job_id} still {j['state']}: {j}"
            time.sleep(0.02)

    def import_ok(self, model, source, **opts):
        j = self.wait_job(self.submit_import(model, source, **opts)["id"])
        assert j["state"] == "succeeded", j
        return j

    def generations(self, model):
        r = self.get(f"/v1/models/{seg(model)}/generations?limit=1000")
        if r.status == 404:
            return []
        assert r.status == 200, r
        return r.json()["generations"]

    def device(self):
        devs = self.ok("GET", "/v1/devices")["devices"]
        assert len(devs) == 1, devs
        return devs[0]


@contextlib.contextmanager
def serving(build_dir, tmp, checkpoints):
    """A daemon on tmp (a 256 MiB store image) serving checkpoints {model:
    path}, each imported and activated, its fast-path socket accepting."""
    d = Daemon(build_dir, tmp, settings={"store.image_size": "256M"})
    d.start()
    try:
        for model, path in checkpoints.items():
            d.import_ok(model, path, activate=True)
        d.wait_socket()
        yield d
    finally:
        d.stop()


def set_args(overrides):
    """--set SECTION.KEY=VALUE arguments for tensorvaultd from a dict."""
    out = []
    for k, v in overrides.items():
        out += ["--set", f"{k}={v}"]
    return out


def make_checkpoint(path, tensors, metadata=None):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return str(path)


def big_checkpoint(path, nbytes=256 << 20, seed=0, n_tensors=16):
    """A large checkpoint that is cheap to make: mostly zeros with one random
    4 KiB page in every 64 KiB, and a seed-dependent head so that two seeds
    never deduplicate."""
    rng = np.random.default_rng(seed)
    per = nbytes // n_tensors
    tensors = {}
    for i in range(n_tensors):
        a = np.zeros(per, dtype=np.uint8)
        view = a[: per - per % 65536].reshape(-1, 65536)
        view[:, :4096] = rng.integers(0, 256, size=(view.shape[0], 4096), dtype=np.uint8)
        tensors[f"layers.{i}.weight"] = a
    return make_checkpoint(path, tensors, metadata={"seed": str(seed)})
