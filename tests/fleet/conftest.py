"""Fixtures of the fleet tests (tests/fleet): the servers fleet mode talks to,
all on this machine, started by the tests and stopped at session end (also
when a test fails; the tail of each server's log is attached to a failing
test's report).

- `postgres`: Debian's PostgreSQL (/usr/lib/postgresql/*/bin), a fresh
  cluster in a temporary directory owned by the `postgres` user (initdb
  refuses root), on 127.0.0.1:PORT (scram-sha-256 passwords) and a UNIX
  socket in that directory (trust, for the superuser). Database and role
  `tensorvault` with a password.
- `s3`: a moto server (tests/fleet/moto_s3.py) that checks SigV4 for a fixed
  key pair; talked to with `curl --aws-sigv4`, the mechanism of libcurl's
  CURLOPT_AWS_SIGV4. Two things S3 needs from such a client (and so from the
  C side later): an `x-amz-content-sha256` header (curl 7.88 does not add it
  and signs it when given; without it moto's signature differs), and a body
  sent as an upload (`-T` / CURLOPT_UPLOAD), not as form data (moto then
  stores an empty object).
- `origin`: tests/fleet/origin.py, a Range-capable HTTP origin over a
  directory with byte counters and fault switches.
- `fleet_nodes` (a factory, over `fleet_net`, `fleet_pg`, `fleet_s3`):
  tensorvaultd nodes, each in a network namespace of its own on a bridge
  (tests/fleet/nodes.py), sharing a fresh catalog database; PostgreSQL and
  moto then listen on the bridge's address too.

What is missing (the PostgreSQL binaries, curl, moto) fails the test with
the reason: scripts/deps installs them all."""
import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import xml.etree.ElementTree as ET

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # daemon.py

from origin import Origin  # noqa: E402


@pytest.fixture(scope="session")
def build_dir():
    d = os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build"))
    if not os.path.exists(os.path.join(d, "tensorvaultd")):
        pytest.fail(f"tensorvaultd not built in {d} (run scripts/build)")
    return d


def fresh_db(postgres, prefix="tvdb_"):
    """A new empty database owned by the application role: (name, DSN)."""
    import uuid
    name = prefix + uuid.uuid4().hex[:10]
    postgres.psql(f"CREATE DATABASE {name} OWNER {postgres.user}")
    return name, postgres.dsn.rsplit("/", 1)[0] + "/" + name


def wait_for(fn, timeout=30, what="condition"):
    """fn() until it is truthy (returned), polling every 0.1 s; fails after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

_LOGS = {}  # name -> path of a server log, for failure reports

# ---- shared by the remote-import tests (test_import_http.py, test_import_s3.py)


def sample_tensors(seed, n=4, per=300_000):
    """n float32 tensors of per bytes and a uint8 one: a checkpoint to import."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {f"layers.{i}.w": rng.standard_normal(per // 4, dtype=np.float32) for i in range(n)}
    out["bias"] = rng.integers(0, 255, size=1234, dtype=np.uint8)
    return out


def check_published(d, model, gen, want):
    """Generation gen of model holds exactly the tensors of want (name ->
    array, as the official loader reads them), byte for byte."""
    from daemon import seg
    listed = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/tensors?limit=1000")
    assert sorted(t["name"] for t in listed["tensors"]) == sorted(want)
    for name, arr in want.items():
        body = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/tensors/{seg(name)}/data")
        assert body == arr.tobytes(), name


def failed_job(d, model, url):
    """Imports url as model; the job fails and no ready generation appears."""
    j = d.wait_job(d.submit_import(model, url)["id"])
    assert j["state"] == "failed", j
    assert all(g["state"] != "ready" for g in d.generations(model))
    return j


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path, n=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name, path in _LOGS.items():
            rep.sections.append((f"{name} log (tail of {path})", _tail(path)))


# --------------------------------------------------------------- PostgreSQL

def _pg_bindir():
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return d
    return None


def _pg_os_user():
    """The unprivileged user the server runs as when we are root."""
    import pwd
    for name in ("postgres", "tvfleet-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "tvfleet-pg"], check=True)
    return "tvfleet-pg"


class Postgres:
    """A PostgreSQL cluster of its own. dsn/host/port/sockdir/user/password/
    dbname; psql(sql) as the superuser over the socket (or as_app=True: as
    the `tensorvault` role over TCP with its password); stop()/start()/
    restart() keep the data directory and the port."""

    user = "tensorvault"
    password = "tv-fleet-pw"
    dbname = "tensorvault"

    def __init__(self, bindir, base):
        self.bindir = bindir
        self.base = base
        self.datadir = os.path.join(base, "data")
        self.sockdir = base
        self.logfile = os.path.join(base, "postgres.log")
        self.host = "127.0.0.1"
        self.port = free_port()
        self.running = False
        self.also = []  # addresses listened on besides host (listen_also)
        self._runas = []
        os.chmod(base, 0o755)  # the socket is reachable by any user
        if os.geteuid() == 0:
            osuser = _pg_os_user()
            shutil.chown(base, osuser, osuser)
            self._runas = ["runuser", "-u", osuser, "--"]

    @property
    def dsn(self):
        pw = urllib.parse.quote(self.password, safe="")
        return f"postgresql://{self.user}:{pw}@{self.host}:{self.port}/{self.dbname}"

    def dsn_on(self, host, dbname=None):
        """The DSN with another host (e.g. the fleet bridge's address)."""
        pw = urllib.parse.quote(self.password, safe="")
        return f"postgresql://{self.user}:{pw}@{host}:{self.port}/{dbname or self.dbname}"

    def listen_also(self, addr, cidr):
        """Listens on addr as well as 127.0.0.1 (scram-sha-256 for clients
        in cidr): appended to the configuration, then a restart (same port,
        same data). Once per address."""
        if addr in self.also:
            return
        self.also.append(addr)
        with open(os.path.join(self.datadir, "pg_hba.conf"), "a") as f:
            f.write(f"\n# tests/fleet: the fleet network\nhost all all {cidr} scram-sha-256\n")
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = '{','.join([self.host] + self.also)}'\n")
        if self.running:
            self.restart()

    def _bin(self, name):
        return os.path.join(self.bindir, name)

    def _run(self, argv, **kw):
        r = subprocess.run(self._runas + argv, capture_output=True, text=True, timeout=60, **kw)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}\n"
                               f"{_tail(self.logfile, 30)}")
        return r.stdout

    def init(self):
        self._run([self._bin("initdb"), "-D", self.datadir, "-U", "postgres", "--auth-local=trust",
                   "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        conf = os.path.join(self.datadir, "postgresql.conf")
        with open(conf) as f:
            base_conf = f.read()
        for attempt in range(3):  # the free port may be taken before we bind it
            with open(conf, "w") as f:
                f.write(base_conf + "\n# tests/fleet\n"
                        f"port = {self.port}\n"
                        f"listen_addresses = '{self.host}'\n"
                        f"unix_socket_directories = '{self.sockdir}'\n"
                        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                        "max_connections = 100\n")
            try:
                self.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = free_port()
        self.psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'")
        self.psql(f"CREATE DATABASE {self.dbname} OWNER {self.user}")
        return self

    def start(self):
        self._run([self._bin("pg_ctl"), "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60",
                   "start"])
        deadline = time.monotonic() + 30
        while True:
            r = subprocess.run([self._bin("pg_isready"), "-h", self.host, "-p", str(self.port),
                                "-t", "1"], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL not ready on {self.host}:{self.port}: {r.stdout}")
            time.sleep(0.1)
        self.running = True

    def stop(self, mode="fast"):
        """mode: smart | fast | immediate (pg_ctl -m; immediate is a crash)."""
        self._run([self._bin("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", "60", "stop"])
        self.running = False

    def restart(self, mode="fast"):
        self.stop(mode)
        self.start()

    def psql(self, sql, as_app=False, dbname=None, check=True):
        """Runs sql (one or more statements) and returns psql's unaligned,
        tuples-only output (fields separated by '|')."""
        if as_app:
            argv = [self._bin("psql"), self.dsn if dbname is None else
                    self.dsn.rsplit("/", 1)[0] + "/" + dbname]
        else:
            argv = [self._bin("psql"), "-h", self.sockdir, "-p", str(self.port), "-U", "postgres",
                    "-d", dbname or "postgres"]
        r = subprocess.run(argv + ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PGCONNECT_TIMEOUT": "5"})
        if check and r.returncode != 0:
            raise RuntimeError(f"psql exited {r.returncode}: {r.stderr.strip()}")
        return r.stdout if check else r

    def close(self):
        if self.running:
            try:
                self.stop("fast")
            except Exception:  # noqa: BLE001 - fall back to a crash stop
                subprocess.run(self._runas + [self._bin("pg_ctl"), "-D", self.datadir, "-m",
                                              "immediate", "stop"], capture_output=True)
            self.running = False


@pytest.fixture(scope="session")
def postgres():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                    "(apt-get install postgresql; scripts/deps does it)")
    base = tempfile.mkdtemp(prefix="tv-fleet-pg-")
    pg = Postgres(bindir, base)
    _LOGS["postgres"] = pg.logfile
    try:
        pg.init()
        yield pg
    finally:
        pg.close()
        _LOGS.pop("postgres", None)
        shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------------- S3

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
            [sys.executable, os.path.join(HERE, "moto_s3.py"), "--host", self.bind,
             "--port", str(self.port), "--access-key", self.access_key,
             "--secret-key", self.secret_key, "--region", self.region],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto exited {self.proc.returncode}:\n{_tail(self.logfile)}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    pass
                st, _, _ = self.request("GET", "/")
                if st == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto not answering on {self.endpoint}:\n{_tail(self.logfile)}")
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


@pytest.fixture(scope="session")
def s3():
    if shutil.which("curl") is None:
        pytest.fail("curl not found (apt-get install curl; scripts/deps does it)")
    try:
        import moto  # noqa: F401
    except ImportError as e:
        pytest.fail(f"moto is not installed in {sys.executable} ({e}): run scripts/deps")
    base = tempfile.mkdtemp(prefix="tv-fleet-s3-")
    srv = S3(base)
    _LOGS["moto"] = srv.logfile
    try:
        for attempt in range(3):  # the free port may be taken before moto binds it
            try:
                srv.start()
                break
            except RuntimeError:
                srv.stop()
                if attempt == 2:
                    raise
                srv.port = free_port()
        yield srv
    finally:
        srv.stop()
        _LOGS.pop("moto", None)
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------- origin

@pytest.fixture(scope="session")
def origin():
    """An Origin (tests/fleet/origin.py) serving a fresh directory (.root)."""
    base = tempfile.mkdtemp(prefix="tv-fleet-origin-")
    o = Origin(os.path.join(base, "root")).start()
    try:
        yield o
    finally:
        o.stop()
        shutil.rmtree(base, ignore_errors=True)


# -------------------------------------------------------------- fleet nodes

@pytest.fixture(scope="session")
def fleet_net():
    """The fleet network of this session (tests/fleet/nodes.py's Net): a
    bridge and a namespace per node, removed at session end; without root
    or `ip`, .available is False with the .reason (the nodes share
    loopback)."""
    import nodes
    net = nodes.Net.create()
    try:
        yield net
    finally:
        net.close()


@pytest.fixture(scope="session")
def fleet_pg(postgres, fleet_net):
    """`postgres`, also listening on the bridge's address (a restart, once):
    .dsn_on(fleet_net.host_ip, db) is what the nodes connect with."""
    if fleet_net.available:
        postgres.listen_also(fleet_net.host_ip, fleet_net.cidr)
    return postgres


@pytest.fixture(scope="session")
def fleet_s3(s3, fleet_net):
    """`s3`, also reachable from the nodes (bound to 0.0.0.0, a restart that
    keeps every object, once): .endpoint_on(fleet_net.host_ip)."""
    if fleet_net.available:
        s3.bind_all()
    return s3


def _node_settings(config):
    """fleet_nodes' keyword arguments as INI keys: a key with a dot as is
    ("fleet.token"), else its first "_" is the dot (fleet_token)."""
    return {(k if "." in k else k.replace("_", ".", 1)): str(v) for k, v in config.items()}


@pytest.fixture
def fleet_nodes(build_dir, fleet_pg, fleet_net, tmp_path):
    """A factory: fleet_nodes(n=3, per_node=None, start=True, **config) ->
    [Node] n1..nN (tests/fleet/nodes.py), started (all spawned, then each
    waited for), each with its own store under tmp_path/nI, fleet.postgres
    a fresh database (the same for all of one call) at the bridge's address
    and fleet.node nI. config: more INI keys (see _node_settings);
    per_node: {"n2": {key: value}} on top. The factory's .db is the last
    database made. At test end every node's link is set up again and the
    node stopped (SIGTERM, else SIGKILL); while the test runs, each node's log is
    attached to a failing test's report; a link shaped (Node.shape) is
    unshaped."""
    from nodes import Node
    made = []

    def make(n=3, per_node=None, start=True, **config):
        db, _ = fresh_db(fleet_pg, "tvnodes_")
        make.db = db
        dsn = fleet_pg.dsn_on(fleet_net.host_ip, db)
        out = []
        for _ in range(n):
            i = len(made) + 1
            name = f"n{i}"
            settings = {"fleet.postgres": dsn, "fleet.node": name, **_node_settings(config),
                        **_node_settings((per_node or {}).get(name, {}))}
            node = Node(fleet_net, i, build_dir, tmp_path / name, settings=settings, name=name)
            made.append(node)
            out.append(node)
            _LOGS[f"node {name}"] = node.log
        if start:
            for node in out:
                node.spawn()
            for node in out:
                node.wait_healthy()
        return out

    make.db = None
    try:
        yield make
    finally:
        for node in made:
            if node.ns:  # first, so that a node cut off stops as quickly as the others
                try:
                    node.link_up()
                    node.unshape()  # the namespaces outlive the test: the next one starts unthrottled
                except Exception:  # noqa: BLE001 - the namespace may be gone already
                    pass
            try:
                node.stop(timeout=10)
            except AssertionError:
                pass  # stop() SIGKILLed it
            finally:
                node.kill()
                _LOGS.pop(f"node {node.name}", None)
