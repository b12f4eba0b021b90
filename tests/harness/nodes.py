"""Several tensorvaultd nodes on one machine, for the fleet tests
(tests/fleet/conftest.py's fixtures `fleet_net`, `fleet_pg`, `fleet_s3` and
`fleet_nodes` use it, and the fleet benchmark).

The network (Net): as root with `ip`, a bridge tvfbr<pid> holding
10.231.X.1/24 (X free on this machine, chosen under a lock) and, per node, a
namespace tvf<pid>n<i> joined to the bridge by a veth pair (host side
tvf<pid>h<i>, up; namespace side with 10.231.X.(10+i)/24, lo up). PostgreSQL
and moto listen on the bridge address as well (Postgres.listen_also,
S3.bind_all), so the nodes reach them, and each other, over the bridge.
Node.shape(rate) throttles a node's link both ways with tc's token bucket
(unshape() removes it; the fixture does at test end). link_down() sets the
host side of a node's veth down: the node keeps
running, cut off from PostgreSQL, S3, the other nodes and the tests (which
reach it again from inside its namespace: Node.ns_http). Net.create removes
what a killed earlier run left (same prefix, dead pid) before it makes its
own; Net.close removes everything it made.

Without root or `ip`, when making the bridge fails, or with
TV_FLEET_NO_NETNS=1 in the environment, Net.available is
False with the reason, the nodes listen on free 127.0.0.1 ports, and
link_down()/link_up()/ns_http() skip the test with that reason.

Node: one tensorvaultd (harness.daemon's Daemon, so import_ok,
wait_job, generations, ok, ... work) with its own store and INI config,
started in its namespace on ADDRESS:8470."""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from harness.daemon import ADMIN, SLOW, Daemon, Resp, seg
from harness.net import free_port

PREFIX = "tvf"
NODE_PORT = 8470  # every node has a network stack of its own: one port for all
_LEFTOVER = re.compile(r"^tvf(?:br(\d+)|(\d+)[hn]\d+)$")
_LOCK = "/run/lock/tvfleet-net.lock"


def _ip(*args, check=True, ns=None):
    argv = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _names():
    """(links, namespaces) on this machine whose names have our prefix."""
    links = []
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            links.append(parts[1].strip().split("@")[0])
    nss = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines()
           if line.strip()]
    return ([n for n in links if _LEFTOVER.match(n)], [n for n in nss if _LEFTOVER.match(n)])


def _owner(name):
    m = _LEFTOVER.match(name)
    return int(m.group(1) or m.group(2))


def _kill_ns_processes(ns):
    """SIGKILLs what still runs in namespace ns (daemons of a test run that
    was killed itself) and waits for them to go."""
    r = _ip("netns", "pids", ns, check=False)
    pids = [int(p) for p in r.stdout.split() if p.isdigit()]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def remove_leftovers(keep_pid=None):
    """Removes the namespaces (and what runs in them) and links of earlier
    runs whose pid is dead; keep_pid's own are kept whatever."""
    links, nss = _names()
    for ns in nss:
        pid = _owner(ns)
        if pid != keep_pid and not _pid_alive(pid):
            _kill_ns_processes(ns)
            _ip("netns", "del", ns, check=False)
    for link in links:
        pid = _owner(link)
        if pid != keep_pid and not _pid_alive(pid):
            _ip("link", "del", link, check=False)


class Net:
    """The bridge and the namespaces of one pytest session (see the module's
    docstring). available/reason; host_ip (what the nodes reach PostgreSQL
    and moto at); cidr; node_ip(i)."""

    def __init__(self, available, reason=""):
        self.available = available
        self.reason = reason
        self.pid = os.getpid()
        self.bridge = f"{PREFIX}br{self.pid}"
        self.third = None
        self.namespaces = {}  # index -> (ns, veth host side)

    @property
    def host_ip(self):
        return f"10.231.{self.third}.1" if self.available else "127.0.0.1"

    @property
    def cidr(self):
        return f"10.231.{self.third}.0/24" if self.available else "127.0.0.1/32"

    def node_ip(self, i):
        return f"10.231.{self.third}.{10 + i}" if self.available else "127.0.0.1"

    @classmethod
    def create(cls):
        if os.environ.get("TV_FLEET_NO_NETNS"):
            return cls(False, "TV_FLEET_NO_NETNS is set; the nodes share loopback")
        if os.geteuid() != 0:
            return cls(False, "network namespaces need root (the tests run as uid "
                              f"{os.geteuid()}); the nodes share loopback")
        if shutil.which("ip") is None:
            return cls(False, "`ip` (iproute2) not found; the nodes share loopback")
        net = cls(True)
        try:
            remove_leftovers(keep_pid=net.pid)
            net._make_bridge()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            net.close()
            return cls(False, f"cannot make the test network ({e}); the nodes share loopback")
        return net

    def _make_bridge(self):
        os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
        with open(_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions never pick the same subnet
            used = set(re.findall(r"inet 10\.231\.(\d+)\.",
                                  _ip("-o", "-4", "addr", "show", check=False).stdout))
            start = self.pid % 250
            for k in range(250):
                x = (start + k) % 250 + 1
                if str(x) not in used:
                    self.third = x
                    break
            else:
                raise RuntimeError("every 10.231.X.0/24 is in use")
            _ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0",
                "forward_delay", "0")
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")

    def peer(self, i):
        """The namespace side of node i's veth (its name inside the namespace)."""
        return f"{PREFIX}{self.pid}p{i}"

    def namespace(self, i):
        """(namespace, veth host side) of node i, made on first use."""
        if not self.available:
            return None, None
        if i in self.namespaces:
            return self.namespaces[i]
        ns, host, peer = f"{PREFIX}{self.pid}n{i}", f"{PREFIX}{self.pid}h{i}", self.peer(i)
        self.namespaces[i] = (ns, host)  # close() removes it even if what follows fails
        _ip("netns", "add", ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("link", "set", host, "master", self.bridge)
        _ip("link", "set", host, "up")
        _ip("link", "set", "lo", "up", ns=ns)
        _ip("addr", "add", f"{self.node_ip(i)}/24", "dev", peer, ns=ns)
        _ip("link", "set", peer, "up", ns=ns)
        return ns, host

    def close(self):
        for ns, host in self.namespaces.values():
            _kill_ns_processes(ns)
            _ip("netns", "del", ns, check=False)
            _ip("link", "del", host, check=False)  # gone with its peer already, usually
        self.namespaces = {}
        if self.third is not None or self.available:
            _ip("link", "del", self.bridge, check=False)


class Node(Daemon):
    """One tensorvaultd of a fleet test. index i: namespace tvf<pid>n<i>,
    address 10.231.X.(10+i) (127.0.0.1 without namespaces), node name
    settings["fleet.node"]. start()/stop()/kill() keep the store and the
    config (and, on loopback, the port)."""

    def __init__(self, net, index, build_dir, workdir, settings=None, name=None):
        os.makedirs(str(workdir), exist_ok=True)
        super().__init__(build_dir, workdir, settings={"store.image_size": "256M",
                                                      **(settings or {})},
                         name=name or f"n{index}")
        self.net = net
        self.index = index
        self.name = name or f"n{index}"
        self.ns, self.veth = net.namespace(index)
        self.addr = net.node_ip(index)
        self.port = NODE_PORT if self.ns else None

    # -- what the brief names -----------------------------------------------

    @property
    def url(self):
        return f"http://{self.addr}:{self.port}"

    @property
    def admin_token(self):
        return self.token

    def api(self, method, path, json=None, token=ADMIN, timeout=30):  # noqa: A002 - the brief's name
        """(status, the JSON body, else the raw body)."""
        r = self.request(method, path, body=json, token=token, timeout=timeout)
        if r.body and r.headers.get("content-type", "").startswith("application/json"):
            return r.status, r.json()
        return r.status, r.body

    def kill(self):
        """SIGKILL; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.kill()
        return self.proc.wait()

    def _need_ns(self, what):
        if not self.ns:
            pytest.skip(f"{what} needs network namespaces: {self.net.reason}")

    def link_down(self):
        """The host side of the node's veth down: it keeps running, cut off."""
        self._need_ns("link_down")
        _ip("link", "set", self.veth, "down")

    def link_up(self):
        self._need_ns("link_up")
        _ip("link", "set", self.veth, "up")

    def _tc(self, *args, ns=False, check=True):
        argv = (["ip", "netns", "exec", self.ns] if ns else []) + ["tc", *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def shape(self, rate="40mbit", burst="64kb", latency="500ms"):
        """Throttles the node's link both ways with a token bucket (tc tbf):
        what it receives on the host side of its veth, what it sends on the
        namespace side. Again: the new rate. unshape() (the fixture does it
        at test end) removes it."""
        self._need_ns("shape")
        if shutil.which("tc") is None:
            pytest.skip("`tc` (iproute2) not found: cannot shape a node's link")
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        self._tc("qdisc", "replace", "dev", self.veth, *tbf)
        self._tc("qdisc", "replace", "dev", self.net.peer(self.index), *tbf, ns=True)

    def unshape(self):
        if not self.ns or shutil.which("tc") is None:
            return
        self._tc("qdisc", "del", "dev", self.veth, "root", check=False)
        self._tc("qdisc", "del", "dev", self.net.peer(self.index), "root", ns=True, check=False)

    def rx_bytes(self):
        """Bytes the node's link has delivered to it so far (the host side
        of its veth's tx counter: it lives across restarts of the node)."""
        self._need_ns("rx_bytes")
        with open(f"/sys/class/net/{self.veth}/statistics/tx_bytes") as f:
            return int(f.read())

    def log_tail(self, n=60):
        return "".join(self.log_text().splitlines(True)[-n:])

    # -- inside the namespace -----------------------------------------------

    def ns_run(self, argv, timeout=30, **kw):
        """argv run inside the node's namespace (on the host without one)."""
        prefix = ["ip", "netns", "exec", self.ns] if self.ns else []
        return subprocess.run(prefix + list(argv), capture_output=True, text=True,
                              timeout=timeout, **kw)

    def ns_http(self, url, timeout=3, token=None):
        """(status, body) of GET url with curl from inside the namespace
        (token: sent as a bearer token); status 0 when nothing answered
        within timeout s."""
        self._need_ns("ns_http")
        auth = ["-H", f"Authorization: Bearer {token}"] if token else []
        r = self.ns_run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *auth,
                         "--connect-timeout", str(timeout), "--max-time", str(timeout), url],
                        timeout=timeout + 10)
        body, _, code = r.stdout.rpartition("\n")
        return (int(code) if code.strip().isdigit() else 0), body

    # -- life cycle (Daemon's, in the namespace, on ADDRESS:PORT) -------------

    def spawn(self, extra_args=(), port=None):
        if port:
            self.port = port
        elif not self.port:
            self.port = free_port()
        self.settings["http.listen"] = f"{self.addr}:{self.port}"
        self.write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        env.update({k: v for k, v in self.env.items() if v is not None})
        for k in [k for k, v in self.env.items() if v is None]:
            env.pop(k, None)
        prefix = ["ip", "netns", "exec", self.ns] if self.ns else []  # ip execs the daemon
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(prefix + [self.exe, "--config", self.config, *extra_args],
                                     cwd=self.workdir, stdout=logf, stderr=subprocess.STDOUT,
                                     env=env)
        logf.close()
        return self.proc

    def wait_healthy(self, timeout=30):
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
            self.kill()
            raise AssertionError(f"{self.name}: tensorvaultd did not answer /healthz on {self.url} "
                                 f"in {timeout * SLOW}s:\n{self.log_tail()}")
        raise AssertionError(f"{self.name}: tensorvaultd exited {self.proc.returncode}:\n"
                             f"{self.log_tail()}")

    def start(self, extra_args=(), timeout=30):
        """Starts (same store, same config) and waits for /healthz. On
        loopback a port taken meanwhile is retried on another."""
        for _ in range(3):
            self.spawn(extra_args)
            try:
                return self.wait_healthy(timeout)
            except AssertionError:
                if self.ns or "in use" not in self.log_tail(5):
                    raise
                self.port = None
        raise AssertionError(f"{self.name}: found no free port:\n{self.log_tail()}")

    def request(self, method, path, body=None, token=ADMIN, headers=None, raw=None, timeout=60):
        import http.client
        h = dict(headers or {})
        if token is ADMIN:
            token = self.token
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=timeout * SLOW)
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

    def __repr__(self):
        return f"<Node {self.name} {self.url} ns={self.ns}>"


# ---------------------------------------------------------------- model bytes

def _split_ref(model_ref):
    """NAME (the active generation), NAME@GEN or NAME@ALIAS -> (name, gen)."""
    name, sep, gen = str(model_ref).rpartition("@")
    return (name, gen) if sep else (gen, "active")


def read_all(node, model_ref):
    """{tensor name: numpy array} of model_ref (NAME, NAME@GEN, NAME@ALIAS)
    as node serves it through GET .../tensors/{t}/data, with the listing's
    dtype and shape (dtypes numpy lacks: the raw bytes as uint8)."""
    import numpy as np
    from harness.checkpoints import DTYPES
    name, gen = _split_ref(model_ref)
    base = f"/v1/models/{seg(name)}/generations/{seg(gen)}/tensors"
    tensors, cursor = [], None
    while True:
        q = "?limit=1000" + (f"&cursor={seg(cursor)}" if cursor else "")
        page = node.ok("GET", base + q)
        tensors += page["tensors"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    out = {}
    for t in tensors:
        body = node.ok("GET", f"{base}/{seg(t['name'])}/data")
        assert isinstance(body, bytes) and len(body) == t["nbytes"], (t, len(body))
        dt = DTYPES.get(t["dtype"])
        if dt is None:
            out[t["name"]] = np.frombuffer(body, dtype=np.uint8)
        else:
            out[t["name"]] = np.frombuffer(body, dtype=dt).reshape(t["shape"])
    return out


def assert_same_as_safetensors(node, model_ref, path):
    """What node serves for model_ref equals what the official loader
    (safetensors.numpy) reads from path (a .safetensors file, a list of
    them, or a directory of them): the same tensor names, and for each the
    same dtype, shape and bytes."""
    from safetensors.numpy import load_file
    if isinstance(path, (list, tuple)):
        files = [str(p) for p in path]
    elif os.path.isdir(str(path)):
        files = sorted(os.path.join(str(path), f) for f in os.listdir(str(path))
                       if f.endswith(".safetensors"))
    else:
        files = [str(path)]
    want = {}
    for f in files:
        want.update(load_file(f))
    got = read_all(node, model_ref)
    assert sorted(got) == sorted(want), (node.name, model_ref)
    for name, arr in want.items():
        g = got[name]
        assert g.dtype == arr.dtype, (name, g.dtype, arr.dtype)
        assert g.shape == arr.shape, (name, g.shape, arr.shape)
        assert g.tobytes() == arr.tobytes(), name
