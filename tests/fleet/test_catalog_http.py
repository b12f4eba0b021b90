"""The REST API while the fleet catalog is stuck: PostgreSQL work never
runs on an HTTP thread. Another session holds the catalog's locks (the
migration lock and the alias's own), or the backend serving the alias
moves is stopped (SIGSTOP): alias moves are answered 503 within their
deadline, naming what happened, while /healthz, the model list and
GET /v1/fleet keep answering at once; once the catalog is free again the
same move succeeds."""
import os
import signal
import subprocess
import threading
import time

from harness.daemon import Daemon, make_checkpoint, seg
from harness.postgres import fresh_db
from harness.wait import wait_for

MIGRATION_LOCK = 0x74767631  # TV__CATALOG_LOCK


def quick(d, path):
    """(status, seconds) of a GET."""
    t0 = time.monotonic()
    r = d.request("GET", path, timeout=30)
    return r.status, time.monotonic() - t0


def move(d, expect, results):
    t0 = time.monotonic()
    r = d.request("PUT", f"/v1/fleet/aliases/{seg('m')}/prod", timeout=60,
                  body={"generation": 1, "expect_version": expect})
    results.append((r, time.monotonic() - t0))


def watch_health(d, stop, worst):
    while not stop.is_set():
        for path in ("/healthz", "/v1/models", "/v1/fleet"):
            st, secs = quick(d, path)
            assert st == 200, path
            worst[0] = max(worst[0], secs)
        time.sleep(0.05)


def moves_while(d, n):
    """n alias moves at once, the API probed all along: (results, worst
    probe latency)."""
    results, worst, stop = [], [0.0], threading.Event()
    probe = threading.Thread(target=watch_health, args=(d, stop, worst))
    probe.start()
    movers = [threading.Thread(target=move, args=(d, 0, results)) for _ in range(n)]
    for t in movers:
        t.start()
    for t in movers:
        t.join(60)
    stop.set()
    probe.join(30)
    return results, worst[0]


def test_alias_moves_wait_for_the_catalog_off_the_http_threads(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvhttp_")
    d = Daemon(build_dir, tmp_path, name="h",
               settings={"store.image_size": "256M", "fleet.postgres": dsn, "fleet.node": "node-h",
                         "http.threads": "2"})
    d.start()
    holder = None
    backend = None
    try:
        import numpy as np
        src = make_checkpoint(tmp_path / "c" / "model.safetensors",
                              {"w": np.arange(1000, dtype=np.float32)})
        d.import_ok("m", src)
        wait_for(lambda: any(g["model"] == "m" for g in d.ok("GET", "/v1/fleet")["generations"]),
                 what="generation 1 published")

        # another session holds the migration lock and the aliases table
        holder = subprocess.Popen(
            [postgres._bin("psql"), postgres.dsn.rsplit("/", 1)[0] + "/" + db, "-X", "-q", "-c",
             f"BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK}); "
             "LOCK TABLE aliases IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60);"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: postgres.psql(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE a.query LIKE '%pg_sleep(60)%' AND l.granted AND "
            "(l.locktype = 'advisory' OR l.mode = 'AccessExclusiveLock')",
            dbname=db).strip() == "2", what="the locks held")
        results, worst = moves_while(d, 3)
        assert len(results) == 3
        for r, secs in results:
            assert r.status == 503, r
            assert r.headers.get("retry-after") == "1"
            msg = r.json()["error"]["message"]
            assert "lock timeout" in msg or "did not move" in msg, msg
            assert secs < 8, secs
        assert worst < 1.0, worst
        postgres.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                      "query LIKE '%pg_sleep(60)%' AND pid <> pg_backend_pid()", dbname=db)
        holder.wait(30)
        holder = None

        r = d.request("PUT", f"/v1/fleet/aliases/{seg('m')}/prod",
                      body={"generation": 1, "expect_version": 0})
        assert r.status == 200 and r.json()["version"] == 1, r

        # the backend of the alias moves stops answering at all
        pids = postgres.psql("SELECT pid FROM pg_stat_activity WHERE application_name = "
                             "'tensorvaultd (alias moves)'", dbname=db).split()
        assert len(pids) == 1, pids
        backend = int(pids[0])
        os.kill(backend, signal.SIGSTOP)
        results, worst = moves_while(d, 2)
        for r, secs in results:
            assert r.status == 503, r
            assert secs < 8, secs
        msgs = [r.json()["error"]["message"] for r, _ in results]
        # the first was taken and may have moved; the one behind it did not move
        assert sum("may have moved" in m for m in msgs) == 1, msgs
        assert sum("did not move" in m for m in msgs) == 1, msgs
        assert worst < 1.0, worst
        # stopping does not wait on it either
        t0 = time.monotonic()
        assert d.stop(timeout=30) == 0, d.log_text()
        assert time.monotonic() - t0 < 15
    finally:
        if holder:
            holder.kill()
            holder.wait()
        if backend:
            os.kill(backend, signal.SIGCONT)
        if d.alive():
            d.kill9()
