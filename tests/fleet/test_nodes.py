"""The three-node harness (harness.nodes, the fleet conftest's fleet_nodes):
three daemons with stores of their own in network namespaces on a bridge,
registered in one catalog; what one imports is published; the nodes reach
each other and PostgreSQL over the bridge; a node cut off (link down) keeps
serving inside its namespace, stops its heartbeat and resumes it once the
link is back; a node killed and started again keeps its store."""
import os

import numpy as np
import pytest

from harness.daemon import make_checkpoint
from harness.nodes import assert_same_as_safetensors, read_all
from harness.wait import wait_for


def q(pg, db, sql):
    """psql's answer; "" while it fails (the first node has not made the
    catalog's tables yet)."""
    r = pg.psql(sql, as_app=True, dbname=db, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def checkpoint(node, name, seed):
    """A small checkpoint in node's import root (F16 and F32 tensors)."""
    rng = np.random.default_rng(seed)
    t = {f"layers.{i}.weight": rng.standard_normal((8, i + 2)).astype(np.float16) for i in range(5)}
    t["norm"] = rng.standard_normal(16).astype(np.float32)
    return make_checkpoint(f"{node.workdir}/{name}/model.safetensors", t)


def published(pg, db, model, number, by):
    return q(pg, db, f"SELECT published_by FROM generations WHERE model = '{model}' "
                     f"AND number = {number}") == by


def age_s(pg, db, node):
    """Seconds since node's last heartbeat, by PostgreSQL's clock."""
    v = q(pg, db, f"SELECT extract(epoch FROM now() - last_seen) FROM nodes WHERE name = '{node}'")
    return float(v) if v else None


def test_three_nodes_register_and_publish(fleet_nodes, fleet_pg, fleet_net):
    nodes = fleet_nodes(3)
    db = fleet_nodes.db
    assert len({n.store for n in nodes}) == 3
    want = sorted(f"{n.name}|{n.url}|up" for n in nodes)
    wait_for(lambda: sorted(q(fleet_pg, db, "SELECT name, url, state FROM nodes").splitlines())
             == want, what="three nodes in the catalog")
    if fleet_net.available:
        assert len({n.url for n in nodes}) == 3 and len({n.ns for n in nodes}) == 3
    src = checkpoint(nodes[0], "m", 1)
    nodes[0].import_ok("tiny", src, activate=True)
    wait_for(lambda: published(fleet_pg, db, "tiny", 1, "n1"), what="generation 1 published by n1")
    assert q(fleet_pg, db, "SELECT state FROM generations WHERE model = 'tiny'") == "ready"
    assert_same_as_safetensors(nodes[0], "tiny", src)
    assert_same_as_safetensors(nodes[0], "tiny@1", src)
    # the others hold nothing of it: stores of their own
    for n in nodes[1:]:
        assert n.generations("tiny") == []
    st, body = nodes[0].api("GET", "/v1/models/tiny")
    assert st == 200 and body["active_generation"] == 1, body
    assert nodes[1].api("GET", "/v1/models", token="wrong")[0] == 401


def test_reach_across_the_bridge(fleet_nodes, fleet_pg, fleet_s3, fleet_net):
    if not fleet_net.available:
        pytest.skip(f"namespaces: {fleet_net.reason}")
    n1, n2, _ = fleet_nodes(3)
    st, body = n2.ns_http(n1.url + "/healthz")
    assert st == 200, body
    # moto answers at the bridge's address (a signed ListBuckets) and still
    # at 127.0.0.1 for the tests
    fleet_s3.bucket("tvnodes")
    r = n2.ns_run(["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}",
                   "--aws-sigv4", f"aws:amz:{fleet_s3.region}:s3",
                   "--user", f"{fleet_s3.access_key}:{fleet_s3.secret_key}",
                   "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                   fleet_s3.endpoint_on(fleet_net.host_ip) + "/"])
    assert r.stdout.endswith("\n200") and "<Name>tvnodes</Name>" in r.stdout, (r.stdout, r.stderr)
    assert "tvnodes" in fleet_s3.buckets()
    r = n2.ns_run([fleet_pg._bin("psql"), fleet_pg.dsn_on(fleet_net.host_ip, fleet_nodes.db),
                   "-X", "-A", "-t", "-c", "SELECT 1"], env={**os.environ, "PGCONNECT_TIMEOUT": "5"})
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    # loopback inside a namespace is its own: n1's address, not 127.0.0.1
    assert n2.ns_http(f"http://127.0.0.1:{n1.port}/healthz", timeout=1)[0] == 0


def test_link_down_and_up(fleet_nodes, fleet_pg):
    # fleet.node_down_s 6: a heartbeat every 2 s (a third of it)
    nodes = fleet_nodes(3, fleet_node_down_s=6)
    n1, n2, _ = nodes
    db = fleet_nodes.db
    wait_for(lambda: q(fleet_pg, db, "SELECT count(*) FROM nodes") == "3", what="three nodes")
    n2.link_down()  # skips without namespaces, with the reason
    st, _ = n2.ns_http(n2.url + "/healthz")
    assert st == 200, "n2 does not answer inside its namespace"
    assert n1.ns_http(n2.url + "/healthz", timeout=1)[0] == 0, "n1 still reaches n2"
    # the heartbeat (every 2 s) stops: 5 s without one, by PostgreSQL's
    # clock, while n1 goes on
    wait_for(lambda: (age_s(fleet_pg, db, "n2") or 0) > 5, timeout=20,
             what="n2's last_seen to stop advancing")
    assert age_s(fleet_pg, db, "n1") < 4.5
    assert n2.alive(), n2.log_tail()
    n2.link_up()
    wait_for(lambda: age_s(fleet_pg, db, "n2") < 2, timeout=25,
             what="n2's last_seen to advance again after link_up")
    assert n1.ns_http(n2.url + "/healthz")[0] == 200
    assert n2.api("GET", "/healthz", token=None)[0] == 200
    assert fleet_pg.password not in n2.log_text()


def test_kill_and_start_keeps_the_store(fleet_nodes, fleet_pg):
    nodes = fleet_nodes(3)
    n3 = nodes[2]
    db = fleet_nodes.db
    src = checkpoint(n3, "k", 7)
    n3.import_ok("keep", src, activate=True)
    wait_for(lambda: published(fleet_pg, db, "keep", 1, "n3"), what="published by n3")
    before = n3.generations("keep")
    data = read_all(n3, "keep@1")
    assert n3.kill() == -9
    assert not n3.alive()
    n3.start()
    assert n3.generations("keep") == before
    got = read_all(n3, "keep@1")
    assert sorted(got) == sorted(data)
    assert all(got[k].tobytes() == data[k].tobytes() for k in data)
    assert_same_as_safetensors(n3, "keep", src)
    wait_for(lambda: age_s(fleet_pg, db, "n3") is not None and age_s(fleet_pg, db, "n3") < 2,
             what="n3's heartbeat after the restart")
    assert q(fleet_pg, db, "SELECT count(*) FROM generations WHERE model = 'keep'") == "1"
    assert q(fleet_pg, db, "SELECT state FROM nodes WHERE name = 'n3'") == "up"
