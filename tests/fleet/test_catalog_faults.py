"""Faults of the fleet catalog around a daemon (server/fleet): a catalog
that stops answering must never keep the daemon from stopping."""
import os
import signal
import time
import uuid

import numpy as np

from harness.daemon import Daemon, make_checkpoint
from harness.postgres import fresh_db
from harness.wait import wait_for


def count(postgres, db, sql):
    """The count sql answers; -1 while the daemon has not created the
    catalog's tables yet."""
    r = postgres.psql(sql, as_app=True, dbname=db, check=False)
    return int(r.stdout.strip()) if r.returncode == 0 else -1


def checkpoint(tmp_path, name, seed):
    rng = np.random.default_rng(seed)
    tensors = {f"w.{i}": rng.standard_normal((4, i + 1)).astype(np.float16) for i in range(4)}
    return make_checkpoint(tmp_path / name / "model.safetensors", tensors)


def test_stop_while_the_catalog_hangs(build_dir, postgres, tmp_path):
    """The backend serving the daemon is SIGSTOPped (a hung server: TCP is
    still acknowledged, so no keepalive notices) while the fleet thread
    publishes: SIGTERM still stops the daemon, with exit status 0."""
    db, dsn = fresh_db(postgres, "tvflt_")
    d = Daemon(build_dir, tmp_path, name="h",
               settings={"store.image_size": "256M", "fleet.postgres": dsn, "fleet.node": "node-h"})
    d.start()
    backend = None
    try:
        d.import_ok("hang", checkpoint(tmp_path, "a", 1))
        wait_for(lambda: count(postgres, db, "SELECT count(*) FROM generations "
                                             "WHERE model = 'hang'") == 1,
                 what="generation 1 published")
        pids = postgres.psql("SELECT pid FROM pg_stat_activity WHERE datname = "
                             f"'{db}' AND application_name = 'tensorvaultd'").split()
        assert len(pids) == 1, pids
        backend = int(pids[0])
        os.kill(backend, signal.SIGSTOP)
        # an import kicks the fleet thread: its BEGIN waits on the stopped backend
        d.import_ok("hang", checkpoint(tmp_path, "b", 2))
        time.sleep(1.0)
        t0 = time.monotonic()
        rc = d.stop(timeout=30)
        took = time.monotonic() - t0
        assert rc == 0, d.log_text()
        assert took < 15, f"stopping took {took:.1f} s\n{d.log_text()}"
        assert "did not answer within" in d.log_text()
        assert postgres.password not in d.log_text()
    finally:
        if backend:
            os.kill(backend, signal.SIGCONT)
        if d.alive():
            d.kill9()


def test_names_stay_utf8_in_a_latin1_catalog(build_dir, postgres, tmp_path):
    """The catalog's database is LATIN1: the daemon's names are UTF-8 (the
    registry's), so they are sent as UTF-8 whatever the database's encoding
    (libpq's default client_encoding is the database's), never stored as
    mojibake."""
    name = "tvl1_" + uuid.uuid4().hex[:10]
    postgres.psql(f"CREATE DATABASE {name} OWNER {postgres.user} ENCODING 'LATIN1' "
                  "LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    dsn = postgres.dsn.rsplit("/", 1)[0] + "/" + name
    d = Daemon(build_dir, tmp_path, name="l1",
               settings={"store.image_size": "256M", "fleet.postgres": dsn, "fleet.node": "node-l1"})
    d.start()
    try:
        src = make_checkpoint(tmp_path / "c" / "model.safetensors",
                              {"poids.\u00e9": np.arange(8, dtype=np.float32),
                               "plain": np.arange(4, dtype=np.float32)})
        d.import_ok("m", src)
        wait_for(lambda: count(postgres, name, "SELECT count(*) FROM generations "
                                               "WHERE model = 'm'") == 1,
                 what="generation 1 published")
        got = postgres.psql("SELECT count(*) FROM tensors WHERE model = 'm' "
                            "AND name = U&'poids.\\00E9'", as_app=True, dbname=name).strip()
        assert got == "1", postgres.psql("SELECT name, length(name) FROM tensors",
                                         as_app=True, dbname=name)
        assert d.stop() == 0, d.log_text()
    finally:
        if d.alive():
            d.kill9()


def keepalive_timers(pid, port):
    """[(timer kind, seconds left)] of pid's established TCP connections to
    port, from /proc/net/tcp (kind 2 = keepalive)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    out = []
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            c = line.split()
            if c[3] != "01" or int(c[2].split(":")[1], 16) != port or c[9] not in inodes:
                continue
            kind, when = c[5].split(":")
            out.append((int(kind, 16), int(when, 16) / os.sysconf("SC_CLK_TCK")))
    return out


def test_connection_notices_a_vanished_server(build_dir, postgres, tmp_path, dsn_suffix=""):
    """A server that vanishes (a lost network: no RST) while the thread waits
    on it is noticed by TCP keepalives within seconds, not the system's 2 h:
    the daemon's catalog connection has a keepalive timer of at most 30 s."""
    db, dsn = fresh_db(postgres, "tvflt_")
    d = Daemon(build_dir, tmp_path, name="k",
               settings={"store.image_size": "256M", "fleet.postgres": dsn + dsn_suffix,
                         "fleet.node": "node-k"})
    d.start()
    try:
        wait_for(lambda: count(postgres, db, "SELECT count(*) FROM nodes") == 1,
                 what="the node row")
        timers = keepalive_timers(d.proc.pid, postgres.port)
        assert len(timers) == 1, timers
        kind, left = timers[0]
        assert kind == 2 and left <= 30, timers
        assert d.stop() == 0, d.log_text()
    finally:
        if d.alive():
            d.kill9()


def test_node_ages_grow_while_the_catalog_is_away(build_dir, postgres, tmp_path):
    """PostgreSQL stopped: GET /v1/fleet keeps the last document read, and
    each node's age in it goes on growing (this node's: the time since its
    last heartbeat the catalog took; a peer's: its age when read plus the
    time since), so a node unseen for fleet.node_down_s shows down; once the
    catalog is back the ages are fresh again."""
    db, dsn = fresh_db(postgres, "tvflt_")
    down_s = 4
    d = Daemon(build_dir, tmp_path, name="a",
               settings={"store.image_size": "256M", "fleet.postgres": dsn,
                         "fleet.node": "node-a", "fleet.node_down_s": str(down_s)})
    d.start()

    def me():
        doc = d.ok("GET", "/v1/fleet")
        n = [x for x in doc["nodes"] if x["name"] == "node-a"]
        return doc, (n[0] if n else None)

    try:
        wait_for(lambda: me()[1] and me()[1]["up"] and me()[0]["catalog"]["connected"],
                 what="node-a up in its GET /v1/fleet")
        doc, n = me()
        assert doc["node_down_s"] == down_s and n["age_s"] < down_s, doc
        postgres.stop()
        t_stop = time.monotonic()
        try:
            wait_for(lambda: me()[0]["catalog"]["connected"] is False, timeout=20,
                     what="the catalog seen away")
            a1 = me()[1]["age_s"]
            wait_for(lambda: me()[1]["age_s"] >= a1 + 1.5, timeout=10,
                     what="node-a's age to grow while the catalog is away")
            doc, n = wait_for(lambda: (lambda dn: dn if dn[1]["up"] is False else None)(me()),
                              timeout=20, what="node-a down after fleet.node_down_s")
            away = time.monotonic() - t_stop
            print(f"catalog away {away:.1f} s: node-a age {n['age_s']} s, "
                  f"document read {doc['catalog']['read_s_ago']} s ago")
            # at most a heartbeat (node_down_s / 3) older than the outage
            assert down_s <= n["age_s"] <= away + down_s / 3 + 1.5, (n, away)
            assert doc["catalog"]["read_s_ago"] >= 1, doc["catalog"]
        finally:
            postgres.start()
        wait_for(lambda: me()[0]["catalog"]["connected"] and me()[1]["up"], timeout=30,
                 what="node-a up again once the catalog is back")
        assert me()[1]["age_s"] < down_s
        assert d.stop() == 0, d.log_text()
    finally:
        if d.alive():
            d.kill9()
