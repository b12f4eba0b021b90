"""tensorvaultd's import jobs under stress: concurrent imports;
cancel mid-import (nothing published, free space back to what it was);
cancel of a queued job and of a finished one; a full queue answers 503;
kill -9 of the daemon mid-import, then restart (job failed, nothing
published, space reclaimed); SIGTERM during an import (exit 0, job
cancelled or failed, nothing published). Mid-import means the job is
running with bytes written: the checkpoint is 256 MiB (64 MiB under ASan;
mostly zeros, made once per session) so the write step lasts long enough to be caught."""
import os
import signal
import time

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import SLOW, Daemon, big_checkpoint, seg
from harness.store import reference_tensors

# Under ASan+UBSan the importer hashes ~10x slower: a quarter is as long.
BIG = (64 << 20) if SLOW > 1 else (256 << 20)


@pytest.fixture(scope="session")
def bigdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bigckpt")


@pytest.fixture(scope="session")
def big(bigdir):
    """big(i): a 256 MiB checkpoint, a different one for every i (so that a
    retry never deduplicates against an earlier attempt)."""
    made = {}

    def make(i):
        if i not in made:
            made[i] = big_checkpoint(bigdir / f"big{i}" / "model.safetensors", BIG, seed=100 + i)
        return made[i]

    return make


_started = []


@pytest.fixture(autouse=True)
def reaper():
    """kill -9s whatever daemon a failed test left running."""
    yield
    while _started:
        d = _started.pop()
        if d.alive():
            d.kill9()


def daemon(build_dir, tmp_path, bigdir, store=None, name="d", **settings):
    s = {"import.roots": f"{tmp_path}:{bigdir}", "store.image_size": "2G"}
    s.update(settings)
    d = Daemon(build_dir, tmp_path, settings=s, store=store, name=name)
    _started.append(d)
    return d


def published(d, model):
    """The generations of model that a reader could see."""
    return [g for g in d.generations(model) if g["state"] in ("ready", "importing")]


def catch_mid_import(d, big, model, attempts=3):
    """Submits imports of fresh big checkpoints until one is seen running
    with bytes written and not yet publishing. Returns (job, attempt)."""
    for attempt in range(attempts):
        job = d.submit_import(model, big(attempt))
        deadline = time.monotonic() + 60 * SLOW
        while time.monotonic() < deadline:
            j = d.job(job["id"])
            if j["state"] != "queued" and j["state"] != "running":
                break
            if j["state"] == "running" and j["step"] in ("write", "flush") and j["bytes_done"] > 0:
                assert j["bytes_total"] >= BIG and j["started_at"] is not None, j
                assert j["bytes_done"] <= j["bytes_total"] and j["rate_bytes_per_s"] >= 0, j
                assert j["eta_seconds"] is None or j["eta_seconds"] >= 0, j
                assert j["finished_at"] is None and j["result"] is None, j
                return j, attempt
            time.sleep(0.005)
        # too late (or too slow to be seen): undo it and try a fresh checkpoint
        j = d.wait_job(job["id"])
        assert j["state"] == "succeeded", j
        d.ok("POST", f"/v1/models/{model}/generations/{j['generation']}/retire")
        d.ok("POST", "/v1/gc")
    pytest.fail(f"no import of {BIG >> 20} MiB was seen mid-write in {attempts} attempts")


def test_concurrent_imports(build_dir, tmp_path, bigdir):
    d = daemon(build_dir, tmp_path, bigdir, **{"import.workers": "3"}).start()
    try:
        srcs = []
        for i in range(6):
            tensors = gen.random_tensors(np.random.default_rng(40 + i), 20,
                                         big_tensor_bytes=(4 << 20) + i)
            srcs.append(gen.write_checkpoint(str(tmp_path / f"c{i}"), tensors, 1 + i % 3))
        models = ["alpha", "beta", "alpha", "gamma/x", "beta", "alpha"]
        jobs = [d.submit_import(m, s) for m, s in zip(models, srcs)]
        done = [d.wait_job(j["id"]) for j in jobs]
        assert all(j["state"] == "succeeded" for j in done), done
        for m in set(models):
            gens = sorted(j["result"]["generation"] for j in done if j["model"] == m)
            assert gens == list(range(1, models.count(m) + 1)), (m, gens)
        for j, src in zip(done, srcs):
            ref = reference_tensors(src)
            assert j["result"]["n_tensors"] == len(ref)
            g = j["result"]["generation"]
            base = f"/v1/models/{seg(j['model'])}/generations/{g}/tensors"
            for name, (dtype, shape, data) in ref.items():
                r = d.get(f"{base}/{seg(name)}/data")
                assert r.status == 200 and r.body == data, (j["model"], g, name)
        # the extents of the concurrent writers do not overlap: every object verifies
        v = d.wait_job(d.ok("POST", "/v1/verify", status=202, body={})["id"])
        assert v["state"] == "succeeded" and v["result"]["n_failed"] == 0, v
        assert v["result"]["n_objects"] == sum(1 + i % 3 for i in range(6))
        offs = sorted((o["device_offset"], o["canonical_bytes"]) for o in v["result"]["objects"])
        for (a, n), (b, _) in zip(offs, offs[1:]):
            assert a + n <= b, offs
        st = d.ok("GET", "/v1/status")
        assert st["jobs"] == {"queued": 0, "running": 0} and st["n_models"] == 3
    finally:
        assert d.stop() == 0, d.log_text()


def test_cancel_mid_import_publishes_nothing_and_frees_the_space(build_dir, tmp_path, bigdir, big):
    d = daemon(build_dir, tmp_path, bigdir, **{"import.workers": "1"}).start()
    try:
        small = gen.write_checkpoint(str(tmp_path / "small"),
                                     gen.random_tensors(np.random.default_rng(1), 5), 1)
        d.import_ok("keep", small, activate=True)
        dev0 = d.device()
        j, attempt = catch_mid_import(d, big, "bigc")
        c = d.ok("POST", f"/v1/jobs/{j['id']}/cancel")
        assert c["id"] == j["id"] and c["state"] in ("running", "cancelled")
        j = d.wait_job(j["id"])
        assert j["state"] == "cancelled" and j["result"] is None, j
        assert j["finished_at"] is not None
        # nothing published, nothing reserved
        assert published(d, "bigc") == []
        assert d.get("/v1/models/bigc/generations/active/tensors").status in (404, 409)
        dev = d.device()
        assert (dev["used_bytes"], dev["free_bytes"], dev["n_objects"]) == \
            (dev0["used_bytes"], dev0["free_bytes"], dev0["n_objects"]), (dev0, dev)
        assert d.ok("POST", "/v1/gc")["n_objects_freed"] == 0
        # finished jobs cannot be cancelled; unknown ones are 404
        r = d.request("POST", f"/v1/jobs/{j['id']}/cancel")
        assert r.status == 409, r
        assert d.request("POST", "/v1/jobs/999999/cancel").status == 404
        # the store still works: the same checkpoint imports and reads back
        j2 = d.import_ok("bigc", big(attempt), activate=True)
        assert j2["result"]["deduplicated_bytes"] == 0
        r = d.get("/v1/models/bigc/generations/active/tensors/layers.3.weight/data",
                  headers={"Range": "bytes=65530-65545"})
        assert r.status == 206 and len(r.body) == 16
        assert r.body == reference_tensors(big(attempt))["layers.3.weight"][2][65530:65546]
        assert d.ok("GET", "/v1/models/keep")["active_generation"] == 1
    finally:
        assert d.stop() == 0, d.log_text()


def test_full_queue_answers_503(build_dir, tmp_path, bigdir, big):
    d = daemon(build_dir, tmp_path, bigdir, **{"import.workers": "1", "import.queue": "2"}).start()
    try:
        small = gen.write_checkpoint(str(tmp_path / "small"),
                                     gen.random_tensors(np.random.default_rng(2), 5), 1)
        ids, refused = [], None
        for i in range(8):
            r = d.request("POST", "/v1/imports", body={"model": f"q{i}",
                                                       "source": big(0) if i == 0 else small})
            if r.status == 503:
                refused = r
                break
            assert r.status == 202, r
            ids.append(r.json()["id"])
            for _ in range(int(2000 * SLOW)):
                if i > 0 or d.job(ids[0])["state"] != "queued":
                    break
                time.sleep(0.005)
        assert refused is not None, "8 submissions into a queue of 2 behind one worker"
        assert refused.json()["error"]["code"] == "TV_E_BUSY"
        assert refused.headers.get("retry-after") == "1"
        assert len(ids) == 3, ids  # one running, two queued
        # the queued ones cancel at once and never start; then the running one
        for i in ids[1:]:
            c = d.ok("POST", f"/v1/jobs/{i}/cancel")
            assert c["state"] == "cancelled", c
            q = d.job(i)
            assert q["state"] == "cancelled" and q["started_at"] is None, q
            assert q["generation"] is None and q["finished_at"] is not None, q
        r = d.request("POST", f"/v1/jobs/{ids[0]}/cancel")
        assert r.status in (200, 409), r
        assert d.wait_job(ids[0])["state"] in ("cancelled", "succeeded")
        for i in range(1, 3):
            assert published(d, f"q{i}") == []
        # room again
        assert d.request("POST", "/v1/imports", body={"model": "q9", "source": small}).status == 202
    finally:
        assert d.stop() == 0, d.log_text()


def test_kill9_mid_import_then_restart(build_dir, tmp_path, bigdir, big):
    d = daemon(build_dir, tmp_path, bigdir).start()
    small = gen.write_checkpoint(str(tmp_path / "small"),
                                 gen.random_tensors(np.random.default_rng(3), 5), 1)
    d.import_ok("keep", small, activate=True)
    dev0 = d.device()
    j, attempt = catch_mid_import(d, big, "bigk")
    assert d.kill9() == -9
    d2 = daemon(build_dir, tmp_path, bigdir, store=d.store, name="restart").start()
    try:
        after = d2.job(j["id"])
        assert after["state"] == "failed", after
        assert "interrupted" in after["error"]["message"], after
        assert after["finished_at"] is not None and after["result"] is None
        assert published(d2, "bigk") == []
        assert d2.ok("GET", "/v1/models/keep")["active_generation"] == 1
        d2.ok("POST", "/v1/gc")
        dev = d2.device()
        assert (dev["used_bytes"], dev["n_objects"]) == (dev0["used_bytes"], dev0["n_objects"]), \
            (dev0, dev)
        assert dev["free_bytes"] == dev0["free_bytes"]
        v = d2.wait_job(d2.ok("POST", "/v1/verify", status=202, body={})["id"])
        assert v["state"] == "succeeded" and v["result"]["n_failed"] == 0, v
        # and it imports again
        assert d2.import_ok("bigk", big(attempt))["result"]["generation"] >= 1
        assert d2.ok("GET", "/v1/status")["jobs"] == {"queued": 0, "running": 0}
    finally:
        assert d2.stop() == 0, d2.log_text()


def test_sigterm_during_import_exits_0_and_publishes_nothing(build_dir, tmp_path, bigdir, big):
    d = daemon(build_dir, tmp_path, bigdir).start()
    dev0 = d.device()
    j, attempt = catch_mid_import(d, big, "bigt")
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0, d.log_text()
    assert time.monotonic() - t0 < 20 * SLOW
    d2 = daemon(build_dir, tmp_path, bigdir, store=d.store, name="restart").start()
    try:
        after = d2.job(j["id"])
        assert after["state"] in ("cancelled", "failed"), after
        assert after["result"] is None and after["finished_at"] is not None
        assert published(d2, "bigt") == []
        d2.ok("POST", "/v1/gc")
        dev = d2.device()
        assert (dev["used_bytes"], dev["free_bytes"], dev["n_objects"]) == \
            (dev0["used_bytes"], dev0["free_bytes"], dev0["n_objects"]), (dev0, dev)
    finally:
        assert d2.stop() == 0, d2.log_text()


def test_sigint_idle_exits_0(build_dir, tmp_path, bigdir):
    d = daemon(build_dir, tmp_path, bigdir).start()
    assert d.stop(signal.SIGINT) == 0, d.log_text()
    assert os.path.exists(os.path.join(d.store, "admin.token"))


def test_sighup_reopens_the_log_file(build_dir, tmp_path, bigdir):
    log = tmp_path / "tv.log"
    d = daemon(build_dir, tmp_path, bigdir, **{"log.file": str(log)}).start()
    try:
        assert d.get("/healthz", token=None).status == 200
        deadline = time.monotonic() + 10 * SLOW
        while not (log.exists() and log.stat().st_size > 0):
            assert time.monotonic() < deadline, "nothing logged to log.file"
            time.sleep(0.02)
        os.rename(log, tmp_path / "tv.log.1")
        d.proc.send_signal(signal.SIGHUP)
        # the daemon keeps answering, and what it logs next goes to a new log.file
        deadline = time.monotonic() + 10 * SLOW
        while not log.exists():
            assert d.alive(), d.log_text()
            assert time.monotonic() < deadline, "SIGHUP did not reopen log.file"
            d.get("/healthz", token=None)
            time.sleep(0.02)
        assert d.get("/healthz", token=None).status == 200
    finally:
        assert d.stop() == 0, d.log_text()
    assert "stop" in log.read_text(), log.read_text()
