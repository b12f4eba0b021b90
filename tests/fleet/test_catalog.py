"""The fleet catalog on PostgreSQL (server/fleet, docs/fleet.md), step 1:
migrations applied once, a daemon with fleet.postgres publishing what it
imports, re-publishing idempotent, a PostgreSQL restart survived, and a
daemon without fleet.postgres untouched. Alias compare-and-set and NOTIFY
(no route calls them yet) run in the cmocka test test_catalog against a
database of its own (TV_TEST_PG_DSN)."""
import os
import subprocess
import time

import numpy as np
import pytest

from harness import ROOT
from harness.daemon import Daemon, make_checkpoint, seg
from harness.postgres import fresh_db
from harness.wait import wait_for


def q(postgres, db, sql):
    return postgres.psql(sql, as_app=True, dbname=db).strip()


def q_or_none(postgres, db, sql):
    """q, or None while it fails (e.g. a table a daemon's migration has not
    made yet: /healthz answers before the catalog is migrated)."""
    r = postgres.psql(sql, as_app=True, dbname=db, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def healthy(d):
    assert d.proc.poll() is None, d.log_text()
    try:
        return d.request("GET", "/healthz", token=None, timeout=2).status == 200
    except OSError:
        return False


def checkpoint(tmp_path, name, seed, n=6):
    rng = np.random.default_rng(seed)
    tensors = {f"layers.{i}.weight": rng.standard_normal((4, i + 1)).astype(np.float16)
               for i in range(n)}
    tensors["scalar"] = np.array(seed, dtype=np.float32)
    return make_checkpoint(tmp_path / name / "model.safetensors", tensors)


def fleet_daemon(build_dir, workdir, dsn, node, name="d"):
    os.makedirs(workdir, exist_ok=True)
    return Daemon(build_dir, workdir, name=name,
                  settings={"store.image_size": "256M", "fleet.postgres": dsn, "fleet.node": node})


def published(postgres, db, model, number):
    """True once the row is there; False while it is not, including while the
    daemon's catalog migration has not made the table yet."""
    return q_or_none(postgres, db, f"SELECT count(*) FROM generations WHERE model = '{model}' "
                                   f"AND number = {number}") == "1"


def test_two_daemons_migrate_once(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvcat_")
    a = fleet_daemon(build_dir, tmp_path / "a", dsn, "node-a")
    b = fleet_daemon(build_dir, tmp_path / "b", dsn, "node-b")
    a.spawn()
    b.spawn()
    try:
        for d in (a, b):
            wait_for(lambda d=d: healthy(d), what="healthz")
        wait_for(lambda: q_or_none(postgres, db, "SELECT count(*) FROM nodes") == "2",
                 what="both nodes")
        # every file of migrations/fleet applied
        n_files = len([f for f in os.listdir(os.path.join(ROOT, "migrations", "fleet"))
                       if f.endswith(".sql")])
        assert q(postgres, db, "SELECT version FROM tv_schema") == str(n_files)
        assert q(postgres, db, "SELECT count(*) FROM tv_schema") == "1"
        rows = q(postgres, db, "SELECT name, url <> '', state FROM nodes ORDER BY name")
        assert rows.splitlines() == ["node-a|t|up", "node-b|t|up"]
        for d in (a, b):
            assert "catalog not reachable" not in d.log_text()
            assert postgres.password not in d.log_text()
        # the migration ran once: one of the two logs says so
        applied = [d for d in (a, b) if "applied migration fleet/0001_catalog.sql" in d.log_text()]
        assert len(applied) == 1
        assert a.stop() == 0, a.log_text()
        assert b.stop() == 0, b.log_text()
    finally:
        a.stop()
        b.stop()


def test_import_published_and_idempotent(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvcat_")
    d = fleet_daemon(build_dir, tmp_path / "w", dsn, "node-pub")
    d.start()
    try:
        src = checkpoint(tmp_path / "w", "m1", 1)
        d.import_ok("llama", src)
        wait_for(lambda: published(postgres, db, "llama", 1), what="generation published")
        gen = d.ok("GET", "/v1/models/llama/generations/1")
        row = q(postgres, db, "SELECT state, total_bytes, n_shards, n_tensors, published_by, source "
                              "FROM generations WHERE model = 'llama' AND number = 1")
        assert row == (f"ready|{gen['total_bytes']}|{gen['n_shards']}|{gen['n_tensors']}|"
                       f"node-pub|{gen['source']}")
        shards = q(postgres, db, "SELECT idx, name, sha256, file_bytes, header_bytes FROM shards "
                                 "WHERE model = 'llama' AND number = 1 ORDER BY idx").splitlines()
        assert shards == [f"{s['index']}|{s['name']}|{s['sha256']}|{s['file_bytes']}|"
                          f"{s['header_bytes']}" for s in gen["shards"]]
        tl = d.ok("GET", "/v1/models/llama/generations/1/tensors?limit=1000")["tensors"]
        assert q(postgres, db, "SELECT count(*) FROM tensors WHERE model = 'llama' AND number = 1") \
            == str(len(tl)) == str(gen["n_tensors"])
        for t in tl[:3] + tl[-2:]:
            r = q(postgres, db, "SELECT dtype, array_to_string(shape, ','), shard, \"begin\", \"end\" "
                                f"FROM tensors WHERE model = 'llama' AND number = 1 "
                                f"AND name = '{t['name']}'")
            assert r == (f"{t['dtype']}|{','.join(map(str, t['shape']))}|{t['shard_index']}|"
                         f"{t['data_offsets'][0]}|{t['data_offsets'][1]}"), (t, r)
        # a second import: generation 2 published, generation 1 untouched
        d.import_ok("llama", checkpoint(tmp_path / "w", "m2", 2))
        wait_for(lambda: published(postgres, db, "llama", 2), what="generation 2 published")
        # restart: every ready generation published again = a no-op
        before = q(postgres, db, "SELECT count(*), max(created_at) FROM generations")
        ntens = q(postgres, db, "SELECT count(*) FROM tensors")
        assert d.stop() == 0, d.log_text()
        d.start()
        wait_for(lambda: d.log_text().count("fleet: catalog host=") >= 2, what="reconnect")
        time.sleep(1.0)
        assert q(postgres, db, "SELECT count(*), max(created_at) FROM generations") == before
        assert q(postgres, db, "SELECT count(*) FROM tensors") == ntens
        assert "not published" not in d.log_text()
        assert d.stop() == 0, d.log_text()
    finally:
        d.stop()


def test_postgres_restart_while_serving(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvcat_")
    d = fleet_daemon(build_dir, tmp_path / "r", dsn, "node-r")
    d.start()
    try:
        d.import_ok("m", checkpoint(tmp_path / "r", "a", 3), activate=True)
        wait_for(lambda: published(postgres, db, "m", 1), what="generation 1 published")
        postgres.stop()
        try:
            # reads go on without PostgreSQL
            assert d.ok("GET", "/v1/models/m/generations/1")["state"] == "ready"
            d.import_ok("m", checkpoint(tmp_path / "r", "b", 4))
            assert d.ok("GET", "/v1/models/m/generations/2")["state"] == "ready"
        finally:
            postgres.start()
        wait_for(lambda: published(postgres, db, "m", 2), timeout=60,
                 what="generation 2 published after PostgreSQL came back")
        assert d.ok("GET", "/v1/models/m/generations/2")["state"] == "ready"
        d.import_ok("m", checkpoint(tmp_path / "r", "c", 5))
        wait_for(lambda: published(postgres, db, "m", 3), what="generation 3 published")
        # the server ends the daemon's session: the next call finds it dropped
        # and reconnects within that call (no retry round: nothing is logged
        # as failed)
        n_failed = d.log_text().count("failed (retrying")
        killed = postgres.psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               f"WHERE datname = '{db}' AND application_name = 'tensorvaultd'")
        assert killed.strip() == "1"
        d.import_ok("m", checkpoint(tmp_path / "r", "d", 8))
        wait_for(lambda: published(postgres, db, "m", 4), timeout=10,
                 what="generation 4 published after the session was terminated")
        assert d.log_text().count("failed (retrying") == n_failed
        assert "reconnected" in d.log_text()
        # a plain restart between two imports: reads go on, the next import
        # is published over a new connection
        postgres.restart()
        assert d.ok("GET", "/v1/models/m/generations/4")["state"] == "ready"
        d.import_ok("m", checkpoint(tmp_path / "r", "e", 9))
        wait_for(lambda: published(postgres, db, "m", 5), timeout=30,
                 what="generation 5 published after postgres.restart()")
        assert postgres.password not in d.log_text()
        assert d.stop() == 0, d.log_text()
    finally:
        d.stop()


def test_unreachable_at_start_serves_standalone(build_dir, postgres, tmp_path):
    # a port nobody listens on: the daemon starts, serves and says why once
    dsn = postgres.dsn.replace(f":{postgres.port}/", ":1/")
    d = fleet_daemon(build_dir, tmp_path / "u", dsn, "node-u")
    d.start()
    try:
        d.import_ok("solo", checkpoint(tmp_path / "u", "s", 6))
        wait_for(lambda: "catalog not reachable" in d.log_text(), what="the warning")
        log = d.log_text()
        assert log.count("catalog not reachable") == 1
        assert postgres.password not in log
        assert "127.0.0.1" in log
        assert d.stop() == 0, d.log_text()
    finally:
        d.stop()


def test_standalone_untouched(build_dir, postgres, tmp_path):
    d = Daemon(build_dir, tmp_path, settings={"store.image_size": "256M"})
    before = postgres.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'tensorvault'")
    d.start()
    try:
        d.import_ok("alone", checkpoint(tmp_path, "x", 7))
        assert "fleet:" not in d.log_text() and "fleet catalog" not in d.log_text()
        after = postgres.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'tensorvault'")
        assert after == before
        assert d.stop() == 0, d.log_text()
    finally:
        d.stop()


def test_catalog_unit_against_postgres(build_dir, postgres):
    """The cmocka test's PostgreSQL half: concurrent migration, publish
    (idempotent, conflict), alias compare-and-set with two setters at once
    and the NOTIFY a listener receives."""
    exe = os.path.abspath(os.path.join(build_dir, "tests", "test_catalog"))
    assert os.path.exists(exe), f"{exe} not built"
    db, dsn = fresh_db(postgres, "tvcat_")
    env = {**os.environ, "TV_TEST_PG_DSN": dsn, "CMOCKA_MESSAGE_OUTPUT": "STDOUT",
           "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=1")}
    r = subprocess.run([exe], capture_output=True, text=True, timeout=120, env=env,
                       cwd=os.path.join(ROOT, "tests"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for name in ("migrate_once", "publish", "alias_cas_notify"):
        assert f"pg: ran {name}" in out, out
    assert "SKIPPED" not in out, out
    # what the C test left: the alias moved 1 + 5 times, its placement array
    # quoted right; 120k tensors of one generation by COPY, names with a tab
    # and a backslash intact
    assert q(postgres, db, "SELECT generation, version, placement FROM aliases "
                           "WHERE model = 'unit-alias' AND alias = 'prod'") == \
        '1|6|{node-a,"node \\"b\\""}'
    assert q(postgres, db, "SELECT count(*) FROM tensors WHERE model = 'unit-pub'") == "120000"
    assert q(postgres, db, "SELECT count(*) FROM tensors WHERE model = 'unit-pub' "
                           "AND name = E'odd\\tname\\\\1'") == "1"
    assert q(postgres, db, "SELECT dtype, array_to_string(shape, ','), shard, \"begin\", \"end\" "
                           "FROM tensors WHERE model = 'unit-pub' AND name = 'layer.7.weight'") == \
        "F16|4,7|1|56|64"
    assert q(postgres, db, "SELECT array_length(shape, 1) IS NULL FROM tensors "
                           "WHERE model = 'unit-pub' AND name = 'layer.0.weight'") == "t"
