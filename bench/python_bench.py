#!/usr/bin/env python3
"""Python loading benchmark: every tensor of a checkpoint into
host memory, in one run, in interleaved rounds, each measurement in its own
process from a dropped page cache:
  (b)  the C in-process reader: `tensorvault bench --store S m` (the ceiling);
  (t)  tensorvault.safe_open through the fast path (tensorvaultd on the same
       store), get_tensor of every name in offset_keys(), each kept:
       framework="np" and framework="pt";
  (tb) the same with one get_tensors() call (informational);
  (s)  the official safetensors.safe_open (0.8, backend "mmap", its default)
       on the original shard files, get_tensor of every key, each kept:
       framework="np" and "pt";
  (sp) the same with backend="pread" (reported);
on a >= 2 GiB checkpoint (bench/read_bench.py's, cached under --dir), then
the start-up case: a ~100 MB model (F16 matrices and F32 norms, GPT-2-small
shaped rows, 1 shard), the time from safe_open to the last tensor, pt and
np, for tensorvault (fast path; and pt with store=, in-process: (ts))
against the official loader.

Prints each row (GB/s, seconds, disk bytes the kernel read during it, peak
RSS), the ratios and the issue's targets: t/b >= 0.9 (np and pt), t/s >= 2.0
(np and pt), small: t/s time <= 0.8. The exit status is 0 whatever the ratios.

Invariants: each loader's seconds are its own timing from safe_open until
every page of every tensor was touched (touch(): the official pt loader's
mmap tensors are read only when touched), connect and open included for
tensorvault, interpreter start-up and imports (done before the clock
starts) for nobody; `tensorvault bench` times tv_read_batch only;
the daemon's read group closes with its last handle, so every run reads the
device again (its slots are not a cache across runs); measurements hold the
benchmark lock (TV_BENCH_LOCK, shared with the other drivers); the store is
deleted afterwards unless --keep-store.

Usage: python_bench.py [--dir DIR] [--build-dir DIR] [--repeat N] [--small-repeat N]
                       [--small] [--json] [--keep-store]
--small (or TV_BENCH_SMALL=1): bench/fastpath_bench.py's ~150 MiB checkpoint in
place of the big one and one round: a smoke run, its figures mean little.
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
import read_bench as rb  # noqa: E402  (checkpoint, cold-cache runs)
import fastpath_bench as fb  # noqa: E402  (the small checkpoint)
from benchutil import Lock, interleaved  # noqa: E402

MiB = 1 << 20
TARGETS = {"t/b np": 0.9, "t/b pt": 0.9, "t/s np": 2.0, "t/s pt": 2.0, "small t/s time pt": 0.8}
STARTUP_SPEC = {"version": 1, "layers": 8, "hidden": 768, "dtypes": ["F16", "F32"],
                "writer": "safetensors.numpy.save_file"}


# ---------------------------------------------------------------- children

def preload(framework):
    """Imports what the loaders need before the clock starts (torch's
    libraries are ~1 GB read from a cold page cache: nobody's load time)."""
    import numpy  # noqa: F401
    if framework == "pt":
        import torch  # noqa: F401


def child_tv(framework, mode, where, spec):
    """where: the daemon's socket, or store:DIR (in-process)."""
    preload(framework)
    import tensorvault
    src = {"store": where[6:]} if where.startswith("store:") else {"socket": where}
    out, total = {}, 0
    t0 = time.monotonic()
    with tensorvault.safe_open(spec, framework=framework, **src) as f:
        if mode == "batch":
            out = f.get_tensors()
        else:
            for k in f.offset_keys():
                out[k] = f.get_tensor(k)
    touch(out)
    secs = time.monotonic() - t0
    total = sum(_nbytes(t) for t in out.values())
    return {"bytes": total, "seconds": secs, "tensors": len(out)}


def child_official(framework, backend, paths):
    preload(framework)
    from safetensors import safe_open
    out = {}
    t0 = time.monotonic()
    for p in paths:
        with safe_open(p, framework=framework, backend=backend) as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    touch(out)
    secs = time.monotonic() - t0
    return {"bytes": sum(_nbytes(t) for t in out.values()), "seconds": secs, "tensors": len(out)}


def touch(out):
    """Reads one byte of every 4 KiB page of every tensor: the official pt
    loader with its default mmap backend returns tensors over the file's
    mapping that are not read yet (RSS grows only when touched), so a load
    counts as done only when every page is in memory. The same pass runs
    for every loader (a strided read of resident memory costs little)."""
    for t in out.values():
        if hasattr(t, "numel"):
            if t.numel():
                t.reshape(-1).view(_torch().uint8)[::4096].sum()
        elif t.size:
            t.reshape(-1).view("u1")[::4096].sum()


def _torch():
    import torch
    return torch


def _nbytes(t):
    n = getattr(t, "nbytes", None)
    return n if isinstance(n, int) else t.numel() * t.element_size()


# ---------------------------------------------------------------- start-up model

def startup_dir(root):
    return os.path.join(root, "startup-100m")


def ensure_startup(root, log):
    """A ~100 MB single-file model: 8 layers of [768, 2304] qkv, [768, 768]
    out, [768, 3072] and [3072, 768] MLP in F16, F32 norms and biases, plus
    a [16384, 768] F16 embedding (~130 tensors). Generated once."""
    d = startup_dir(root)
    path = os.path.join(d, "model.safetensors")
    try:
        with open(os.path.join(d, rb.STAMP)) as f:
            if json.load(f) == STARTUP_SPEC and os.path.exists(path):
                return path
    except (OSError, ValueError):
        pass
    subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-startup", "--dir", root],
                   check=True)
    log(f"generated {path}")
    return path


def generate_startup(root):
    import numpy as np
    from safetensors.numpy import save_file
    d = startup_dir(root)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = np.random.default_rng(11)
    h = STARTUP_SPEC["hidden"]
    t = {"wte.weight": rng.standard_normal((16384, h), dtype=np.float32).astype(np.float16)}
    for i in range(STARTUP_SPEC["layers"]):
        p = f"h.{i}."
        for name, shape in (("attn.c_attn.weight", (h, 3 * h)), ("attn.c_proj.weight", (h, h)),
                            ("mlp.c_fc.weight", (h, 4 * h)), ("mlp.c_proj.weight", (4 * h, h))):
            t[p + name] = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
        for name, n in (("ln_1.weight", h), ("ln_1.bias", h), ("ln_2.weight", h), ("ln_2.bias", h),
                        ("attn.c_attn.bias", 3 * h), ("attn.c_proj.bias", h),
                        ("mlp.c_fc.bias", 4 * h), ("mlp.c_proj.bias", h)):
            t[p + name] = rng.standard_normal(n, dtype=np.float32)
    t["ln_f.weight"] = np.ones(h, dtype=np.float32)
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    os.sync()
    with open(os.path.join(d, rb.STAMP), "w") as f:
        json.dump(STARTUP_SPEC, f)


# ---------------------------------------------------------------- driver

class PyBench(rb.Bench):
    def child(self, *args):
        argv = [sys.executable, os.path.abspath(__file__), "--child", *map(str, args)]
        p, wall, ru, disk = self.cold(argv)
        r = json.loads(p.stdout)
        return self.row(r["bytes"], r["seconds"], wall, ru, disk, " ".join(argv),
                        tensors=r["tensors"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp/tv-bench"))
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--small", action="store_true", default=os.environ.get("TV_BENCH_SMALL") == "1")
    ap.add_argument("--repeat", type=int, default=None, help="rounds on the big checkpoint (3; --small 1)")
    ap.add_argument("--small-repeat", type=int, default=None, help="rounds of the start-up case (5)")
    ap.add_argument("--lock", default=os.environ.get("TV_BENCH_LOCK", "/tmp/tv-bench.lock"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-store", action="store_true")
    ap.add_argument("--generate-startup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "tv":
            r = child_tv(*rest)
        else:
            r = child_official(rest[0], rest[1], rest[2:])
        print(json.dumps(r))
        return 0
    root = os.path.abspath(a.dir)
    if a.generate_startup:
        generate_startup(root)
        return 0
    repeat = a.repeat or (1 if a.small else 3)
    small_repeat = a.small_repeat or (2 if a.small else 5)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    exe = os.path.abspath(os.path.join(a.build_dir, "tensorvault"))
    for b in ("tensorvault", "tensorvaultd"):
        if not os.access(os.path.join(a.build_dir, b), os.X_OK):
            sys.exit(f"python_bench: no {b} in {a.build_dir} (scripts/build plain)")
    from harness.daemon import Daemon  # noqa: E402

    os.makedirs(root, exist_ok=True)
    t_start = time.monotonic()
    load0 = os.getloadavg()[0]
    if a.small:
        index, _ = fb.small_checkpoint(root, log)
    else:
        index, _ = rb.ensure_checkpoint(root, 3, log)
    paths = rb.shard_paths(index)
    startup = ensure_startup(root, log)
    ck_bytes = sum(os.path.getsize(p) for p in paths) + os.path.getsize(startup)

    work = tempfile.mkdtemp(prefix="py-", dir=root)
    size = -(-int(ck_bytes * 1.05 + 256 * MiB) // MiB)
    roots = f"{os.path.dirname(index)}:{os.path.dirname(startup)}"
    d = Daemon(a.build_dir, work, settings={"import.roots": roots, "store.image_size": f"{size}M",
                                            "log.level": "warn"})
    b = None
    try:
        d.start()
        d.wait_socket()
        sock = d.socket_path
        d.import_ok("m", index, activate=True)
        d.import_ok("small", startup, activate=True)
        log(f"imported into {d.store}")
        b = PyBench(exe, root, rb.disk_stat_path(root))
        names = {
            "b": "(b) tensorvault bench --store (C)",
            "b'": "(b') the same, --fresh buffers",
            "t np": "(t) tensorvault.safe_open np",
            "t pt": "(t) tensorvault.safe_open pt",
            "tb np": "(tb) tensorvault get_tensors() np",
            "ts pt": "(ts) tensorvault store= pt (in-process)",
            "s np": "(s) safetensors np (mmap)",
            "s pt": "(s) safetensors pt (mmap)",
            "sp np": "(sp) safetensors np pread",
            "sp pt": "(sp) safetensors pt pread",
        }
        fns = {
            "b": lambda: b.tv_bench(d.store),
            "b'": lambda: b.tv_bench(d.store, fresh=True),
            "t np": lambda: b.child("tv", "np", "loop", sock, "m"),
            "t pt": lambda: b.child("tv", "pt", "loop", sock, "m"),
            "tb np": lambda: b.child("tv", "np", "batch", sock, "m"),
            "s np": lambda: b.child("st", "np", "mmap", *paths),
            "s pt": lambda: b.child("st", "pt", "mmap", *paths),
            "sp np": lambda: b.child("st", "np", "pread", *paths),
            "sp pt": lambda: b.child("st", "pt", "pread", *paths),
        }
        small_fns = {"t pt": lambda: b.child("tv", "pt", "loop", sock, "small"),
                     "ts pt": lambda: b.child("tv", "pt", "loop", "store:" + d.store, "small"),
                     "s pt": lambda: b.child("st", "pt", "mmap", startup),
                     "t np": lambda: b.child("tv", "np", "loop", sock, "small"),
                     "s np": lambda: b.child("st", "np", "mmap", startup)}
        with Lock(a.lock):
            runs = interleaved(fns, repeat, log)
            small_runs = interleaved(small_fns, small_repeat)
            log("  start-up (s): " + ", ".join(f"{k} {min(x['seconds'] for x in v):.3f}"
                                              for k, v in small_runs.items()))
    except BaseException:
        sys.stderr.write("python_bench: daemon log (tail):\n" + d.log_text()[-4000:] + "\n")
        raise
    finally:
        d.stop()
        if not a.keep_store:
            shutil.rmtree(work, ignore_errors=True)

    rows = {k: rb.best(v) for k, v in runs.items()}
    srows = {k: rb.best(v) for k, v in small_runs.items()}
    g = {k: r["gb_per_s"] for k, r in rows.items()}
    ratios = {"t/b np": g["t np"] / g["b"], "t/b pt": g["t pt"] / g["b"],
              "t/s np": g["t np"] / g["s np"], "t/s pt": g["t pt"] / g["s pt"],
              "small t/s time pt": srows["t pt"]["seconds"] / srows["s pt"]["seconds"]}
    other = {"t/sp np": g["t np"] / g["sp np"], "t/sp pt": g["t pt"] / g["sp pt"],
             "tb/t np": g["tb np"] / g["t np"],
             "small t/s time np": srows["t np"]["seconds"] / srows["s np"]["seconds"],
             "small ts/s time pt": srows["ts pt"]["seconds"] / srows["s pt"]["seconds"]}
    notes = set(b.notes) if b else set()
    if load0 > 0.5:
        notes.add(f"load average {load0:.2f} at start: other work shares the CPUs")
    if a.small:
        notes.add("--small: a smoke run on a small checkpoint, not the issue's figures")
    up = ("small t/s time pt",)

    pr = (lambda s="": print(s, file=sys.stderr)) if a.json else print
    model_bytes = rows["b"]["bytes"]
    pr(f"filesystem: {root} ({rb.fs_of(root)}); checkpoint {index}: {len(paths)} shards, "
       f"{model_bytes} tensor bytes; start-up model {startup} "
       f"({os.path.getsize(startup)} bytes); best of {repeat} / {small_repeat}")
    pr(f"{'what':<38}{'bytes':>12}{'seconds':>9}{'GB/s':>7}{'disk MB':>9}{'RSS MiB':>9}")
    for label, rs in (("", rows), ("start-up ", srows)):
        for k, r in rs.items():
            disk = r["disk_read_bytes"]
            pr(f"{label + names[k]:<38}{r['bytes']:>12}{r['seconds']:>9.3f}{r['gb_per_s']:>7.3f}"
               f"{(disk or 0) / 1e6:>9.0f}{r['peak_rss_mib']:>9.0f}")
    for k, v in ratios.items():
        ok = v <= TARGETS[k] if k in up else v >= TARGETS[k]
        pr(f"ratio {k:<20}{v:>7.3f}  (target {'<=' if k in up else '>='} {TARGETS[k]:.2f})  "
           f"{'PASS' if ok else 'MISS'}")
    pr("other ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in other.items()))
    for n in sorted(notes):
        pr(f"note: {n}")
    pr(f"total {time.monotonic() - t_start:.0f} s")
    if a.json:
        print(json.dumps({"dir": root, "checkpoint": index, "startup_model": startup,
                          "small": a.small, "repeat": repeat, "small_repeat": small_repeat,
                          "runs": rows, "startup_runs": srows, "ratios": ratios,
                          "targets": TARGETS, "other_ratios": other, "notes": sorted(notes),
                          "total_seconds": time.monotonic() - t_start}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
