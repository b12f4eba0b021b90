#!/usr/bin/env python3
"""Fast-path benchmark: a generated checkpoint (>= 2 GiB, the same
one bench/read.sh caches) imported into a tensorvaultd store on the real
disk, then in one run, in interleaved rounds, each measurement from a
dropped page cache:
  (a) fio sequential read of the store image's used extent (1 MiB blocks,
      O_DIRECT, io_uring, depth 32): the device's limit;
  (b) the in-process reader: `tensorvault bench --store S m`;
  (c) one fast-path client: `tensorvault bench m --fastpath SOCKET` (every
      tensor into one pre-faulted arena of the model's size);
  (c') one bench_fastpath client (bench/bench_fastpath.c: the same load in
      batches through a reused, pre-faulted 256 MiB window);
  (d) N (default 8) bench_fastpath clients that connect, open and
      pre-fault, then start loading at one CLOCK_REALTIME instant (eight
      copies of a 2.7 GB model would not fit in this machine's memory, and
      staggered starts would not share reads): aggregate delivered bytes/s
      (first start to last end), device bytes read by the daemon (the
      tensorvault_fastpath_device_read_bytes_total delta of /metrics) per
      model byte, and the slowest client's load time over (c')'s;
then (e) the latency of a 4 KiB tensor: in-process (`tensorvault bench
--latency`) against the fast path warm (`tensorvault bench --fastpath
--latency`: the same tensor again and again, so after the first read its
chunk is in a free slot and this is the protocol's round trip) and cold
(`bench_fastpath --cold`: each 4 KiB q_norm tensor, one per layer and each
in its own chunk, once per round, a newly opened model per round, so
every read goes to the device and reads a whole slot).
Prints the figures, the ratios and the issue's targets: c/b >= 0.95,
c/a >= 0.9, device bytes <= 1.1 x model bytes, slowest <= 1.5 x single,
4 KiB p50 <= 1.5 x in-process (warm; cold is printed beside it). The exit
status is 0 whatever the ratios.

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
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the test harness package
import read_bench as rb  # noqa: E402  (checkpoint, fio, cold-cache runs)
from benchutil import Lock, interleaved  # noqa: E402

MiB = 1 << 20
LATENCY_TENSOR = rb.LATENCY_TENSOR  # F32 [1024]: 4 KiB, one per layer
TARGETS = {"c/b": 0.95, "c/a": 0.90, "device/model": 1.10, "slowest/single": 1.50,
           "4k p50 fast/in-process": 1.50}
SMALL_LAYERS = 2


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
    def __init__(self, exe, root, stat_path, d, tool_exe):
        super().__init__(exe, root, stat_path)
        self.d, self.tool_exe = d, tool_exe

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

    def tool(self, sock, *args):
        """One bench_fastpath run (build/bench/bench_fastpath), its JSON."""
        argv = [self.tool_exe, sock, "m", *map(str, args)]
        p, wall, ru, disk = self.cold(argv)
        r = json.loads(p.stdout)
        r["cmd"] = " ".join(argv)
        return r, wall, ru, disk

    def fp_single(self, sock):
        """(c'): bench_fastpath alone: batches through a reused 256 MiB window."""
        dev0 = self.device_read()
        r, wall, ru, disk = self.tool(sock)
        dev1 = self.device_read()
        return self.row(r["bytes"], r["seconds"], wall, ru, disk, r["cmd"], batches=r["batches"],
                        daemon_device_bytes=None if dev0 is None else dev1 - dev0)

    def fp_many(self, sock, n):
        """(d): n bench_fastpath processes that connect, open and pre-fault,
        then start loading at the same CLOCK_REALTIME instant."""
        rb.settle(self.stat_path)
        note = rb.drop_caches()
        if note:
            self.notes.add(note)
        dev0 = self.device_read()
        disk0 = rb.disk_read_bytes(self.stat_path)
        start_at = time.time() + 1.5 + 0.1 * n
        argv = [self.tool_exe, sock, "m", "--start-at", f"{start_at:.6f}"]
        files = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in range(n)]
        procs = [subprocess.Popen(argv, stdout=fo, stderr=fe, env=env_clean()) for fo, fe in files]
        for p in procs:
            p.wait()
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
            clients.append(json.loads(out))
        late = max(c["late"] for c in clients)
        if late > 0:
            self.notes.add(f"(d): a client finished its setup {late:.3f} s after the common start")
        total = sum(c["bytes"] for c in clients)
        span = max(c["end"] for c in clients) - min(c["start"] for c in clients)
        slowest = max(c["seconds"] for c in clients)
        return {"clients": n, "per_client": [{k: c[k] for k in ("bytes", "seconds", "late")}
                                              for c in clients],
                "bytes": total, "seconds": span, "gb_per_s": total / span / 1e9,
                "slowest_seconds": slowest,
                "daemon_device_bytes": None if dev0 is None else dev1 - dev0,
                "disk_read_bytes": None if disk0 is None else disk1 - disk0,
                "daemon_rss_mib": self.d.rss_kib() / 1024, "cmd": " ".join(argv)}

    def fp_latency_cli(self, sock, tensor, count):
        argv = [self.exe, "bench", "m", "--fastpath", sock, "--latency", tensor, "--count",
                str(count), "--json"]
        p, wall, ru, disk = self.cold(argv)
        r = json.loads(p.stdout)
        r["cmd"] = " ".join(argv)
        return r

    def fp_latency_cold(self, sock, suffix, rounds):
        dev0 = self.device_read()
        r, wall, ru, disk = self.tool(sock, "--cold", suffix, rounds)
        r["daemon_device_bytes"] = self.device_read() - dev0
        return r


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
    tool = os.path.abspath(os.path.join(a.build_dir, "bench", "bench_fastpath"))
    for b in ("tensorvault", "tensorvaultd", "bench/bench_fastpath"):
        if not os.access(os.path.join(a.build_dir, b), os.X_OK):
            sys.exit(f"fastpath_bench: no {b} in {a.build_dir} (scripts/build plain)")
    if not shutil.which("fio"):
        sys.exit("fastpath_bench: fio is not installed (apt-get install fio)")
    from harness.daemon import Daemon  # noqa: E402 (numpy comes with it: after the checks)

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
    try:
        d.start()
        d.wait_socket()
        sock = d.socket_path
        t0 = time.monotonic()
        d.import_ok("m", index, activate=True)
        log(f"imported into the daemon's store {d.store} ({time.monotonic() - t0:.1f} s)")
        dev = d.device()
        img, off, used = dev["path"], dev["data_offset"], dev["used_bytes"]
        b = FastBench(exe, root, rb.disk_stat_path(root), d, tool)
        names = {"a": "(a) fio seq 1M io_uring qd32", "b": "(b) tensorvault bench --store",
                 "c": "(c) tensorvault bench --fastpath", "c'": "(c') bench_fastpath, 1 client",
                 "d": f"(d) bench_fastpath, {a.clients} at once"}
        fns = {"a": lambda: b.fio_seq(img, off, used), "b": lambda: b.tv_bench(d.store),
               "c": lambda: b.fp_bench(sock), "c'": lambda: b.fp_single(sock),
               "d": lambda: b.fp_many(sock, a.clients)}
        with Lock(a.lock):
            runs = interleaved(fns, repeat, log)
            lat_in = b.tv_latency(d.store, LATENCY_TENSOR, count)
            lat_warm = b.fp_latency_cli(sock, LATENCY_TENSOR, count)
            lat_cold = b.fp_latency_cold(sock, "self_attn.q_norm.weight", cold_rounds)
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
    ratios = {
        "c/b": g["c"] / g["b"],
        "c/a": g["c"] / g["a"],
        "device/model": (dd["daemon_device_bytes"] / model_bytes
                         if dd["daemon_device_bytes"] is not None else float("nan")),
        "slowest/single": dd["slowest_seconds"] / rows["c'"]["seconds"],
        "4k p50 fast/in-process": lat_warm["p50_us"] / lat_in["p50_us"],
    }
    other = {"4k p50 cold fast/in-process": lat_cold["p50_us"] / lat_in["p50_us"],
             "4k p99 fast/in-process": lat_warm["p99_us"] / lat_in["p99_us"],
             "(c')/(c)": g["c'"] / g["c"],
             "(d) aggregate/(c')": g["d"] / g["c'"],
             "(d) aggregate/(a)": g["d"] / g["a"]}
    notes = set(b.notes)
    if load0 > 0.5:
        notes.add(f"load average {load0:.2f} at start: other work shares the CPUs")
    if a.small:
        notes.add("--small: a smoke run on a small checkpoint, not the issue's figures")
    if lat_cold["daemon_device_bytes"] < lat_cold["count"] * 4096:
        notes.add(f"the cold latency rounds read only {lat_cold['daemon_device_bytes']} device "
                  f"bytes for {lat_cold['count']} reads: the daemon kept a group's slots between "
                  f"handles")
    up = ("device/model", "slowest/single", "4k p50 fast/in-process")  # lower is better

    pr = (lambda s="": print(s, file=sys.stderr)) if a.json else print
    pr(f"filesystem: {root} ({rb.fs_of(root)}); checkpoint {ck_bytes} bytes, {len(paths)} shards, "
       f"{len(heads)} tensors, {model_bytes} tensor bytes; store extent [{off}, +{used}) of {img}; "
       f"best of {repeat}")
    pr(f"{'what':<38}{'bytes':>12}{'seconds':>9}{'GB/s':>7}")
    for k, r in rows.items():
        pr(f"{names[k]:<38}{r['bytes']:>12}{r['seconds']:>9.3f}{r['gb_per_s']:>7.3f}")
    per = ", ".join(f"{c['seconds']:.3f}" for c in dd["per_client"])
    dev_b = dd["daemon_device_bytes"]
    pr(f"(d) first start to last end {dd['seconds']:.3f} s; per client s: {per}; daemon device "
       f"bytes {dev_b:.0f} for {model_bytes} model bytes ({dev_b / model_bytes:.3f}x); daemon RSS "
       f"{dd['daemon_rss_mib']:.0f} MiB")
    for k, v in ratios.items():
        ok = v <= TARGETS[k] if k in up else v >= TARGETS[k]
        pr(f"ratio {k:<24}{v:>7.3f}  (target {'<=' if k in up else '>='} {TARGETS[k]:.2f})  "
           f"{'PASS' if ok else 'MISS'}")
    pr("other ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in other.items()))
    pr(f"latency of a 4 KiB tensor ({LATENCY_TENSOR}):")
    for label, r in [("in-process (tensorvault bench --latency)", lat_in),
                     ("fast path warm (bench --fastpath --latency)", lat_warm),
                     (f"fast path cold ({len(q_norms)} q_norm x {cold_rounds} rounds)", lat_cold)]:
        pr(f"  {label:<46} p50 {r['p50_us']:>8.1f} us  p99 {r['p99_us']:>8.1f} us  "
           f"({r['count']} reads)")
    for n in sorted(notes):
        pr(f"note: {n}")
    pr(f"total {time.monotonic() - t_start:.0f} s")
    if a.json:
        print(json.dumps({"dir": root, "checkpoint": index, "checkpoint_bytes": ck_bytes,
                          "model_bytes": model_bytes, "small": a.small, "repeat": repeat,
                          "runs": rows, "ratios": ratios, "targets": TARGETS, "other_ratios": other,
                          "latency": {"in_process": lat_in, "fastpath_warm": lat_warm,
                                      "fastpath_cold": lat_cold},
                          "notes": sorted(notes), "total_seconds": time.monotonic() - t_start},
                         indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
