#!/usr/bin/env python3
"""Writes the demo checkpoint: GPT-2-shaped, BF16, two shards plus
model.safetensors.index.json, with the official safetensors writer (numpy +
ml_dtypes bfloat16, no torch), and beside them the model's config.json and
generation_config.json (transformers' GPT-2 keys: an import keeps them with
the generation, and a checkout gives a directory transformers builds the
model from). Deterministic: the same arguments give the same bytes. The
default is GPT-2 small (12 layers x 768, ~250 MB). The index is written
last: a directory with it is complete.

Usage: gen_demo.py OUT_DIR [--layers N] [--embd N] [--vocab N] [--ctx N] [--seed N]
Prints the index path.
"""
import argparse
import json
import os
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BF16 = np.dtype(ml_dtypes.bfloat16)


def shapes(layers, embd, vocab, ctx):
    """(name, shape) in GPT-2's order (the HF "gpt2" names, without the
    transformer. prefix, as the original checkpoint has them)."""
    out = [("wte.weight", (vocab, embd)), ("wpe.weight", (ctx, embd))]
    for i in range(layers):
        p = f"h.{i}."
        out += [
            (p + "ln_1.weight", (embd,)), (p + "ln_1.bias", (embd,)),
            (p + "attn.c_attn.weight", (embd, 3 * embd)), (p + "attn.c_attn.bias", (3 * embd,)),
            (p + "attn.c_proj.weight", (embd, embd)), (p + "attn.c_proj.bias", (embd,)),
            (p + "ln_2.weight", (embd,)), (p + "ln_2.bias", (embd,)),
            (p + "mlp.c_fc.weight", (embd, 4 * embd)), (p + "mlp.c_fc.bias", (4 * embd,)),
            (p + "mlp.c_proj.weight", (4 * embd, embd)), (p + "mlp.c_proj.bias", (embd,)),
        ]
    out += [("ln_f.weight", (embd,)), ("ln_f.bias", (embd,))]
    return out


def value(name, shape, rng):
    if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        return np.ones(shape, dtype=BF16)
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=BF16)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(BF16)


def configs(layers, embd, vocab, ctx):
    """config.json and generation_config.json of a GPT-2 of these sizes
    (heads: 12 where the width allows it, else the largest divisor below)."""
    heads = next(h for h in range(min(12, embd), 0, -1) if embd % h == 0)
    eos = vocab - 1
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": layers,
              "n_embd": embd, "n_head": heads, "n_inner": None, "vocab_size": vocab,
              "n_positions": ctx, "n_ctx": ctx, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
              "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos,
              "torch_dtype": "bfloat16"}
    generation = {"bos_token_id": eos, "eos_token_id": eos}
    return config, generation


def write_demo(out_dir, layers=12, embd=768, vocab=50257, ctx=1024, seed=0):
    os.makedirs(out_dir, exist_ok=True)
    config, generation = configs(layers, embd, vocab, ctx)
    for name, doc in (("config.json", config), ("generation_config.json", generation)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    rng = np.random.default_rng(seed)
    items = shapes(layers, embd, vocab, ctx)
    # Shard 1: the embeddings and the first half of the blocks; shard 2: the rest.
    half = layers // 2
    first = {n for n, _ in items if n.startswith(("wte.", "wpe."))}
    first |= {n for n, _ in items if n.startswith("h.") and int(n.split(".")[1]) < half}
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [{}, {}]
    for n, shp in items:
        parts[0 if n in first else 1][n] = value(n, shp, rng)
    weight_map, total = {}, 0
    # One metadata key: the writer keeps __metadata__ in a hash map, whose
    # order (and so the header bytes) would vary from run to run with more.
    meta = {"format": "np"}
    for fname, part in zip(files, parts):
        save_file(part, os.path.join(out_dir, fname), metadata=meta)
        for k, v in part.items():
            weight_map[k] = fname
            total += v.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    path = os.path.join(out_dir, "model.safetensors.index.json")
    with open(path, "w") as f:
        json.dump(index, f, indent=2)
    return path


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for k in ("layers", "embd", "vocab", "ctx"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be at least 1")
    print(write_demo(a.out_dir, a.layers, a.embd, a.vocab, a.ctx, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
