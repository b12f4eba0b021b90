"""Fixtures of the fleet tests (tests/fleet): the servers fleet mode talks to,
all on this machine, started by the tests and stopped at session end (also
when a test fails; the tail of each server's log is attached to a failing
test's report: harness.logs).

- `postgres` (tests/conftest.py: the browser tests use it too): a
  PostgreSQL cluster of its own (harness.postgres).
- `s3`: a moto server that checks SigV4 for a fixed key pair (harness.s3).
- `origin`: a Range-capable HTTP origin over a directory with byte counters
  and fault switches (harness.origin).
- `fleet_nodes` (a factory, over `fleet_net`, `fleet_pg`, `fleet_s3`):
  tensorvaultd nodes, each in a network namespace of its own on a bridge
  (harness.nodes), sharing a fresh catalog database; PostgreSQL and moto
  then listen on the bridge's address too.

What is missing (the PostgreSQL binaries, curl, moto) fails the test with
the reason: scripts/deps installs them all."""
import os
import shutil
import sys
import tempfile

import pytest

from harness import logs, nodes
from harness.origin import Origin
from harness.postgres import fresh_db
from harness.s3 import S3


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
    logs.attach("moto", srv.logfile)
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
        logs.detach("moto")
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------- origin

@pytest.fixture(scope="session")
def origin():
    """An Origin (harness.origin) serving a fresh directory (.root)."""
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
    """The fleet network of this session (harness.nodes' Net): a
    bridge and a namespace per node, removed at session end; without root
    or `ip`, .available is False with the .reason (the nodes share
    loopback)."""
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
    """A factory: fleet_nodes(n=3, per_node=None, start=True, dsn_query=None, **config) ->
    [Node] n1..nN (harness.nodes), started (all spawned, then each
    waited for), each with its own store under tmp_path/nI, fleet.postgres
    a fresh database (the same for all of one call) at the bridge's address
    (dsn_query: libpq options appended to its URI, "tcp_user_timeout=5000")
    and fleet.node nI. config: more INI keys (see _node_settings);
    per_node: {"n2": {key: value}} on top. The factory's .db is the last
    database made. At test end every node's link is set up again and the
    node stopped (SIGTERM, else SIGKILL); while the test runs, each node's log is
    attached to a failing test's report; a link shaped (Node.shape) is
    unshaped."""
    made = []

    def make(n=3, per_node=None, start=True, dsn_query=None, **config):
        db, _ = fresh_db(fleet_pg, "tvnodes_")
        make.db = db
        dsn = fleet_pg.dsn_on(fleet_net.host_ip, db) + (f"?{dsn_query}" if dsn_query else "")
        out = []
        for _ in range(n):
            i = len(made) + 1
            name = f"n{i}"
            settings = {"fleet.postgres": dsn, "fleet.node": name, **_node_settings(config),
                        **_node_settings((per_node or {}).get(name, {}))}
            node = nodes.Node(fleet_net, i, build_dir, tmp_path / name, settings=settings, name=name)
            made.append(node)
            out.append(node)
            logs.attach(f"node {name}", node.log)
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
                logs.detach(f"node {node.name}")
