"""Helpers the fleet tests share (the remote-import tests test_import_http,
test_import_s3, test_resume, test_rollout): a checkpoint to import, the
check that a generation holds exactly given tensors, a failed import."""
from harness.daemon import seg


def sample_tensors(seed, n=4, per=300_000):
    """n float32 tensors of per bytes and a uint8 one: a checkpoint to import."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = {f"layers.{i}.w": rng.standard_normal(per // 4, dtype=np.float32) for i in range(n)}
    out["bias"] = rng.integers(0, 255, size=1234, dtype=np.uint8)
    return out


def check_published(d, model, gen, want):
    """Generation gen of model holds exactly the tensors of want (name ->
    array, as the official loader reads them), byte for byte."""
    listed = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/tensors?limit=1000")
    assert sorted(t["name"] for t in listed["tensors"]) == sorted(want)
    for name, arr in want.items():
        body = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/tensors/{seg(name)}/data")
        assert body == arr.tobytes(), name


def failed_job(d, model, url):
    """Imports url as model; the job fails and no ready generation appears."""
    j = d.wait_job(d.submit_import(model, url)["id"])
    assert j["state"] == "failed", j
    assert all(g["state"] != "ready" for g in d.generations(model))
    return j
