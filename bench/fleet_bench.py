#!/usr/bin/env python3
"""Fleet benchmark (several nodes, the catalog, the object store), each
figure beside its reference measured in the same run, every server on this
machine over loopback:

  1. S3 pull: a model (TV_BENCH_FLEET_MB, default 256 MiB of random BF16,
     two shards + index, official writer) in a moto S3 server checking
     SigV4 (tests/harness/s3.py); `POST /v1/imports s3://BUCKET/PREFIX/`
     into a fresh daemon (its job's own seconds) vs one `curl --aws-sigv4`
     downloading the same three objects to files on the same disk, and vs
     curl making the importer's requests (import.http_range pieces, 4 at
     once: moto's cost is per request, not per byte); alternating curl, tv,
     curl, tv, ...; median of --repeat each; MB/s and the ratios tv/curl
     (target >= 0.9).
  2. Peer pull: node n1 holds the model; n2 pulls it through a fleet alias
     move placed on n2 only (its pull job's own seconds; the shards come
     from n1's GET /v1/blobs/sha256:HEX with the fleet token) vs curl of the
     same blob URLs with the same bearer token; one distinct model per round
     (a pull of bytes n2 already holds would skip the writes); ratio.
  3. Three-node rollout (n1..n3, fleet.object_store on the moto bucket):
     a. n1 imports from the HTTP origin (tests/harness/origin.py, which counts
        the body bytes it sends), the alias is moved to every node: bytes the
        origin sent during the import and the rollout / model bytes (target
        <= 1.2);
     b. n1 imports from a local path (its shards are copied to the object
        store), the alias is moved to every node: bytes the object store
        sent during the rollout (counted by a TCP relay in front of moto,
        HTTP headers included) / model bytes, and the bytes the nodes' blob
        routes sent (tensorvault_read_bytes_total);
     for both, the time from the alias move (PUT answered) until all three
     nodes serve the alias locally, against n1's import time of that model.

PostgreSQL (initdb in a temp dir), moto and the origin are started with the
fleet tests' own helpers (tests/harness: postgres's Postgres, s3's S3,
origin's Origin, daemon's Daemon). Every
measurement holds flock LOCK (TV_BENCH_LOCK), shared with the other
benchmark drivers.
Usage: fleet_bench.py [--build-dir DIR] [--dir DIR] [--mb N] [--repeat N] [--json]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the test harness package
from benchutil import Lock  # noqa: E402
from harness.daemon import Daemon, seg  # noqa: E402
from harness.origin import Origin  # noqa: E402
from harness.postgres import Postgres, fresh_db, pg_bindir  # noqa: E402
from harness.s3 import S3  # noqa: E402
from http_bench import make_model  # noqa: E402

MiB = 1 << 20
HTTP_RANGE = 8 * MiB  # import.http_range's default: the importer's Range GETs
IN_FLIGHT = 4  # the importer's requests in flight (2 readers x 16 MiB chunks / 8 MiB)
FLEET_TOKEN = "fleet-bench-secret-0123456789"
BUCKET = "tv-bench"
TARGETS = {"s3": 0.9, "peer": 0.9, "origin": 1.2}
NO_AWS_ENV = {k: None for k in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                                "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                "AWS_SESSION_TOKEN")}


def log(m):
    print(m, file=sys.stderr, flush=True)


def wait_for(fn, timeout, what, every=0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


# ------------------------------------------------------------ byte counting

class Relay:
    """A TCP relay 127.0.0.1:port -> upstream that counts the bytes it
    forwards each way: `served` (upstream to clients: what the object store
    sent, HTTP headers included) and `received`."""

    def __init__(self, upstream_port):
        self.upstream = ("127.0.0.1", upstream_port)
        self.lock = threading.Lock()
        self.served = self.received = 0
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="tv-relay").start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def reset(self):
        with self.lock:
            self.served = self.received = 0

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.upstream, timeout=10)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            threading.Thread(target=self._pump, args=(u, c, "served"), daemon=True).start()
            threading.Thread(target=self._pump, args=(c, u, "received"), daemon=True).start()

    def _pump(self, src, dst, counter):
        buf = bytearray(1 << 20)
        try:
            while True:
                n = src.recv_into(buf)
                if n == 0:
                    break
                dst.sendall(memoryview(buf)[:n])
                with self.lock:
                    setattr(self, counter, getattr(self, counter) + n)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            src.close()

    def close(self):
        self.ls.close()


def blob_bytes_sent(d):
    """tensorvault_read_bytes_total summed over the blob routes of d."""
    return sum(v for k, v in d.metrics().items()
               if k.startswith("tensorvault_read_bytes_total") and "blob" in k)


# ------------------------------------------------------------------ helpers

def model_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith((".safetensors", ".json")))


def shard_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in model_files(d)
               if f.endswith(".safetensors"))


def curl(argv_tail, out_dir):
    """One curl command (argv_tail: options and `-o FILE URL` pairs); returns
    its wall seconds and the bytes it wrote. The files are deleted after."""
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    p = subprocess.run(["curl", "-sS", "-f", "--max-time", "300", *argv_tail],
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode:
        raise RuntimeError(f"curl exited {p.returncode}: {p.stderr.strip()}")
    n = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    shutil.rmtree(out_dir)
    return wall, n


def job_of(d, model):
    jobs = [j for j in d.ok("GET", "/v1/jobs")["jobs"] if j["model"] == model]
    return max(jobs, key=lambda j: j["id"]) if jobs else None


def local_alias(d, model, alias):
    r = d.request("GET", f"/v1/models/{seg(model)}/aliases")
    if r.status != 200:
        return None
    return next((a["generation"] for a in r.json()["aliases"] if a["alias"] == alias), None)


def move(d, model, alias, gen, expect=0, placement=None):
    body = {"generation": gen, "expect_version": expect}
    if placement is not None:
        body["placement"] = placement
    r = d.request("PUT", f"/v1/fleet/aliases/{seg(model)}/{alias}", body=body)
    if r.status != 200:
        raise RuntimeError(f"alias move {model}/{alias} -> {gen}: {r}")


def published(d, model, gen, holders):
    def ok():
        for g in d.ok("GET", "/v1/fleet")["generations"]:
            if g["model"] == model and g.get("number", g.get("generation")) == gen and \
                    set(holders) <= set(g.get("holders") or []):
                return True
        return False
    wait_for(ok, 300, f"{model} generation {gen} published by {holders}", every=0.05)


def node(build_dir, root, name, dsn, **extra):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    settings = {"store.image_size": "4G", "fleet.postgres": dsn, "fleet.node": name,
                "fleet.token": FLEET_TOKEN, "import.roots": root, "log.level": "info"}
    settings.update(extra)
    # TV_BENCH_FLEET_SET="import.http_range=4M,import.workers=2": settings to try
    for kv in filter(None, os.environ.get("TV_BENCH_FLEET_SET", "").split(",")):
        k, _, v = kv.partition("=")
        settings[k.strip()] = v.strip()
    return Daemon(build_dir, wd, name=name, settings=settings, env=NO_AWS_ENV)


def med(v):
    return statistics.median(v)


# ------------------------------------------------------------ measurements

def bench_s3(a, s3, models, lock, root):
    """1. curl vs a daemon's S3 import of the same objects, alternating."""
    src = models[0]
    prefix = "models/m0"
    for f in model_files(src):
        with open(os.path.join(src, f), "rb") as fh:
            s3.put(BUCKET, f"{prefix}/{f}", fh.read())
    files = model_files(src)
    total = sum(os.path.getsize(os.path.join(src, f)) for f in files)
    out = os.path.join(root, "curl-s3")
    argv = ["--aws-sigv4", f"aws:amz:{s3.region}:s3", "--user", f"{s3.access_key}:{s3.secret_key}",
            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    auth = list(argv)
    ranges = []  # (output file, URL, range or None): one request each
    for f in files:
        url = f"{s3.endpoint}/{BUCKET}/{prefix}/{f}"
        argv += ["-o", os.path.join(out, f), url]
        size = os.path.getsize(os.path.join(src, f))
        if not f.endswith(".safetensors"):
            ranges.append((os.path.join(out, f), url, None))
            continue
        for k, off in enumerate(range(0, size, HTTP_RANGE)):
            ranges.append((os.path.join(out, f"{f}.{k}"), url,
                           f"{off}-{min(size, off + HTTP_RANGE) - 1}"))
    # -r is global to a URL set: one set per request (--next; the connection is kept)
    argv_ranges = ["--parallel", "--parallel-max", str(IN_FLIGHT)]
    for k, (o, url, r) in enumerate(ranges):
        argv_ranges += (["--next", "-sS", "-f", "--max-time", "300"] if k else []) + auth + \
            (["-r", r] if r else []) + ["-o", o, url]
    settings = {"store.image_size": "2G", "import.origins": f"s3://{BUCKET}/models/",
                "s3.endpoint": s3.endpoint, "s3.region": s3.region,
                "s3.access_key_id": s3.access_key, "s3.secret_access_key": s3.secret_key}
    rows = {"curl": [], "curl_ranges": [], "tv": []}
    for i in range(a.repeat):
        with Lock(a.lock):
            wall, n = curl(argv, out)
        assert n == total, (n, total)
        rows["curl"].append({"seconds": wall, "bytes": n})
        with Lock(a.lock):
            wall, n = curl(argv_ranges, out)
        assert n == total, (n, total)
        rows["curl_ranges"].append({"seconds": wall, "bytes": n})
        wd = tempfile.mkdtemp(prefix="s3d-", dir=root)
        d = Daemon(a.build_dir, wd, settings=settings, env=NO_AWS_ENV)
        d.start()
        try:
            with Lock(a.lock):
                t0 = time.monotonic()
                j = d.wait_job(d.submit_import("m0", f"s3://{BUCKET}/{prefix}/")["id"], 300)
                wall = time.monotonic() - t0
            if j["state"] != "succeeded":
                raise RuntimeError(f"S3 import failed: {j}")
            rows["tv"].append({"seconds": j["result"]["seconds"], "wall": wall,
                               "bytes": j["result"]["total_bytes"]})
        finally:
            d.stop()
            shutil.rmtree(wd, ignore_errors=True)
        log(f"  s3 round {i + 1}: curl {rows['curl'][-1]['seconds']:.2f} s, curl ranges "
            f"{rows['curl_ranges'][-1]['seconds']:.2f} s, "
            f"tv {rows['tv'][-1]['seconds']:.2f} s (job wall {wall:.2f} s)")
    return {"rows": rows, "bytes": total, "cmd": "curl -sS -f " + " ".join(
        x if " " not in x else repr(x) for x in argv).replace(s3.secret_key, "SECRET")}


def bench_peer(a, pg, models, lock, root):
    """2. n2 pulls from n1 (alias move placed on n2) vs curl of n1's blobs."""
    _, dsn = fresh_db(pg, "tvbenchpeer_")
    n1, n2 = (node(a.build_dir, root, n, dsn) for n in ("p1", "p2"))
    for d in (n1, n2):
        d.start()
    rows = {"curl": [], "tv": []}
    try:
        wait_for(lambda: len(n1.ok("GET", "/v1/fleet")["nodes"]) == 2, 30, "two nodes")
        gens = []
        for k, src in enumerate(models[:a.repeat]):
            name = f"peer{k}"
            gens.append((name, n1.import_ok(name, src)["generation"]))
        for name, gen in gens:
            published(n1, name, gen, ["p1"])
        for i, (name, gen) in enumerate(gens):
            shards = n1.ok("GET", f"/v1/models/{seg(name)}/generations/{gen}")["shards"]
            out = os.path.join(root, "curl-peer")
            argv = ["-H", f"Authorization: Bearer {FLEET_TOKEN}"]
            for s in shards:
                argv += ["-o", os.path.join(out, s["name"]),
                         f"http://127.0.0.1:{n1.port}/v1/blobs/sha256:{s['sha256']}"]
            total = sum(s["file_bytes"] for s in shards)
            with Lock(a.lock):
                wall, n = curl(argv, out)
            assert n == total, (n, total)
            rows["curl"].append({"seconds": wall, "bytes": n})
            with Lock(a.lock):
                t0 = time.monotonic()
                move(n1, name, "bench", gen, placement=["p2"])
                wait_for(lambda: local_alias(n2, name, "bench") == gen, 300, f"p2 pulled {name}")
                wall = time.monotonic() - t0
            j = job_of(n2, name)
            if not j or j["state"] != "succeeded":
                raise RuntimeError(f"pull of {name} on p2: {j}")
            rows["tv"].append({"seconds": j["result"]["seconds"], "wall_move_to_switch": wall,
                               "bytes": j["result"]["total_bytes"]})
            log(f"  peer round {i + 1}: curl {rows['curl'][-1]['seconds']:.2f} s, tv pull "
                f"{rows['tv'][-1]['seconds']:.2f} s (move to switch {wall:.2f} s)")
        from_peers = "from peers" in n2.log_text()
        cmd = "curl -sS -f " + " ".join(x if " " not in x else repr(x) for x in argv)
    finally:
        for d in (n1, n2):
            d.stop()
    return {"rows": rows, "bytes": rows["curl"][0]["bytes"], "cmd": cmd,
            "log_says_from_peers": from_peers}


def rollout(nodes, name, gen, pg, db):
    """Moves NAME@prod to gen on every node; returns the seconds until all
    three serve it (polled), the PUT's seconds and per node (reported ready,
    serving): ready from the catalog's own clock (node_generations.updated_at
    against aliases.updated_at, the move; negative: ready before it)."""
    t0 = time.monotonic()
    move(nodes[0], name, "prod", gen)
    t_put = time.monotonic() - t0
    t1 = time.monotonic()
    pending = set(range(len(nodes)))
    each = {}
    deadline = t1 + 300
    while pending:
        for k in sorted(pending):
            if local_alias(nodes[k], name, "prod") == gen:
                each[nodes[k].settings["fleet.node"]] = time.monotonic() - t1
                pending.discard(k)
        if time.monotonic() > deadline:
            raise RuntimeError(f"rollout of {name}: not switched after 300 s: {pending}")
        time.sleep(0.02)
    q = ("SELECT ng.node, extract(epoch FROM ng.updated_at - a.updated_at) FROM node_generations ng "
         "JOIN aliases a ON a.model = ng.model AND a.generation = ng.number "
         f"WHERE a.alias = 'prod' AND ng.state = 'ready' AND ng.model = '{name}'")
    ready = {ln.split("|")[0]: float(ln.split("|")[1])
             for ln in pg.psql(q, as_app=True, dbname=db).split() if "|" in ln}
    return time.monotonic() - t1, t_put, {k: (ready.get(k), v) for k, v in each.items()}


def bench_rollout(a, pg, s3, relay, origin, models, root):
    """3. a (origin) and b (object store) on three nodes."""
    db, dsn = fresh_db(pg, "tvbenchroll_")
    conf = {"fleet.object_store": f"s3://{BUCKET}/fleet/", "s3.endpoint": relay.endpoint,
            "s3.region": s3.region, "s3.access_key_id": s3.access_key,
            "s3.secret_access_key": s3.secret_key, "import.origins": origin.url + "/"}
    nodes = [node(a.build_dir, root, f"n{i}", dsn, **conf) for i in (1, 2, 3)]
    for d in nodes:
        d.start()
    out = {}
    try:
        wait_for(lambda: len(nodes[0].ok("GET", "/v1/fleet")["nodes"]) == 3, 30, "three nodes")
        n1 = nodes[0]
        # a. from the HTTP origin
        src = models[1]
        rel = "ro/"
        os.makedirs(os.path.join(origin.root, rel), exist_ok=True)
        for f in model_files(src):
            shutil.copy(os.path.join(src, f), os.path.join(origin.root, rel, f))
        origin.reset_counters()
        relay.reset()
        with Lock(a.lock):
            j = n1.import_ok("roll-origin", origin.url + "/" + rel)
        gen = j["generation"]
        imported = origin.bytes_served()
        published(n1, "roll-origin", gen, ["n1"])
        blob0 = sum(blob_bytes_sent(d) for d in nodes)
        with Lock(a.lock):
            t_all, t_put, each = rollout(nodes, "roll-origin", gen, pg, db)
        out["origin"] = {"model_bytes": shard_bytes(src),
                         "files_bytes": sum(os.path.getsize(os.path.join(src, f))
                                            for f in model_files(src)),
                         "origin_bytes_import": imported, "origin_bytes_total": origin.bytes_served(),
                         "object_store_bytes": relay.served,
                         "peer_bytes": sum(blob_bytes_sent(d) for d in nodes) - blob0,
                         "import_seconds": j["result"]["seconds"], "switch_seconds": t_all,
                         "put_seconds": t_put, "per_node": each}
        log(f"  rollout from the origin: switched in {t_all:.2f} s, import {j['result']['seconds']:.2f} s")
        # b. local path, copied to the object store
        src = models[0]
        relay.reset()
        with Lock(a.lock):
            j = n1.import_ok("roll-local", src)
        gen = j["generation"]
        t0 = time.monotonic()  # ready at once; the uploader copies it to the object store
        published(n1, "roll-local", gen, ["n1"])

        def blobs():
            o = pg.psql("SELECT count(*) FROM blobs WHERE uploaded_by = 'n1'", as_app=True,
                        dbname=db).strip()
            return int(o) >= 2
        wait_for(blobs, 300, "n1's shards in the object store", every=0.2)
        upload_s = time.monotonic() - t0
        uploaded = relay.received  # proof the relay is on the object store's path
        relay.reset()
        origin.reset_counters()
        blob0 = sum(blob_bytes_sent(d) for d in nodes)
        with Lock(a.lock):
            t_all, t_put, each = rollout(nodes, "roll-local", gen, pg, db)
        out["object_store"] = {"model_bytes": shard_bytes(src), "object_store_bytes": relay.served,
                               "peer_bytes": sum(blob_bytes_sent(d) for d in nodes) - blob0,
                               "origin_bytes": origin.bytes_served(),
                               "import_seconds": j["result"]["seconds"], "switch_seconds": t_all,
                               "put_seconds": t_put, "per_node": each,
                               "upload_wait_seconds": upload_s, "uploaded_bytes": uploaded}
        log(f"  rollout of a local import: switched in {t_all:.2f} s, import {j['result']['seconds']:.2f} s")
        out["pull_sources"] = [d.settings["fleet.node"] + ": " + ln.split("fleet: pulling ", 1)[1]
                               for d in nodes for ln in d.log_text().splitlines()
                               if "fleet: pulling" in ln]
    finally:
        for d in nodes:
            d.stop()
    return out


# ------------------------------------------------------------------ report

def per_node(r):
    """Per node: reported ready (catalog clock) and serving (polled), from the move."""
    def rd(v):
        return "?" if v is None else "before" if v < 0 else f"{v:.2f} s"
    return ", ".join(f"{k} ready {rd(r_)} / serving {sv:.2f} s"
                     for k, (r_, sv) in sorted(r["per_node"].items()))

def report(res, a, t_total):
    pr = print
    mb = res["model_mb"]
    pr(f"fleet benchmark: model of {res['model_bytes'] / 1e6:.0f} MB (2 shards + index, random BF16; "
       f"TV_BENCH_FLEET_MB={mb}), every server on loopback; median of {a.repeat}, alternating")
    s = res["s3"]
    c, t = med([r["seconds"] for r in s["rows"]["curl"]]), med([r["seconds"] for r in s["rows"]["tv"]])
    tw = med([r["wall"] for r in s["rows"]["tv"]])
    pr(f"1. S3 pull from moto {res['moto']} (SigV4), {s['bytes'] / 1e6:.0f} MB, 3 objects:")
    pr(f"  {'curl --aws-sigv4 (one command, to files, same disk)':<56}{s['bytes'] / c / 1e6:>8.1f} MB/s"
       f"{c:>8.2f} s")
    cr = med([r["seconds"] for r in s["rows"]["curl_ranges"]])
    what = f"curl, the importer's {HTTP_RANGE // MiB} MiB Range GETs, {IN_FLIGHT} at once"
    pr(f"  {what:<56}{s['bytes'] / cr / 1e6:>8.1f} MB/s{cr:>8.2f} s")
    pr(f"  {'tensorvault import s3://... (daemon job, its seconds)':<56}{s['bytes'] / t / 1e6:>8.1f} MB/s"
       f"{t:>8.2f} s  (submit to succeeded {tw:.2f} s)")
    r1 = c / t
    pr(f"  ratio tv/curl {r1:.3f}  (target >= {TARGETS['s3']})  {'PASS' if r1 >= TARGETS['s3'] else 'BELOW'}")
    r2 = cr / t
    pr(f"  ratio tv/curl making the same requests {r2:.3f}  (target >= {TARGETS['s3']})  "
       f"{'PASS' if r2 >= TARGETS['s3'] else 'BELOW'}")
    pr("  note: moto is a single Python process and the bottleneck of every row here: it spends "
       "about 100 ms on a GET whatever its range (1 MiB of a 128 MiB object 101 ms, 16 MiB 109 ms, "
       "the whole object 138 ms, measured with curl), so against moto a rate is set by the number "
       "of requests")
    p = res["peer"]
    c, t = med([r["seconds"] for r in p["rows"]["curl"]]), med([r["seconds"] for r in p["rows"]["tv"]])
    tw = med([r["wall_move_to_switch"] for r in p["rows"]["tv"]])
    pr(f"2. peer pull p1 -> p2 (GET /v1/blobs/sha256:HEX, fleet token), {p['bytes'] / 1e6:.0f} MB, "
       f"one model per round:")
    pr(f"  {'curl of the 2 blob URLs (one command, to files)':<56}{p['bytes'] / c / 1e6:>8.1f} MB/s{c:>8.2f} s")
    pr(f"  {'tensorvault pull (alias move placed on p2; job seconds)':<56}{p['bytes'] / t / 1e6:>8.1f} MB/s"
       f"{t:>8.2f} s  (move to switch {tw:.2f} s)")
    r2 = c / t
    pr(f"  ratio tv/curl {r2:.3f}  (target >= {TARGETS['peer']})  {'PASS' if r2 >= TARGETS['peer'] else 'BELOW'}")
    ro = res["rollout"]
    o, b = ro["origin"], ro["object_store"]
    pr("3. three-node rollout (n1..n3, fleet.object_store on moto), alias moved to every node:")
    ratio_o = o["origin_bytes_total"] / o["model_bytes"]
    pr(f"  a. n1 imports from the HTTP origin: origin sent {o['origin_bytes_total'] / 1e6:.1f} MB over the "
       f"import and the rollout ({o['origin_bytes_import'] / 1e6:.1f} MB in the import) for "
       f"{o['model_bytes'] / 1e6:.1f} MB of shards:")
    pr(f"     ratio origin bytes / model bytes {ratio_o:.3f}  (target <= {TARGETS['origin']})  "
       f"{'PASS' if ratio_o <= TARGETS['origin'] else 'ABOVE'}; during the rollout the object store "
       f"sent {o['object_store_bytes'] / 1e6:.1f} MB, the nodes' blob routes {o['peer_bytes'] / 1e6:.1f} MB")
    pr(f"     move to all three serving {o['switch_seconds']:.2f} s vs n1's import {o['import_seconds']:.2f} s:"
       f" ratio {o['switch_seconds'] / o['import_seconds']:.2f}  (from the move, per node: " +
       per_node(o) + ")")
    ratio_b = b["object_store_bytes"] / b["model_bytes"]
    pr(f"  b. n1 imports from a local path (shards copied to the object store first): during the "
       f"rollout the object store sent {b['object_store_bytes'] / 1e6:.1f} MB (relay count, headers "
       f"included), the nodes' blob routes {b['peer_bytes'] / 1e6:.1f} MB:")
    pr(f"     (n1 had uploaded {b['uploaded_bytes'] / 1e6:.1f} MB to the object store through the relay "
       f"before the move; in the object store {b['upload_wait_seconds']:.1f} s after its import)")
    pr(f"     ratio object-store bytes / model bytes {ratio_b:.3f}  (target <= {TARGETS['origin']})  "
       f"{'PASS' if ratio_b <= TARGETS['origin'] else 'ABOVE'}")
    pr(f"     move to all three serving {b['switch_seconds']:.2f} s vs n1's import {b['import_seconds']:.2f} s:"
       f" ratio {b['switch_seconds'] / b['import_seconds']:.2f}  (from the move, per node: " +
       per_node(b) + ")")
    pr("  pulls (the nodes' logs):")
    for ln in ro["pull_sources"]:
        pr(f"     {ln}")
    pr(f"total {t_total:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", "build"))
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp/tv-bench"))
    ap.add_argument("--mb", type=int, default=int(os.environ.get("TV_BENCH_FLEET_MB", "256")))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lock", default=os.environ.get("TV_BENCH_LOCK", "/tmp/tv-bench.lock"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    for tool in ("curl",):
        if shutil.which(tool) is None:
            raise SystemExit(f"fleet_bench.py: {tool} is not installed")
    bindir = pg_bindir()
    if bindir is None:
        raise SystemExit("fleet_bench.py: PostgreSQL server binaries not found under "
                         "/usr/lib/postgresql/*/bin (scripts/deps installs them)")
    import moto
    t_start = time.monotonic()
    os.makedirs(a.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="tv-fleet-bench-", dir=a.dir)
    os.chmod(root, 0o755)
    pg = s3 = relay = origin = None
    pg_base = tempfile.mkdtemp(prefix="tv-bench-pg-")
    s3_base = tempfile.mkdtemp(prefix="tv-bench-s3-")
    try:
        n_models = max(3, a.repeat)
        models = []
        for k in range(n_models):  # distinct bytes: no node ever holds the same shard twice
            d = os.path.join(root, f"model{k}")
            make_model(d, a.mb, seed=1000 + k)
            models.append(d)
        log(f"  {n_models} models of {shard_bytes(models[0]) / 1e6:.0f} MB written "
            f"({time.monotonic() - t_start:.1f} s)")
        pg = Postgres(bindir, pg_base).init()
        s3 = S3(s3_base).start()
        s3.bucket(BUCKET)
        relay = Relay(s3.port)
        origin = Origin(os.path.join(root, "origin")).start()
        res = {"model_mb": a.mb, "model_bytes": shard_bytes(models[0]), "moto": moto.__version__}
        res["s3"] = bench_s3(a, s3, models, a.lock, root)
        res["peer"] = bench_peer(a, pg, models, a.lock, root)
        res["rollout"] = bench_rollout(a, pg, s3, relay, origin, models, root)
        if a.json:
            print(json.dumps(res, indent=2))
        else:
            report(res, a, time.monotonic() - t_start)
    finally:
        for x in (origin, relay):
            if x is not None:
                (x.stop if isinstance(x, Origin) else x.close)()
        if s3 is not None:
            s3.stop()
        if pg is not None:
            pg.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pg_base, ignore_errors=True)
        shutil.rmtree(s3_base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
