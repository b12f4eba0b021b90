#!/usr/bin/env python3
"""GPU differential check of the Python package (for tests/gpu/run.sh):
tensorvault.safe_open(MODEL, framework="pt", device="cuda:0") with store=
(in-process) and socket= (tensorvaultd's fast path) against
safetensors.safe_open(framework="pt", device="cuda:0") on the checkpoint's
files: for every tensor get_tensor's bytes, dtype, shape and device; one
get_tensors() of the whole model and one of a few names; a few slices of
every tensor of rank >= 1; tensorvault.torch.load_file(device="cuda:0");
metadata() when the library reads shard headers.

Usage: py_cuda_cmp.py STORE SOCKET MODEL CHECKPOINT
(SOCKET "-": the store= backend only; the package and library come from
PYTHONPATH / TENSORVAULT_LIBRARY as for the integration tests.)
Prints one line per check ("py_cuda_cmp: BACKEND CHECK: N checked, M
mismatches"); exit 0 when nothing mismatched, 1 on a mismatch or an error,
77 when torch sees no CUDA device. TV_GPU_DRY_RUN=1 without a CUDA device:
the same checks on device "cpu" (checks this script), then 77."""
import os
import sys

from torch_cmp import shard_files  # same folder: the checkpoint's shard files


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    store, sock, model, ck = sys.argv[1:]
    import torch

    dry = False
    if not torch.cuda.is_available():
        if os.environ.get("TV_GPU_DRY_RUN") != "1":
            print("py_cuda_cmp: torch sees no CUDA device: skipped", file=sys.stderr)
            return 77
        dry = True
        print("py_cuda_cmp: dry run: no CUDA device, every check on the cpu")
    dev = torch.device("cpu") if dry else torch.device("cuda", 0)
    from safetensors import safe_open

    import tensorvault
    import tensorvault.torch

    def flat(t):
        out = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        out.copy_(t.reshape(-1))
        return out.view(torch.uint8) if t.numel() else out

    def same(a, b):
        return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and
                torch.equal(flat(a), flat(b)))

    ref, osl, metas = {}, {}, []
    files = shard_files(ck)
    handles = [safe_open(p, framework="pt", device=str(dev)) for p in files]
    for o in handles:
        metas.append(o.metadata())
        for name in o.offset_keys():
            ref[name] = o.get_tensor(name)
            osl[name] = o.get_slice(name)
    merged = None
    for m in metas:
        if m is not None:
            merged = {} if merged is None else merged
            for k, v in m.items():
                merged.setdefault(k, v)

    backends = [("store", {"store": store})]
    if sock != "-":
        backends.append(("socket", {"socket": sock}))
    bad = 0

    def report(backend, check, n, mism):
        nonlocal bad
        bad += mism
        print(f"py_cuda_cmp: {backend} {check}: {n} checked, {mism} mismatches")

    for backend, kw in backends:
        with tensorvault.safe_open(model, framework="pt", device=dev, **kw) as f:
            names = f.offset_keys()
            mism = 0 if sorted(names) == sorted(ref) else 1
            report(backend, "keys", len(names), mism)
            mism = 0
            for name in names:
                if name not in ref or not same(f.get_tensor(name), ref[name]):
                    mism += 1
                    if mism <= 5:
                        print(f"py_cuda_cmp: {backend} MISMATCH get_tensor {name}")
            report(backend, "get_tensor", len(names), mism)
            every = f.get_tensors()
            mism = sum(1 for k, t in every.items() if k not in ref or not same(t, ref[k]))
            mism += 0 if list(every) == names else 1
            report(backend, "get_tensors", len(every), mism)
            pick = names[::3][:8]
            some = f.get_tensors(pick)
            mism = sum(1 for k in pick if not same(some[k], ref[k]))
            report(backend, "get_tensors(names)", len(pick), mism)
            n = mism = 0
            for name in names:
                full = ref[name]
                if full.dim() == 0 or full.shape[0] == 0:
                    continue
                d0 = full.shape[0]
                exprs = [slice(None), 0, d0 - 1, slice(1, None), slice(0, d0, 2),
                         (Ellipsis, 0) if full.dim() > 1 else slice(None, 1)]
                if full.dim() > 1:
                    exprs += [(slice(None), slice(1, None)), (d0 // 2, 0)]
                sl = f.get_slice(name)
                for e in exprs:
                    n += 1
                    try:
                        want = full[e]
                    except IndexError:  # then tensorvault refuses it too
                        try:
                            sl[e]
                        except IndexError:
                            continue
                        want = None
                    got = None if want is None else sl[e]
                    if want is None or not same(got, want) or not same(got, osl[name][e]):
                        mism += 1
                        if mism <= 5:
                            print(f"py_cuda_cmp: {backend} MISMATCH slice {name}[{e}]")
            report(backend, "get_slice", n, mism)
            try:
                meta = f.metadata()
            except tensorvault.Error as e:
                print(f"py_cuda_cmp: {backend} metadata: not checked ({e.name})")
            else:
                report(backend, "metadata", 1, 0 if meta == merged else 1)
        loaded = tensorvault.torch.load_file(model, device=dev, **kw)
        mism = sum(1 for k, t in loaded.items() if k not in ref or not same(t, ref[k]))
        mism += 0 if sorted(loaded) == sorted(ref) else 1
        report(backend, "load_file", len(loaded), mism)
    if not dry:
        torch.cuda.synchronize()
    print(f"py_cuda_cmp: RESULT tensors={len(ref)} mismatches={bad}")
    return 1 if bad else 77 if dry else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # an error is a failure, not a crash without a line
        print(f"py_cuda_cmp: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
