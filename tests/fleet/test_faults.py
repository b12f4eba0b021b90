"""Rollout faults on the netns harness (docs/fleet.md
"Faults"): three nodes in namespaces of their own, a 32 MB two-shard
checkpoint imported on n1, the pulling nodes' links throttled with tc (5 MB/s:
a pull takes about 6.5 s), and one fault in the middle of the pull:

1. n3 SIGKILLed mid-pull: n1 and n2 switch on the quorum once the timeout
   passed (not before); n3 started again pulls, reports ready and switches;
2. n3 cut off mid-pull (link down): the others switch after the timeout, n1
   shows n3 'up' false once its heartbeat expired, n3's pull attempt fails
   (it keeps serving inside its namespace); after link up a new attempt
   finishes and n3 switches, also when the peer it was pulling from is its
   only source (that peer was dropped when the transfer stalled);
3. PostgreSQL stopped while n2 and n3 pull: every node keeps serving what
   it holds and GET /v1/fleet answers (catalog not connected, the reason,
   the last document kept); the pulls finish without the catalog, nobody
   switches; after the start the heartbeats resume and the rollout
   completes everywhere.

Every node's bytes are compared with the official safetensors loader's."""
import json
import os
import sqlite3
import time

import numpy as np
import pytest

from harness.daemon import make_checkpoint
from harness.nodes import assert_same_as_safetensors
from harness.wait import wait_for
from .test_rollout import alias_state, fleet, local_alias, move

TOKEN = "fleet-faults-secret-0123456789"
RATE = "40mbit"  # 5 MB/s: a pull of the 32 MB model takes about 6.5 s
MODEL_MB = 32
TIMEOUT_S = 5  # the rollouts' timeout_s (quorum 2)
KILL_TIMEOUT_S = 8  # the kill waits for the first resume record (a shard flushed, ~3.5 s)
NODE_DOWN_S = 5  # fleet.node_down_s of the cut-off test (the default 30 s would make it 50 s)


@pytest.fixture(autouse=True)
def _netns(fleet_net):
    if not fleet_net.available:
        pytest.skip(f"the fault tests need network namespaces: {fleet_net.reason}")


def big_sharded(root, seed, mb=MODEL_MB):
    """A checkpoint of about mb MB (random F32 tensors and an F16 one) in two
    shards with an index: (directory, bytes of its shards)."""
    rng = np.random.default_rng(seed)
    n = 8
    per = mb * (1 << 20) // n // 4
    t = {f"layers.{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(n)}
    t["norm"] = rng.standard_normal(64).astype(np.float16)
    names = sorted(t)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    total = 0
    wm = {}
    for fname, keys in shards.items():
        make_checkpoint(root / fname, {k: t[k] for k in keys})
        total += (root / fname).stat().st_size
        wm.update({k: fname for k in keys})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {},
                                                                   "weight_map": wm}))
    return root, total


def small(root, seed):
    rng = np.random.default_rng(seed)
    t = {f"w.{i}": rng.standard_normal((16, i + 3)).astype(np.float16) for i in range(4)}
    return make_checkpoint(root / "model.safetensors", t)


def entry(d, model, alias, node):
    """node's entry of model@alias in d's GET /v1/fleet ({} when absent)."""
    a = alias_state(d, model, alias)
    for x in (a or {}).get("nodes", []):
        if x["node"] == node:
            return x
    return {}


def pulling(d, model, alias, node):
    e = entry(d, model, alias, node)
    return e.get("state") == "pulling" and e.get("bytes_done", 0) > 0


def flushed(node, model):
    """Bytes the resume record of node's newest import of model names as
    written and flushed (its jobs.resume record; 0: none yet)."""
    try:
        con = sqlite3.connect(f"file:{os.path.join(node.store, 'registry.db')}?mode=ro",
                              uri=True, timeout=5)
        try:
            row = con.execute("SELECT resume FROM jobs WHERE model = ? AND resume IS NOT NULL "
                              "ORDER BY id DESC LIMIT 1", (model,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return 0
    return sum(o["done"] for o in json.loads(row[0])["objects"]) if row else 0


def catalog_q(pg, db, sql):
    r = pg.psql(sql, as_app=True, dbname=db, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def last_seen(pg, db):
    """{node: last_seen as epoch seconds} by the catalog."""
    out = catalog_q(pg, db, "SELECT name, extract(epoch FROM last_seen) FROM nodes")
    return {n: float(v) for n, v in (line.split("|") for line in out.splitlines())}


def setup_big(nodes, tmp_path, seed):
    """n1 imports the big checkpoint and publishes it: (dir, bytes, generation)."""
    n1 = nodes[0]
    wait_for(lambda: len(fleet(n1)["nodes"]) == 3, what="three nodes in the catalog")
    src, model_bytes = big_sharded(tmp_path / "n1" / "big", seed)
    gen = n1.import_ok("big", str(src))["generation"]
    wait_for(lambda: any(g["model"] == "big" and g["holders"] == ["n1"]
                         for g in fleet(n1)["generations"]), what="n1 holds big in the catalog")
    return src, model_bytes, gen


def switch_times(t0, nodes, gen, timeout):
    """Seconds from t0 at which each node was first seen serving big@prod gen."""
    seen = {}

    def all_switched():
        for n in nodes:
            if n.name not in seen and local_alias(n, "big", "prod") == gen:
                seen[n.name] = time.monotonic() - t0
        return len(seen) == len(nodes)

    wait_for(all_switched, timeout=timeout, what=f"{[n.name for n in nodes]} switched")
    return seen


def big_jobs(d):
    return [j for j in d.ok("GET", "/v1/jobs")["jobs"] if j["model"] == "big"]


def test_node_killed_mid_pull_catches_up(fleet_nodes, tmp_path):
    nodes = fleet_nodes(3, fleet_token=TOKEN)
    n1, n2, n3 = nodes
    src, model_bytes, gen = setup_big(nodes, tmp_path, 21)
    n3.shape(RATE)
    t0 = time.monotonic()
    r = move(n1, "big", "prod", gen, 0, quorum=2, timeout_s=KILL_TIMEOUT_S)
    assert r.status == 200, r
    wait_for(lambda: pulling(n1, "big", "prod", "n3"), timeout=30,
             what="n3 pulling with bytes > 0")
    # killed once its first shard is written and flushed (its job row says so)
    wait_for(lambda: flushed(n3, "big") > 0, timeout=30, what="n3's first resume record")
    t_kill = time.monotonic() - t0
    assert t_kill < KILL_TIMEOUT_S - 1, f"n3 reported bytes only {t_kill:.1f} s after the move"
    assert n3.kill() == -9
    seen = switch_times(t0, (n1, n2), gen, 30)
    print(f"n3 killed {t_kill:.1f} s after the move; n1, n2 switched at {seen} "
          f"(timeout_s {KILL_TIMEOUT_S})")
    for name, t in seen.items():
        assert t >= KILL_TIMEOUT_S - 0.3, f"{name} switched {t:.1f} s after the move, before the timeout"
    assert local_alias(n1, "big", "prod") == gen
    # n3 comes back (still throttled), pulls again, is ready and switches
    rx0 = n3.rx_bytes()
    n3.start()
    wait_for(lambda: local_alias(n3, "big", "prod") == gen, timeout=60, what="n3 switched")
    fetched_after_restart = n3.rx_bytes() - rx0
    print(f"n3 fetched {fetched_after_restart} bytes after its restart; the model is "
          f"{model_bytes} bytes ({fetched_after_restart / model_bytes:.2f}x)")
    # the killed pull resumed: what was written and flushed is not fetched
    # again (rx_bytes counts everything n3's link delivered, HTTP and
    # catalog traffic too, about 1% of the model)
    assert fetched_after_restart < model_bytes * 0.9, (fetched_after_restart, model_bytes)
    assert "resumed from the device" in n3.log_text()
    states = sorted(j["state"] for j in big_jobs(n3))
    assert states == ["failed", "succeeded"], states  # the killed job, the new one
    wait_for(lambda: all(x["state"] == "ready" and x["serving"] == gen
                         for x in alias_state(n1, "big", "prod")["nodes"]), timeout=30,
             what="every node ready and serving in the catalog")
    n3.unshape()
    for n in nodes:
        assert_same_as_safetensors(n, "big@prod", src)


@pytest.mark.parametrize("peers", ["two_peers", "one_peer"])
def test_node_cut_off_mid_pull_finishes_after_link_up(fleet_nodes, tmp_path, peers):
    """two_peers: placed on all three (quorum 2); one_peer: placed on n1 and
    n3 only (quorum 1), so n1 is n3's only source: the peer whose transfer
    stalled because n3 was cut off must not be lost as a source for good."""
    # a stalled transfer fails after 3 s without a byte, one retry
    # ... a node is down 5 s after its last heartbeat (fleet.node_down_s),
    # and a catalog connection lost without a reset fails within 5 s (not
    # the default 30 s of tcp_user_timeout)
    nodes = fleet_nodes(3, fleet_token=TOKEN, import_http_timeout=3, import_http_retries=1,
                        fleet_node_down_s=NODE_DOWN_S, dsn_query="tcp_user_timeout=5000")
    n1, n2, n3 = nodes
    src, _, gen = setup_big(nodes, tmp_path, 22)
    n3.shape(RATE)
    placed = (n1, n2) if peers == "two_peers" else (n1,)
    t0 = time.monotonic()
    if peers == "two_peers":
        r = move(n1, "big", "prod", gen, 0, quorum=2, timeout_s=TIMEOUT_S)
    else:
        r = move(n1, "big", "prod", gen, 0, placement=["n1", "n3"], quorum=1,
                 timeout_s=TIMEOUT_S)
    assert r.status == 200, r
    wait_for(lambda: pulling(n1, "big", "prod", "n3"), timeout=30,
             what="n3 pulling with bytes > 0")
    t_cut = time.monotonic() - t0
    assert t_cut < TIMEOUT_S - 1, f"n3 reported bytes only {t_cut:.1f} s after the move"
    n3.link_down()
    seen = switch_times(t0, placed, gen, 30)
    for name, t in seen.items():
        assert t >= TIMEOUT_S - 0.3, f"{name} switched {t:.1f} s after the move, before the timeout"
    # n1's view of n3: its last report (pulling, bytes stuck), 'up' false
    # once its heartbeat is NODE_DOWN_S old
    wait_for(lambda: entry(n1, "big", "prod", "n3").get("up") is False, timeout=30,
             what="n1 to show n3 down")
    e = entry(n1, "big", "prod", "n3")
    print(f"n1 shows n3 as {e} ({time.monotonic() - t0:.1f} s after the move)")
    assert e["state"] == "pulling" and 0 < e["bytes_done"] < e["bytes_total"], e
    age = next(x["age_s"] for x in fleet(n1)["nodes"] if x["name"] == "n3")
    assert age >= NODE_DOWN_S, age
    # n3, cut off, still answers inside its namespace: its catalog is away,
    # its pull attempt failed (no byte for 3 s)
    def n3_own(path):
        st, body = n3.ns_http(n3.url + path, timeout=5, token=n3.admin_token)
        assert st == 200, (path, st, body)
        return json.loads(body)

    wait_for(lambda: n3_own("/v1/fleet")["catalog"]["connected"] is False, timeout=20,
             what="n3 to see its catalog away")
    wait_for(lambda: any(j["model"] == "big" and j["state"] == "failed"
                         for j in n3_own("/v1/jobs")["jobs"]), timeout=20,
             what="n3's cut-off pull attempt to fail")
    n3.link_up()
    wait_for(lambda: local_alias(n3, "big", "prod") == gen, timeout=60,
             what="n3 switched after link up")
    print(f"n3 switched {time.monotonic() - t0:.1f} s after the move")
    states = [j["state"] for j in big_jobs(n3)]
    assert states.count("succeeded") == 1 and "failed" in states, states
    assert "failed (attempt 1 of 3)" in n3.log_text()
    wait_for(lambda: all(x["state"] == "ready" and x["serving"] == gen and x["up"]
                         for x in alias_state(n1, "big", "prod")["nodes"]), timeout=30,
             what="every placed node up, ready and serving in the catalog")
    n3.unshape()
    for n in placed + (n3,):
        assert_same_as_safetensors(n, "big@prod", src)
    if peers == "one_peer":
        assert local_alias(n2, "big", "prod") is None and n2.generations("big") == []
        # n1 was dropped as a source when n3's transfer stalled, and was
        # tried again once nothing else was left
        log = n3.log_text()
        assert "dropping http://" in log and "trying them again" in log, log


def test_postgres_restart_during_rollout(fleet_nodes, fleet_pg, tmp_path):
    nodes = fleet_nodes(3, fleet_token=TOKEN)
    n1, n2, n3 = nodes
    db = fleet_nodes.db
    # a model already rolled out everywhere: served through the outage
    tiny = small(tmp_path / "n1" / "tiny", 5)
    src, _, gen = setup_big(nodes, tmp_path, 23)
    tgen = n1.import_ok("tiny", tiny)["generation"]
    wait_for(lambda: any(g["model"] == "tiny" for g in fleet(n1)["generations"]),
             what="tiny published")
    assert move(n1, "tiny", "prod", tgen, 0).status == 200
    for n in nodes:
        wait_for(lambda n=n: local_alias(n, "tiny", "prod") == tgen, timeout=30,
                 what=f"{n.name} serving tiny@prod")
    n2.shape(RATE)
    n3.shape(RATE)
    assert move(n1, "big", "prod", gen, 0).status == 200
    wait_for(lambda: pulling(n1, "big", "prod", "n2") and pulling(n1, "big", "prod", "n3"),
             timeout=30, what="n2 and n3 pulling with bytes > 0")
    seen0 = last_seen(fleet_pg, db)
    fleet_pg.stop()
    t_stop = time.monotonic()
    try:
        for n in nodes:
            # GET /v1/fleet answers without PostgreSQL: not connected, with
            # the reason, and the last document read
            wait_for(lambda n=n: fleet(n)["catalog"]["connected"] is False, timeout=15,
                     what=f"{n.name} to see the catalog away")
            st = fleet(n)
            assert st["mode"] == "fleet" and st["catalog"]["error"], st["catalog"]
            assert alias_state(n, "big", "prod")["generation"] == gen
            assert_same_as_safetensors(n, "tiny@prod", tiny)
            assert local_alias(n, "big", "prod") is None  # n2, n3 not ready in the catalog
        # the pulls go on without the catalog (peers over HTTP) and finish
        for n in (n2, n3):
            wait_for(lambda n=n: [j["state"] for j in big_jobs(n)] == ["succeeded"], timeout=30,
                     what=f"{n.name}'s pull to finish without the catalog")
        # nobody switches: the catalog does not know they are ready
        time.sleep(max(0, 2 - (time.monotonic() - t_stop)))  # at least 2 s without it
        for n in nodes:
            assert local_alias(n, "big", "prod") is None, n.name
    finally:
        fleet_pg.start()
    print(f"PostgreSQL was down {time.monotonic() - t_stop:.1f} s")
    wait_for(lambda: (lambda s: all(s.get(n.name, 0) > seen0[n.name] for n in nodes))(
        last_seen(fleet_pg, db)), timeout=30, what="every node's heartbeat after the restart")
    for n in nodes:
        wait_for(lambda n=n: fleet(n)["catalog"]["connected"] is True, timeout=15,
                 what=f"{n.name} connected again")
    for n in nodes:
        wait_for(lambda n=n: local_alias(n, "big", "prod") == gen, timeout=60,
                 what=f"{n.name} switched after the restart")
    wait_for(lambda: all(x["state"] == "ready" and x["serving"] == gen
                         for x in alias_state(n1, "big", "prod")["nodes"]), timeout=30,
             what="every node ready and serving in the catalog")
    n2.unshape()
    n3.unshape()
    for n in nodes:
        assert_same_as_safetensors(n, "big@prod", src)
        assert_same_as_safetensors(n, "tiny@prod", tiny)
