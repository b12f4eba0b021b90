"""POST /v1/models/{name}/deactivate: a model that was activated can lose
its active generation (readers of NAME get 404, NAME@GEN and aliases still
answer) and then be deleted; read tokens and anonymous callers are refused."""
import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import Daemon, seg


@pytest.fixture(scope="module")
def d(build_dir, tmp_path_factory):
    w = tmp_path_factory.mktemp("daemon_deactivate")
    (w / "root").mkdir()
    dm = Daemon(build_dir, w, settings={"import.roots": str(w / "root")}).start()
    dm.work = w
    yield dm
    assert dm.stop() == 0, dm.log_text()


def test_deactivate_then_delete(d):
    src = str(d.work / "root" / "ck")
    gen.write_checkpoint(src, gen.random_tensors(np.random.default_rng(3), 6), 2)
    m = "org/deact"
    d.import_ok(m, src, activate=True)
    d.import_ok(m, src, alias="canary")
    path = f"/v1/models/{seg(m)}"
    # no token, and a read token, are refused; nothing changes
    assert d.request("POST", path + "/deactivate", token=None).status == 401
    read = d.ok("POST", "/v1/tokens", status=201, body={"name": "r", "scope": "read"})["token"]
    assert d.request("POST", path + "/deactivate", token=read).status == 403
    assert d.ok("GET", path)["active_generation"] == 1
    r = d.ok("POST", path + "/deactivate")
    assert r["name"] == m and r["active_generation"] is None and r["aliases"] == {"canary": 2}
    assert d.ok("POST", path + "/deactivate")["active_generation"] is None  # no-op
    assert d.get(path + "/generations/active").status == 404
    assert d.ok("GET", path + "/generations/1")["active"] is False
    assert d.ok("GET", path + "/generations/canary/tensors")["generation"] == 2
    assert d.request("DELETE", path).status == 409  # still aliased
    d.ok("DELETE", path + "/aliases/canary")
    used = d.device()["used_bytes"]
    gone = d.ok("DELETE", path)
    assert gone["n_generations_retired"] == 2 and d.device()["used_bytes"] == used - gone["freed_bytes"]
    assert d.request("POST", path + "/deactivate").status == 404
