#!/usr/bin/env python3
"""Fast-path benchmark (issue 10): a generated checkpoint (>= 2 GiB, the same
one bench/read.sh caches) imported into a tensorvaultd store on the real
disk, then in one run, each round from a dropped page cache:
  (a) fio sequential read of the store image's used extent (1 MiB blocks,
      O_DIRECT, io_uring, depth 32): the device's limit;
  (b) the in-process reader: `tensorvault bench --store S m`;
  (c) one fast-path client: `tensorvault bench m --fastpath SOCKET`;
  (d) N (default 8) fast-path clients loading the same model at once:
      aggregate delivered bytes/s, device bytes read by the daemon (the
      tensorvault_fastpath_device_read_bytes_total delta of /metrics) per
      model byte, and the slowest client's time over (c)'s;
then (e) the latency of a 4 KiB tensor: the in-process reader
(`tensorvault bench --latency`) against the fast path, warm (the same
tensor again and again: after the first read its chunk is in a free slot,
so this is the protocol's round trip; through `tensorvault bench --fastpath
--latency` when the CLI has it, else the Python client) and cold (a
different 4 KiB tensor each time, each in its own chunk, a fresh read
group per round: every read goes to the device; Python client,
tests/integration/fpwire.py).
Prints the figures, the ratios and the issue's targets: c/b >= 0.95,
c/a >= 0.9, device bytes <= 1.1 x model bytes, slowest <= 1.5 x single,
4 KiB p50 <= 1.5 x in-process. The exit status is 0 whatever the ratios.

Invariants: the store (a sparse image) lives under --dir on the same
filesystem as the checkpoint and is deleted afterwards (unless
--keep-store); measurements hold flock --lock (TV_BENCH_LOCK, shared with
the other drivers); seconds are each program's own timing of its load loop
(fio: its job runtime); the page cache is dropped before each measurement
when permitted (root), else a note says so.

Usage: fastpath_bench.py [--dir DIR] [--build-dir DIR] [--small] [--clients N]
                         [--repeat N] [--count N] [--cold-rounds N] [--json] [--keep-store]
--small (or TV_BENCH_SMALL=1): a ~150 MiB checkpoint and one round, a smoke
run for a shared machine; its figures mean little.
"""
import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import read_bench as rb  # noqa: E402  (checkpoint, fio, cold-cache runs)

MiB = 1 << 20
LATENCY_TENSOR = rb.LATENCY_TENSOR  # F32 [1024]: 4 KiB, one per layer
TARGETS = {"c/b": 0.95, "c/a": 0.90, "device/model": 1.10, "slowest/single": 1.50,
           "4k p50 fast/in-process": 1.50}
SMALL_LAYERS = 2


class Lock:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def small_checkpoint(root, log):
    """SMALL_LAYERS of read_bench's layers (8 big tensors of 4-16 MiB and the
    small ones, 4 KiB q_norm among them) in 2 shards: ~150 MiB."""
    d = os.path.join(root, f"fp-small-{SMALL_LAYERS}l")
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, rb.STAMP)):
        return index, False
    import numpy as np
    from safetensors.numpy import save_file
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = np.random.default_rng(7)
    block = np.frombuffer(rng.bytes(rb.RANDOM_BLOCK), dtype=np.uint8)
    weight_map, total = {}, 0
    for s in range(2):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        tensors = {}
        for layer in range(s, SMALL_LAYERS, 2):
            tensors.update(rb.layer_tensors(np, block, layer))
        save_file(tensors, os.path.join(d, fname), metadata={"format": "np"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += v.nbytes
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    os.sync()
    with open(os.path.join(d, rb.STAMP), "w") as f:
        f.write("small\n")
    log(f"generated {d}")
    return index, True


def env_clean():
    return {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class FastBench(rb.Bench):
    def __init__(self, exe, root, stat_path, d):
        super().__init__(exe, root, stat_path)
        self.d = d

    def device_read(self):
        return self.d.metrics().get("tensorvault_fastpath_device_read_bytes_total")

    def fp_bench(self, sock):
        argv = [self.exe, "bench", "m", "--fastpath", sock, "--json"]
        dev0 = self.device_read()
        p, wall, ru, disk = self.cold(argv)
        dev1 = self.device_read()
        r = json.loads(p.stdout)
        if r.get("path") not in (None, "fastpath"):
            raise RuntimeError(f"{' '.join(argv)} did not go through the fast path: {r}")
        return self.row(r["bytes"], r["seconds"], wall, ru, disk, " ".join(argv),
                        tensors=r.get("tensors"), path=r.get("path"),
                        daemon_device_bytes=None if dev0 is None else dev1 - dev0)

    def fp_many(self, sock, n):
        """n clients at once (started back to back, each its own process)."""
        argv = [self.exe, "bench", "m", "--fastpath", sock, "--json"]
        rb.settle(self.stat_path)
        note = rb.drop_caches()
        if note:
            self.notes.add(note)
        dev0 = self.device_read()
        disk0 = rb.disk_read_bytes(self.stat_path)
        files = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in range(n)]
        t0 = time.monotonic()
        procs = [subprocess.Popen(argv, stdout=fo, stderr=fe, env=env_clean()) for fo, fe in files]
        for p in procs:
            p.wait()
        wall = time.monotonic() - t0
        dev1 = self.device_read()
        disk1 = rb.disk_read_bytes(self.stat_path)
        clients = []
        for p, (fo, fe) in zip(procs, files):
            fo.seek(0)
            fe.seek(0)
            out, err = fo.read().decode(), fe.read().decode()
            fo.close()
            fe.close()
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {err.strip()[-2000:]}")
            r = json.loads(out)
            clients.append({"bytes": r["bytes"], "seconds": r["seconds"]})
        total = sum(c["bytes"] for c in clients)
        slowest = max(c["seconds"] for c in clients)
        return {"clients": n, "per_client": clients, "bytes": total, "seconds": slowest,
                "gb_per_s": total / slowest / 1e9, "wall_seconds": wall,
                "wall_gb_per_s": total / wall / 1e9,
                "daemon_device_bytes": None if dev0 is None else dev1 - dev0,
                "disk_read_bytes": None if disk0 is None else disk1 - disk0,
                "daemon_rss_mib": self.d.rss_kib() / 1024, "cmd": " ".join(argv)}

    def fp_latency_cli(self, sock, tensor, count):
        argv = [self.exe, "bench", "m", "--fastpath", sock, "--latency", tensor, "--count",
                str(count), "--json"]
        try:
            p, wall, ru, disk = self.cold(argv)
        except RuntimeError as e:
            return {"error": str(e)[-300:], "cmd": " ".join(argv)}
        r = json.loads(p.stdout)
        r["cmd"] = " ".join(argv)
        return r


def py_latency(sock, names, warm_count, cold_rounds):
    """(warm, cold) latency in us through the Python client: warm = names[0]
    read warm_count times in one handle (after one untimed read); cold =
    every name once per round, a new handle (and read group: nothing else
    has the model open) per round."""
    import fpwire as fp

    def one(s, h, t):
        t0 = time.perf_counter()
        (r,) = s.read(h, [(t["index"], 0, t["nbytes"])])
        dt = time.perf_counter() - t0
        assert r.result == 0 and r.covered == t["nbytes"]
        return dt * 1e6

    warm, cold = [], []
    with fp.Session(sock, timeout=60) as s:
        h = s.open("m")
        t = h.snap.by_name[names[0]]
        one(s, h, t)
        warm = [one(s, h, t) for _ in range(warm_count)]
        s.close_handle(h)
        for _ in range(cold_rounds):
            h = s.open("m")
            for n in names:
                cold.append(one(s, h, h.snap.by_name[n]))
            s.close_handle(h)
    summary = lambda xs: {"p50_us": pct(xs, 0.5), "p99_us": pct(xs, 0.99), "max_us": max(xs),
                          "count": len(xs)}
    return summary(warm), summary(cold)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp/tv-bench"))
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--small", action="store_true", default=os.environ.get("TV_BENCH_SMALL") == "1")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=None, help="rounds of (a)-(d); best counts (3; --small 1)")
    ap.add_argument("--count", type=int, default=2000, help="warm latency reads")
    ap.add_argument("--cold-rounds", type=int, default=None,
                    help="cold latency rounds (one read of every 4 KiB q_norm each; 20, --small 10)")
    ap.add_argument("--lock", default=os.environ.get("TV_BENCH_LOCK", "/tmp/tv-bench.lock"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-store", action="store_true")
    a = ap.parse_args()
    repeat = a.repeat or (1 if a.small else 3)
    cold_rounds = a.cold_rounds or (10 if a.small else 20)
    count = min(a.count, 200) if a.small else a.count

    log = lambda m: print(m, file=sys.stderr, flush=True)
    exe = os.path.abspath(os.path.join(a.build_dir, "tensorvault"))
    for b in ("tensorvault", "tensorvaultd"):
        if not os.access(os.path.join(a.build_dir, b), os.X_OK):
            sys.exit(f"fastpath_bench: no {b} in {a.build_dir} (scripts/build plain)")
    if not shutil.which("fio"):
        sys.exit("fastpath_bench: fio is not installed (apt-get install fio)")
    from daemon import Daemon  # noqa: E402 (numpy comes with it: after the checks)

    root = os.path.abspath(a.dir)
    os.makedirs(root, exist_ok=True)
    t_start = time.monotonic()
    load0 = os.getloadavg()[0]
    if a.small:
        index, fresh = small_checkpoint(root, log)
    else:
        index, fresh = rb.ensure_checkpoint(root, a.shards, log)
    paths = rb.shard_paths(index)
    ck_bytes = sum(os.path.getsize(p) for p in paths)
    heads = [t for p in paths for t in rb.read_header(p)]
    model_bytes = sum(t[4] for t in heads)
    q_norms = [t[0] for t in heads if t[0].endswith("self_attn.q_norm.weight")]
    log(f"checkpoint {index}: {ck_bytes} bytes, {len(paths)} shards, {len(heads)} tensors "
        f"({'generated' if fresh else 'cached'})")

    work = tempfile.mkdtemp(prefix="fp-", dir=root)
    size = -(-int(ck_bytes * 1.05 + 256 * MiB) // MiB)
    d = Daemon(a.build_dir, work, settings={"import.roots": os.path.dirname(index),
                                            "store.image_size": f"{size}M", "log.level": "warn"})
    out = {}
    try:
        d.start()
        d.wait_socket()
        sock = d.socket_path
        t0 = time.monotonic()
        d.import_ok("m", index, activate=True)
        log(f"imported into the daemon's store {d.store} ({time.monotonic() - t0:.1f} s)")
        dev = d.device()
        img, off, used = dev["path"], dev["data_offset"], dev["used_bytes"]
        b = FastBench(exe, root, rb.disk_stat_path(root), d)
        names = {"a": "(a) fio seq 1M io_uring qd32", "b": "(b) tensorvault bench --store",
                 "c": "(c) tensorvault bench --fastpath", "d": f"(d) {a.clients} x --fastpath at once"}
        fns = {"a": lambda: b.fio_seq(img, off, used), "b": lambda: b.tv_bench(d.store),
               "c": lambda: b.fp_bench(sock), "d": lambda: b.fp_many(sock, a.clients)}
        runs = {k: [] for k in fns}
        with Lock(a.lock):
            for i in range(repeat):
                order = list(fns)[i % 4:] + list(fns)[:i % 4]
                for k in order:
                    runs[k].append(fns[k]())
                log(f"  round {i + 1} (GB/s): " + ", ".join(f"{k} {runs[k][-1]['gb_per_s']:.2f}"
                                                    for k in fns))
            lat_in = b.tv_latency(d.store, LATENCY_TENSOR, count)
            lat_cli = b.fp_latency_cli(sock, LATENCY_TENSOR, count)
            dev0 = b.device_read()
            lat_py_warm, lat_py_cold = py_latency(sock, q_norms, count, cold_rounds)
            cold_dev = b.device_read() - dev0
    except BaseException:
        sys.stderr.write("fastpath_bench: daemon log (tail):\n" + d.log_text()[-4000:] + "\n")
        raise
    finally:
        d.stop()
        if not a.keep_store:
            shutil.rmtree(work, ignore_errors=True)

    rows = {k: rb.best(v) for k, v in runs.items()}
    g = {k: r["gb_per_s"] for k, r in rows.items()}
    dd = rows["d"]
    warm_fp = lat_cli if "p50_us" in lat_cli else lat_py_warm
    warm_src = "tensorvault bench --fastpath --latency" if "p50_us" in lat_cli else "Python client"
    ratios = {
        "c/b": g["c"] / g["b"],
        "c/a": g["c"] / g["a"],
        "device/model": (dd["daemon_device_bytes"] / model_bytes
                         if dd["daemon_device_bytes"] is not None else float("nan")),
        "slowest/single": dd["seconds"] / rows["c"]["seconds"],
        "4k p50 fast/in-process": warm_fp["p50_us"] / lat_in["p50_us"],
    }
    other = {"4k p50 cold fast (python)/in-process": lat_py_cold["p50_us"] / lat_in["p50_us"],
             "4k p99 fast/in-process": warm_fp["p99_us"] / lat_in["p99_us"],
             "(d) aggregate / (c)": g["d"] / g["c"],
             "(d) aggregate / (a)": g["d"] / g["a"]}
    notes = set(b.notes)
    if load0 > 0.5:
        notes.add(f"load average {load0:.2f} at start: other work shares the CPUs")
    if a.small:
        notes.add("--small: a smoke run on a small checkpoint, not the issue's figures")
    if "error" in lat_cli:
        notes.add(f"tensorvault bench --fastpath --latency failed ({lat_cli['error'][-160:]}): "
                  f"the warm fast-path latency is the Python client's (slower than C)")
    if cold_dev < len(q_norms) * cold_rounds * 4096:
        notes.add(f"the cold latency rounds read only {cold_dev} device bytes: the daemon kept a "
                  f"read group's cache between handles")

    pr = (lambda s="": print(s, file=sys.stderr)) if a.json else print
    pr(f"filesystem: {root} ({rb.fs_of(root)}); checkpoint {ck_bytes} bytes, {len(paths)} shards, "
       f"{len(heads)} tensors, {model_bytes} tensor bytes; store extent [{off}, +{used}) of {img}; "
       f"best of {repeat}")
    pr(f"{'what':<36}{'bytes':>12}{'seconds':>9}{'GB/s':>7}")
    for k, r in rows.items():
        pr(f"{names[k]:<36}{r['bytes']:>12}{r['seconds']:>9.3f}{r['gb_per_s']:>7.3f}")
    per = ", ".join(f"{c['seconds']:.3f}" for c in dd["per_client"])
    pr(f"(d) per client s: {per}; wall "
       f"{dd['wall_seconds']:.3f} s ({dd['wall_gb_per_s']:.3f} GB/s); daemon device bytes "
       f"{dd['daemon_device_bytes']} for {model_bytes} model bytes; daemon RSS "
       f"{dd['daemon_rss_mib']:.0f} MiB")
    for k, v in ratios.items():
        ok = v <= TARGETS[k] if k in ("device/model", "slowest/single", "4k p50 fast/in-process") \
            else v >= TARGETS[k]
        sign = "<=" if k in ("device/model", "slowest/single", "4k p50 fast/in-process") else ">="
        pr(f"ratio {k:<24}{v:>7.3f}  (target {sign} {TARGETS[k]:.2f})  {'PASS' if ok else 'MISS'}")
    pr("other ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in other.items()))
    pr(f"latency of a 4 KiB tensor ({LATENCY_TENSOR}; cold: {len(q_norms)} q_norm tensors x "
       f"{cold_rounds} rounds):")
    for label, r in [("in-process (tensorvault bench --latency)", lat_in),
                     (f"fast path warm ({warm_src})", warm_fp),
                     ("fast path warm (Python client)", lat_py_warm),
                     ("fast path cold (Python client)", lat_py_cold)]:
        pr(f"  {label:<52} p50 {r['p50_us']:>8.1f} us  p99 {r['p99_us']:>8.1f} us  "
           f"({r['count']} reads)")
    for n in sorted(notes):
        pr(f"note: {n}")
    pr(f"total {time.monotonic() - t_start:.0f} s")
    if a.json:
        print(json.dumps({"dir": root, "checkpoint": index, "checkpoint_bytes": ck_bytes,
                          "model_bytes": model_bytes, "small": a.small, "repeat": repeat,
                          "runs": rows, "ratios": ratios, "targets": TARGETS, "other_ratios": other,
                          "latency": {"in_process": lat_in, "fastpath_cli": lat_cli,
                                      "fastpath_python_warm": lat_py_warm,
                                      "fastpath_python_cold": lat_py_cold,
                                      "cold_device_bytes": cold_dev},
                          "notes": sorted(notes), "total_seconds": time.monotonic() - t_start},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
