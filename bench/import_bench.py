#!/usr/bin/env python3
"""Import benchmark: `tensorvault import` of a >= 2 GiB checkpoint written by
the official safetensors writer, side by side with fio writing the same byte
count the way the importer does (one writer, synchronous O_DIRECT pwrites of
8 MiB, then one flush; also io_uring at depth 4), all on one filesystem.

Two more rows tell where an import's time goes when the checkpoint lies on
the same disk as the store: "fio copy" does the importer's I/O without its
CPU work (an O_DIRECT sequential read of the shards while another job writes
the same byte count with O_DIRECT, at once, as the importer reads a cold
source), and "import, source cached" imports with the shards already in the
page cache (only the writes reach the disk). --no-peers skips them. The
cold-import figure is the import row against "fio copy" of the same round
set: "ratio cold import/fio copy" (target >= 0.85). The importer's CPU
cost is its user + system CPU seconds (os.wait4) per GB of checkpoint.

Invariants: every measurement starts with a synced, settled disk and a cold
page cache when that is permitted (root: drop_caches; otherwise a note says
it was not); the disk's own counters are read around every run, and a note
says when other processes' I/O ran at the same time; the fio file and the
store image are sparse files on the same filesystem as the checkpoint and
are deleted afterwards; the checkpoint is cached (a stamp file records the
spec) and reused across runs. The importer's peak RSS is its ru_maxrss from
os.wait4 on its pid; this process stays small (no numpy here; generation
runs in a child) because a child's ru_maxrss starts at its parent's RSS.

Usage: import_bench.py [--dir DIR] [--build-dir DIR] [--gib N] [--shards N]
                       [--repeat N] [--no-peers] [--json]
The table shows the fastest of --repeat interleaved rounds (default 3; a
shared disk only ever makes a run slower), preferring runs during which no
other process used the disk; the JSON also has every run and the median.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
BLOCK = 8 * MiB          # the importer's default chunk; fio's --bs
RANDOM_BLOCK = 64 * MiB  # tensors tile a fresh random block: generating 2 GiB of randomness is slow
STAMP = ".tv-bench-stamp"
FIO_PSYNC, FIO_URING, IMPORT = "fio psync qd1", "fio io_uring qd4", "tensorvault import"
FIO_COPY, IMPORT_CACHED = "fio copy (read+write)", "import, source cached"


# ---------------------------------------------------------------- checkpoint

def ckpt_spec(gib, shards):
    """Per shard: three big tensors (F32, BF16, F16) of roughly equal size and
    a few small ones (one of odd length). As in real checkpoints, the data
    section starts at 8 + header length, so tensors are 8-byte but not
    4 KiB aligned in the file."""
    per_shard = math.ceil(gib * GiB / shards)
    big = -(-per_shard // 3 // MiB) * MiB
    return {"version": 1, "gib": gib, "shards": shards, "big_tensor_bytes": big,
            "writer": "safetensors.numpy.save_file"}


def shard_tensors(rng, s, big):
    import ml_dtypes
    import numpy as np

    def tiled(n_bytes, dtype):
        block = np.frombuffer(rng.bytes(RANDOM_BLOCK), dtype=np.uint8)
        raw = np.resize(block, n_bytes)  # repeats the block: cheap, still random-looking
        return raw.view(dtype)

    i = s * 8
    return {
        f"model.layers.{i}.mlp.up_proj.weight": tiled(big, np.float32).reshape(-1, 4096),
        f"model.layers.{i}.mlp.down_proj.weight": tiled(big, ml_dtypes.bfloat16).reshape(4096, -1),
        f"model.layers.{i}.self_attn.qkv.weight": tiled(big, np.float16).reshape(-1, 2048),
        f"model.layers.{i}.input_layernorm.weight": np.frombuffer(rng.bytes(4096 * 2), np.float16).copy(),
        f"model.layers.{i}.odd.u8": np.frombuffer(rng.bytes(13), np.uint8).copy(),
        f"model.layers.{i}.post_attention_layernorm.weight": np.frombuffer(rng.bytes(4096 * 2), np.float16).copy(),
    }


def ckpt_dir(root, gib, shards):
    return os.path.join(root, f"tv-bench-ckpt-{gib:g}g-{shards}s")


def ensure_checkpoint(root, gib, shards, log):
    """Returns (index path, total bytes of the shard files, generated?).
    Generation runs in a child process: numpy's arrays would otherwise stay
    in this process's RSS, and a child's ru_maxrss starts from its parent's
    RSS at fork (Linux records the pre-exec high-water mark)."""
    spec = ckpt_spec(gib, shards)
    d = ckpt_dir(root, gib, shards)
    index = os.path.join(d, "model.safetensors.index.json")
    try:
        with open(os.path.join(d, STAMP)) as f:
            if json.load(f) == spec and os.path.exists(index):
                return index, _shards_bytes(index), False
    except (OSError, ValueError):
        pass
    subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-only",
                    "--dir", root, "--gib", str(gib), "--shards", str(shards)], check=True)
    return index, _shards_bytes(index), True


def generate_checkpoint(root, gib, shards, log):
    """Writes the checkpoint with the official writer, shard by shard (one
    shard's arrays in memory at a time), then the index, then the stamp."""
    import numpy as np
    from safetensors.numpy import save_file

    spec = ckpt_spec(gib, shards)
    d = ckpt_dir(root, gib, shards)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = np.random.default_rng(20240607)
    weight_map, total = {}, 0
    t0 = time.monotonic()
    for s in range(shards):
        tensors = shard_tensors(rng, s, spec["big_tensor_bytes"])
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, os.path.join(d, fname), metadata={"format": "np"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += v.nbytes
        del tensors
        log(f"  wrote {fname} ({time.monotonic() - t0:.1f} s)")
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.sync()
    with open(os.path.join(d, STAMP), "w") as f:
        json.dump(spec, f)


def _shards_bytes(index):
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    return sum(os.path.getsize(os.path.join(os.path.dirname(index), s)) for s in files)


# ---------------------------------------------------------------- measuring

def _disk_stat_path(path):
    """/sys/dev/block/MAJ:MIN/stat of the block device holding path, or None
    (tmpfs, overlay: no block device to watch)."""
    st = os.stat(path)
    p = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    return p if os.path.exists(p) else None


def disk_io_bytes(stat_path):
    """Bytes read + written so far by the whole disk (every process)."""
    if not stat_path:
        return None
    with open(stat_path) as f:
        v = f.read().split()
    return (int(v[2]) + int(v[6])) * 512


def settle(stat_path):
    """sync, then wait (at most 5 s) until the disk has nothing in flight and
    its discard counter stopped moving: deleting the previous run's 2 GiB
    file on a filesystem mounted with -o discard issues discards that would
    otherwise land in the next measurement."""
    os.sync()
    if not stat_path:
        return
    prev, t_end = None, time.monotonic() + 5
    while time.monotonic() < t_end:
        with open(stat_path) as f:
            v = f.read().split()
        cur = (v[8], v[14] if len(v) > 14 else "")  # in_flight, discard sectors
        if cur == prev and v[8] == "0":
            return
        prev = cur
        time.sleep(0.25)


def drop_caches():
    """Cold page cache; returns None or a note saying why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as e:
        return f"page cache not dropped ({e.strerror}); figures may be warm"


LAST_DISK_IO = [None]  # disk bytes moved during the last timed() run
LAST_CPU = [None]      # user + system CPU seconds of the last timed() child


def timed(argv, stat_path=None):
    """Runs argv; returns (CompletedProcess, wall seconds, peak RSS KiB of
    that child). Output goes to temporary files, not pipes, so the child is
    reaped with os.wait4 (its own rusage) without a pipe deadlock."""
    import tempfile
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        io0 = disk_io_bytes(stat_path)
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=fo, stderr=fe)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        io1 = disk_io_bytes(stat_path)
        LAST_DISK_IO[0] = None if io0 is None else io1 - io0
        LAST_CPU[0] = ru.ru_utime + ru.ru_stime
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(), fe.read().decode()
    return subprocess.CompletedProcess(argv, p.returncode, out, err), wall, ru.ru_maxrss


def _sparse(path, size):
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:  # a sparse file, like the store image
        f.truncate(size)


def _fio(argv, what, stat_path):
    p, wall, _ = timed(argv + ["--output-format=json"], stat_path)
    if p.returncode != 0:
        raise RuntimeError(f"fio ({what}) failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout[p.stdout.index("{"):])["jobs"], wall


def fio_write(path, nbytes, engine, depth, stat_path):
    """(a) One writer, sequential O_DIRECT writes of BLOCK, then one flush."""
    size = -(-nbytes // BLOCK) * BLOCK
    _sparse(path, size)
    argv = ["fio", "--name=w", "--rw=write", f"--bs={BLOCK}", "--direct=1",
            f"--ioengine={engine}", f"--iodepth={depth}", f"--size={size}",
            f"--filename={path}", "--fallocate=none", "--end_fsync=1"]
    settle(stat_path)
    note = drop_caches()
    try:
        jobs, wall = _fio(argv, engine, stat_path)
    finally:
        os.unlink(path)
    # fio's own job time (the writes and the final fsync), not its wall
    # clock: fio spends ~0.3-0.5 s setting up before the first write.
    return {"bytes": size, "seconds": jobs[0]["job_runtime"] / 1e3, "wall_seconds": wall,
            "fio_bw_bytes": jobs[0]["write"]["bw_bytes"], "cmd": " ".join(argv), "note": note,
            "own_io": size, "disk_io": LAST_DISK_IO[0]}


def fio_copy(path, shard_paths, nbytes, stat_path):
    """The importer's I/O without its CPU work: one job reading the shards
    (O_DIRECT, BLOCK at a time, sequential, as the importer reads a source
    that is not in the page cache) while another writes the same byte count
    with O_DIRECT; both at once, from a cold cache. On one disk this is the
    I/O limit an import can reach."""
    size = -(-nbytes // BLOCK) * BLOCK
    _sparse(path, size)
    argv = ["fio", "--name=r", "--rw=read", f"--bs={BLOCK}", "--direct=1", "--ioengine=psync",
            "--filename=" + ":".join(p.replace(":", "\\:") for p in shard_paths),
            "--file_service_type=sequential", "--invalidate=0",
            "--name=w", "--rw=write", f"--bs={BLOCK}", "--direct=1", "--ioengine=psync",
            f"--size={size}", f"--filename={path}", "--fallocate=none", "--end_fsync=1"]
    settle(stat_path)
    note = drop_caches()
    try:
        jobs, wall = _fio(argv, "copy", stat_path)
    finally:
        os.unlink(path)
    return {"bytes": size, "seconds": max(j["job_runtime"] for j in jobs) / 1e3,
            "wall_seconds": wall, "read_bytes": jobs[0]["read"]["io_bytes"],
            "cmd": " ".join(argv), "note": note, "own_io": size + nbytes,
            "disk_io": LAST_DISK_IO[0]}


def tv_import(exe, root, index, shard_paths, nbytes, stat_path, cached=False):
    """(b) tensorvault import into a fresh store on a sparse image, timed
    as the whole command (start-up, validation, writes, flush, publish); with
    cached=True the shards are read once beforehand, so the import reads
    them from the page cache and only its writes reach the disk."""
    store = os.path.join(root, "tv-bench-store")
    img = os.path.join(root, "tv-bench-store.img")
    shutil.rmtree(store, ignore_errors=True)
    if os.path.exists(img):
        os.unlink(img)
    size = -(-int(nbytes * 1.1) // MiB) * MiB
    try:
        p = subprocess.run([exe, "store", "init", "--store", store, "--image", img,
                            "--size", str(size), "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"store init failed: {p.stderr.strip()}")
        settle(stat_path)
        note = drop_caches()
        if cached:  # read by cat, not here: this process's RSS is the RSS reading's floor
            subprocess.run(["cat", *shard_paths], stdout=subprocess.DEVNULL, check=True)
        p, wall, rss_kib = timed([exe, "import", "--store", store, "m", index, "--json"],
                                 stat_path)
        if p.returncode != 0:
            raise RuntimeError(f"import failed ({p.returncode}): {p.stderr.strip()}")
        r = json.loads(p.stdout)
        return {"bytes": r["total_bytes"], "bytes_written": r["written_bytes"], "seconds": wall,
                "importer_seconds": r["seconds"], "peak_rss_kib": rss_kib, "note": note,
                "cpu_seconds": LAST_CPU[0], "cpu_s_per_gb": LAST_CPU[0] / (r["total_bytes"] / 1e9),
                "own_io": r["written_bytes"] + (0 if cached else nbytes),
                "disk_io": LAST_DISK_IO[0],
                "cmd": f"{exe} import --store {store} m {index} --json"}
    finally:
        shutil.rmtree(store, ignore_errors=True)
        if os.path.exists(img):
            os.unlink(img)


def contaminated(r):
    """True when the disk moved clearly more bytes than this run's own I/O
    (another process was using the disk at the same time)."""
    return r.get("disk_io") is not None and r["disk_io"] > 1.15 * r["own_io"] + 64 * MiB


def summarize(runs):
    """The fastest run without foreign I/O counts (a shared disk only ever
    makes runs slower), else the fastest; the median and every run's
    seconds go into the JSON."""
    clean = [x for x in runs if not contaminated(x)] or runs
    r = dict(min(clean, key=lambda x: x["seconds"]))
    secs = sorted(x["seconds"] for x in runs)
    r["seconds_all"] = [x["seconds"] for x in runs]
    r["contaminated_all"] = [contaminated(x) for x in runs]
    r["seconds_median"] = secs[len(secs) // 2]
    r["mb_per_s"] = r["bytes"] / r["seconds"] / 1e6
    r["mb_per_s_median"] = r["bytes"] / r["seconds_median"] / 1e6
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("TV_BENCH_DIR", "/tmp"),
                    help="filesystem for the checkpoint, the fio file and the store image")
    ap.add_argument("--build-dir", default=os.environ.get("TV_BUILD_DIR", "build"))
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size (at least)")
    ap.add_argument("--shards", type=int, default=3, choices=range(2, 5))
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds (fio psync, fio io_uring, import, interleaved); the fastest counts")
    ap.add_argument("--json", action="store_true", help="also print one JSON document")
    ap.add_argument("--no-peers", action="store_true",
                    help="skip the extra rows (fio copy, import with the source cached)")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()

    log = lambda m: print(m, file=sys.stderr, flush=True)
    root = os.path.abspath(a.dir)
    if a.generate_only:
        generate_checkpoint(root, a.gib, a.shards, log)
        return 0
    exe = os.path.abspath(os.path.join(a.build_dir, "tensorvault"))
    if not os.access(exe, os.X_OK):
        sys.exit(f"import_bench: no tensorvault binary at {exe}")
    if not shutil.which("fio"):
        sys.exit("import_bench: fio is not installed (apt-get install fio)")
    os.makedirs(root, exist_ok=True)

    log(f"checkpoint in {root} ...")
    index, nbytes, fresh = ensure_checkpoint(root, a.gib, a.shards, log)
    log(f"  {index}: {nbytes} bytes ({'generated' if fresh else 'cached'})")

    fio_path = os.path.join(root, "tv-bench-fio.dat")
    with open(index) as f:
        shard_paths = [os.path.join(os.path.dirname(index), s)
                       for s in sorted(set(json.load(f)["weight_map"].values()))]
    stat_path = _disk_stat_path(root)
    runs = {k: [] for k in (FIO_PSYNC, FIO_URING, IMPORT, FIO_COPY, IMPORT_CACHED)}
    import resource
    try:
        for i in range(a.repeat):
            runs[FIO_PSYNC].append(fio_write(fio_path, nbytes, "psync", 1, stat_path))
            runs[FIO_URING].append(fio_write(fio_path, nbytes, "io_uring", 4, stat_path))
            # A child's ru_maxrss can be no lower than this process's RSS
            # when it was spawned: that is the floor of the reading.
            floor_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            r = tv_import(exe, root, index, shard_paths, nbytes, stat_path)
            r["rss_floor_kib"] = floor_kib
            runs[IMPORT].append(r)
            if not a.no_peers:
                runs[FIO_COPY].append(fio_copy(fio_path, shard_paths, nbytes, stat_path))
                r = tv_import(exe, root, index, shard_paths, nbytes, stat_path, cached=True)
                r["rss_floor_kib"] = floor_kib
                runs[IMPORT_CACHED].append(r)
            log(f"  round {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f} s"
                                                for k, v in runs.items() if v))
    finally:
        if os.path.exists(fio_path):
            os.unlink(fio_path)
    runs = {k: v for k, v in runs.items() if v}

    rows = {k: summarize(v) for k, v in runs.items()}
    imp = rows[IMPORT]
    ratio = imp["mb_per_s"] / rows[FIO_PSYNC]["mb_per_s"]
    ratio_uring = imp["mb_per_s"] / rows[FIO_URING]["mb_per_s"]
    ratio_copy = imp["mb_per_s"] / rows[FIO_COPY]["mb_per_s"] if FIO_COPY in rows else None
    ratio_cached = (rows[IMPORT_CACHED]["mb_per_s"] / rows[FIO_PSYNC]["mb_per_s"]
                    if IMPORT_CACHED in rows else None)
    rss_kib = max(r["peak_rss_kib"] for r in runs[IMPORT] + runs.get(IMPORT_CACHED, []))
    floor_kib = max(r["rss_floor_kib"] for r in runs[IMPORT])
    rss_mib = rss_kib / 1024
    notes = sorted({r["note"] for v in runs.values() for r in v if r.get("note")})
    for name, r in rows.items():  # the runs the table shows
        if contaminated(r):
            notes.append(f"{name}: the disk moved {r['disk_io'] / 1e6:.0f} MB during a run "
                         f"that moves {r['own_io'] / 1e6:.0f} MB: other I/O was running, "
                         f"figures are pessimistic")
    if rss_kib <= floor_kib:
        notes.append(f"importer peak RSS is not above this process's RSS ({floor_kib / 1024:.1f} MiB), "
                     "so it is at most that")

    print(f"filesystem: {root} ({_fs_of(root)}); checkpoint {nbytes} bytes, {a.shards} shards "
          f"({'generated' if fresh else 'cached'}); block {BLOCK // MiB} MiB; page cache "
          f"{'dropped' if not any('not dropped' in n for n in notes) else 'NOT dropped'} "
          f"before each run; best of {a.repeat}")
    print(f"{'what':<24}{'bytes':>14}{'seconds':>10}{'MB/s':>10}")
    for name, r in rows.items():
        print(f"{name:<24}{r['bytes']:>14}{r['seconds']:>10.2f}{r['mb_per_s']:>10.1f}")
    print("(fio rows: fio's own job time, final fsync included; import rows: wall time of "
          "the whole command)")
    print(f"ratio import/fio(psync qd1):    {ratio:.3f}  (expected >= 0.8)")
    print(f"ratio import/fio(io_uring qd4): {ratio_uring:.3f}")
    if ratio_copy is not None:
        print(f"ratio cold import/fio copy (same O_DIRECT reads + writes, no hashing): "
              f"{ratio_copy:.3f}  (target >= 0.85)")
        print(f"ratio import(source cached)/fio(psync qd1): {ratio_cached:.3f}")
    print(f"importer CPU (user+sys): {imp['cpu_s_per_gb']:.3f} CPU-s/GB cold"
          + (f", {rows[IMPORT_CACHED]['cpu_s_per_gb']:.3f} CPU-s/GB source cached"
             if IMPORT_CACHED in rows else ""))
    print(f"importer peak RSS: {rss_mib:.1f} MiB  (expected a few tens of MiB; "
          f"reading floor {floor_kib / 1024:.1f} MiB)")
    for n in notes:
        print(f"note: {n}")
    if a.json:
        print(json.dumps({
            "dir": root, "checkpoint": index, "checkpoint_bytes": nbytes, "shards": a.shards,
            "generated": fresh, "block_bytes": BLOCK, "repeat": a.repeat, "runs": rows,
            "ratio_import_fio": ratio, "ratio_import_fio_uring": ratio_uring,
            "ratio_import_fio_copy": ratio_copy, "ratio_import_cached_fio": ratio_cached,
            "importer_cpu_s_per_gb": imp["cpu_s_per_gb"],
            "importer_peak_rss_mib": rss_mib, "rss_floor_mib": floor_kib / 1024, "notes": notes,
        }, indent=2))
    return 0


def _fs_of(path):
    try:
        p = subprocess.run(["df", "--output=source,fstype", path], capture_output=True, text=True)
        return " ".join(p.stdout.split()[2:4])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
