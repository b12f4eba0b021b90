#!/usr/bin/env python3
"""HTTP benchmark of tensorvaultd, each figure beside its reference in the
same run:

  1. wrk (-t2 -c64 -d10s, keep-alive, --latency) against GET /v1/models and
     against one tensor's metadata (GET .../tensors/{tensor}): req/s and p99.
     The issue's target on the 2-core machine: >= 20,000 req/s for tensor
     metadata.
  2. the tensor-bytes route over loopback: every tensor of a whole model
     fetched with GET .../tensors/{tensor}/data by a few concurrent
     keep-alive clients, against the in-process reader
     (`tensorvault bench --store S model`) on the same store in the same
     run; the ratio http/in-process is printed (target >= 0.8).

The daemon runs on a temp store (a sparse image in --dir) on a free loopback
port with anonymous loopback reads, so wrk needs no token. Every measurement
holds flock LOCK (TV_BENCH_LOCK, default /tmp/tv-bench.lock), shared with the
other benchmark drivers.
Usage: http_bench.py [--build-dir DIR] [--dir DIR] [--duration S] [--clients N]
                     [--model-mib N] [--repeat N] [--json]
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the test harness package
from harness.daemon import Daemon, seg  # noqa: E402
from benchutil import Lock  # noqa: E402

MiB = 1 << 20


def make_model(out_dir, total_mib, seed=0):
    """A GPT-2-shaped BF16 checkpoint of about total_mib MiB, two shards plus
    an index, written with the official writer."""
    rng = np.random.default_rng(seed)
    embd = 768
    tensors = {}
    per_layer = 12 * embd * embd * 2  # bytes of one layer's matrices
    n_layers = max(1, (total_mib * MiB) // per_layer)
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def rand(*shape):
        n = int(np.prod(shape))
        return np.frombuffer(rng.bytes(n * 2), dtype=bf16).reshape(shape).copy()

    for i in range(n_layers):
        p = f"h.{i}."
        tensors[p + "ln_1.weight"] = rand(embd)
        tensors[p + "ln_1.bias"] = rand(embd)
        tensors[p + "attn.c_attn.weight"] = rand(embd, 3 * embd)
        tensors[p + "attn.c_attn.bias"] = rand(3 * embd)
        tensors[p + "attn.c_proj.weight"] = rand(embd, embd)
        tensors[p + "attn.c_proj.bias"] = rand(embd)
        tensors[p + "ln_2.weight"] = rand(embd)
        tensors[p + "ln_2.bias"] = rand(embd)
        tensors[p + "mlp.c_fc.weight"] = rand(embd, 4 * embd)
        tensors[p + "mlp.c_fc.bias"] = rand(4 * embd)
        tensors[p + "mlp.c_proj.weight"] = rand(4 * embd, embd)
        tensors[p + "mlp.c_proj.bias"] = rand(embd)
    tensors["ln_f.weight"] = rand(embd)
    tensors["ln_f.bias"] = rand(embd)
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for s, part in enumerate([names[:half], names[half:]]):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, os.path.join(out_dir, fname))
        weight_map.update({k: fname for k in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                   "weight_map": weight_map}, f)
    return out_dir


def wrk(url, duration, threads=2, conns=64):
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", "--latency", url]
    p = subprocess.run(argv, capture_output=True, text=True, check=True)
    out = p.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    m = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99_ms = float(m.group(1)) * units[m.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"cmd": " ".join(argv), "req_per_s": rps, "p99_ms": p99_ms,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": errors.group(1) if errors else None}


def fetch_all(port, paths, clients):
    """Every path once over `clients` keep-alive connections; returns (bytes,
    seconds)."""
    lock = threading.Lock()
    queue = list(reversed(paths))
    total = [0]
    resets = [0]
    failures = []

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        n = 0
        while True:
            with lock:
                if not queue:
                    break
                path = queue.pop()
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
            except (http.client.RemoteDisconnected, ConnectionResetError):
                # the server closed a keep-alive connection: counted, retried once
                with lock:
                    resets[0] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
            if r.status != 200:
                failures.append((path, r.status))
            n += len(body)
        conn.close()
        with lock:
            total[0] += n

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"http_bench: tensor-bytes route failed: {failures[:5]}")
    return total[0], secs, resets[0]


def inproc(exe, store, model):
    argv = [exe, "bench", "--store", store, model, "--json"]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"http_bench: {' '.join(argv)} failed: {p.stderr}")
    r = json.loads(p.stdout)
    nbytes = next(r[k] for k in ("bytes", "total_bytes", "nbytes", "read_bytes") if k in r)
    return {"cmd": " ".join(argv), "bytes": nbytes, "seconds": r["seconds"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp/tv-bench"))
    ap.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients of the bytes route")
    ap.add_argument("--model-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the bytes comparison")
    ap.add_argument("--lock", default=os.environ.get("TV_BENCH_LOCK", "/tmp/tv-bench.lock"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("http_bench: wrk is not installed (apt-get install wrk)")
    exe = os.path.join(a.build_dir, "tensorvault")
    if not os.path.exists(os.path.join(a.build_dir, "tensorvaultd")):
        sys.exit(f"http_bench: no tensorvaultd in {a.build_dir} (scripts/build plain)")
    os.makedirs(a.dir, exist_ok=True)
    ckpt = os.path.join(a.dir, f"http-gpt2-{a.model_mib}m")
    if not os.path.exists(os.path.join(ckpt, "model.safetensors.index.json")):
        make_model(ckpt, a.model_mib)
    work = tempfile.mkdtemp(prefix="http-", dir=a.dir)
    d = Daemon(a.build_dir, work, settings={"import.roots": a.dir, "store.image_size": "8G",
                                            "http.anonymous_reads": "loopback"})
    out = {}
    try:
        d.start()
        job = d.import_ok("gpt2", ckpt, activate=True)
        names, cursor = [], None
        while True:
            q = "limit=1000" + (f"&cursor={urllib.parse.quote(cursor, safe='')}" if cursor else "")
            doc = d.ok("GET", f"/v1/models/gpt2/generations/active/tensors?{q}")
            names += [t["name"] for t in doc["tensors"]]
            cursor = doc["next_cursor"]
            if cursor is None:
                break
        base = f"http://127.0.0.1:{d.port}"
        meta = f"/v1/models/gpt2/generations/active/tensors/{seg('h.0.attn.c_attn.weight')}"
        with Lock(a.lock):
            out["models"] = wrk(base + "/v1/models", a.duration)
        with Lock(a.lock):
            out["tensor_meta"] = wrk(base + meta, a.duration)
        paths = [f"/v1/models/gpt2/generations/active/tensors/{seg(n)}/data" for n in names]
        runs = []
        for _ in range(a.repeat):
            with Lock(a.lock):
                nb, secs, resets = fetch_all(d.port, paths, a.clients)
                ref = inproc(exe, d.store, "gpt2")
            assert nb == ref["bytes"], (nb, ref)
            runs.append({"http_gb_per_s": nb / secs / 1e9, "connection_resets": resets,
                         "inproc_gb_per_s": ref["bytes"] / ref["seconds"] / 1e9})
        best_http = max(r["http_gb_per_s"] for r in runs)
        best_in = max(r["inproc_gb_per_s"] for r in runs)
        out["bytes"] = {"model_bytes": job["result"]["total_bytes"], "tensors": len(names),
                        "clients": a.clients, "runs": runs, "http_gb_per_s": best_http,
                        "inproc_gb_per_s": best_in, "ratio": best_http / best_in,
                        "inproc_cmd": ref["cmd"]}
    except BaseException:
        sys.stderr.write("http_bench: daemon log (tail):\n" + d.log_text()[-4000:] + "\n")
        raise
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"wrk -t2 -c64 -d{a.duration}s --latency (keep-alive):")
    for key, label in [("models", "GET /v1/models"), ("tensor_meta", "GET tensor metadata")]:
        r = out[key]
        extra = f"  non-2xx {r['non_2xx']}" if r["non_2xx"] else ""
        print(f"  {label:<24} {r['req_per_s']:>10.0f} req/s   p99 {r['p99_ms']:>7.2f} ms{extra}")
    b = out["bytes"]
    print(f"tensor bytes, whole model ({b['tensors']} tensors, {b['model_bytes'] / MiB:.0f} MiB, "
          f"{b['clients']} clients, best of {len(b['runs'])}):")
    print(f"  GET .../tensors/{{t}}/data over loopback  {b['http_gb_per_s']:>6.2f} GB/s")
    print(f"  tensorvault bench (in-process)          {b['inproc_gb_per_s']:>6.2f} GB/s")
    print(f"  ratio http / in-process                 {b['ratio']:>6.2f}  (target >= 0.8)")
    n_resets = sum(r["connection_resets"] for r in b["runs"])
    if n_resets:
        print(f"  keep-alive connections closed by the server and retried: {n_resets}")


if __name__ == "__main__":
    main()
