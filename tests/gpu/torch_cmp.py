#!/usr/bin/env python3
"""GPU differential check (optional part of tests/gpu/run.sh): every tensor
read by libtensorvault straight into CUDA memory (tv_read_into_cuda, and all
at once with tv_read_batch_cuda) equals, on the GPU, the tensor the official
loader gives with safetensors.safe_open(framework="pt", device="cuda").

Usage: torch_cmp.py LIBTENSORVAULT.so STORE NAME[@GEN] CHECKPOINT
CHECKPOINT: a .safetensors file, an index .json or a directory.
Prints "RESULT tensors=N mismatches=M skipped=S"; exit 0 when M == 0,
1 on a mismatch or an error, 77 when torch has no CUDA device."""
import ctypes as C
import json
import os
import sys


class TvError(C.Structure):
    _fields_ = [("code", C.c_int), ("msg", C.c_char * 512)]


class OpenOpts(C.Structure):
    _fields_ = [("engine", C.c_int), ("queue_depth", C.c_uint32), ("chunk_len", C.c_size_t),
                ("n_threads", C.c_uint32), ("no_direct", C.c_bool)]


class Desc(C.Structure):
    _fields_ = [("name", C.c_void_p), ("name_len", C.c_size_t), ("dtype", C.c_int),
                ("rank", C.c_uint32), ("shape", C.POINTER(C.c_uint64)), ("nbytes", C.c_uint64),
                ("n_elements", C.c_uint64), ("shard", C.c_uint32)]


class Req(C.Structure):
    _fields_ = [("name", C.c_char_p), ("index", C.c_size_t), ("dest", C.c_void_p),
                ("dest_len", C.c_size_t), ("result", C.c_int)]


def shard_files(ck):
    if os.path.isdir(ck):
        idx = os.path.join(ck, "model.safetensors.index.json")
        ck = idx if os.path.exists(idx) else os.path.join(ck, "model.safetensors")
    if ck.endswith(".json"):
        with open(ck) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(os.path.dirname(ck), n) for n in names]
    return [ck]


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    libpath, store, spec, ck = sys.argv[1:]
    import torch
    from safetensors import safe_open

    if not torch.cuda.is_available():
        print("torch_cmp: torch sees no CUDA device: skipped", file=sys.stderr)
        return 77
    lib = C.CDLL(libpath)
    lib.tv_model_open.argtypes = [C.c_char_p, C.c_char_p, C.POINTER(OpenOpts),
                                  C.POINTER(C.c_void_p), C.POINTER(TvError)]
    lib.tv_model_n_tensors.restype = C.c_size_t
    lib.tv_model_n_tensors.argtypes = [C.c_void_p]
    lib.tv_model_tensor.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(Desc)]
    lib.tv_read_into_cuda.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p, C.c_size_t, C.c_void_p,
                                      C.POINTER(TvError)]
    lib.tv_read_batch_cuda.argtypes = [C.c_void_p, C.POINTER(Req), C.c_size_t, C.c_void_p,
                                       C.POINTER(TvError)]
    lib.tv_err_name.restype = C.c_char_p
    lib.tv_err_name.argtypes = [C.c_int]
    lib.tv_model_close.argtypes = [C.c_void_p]

    err = TvError()
    m = C.c_void_p()
    rc = lib.tv_model_open(store.encode(), spec.encode(), None, C.byref(m), C.byref(err))
    if rc:
        print(f"torch_cmp: open {spec}: {lib.tv_err_name(rc).decode()}: {err.msg.decode()}",
              file=sys.stderr)
        return 1
    dev = torch.device("cuda", 0)
    stream = torch.cuda.current_stream(dev).cuda_stream
    n = lib.tv_model_n_tensors(m)
    descs = []
    for i in range(n):
        d = Desc()
        lib.tv_model_tensor(m, i, C.byref(d))
        descs.append((C.string_at(d.name, d.name_len).decode(), int(d.nbytes)))

    # Reference tensors on the GPU, flattened to bytes.
    ref, skipped = {}, {}
    for path in shard_files(ck):
        with safe_open(path, framework="pt", device="cuda:0") as f:
            for name in f.keys():
                try:
                    t = f.get_tensor(name)
                    ref[name] = t.reshape(-1).view(torch.uint8) if t.numel() else \
                        torch.empty(0, dtype=torch.uint8, device=dev)
                except Exception as e:  # a dtype this torch lacks (F8_E8M0, U16, ...)
                    skipped[name] = str(e).splitlines()[0][:80]

    mismatches = 0
    checked = 0
    # One by one into separate allocations.
    for name, nbytes in descs:
        if name in skipped:
            continue
        if name not in ref:
            print(f"torch_cmp: '{name}' is not in the checkpoint", file=sys.stderr)
            mismatches += 1
            continue
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
        rc = lib.tv_read_into_cuda(m, name.encode(), C.c_void_p(buf.data_ptr()), nbytes,
                                   C.c_void_p(stream), C.byref(err))
        if rc:
            print(f"torch_cmp: read {name}: {lib.tv_err_name(rc).decode()}: "
                  f"{err.msg.decode()}", file=sys.stderr)
            return 1
        if ref[name].numel() != nbytes or not torch.equal(buf[:nbytes], ref[name]):
            mismatches += 1
            if mismatches <= 10:
                print(f"torch_cmp: MISMATCH {name}", file=sys.stderr)
        checked += 1

    # All at once into one arena, odd offsets.
    offs, total = [], 1
    for _, nbytes in descs:
        offs.append(total)
        total += nbytes + 1
    arena = torch.empty(total, dtype=torch.uint8, device=dev)
    reqs = (Req * max(n, 1))()
    for i, (_, nbytes) in enumerate(descs):
        reqs[i].index = i
        reqs[i].dest = arena.data_ptr() + offs[i]
        reqs[i].dest_len = nbytes
    rc = lib.tv_read_batch_cuda(m, reqs, n, C.c_void_p(stream), C.byref(err))
    if rc:
        print(f"torch_cmp: batch: {lib.tv_err_name(rc).decode()}: {err.msg.decode()}",
              file=sys.stderr)
        return 1
    for i, (name, nbytes) in enumerate(descs):
        if name in ref and not torch.equal(arena[offs[i]:offs[i] + nbytes], ref[name]):
            mismatches += 1
            if mismatches <= 10:
                print(f"torch_cmp: MISMATCH (batch) {name}", file=sys.stderr)
    torch.cuda.synchronize()
    lib.tv_model_close(m)
    for name, why in sorted(skipped.items())[:5]:
        print(f"torch_cmp: skipped {name}: {why}")
    print(f"RESULT tensors={checked} mismatches={mismatches} skipped={len(skipped)}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
