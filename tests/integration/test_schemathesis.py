"""docs/openapi.yaml: a valid OpenAPI 3.1 document that covers every route of
the REST API, whose schemas accept the contract's objects and refuse
what breaks them; and (when build/tensorvaultd exists) schemathesis against
the running daemon's /v1/openapi.yaml."""
import copy
import os
import re
import subprocess
import time

import jsonschema_rs
import numpy as np
import pytest
import yaml
from schemathesis.specs.openapi import definitions

from harness.daemon import SLOW, Daemon, make_checkpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPEC = os.path.join(ROOT, "docs", "openapi.yaml")

# (method, path, scope): R = read, A = admin, F = fleet or admin (never
# anonymous), - = no auth. Every route the daemon serves, the blob routes included.
ROUTES = [
    ("get", "/", "-"),
    ("get", "/ui/{name}", "-"),
    ("get", "/healthz", "-"),
    ("get", "/readyz", "-"),
    ("get", "/metrics", "R"),
    ("get", "/v1/version", "R"),
    ("get", "/v1/status", "R"),
    ("get", "/v1/metrics/history", "R"),
    ("get", "/v1/openapi.yaml", "-"),
    ("get", "/v1/devices", "R"),
    ("get", "/v1/devices/{id}", "R"),
    ("get", "/v1/devices/{id}/extents", "R"),
    ("get", "/v1/models", "R"),
    ("get", "/v1/models/{name}", "R"),
    ("delete", "/v1/models/{name}", "A"),
    ("get", "/v1/models/{name}/generations", "R"),
    ("get", "/v1/models/{name}/generations/{gen}", "R"),
    ("post", "/v1/models/{name}/generations/{gen}/activate", "A"),
    ("post", "/v1/models/{name}/generations/{gen}/retire", "A"),
    ("post", "/v1/models/{name}/rollback", "A"),
    ("post", "/v1/models/{name}/deactivate", "A"),
    ("get", "/v1/models/{name}/aliases", "R"),
    ("put", "/v1/models/{name}/aliases/{alias}", "A"),
    ("delete", "/v1/models/{name}/aliases/{alias}", "A"),
    ("get", "/v1/models/{name}/generations/{gen}/tensors", "R"),
    ("get", "/v1/models/{name}/generations/{gen}/tensors/{tensor}", "R"),
    ("get", "/v1/models/{name}/generations/{gen}/tensors/{tensor}/data", "R"),
    ("post", "/v1/imports", "A"),
    ("post", "/v1/verify", "A"),
    ("post", "/v1/gc", "A"),
    ("get", "/v1/jobs", "R"),
    ("get", "/v1/jobs/{id}", "R"),
    ("post", "/v1/jobs/{id}/cancel", "A"),
    ("get", "/v1/sessions", "R"),
    ("get", "/v1/shards", "R"),
    ("get", "/v1/tokens", "A"),
    ("post", "/v1/tokens", "A"),
    ("delete", "/v1/tokens/{id}", "A"),
    ("get", "/v1/fleet", "R"),
    ("put", "/v1/fleet/aliases/{name}/{alias}", "A"),
    ("get", "/v1/blobs", "F"),
    ("get", "/v1/blobs/{digest}", "F"),
    ("get", "/v1/models/{name}/generations/{gen}/files", "R"),
    ("get", "/v1/models/{name}/generations/{gen}/files/{path}", "R"),
]


@pytest.fixture(scope="module")
def spec():
    with open(SPEC) as f:
        return yaml.safe_load(f)


def validator(spec, name):
    root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": spec["components"], "$ref": f"#/components/schemas/{name}"}
    return jsonschema_rs.Draft202012Validator(root)


def test_spec_is_valid_openapi_31(spec):
    assert spec["openapi"].startswith("3.1")
    errors = [str(e) for e in definitions.OPENAPI_31_VALIDATOR.iter_errors(spec)]
    assert errors == []


def test_spec_covers_every_route_and_nothing_else(spec):
    have = {(m, p) for p, item in spec["paths"].items() for m in item
            if m in ("get", "put", "post", "delete", "patch", "head", "options")}
    assert have == {(m, p) for m, p, _ in ROUTES}


def test_spec_security_matches_the_scopes(spec):
    for method, path, scope in ROUTES:
        op = spec["paths"][path][method]
        sec = op.get("security", spec["security"])
        if scope == "-":
            assert sec == [], (method, path)
        elif scope == "R":
            assert {"bearer": []} in sec and {} in sec, (method, path)
        else:  # A and F: a token always
            assert sec == [{"bearer": []}], (method, path)
            assert "401" in op["responses"] and "403" in op["responses"], (method, path)


def test_spec_error_responses_use_the_error_schema(spec):
    responses = spec["components"]["responses"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            for status, r in op["responses"].items():
                if int(status) < 400:
                    continue
                ref = r["$ref"].rsplit("/", 1)[1]
                schema = responses[ref]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)


def test_spec_every_ref_resolves(spec):
    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref":
                    target = spec
                    for part in v.lstrip("#/").split("/"):
                        assert part in target, v
                        target = target[part]
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)


GEN = {"model": "org/m", "generation": 2, "state": "ready", "active": True, "aliases": ["prod"],
       "n_shards": 1, "n_tensors": 3, "total_bytes": 4096, "source": "/data/m", "created_at": 1700000000}
JOB = {"id": 1, "kind": "import", "state": "running", "model": "m", "source": "/data/m",
       "activate": False, "alias": None, "strict": False, "step": "write", "bytes_done": 10,
       "bytes_total": 100, "rate_bytes_per_s": 1.5, "eta_seconds": None, "error": None,
       "generation": None, "created_at": 1, "started_at": 2, "finished_at": None, "result": None}


@pytest.mark.parametrize("name,good", [
    ("Error", {"error": {"code": "TV_E_NOT_FOUND", "message": "model 'x' not found", "errno": -1004}}),
    ("Model", {"name": "a/b", "active_generation": None, "aliases": {"prod": 1}, "n_generations": 1,
               "created_at": 5}),
    ("Generation", GEN),
    ("GenerationDetail", {**GEN, "shards": [{"index": 0, "name": "model.safetensors", "file_bytes": 9,
                                             "header_bytes": 1, "sha256": "0" * 64, "replicas": [
                                                 {"device_id": 1, "object_id": 3, "device_offset": 0}]}]}),
    ("TensorDetail", {"name": "a/b%c d", "dtype": "BF16", "shape": [2, 3], "shard": "s.safetensors",
                      "shard_index": 0, "data_offsets": [0, 12], "nbytes": 12, "file_offset": 100,
                      "replicas": [{"device_id": 1, "device_offset": 4096}]}),
    ("DeviceExtents", {"device_id": 1, "region_offset": 4096, "region_bytes": 1 << 20,
                       "data_offset": 65536, "object_align": 65536, "extents": [
                           {"offset": 4096, "bytes": 61440, "kind": "label"},
                           {"offset": 65536, "bytes": 65536, "kind": "object", "object_id": 5,
                            "state": "committed", "canonical_bytes": 900, "sha256": "a" * 64,
                            "users": [{"model": "m", "generation": 1, "shard": "model.safetensors",
                                       "state": "ready"}]},
                           {"offset": 131072, "bytes": 65536, "kind": "object", "object_id": 6,
                            "state": "writing", "canonical_bytes": 9, "sha256": None, "users": []},
                           {"offset": 196608, "bytes": 852992, "kind": "free"}]}),
    ("Job", JOB),
    ("Job", {**JOB, "state": "failed", "step": None, "error": {"code": "TV_E_ST_HEADER", "message": "m",
                                                              "errno": -1100}}),
    ("Job", {**JOB, "state": "succeeded", "generation": 1, "result": {
        "model": "m", "generation": 1, "active": True, "aliases": [], "n_shards": 1, "n_tensors": 2,
        "total_bytes": 9, "written_bytes": 9, "deduplicated_bytes": 0, "seconds": 0.5}}),
    ("TokenCreated", {"id": 1, "name": "ci", "scope": "read", "created_at": 1, "revoked_at": None,
                      "token": "tvk_" + "ab" * 32}),
    ("TokenCreated", {"id": 2, "name": "peer", "scope": "fleet", "created_at": 1,
                      "revoked_at": None, "token": "tvk_" + "cd" * 32}),
    ("BlobList", {"blobs": [{"digest": "sha256:" + "0f" * 32, "bytes": 9, "n_replicas": 1}],
                  "next_cursor": None}),
    ("Version", {"name": "tensorvault", "version": "0.9.0", "git": "abc", "api": "v1",
                 "features": {"cuda": False, "nvme": True, "io_uring": True}}),
])
def test_schema_accepts_contract_objects(spec, name, good):
    v = validator(spec, name)
    assert [str(e) for e in v.iter_errors(good)] == []


@pytest.mark.parametrize("name,base,mutate", [
    ("Model", "model", lambda d: d.__setitem__("active_generation", 0)),
    ("Model", "model", lambda d: d.__setitem__("active", 1)),           # the pre-issue-9 field
    ("Generation", "gen", lambda d: d.__setitem__("active", 1)),        # bool, not a number
    ("Generation", "gen", lambda d: d.__setitem__("state", "active")),  # not a generation state
    ("Generation", "gen", lambda d: d.pop("total_bytes")),
    ("Job", "job", lambda d: d.__setitem__("state", "done")),
    ("Job", "job", lambda d: d.__setitem__("step", "copy")),
    ("Job", "job", lambda d: d.__setitem__("eta_seconds", "soon")),
    ("Job", "job", lambda d: d.__setitem__("error", {"code": "X"})),
    ("Error", "error", lambda d: d["error"].pop("errno")),
    ("BlobList", "blobs", lambda d: d["blobs"][0].__setitem__("digest", "0f" * 32)),
    ("BlobList", "blobs", lambda d: d["blobs"][0].__setitem__("path", "/x")),
    ("BlobList", "blobs", lambda d: d.pop("next_cursor")),
])
def test_schema_refuses_broken_objects(spec, name, base, mutate):
    bases = {"model": {"name": "m", "active_generation": 1, "aliases": {}, "n_generations": 1,
                       "created_at": 1},
             "gen": GEN, "job": JOB,
             "blobs": {"blobs": [{"digest": "sha256:" + "0f" * 32, "bytes": 9, "n_replicas": 2}],
                       "next_cursor": "b00"},
             "error": {"error": {"code": "TV_E_X", "message": "m", "errno": -1}}}
    doc = copy.deepcopy(bases[base])
    v = validator(spec, name)
    assert v.is_valid(doc)
    mutate(doc)
    assert not v.is_valid(doc)


# -- schemathesis against the running daemon -----------------------------------
#
# Every check of schemathesis (--checks all: status codes, response schemas,
# content types and headers, positive data accepted and negative data
# refused, 405 with Allow for undeclared methods, ignored auth, ...), seeded,
# against the daemon's own /v1/openapi.yaml, with models it can find: the
# document must say exactly what the server does.

# A Range past the end of a tensor or blob is a schema-valid request that
# RFC 9110 answers 416 (declared on both byte routes): valid data that is
# rightly refused, as a 404 for a name that does not exist is.
ACCEPTED = ('[checks.positive_data_acceptance]\nexpected-statuses = '
            '["2xx", "3xx", "401", "403", "404", "409", "416", "429", "5xx"]\n')


def schemathesis_run(d, tmp_path, tag, extra=(), config="", examples=25, timeout=150):
    exe = os.path.join(ROOT, ".venv", "bin", "schemathesis")
    cfg = tmp_path / f"{tag}.toml"
    cfg.write_text(ACCEPTED + config)
    cmd = [exe, "--config-file", str(cfg)]
    base = f"http://127.0.0.1:{d.port}"
    cmd += ["run", f"{base}/v1/openapi.yaml", "--url", base, "--checks", "all",
            "--max-examples", str(examples), "--phases", "examples,coverage,fuzzing",
            "--seed", "9",
            # one worker: this CPython 3.11's ast.parse is not thread-safe
            # (hypothesis describes lambdas with it; two workers sometimes die
            # with "SystemError: AST constructor recursion depth mismatch")
            "--workers", "1", "--request-timeout", "20", "--no-color",
            "--generation-database", "none", "--suppress-health-check", "all",
            "-H", f"Authorization: Bearer {d.token}",
            # revoking tokens by guessed ids would revoke the one it runs with
            "--exclude-operation-id", "revokeToken",
            # deactivating "m" lets the generated DELETEs remove it (covered
            # by test_daemon_deactivate.py instead)
            "--exclude-operation-id", "deactivateModel", *extra]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * SLOW,
                       cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"schemathesis ({tag}) failed:\n{out[-12000:]}\n" \
                              f"daemon log:\n{d.log_text()[-3000:]}"
    assert d.alive() and d.get("/healthz", token=None).status == 200
    return out, time.monotonic() - t0


def test_schemathesis_against_the_daemon(build_dir, tmp_path):
    d = Daemon(build_dir, tmp_path).start()
    try:
        rng = np.random.default_rng(5)
        tensors = {"w.0": rng.integers(0, 255, size=(4, 33), dtype=np.uint8),
                   "w/1": rng.standard_normal((7,)).astype(np.float32)}
        src = make_checkpoint(tmp_path / "m" / "model.safetensors", tensors)
        d.import_ok("m", src, activate=True)
        d.import_ok("m", make_checkpoint(tmp_path / "m2" / "model.safetensors",
                                         {"w.0": tensors["w.0"] + 1}), alias="prod")
        # Everything, with generated parameters (mostly unknown names: 404s) ...
        out, secs = schemathesis_run(d, tmp_path, "all")
        # ... and the read routes with parameters that resolve, so that the
        # success bodies are checked against their schemas.
        out2, secs2 = schemathesis_run(d, tmp_path, "resolved", extra=["--include-method", "GET"],
                                       examples=10, config=(
            '[parameters]\n"path.name" = "m"\n"path.gen" = "1"\n"path.tensor" = "w.0"\n'))
        # It ran the checks that found the disagreements: generated cases by
        # the hundred, undeclared methods, negative data.
        for o in (out, out2):
            n = re.search(r"(\d+) generated", o)
            assert n and int(n.group(1)) >= 100, o[-3000:]
        # the model is still there and intact
        r = d.get("/v1/models/m/generations/1/tensors/w.0/data")
        assert r.status == 200 and r.body == tensors["w.0"].tobytes()
    finally:
        assert d.stop() == 0, d.log_text()


# The disagreements schemathesis found, each pinned down (the same requests
# without schemathesis, so that a failure names the case).
def test_the_contract_cases(build_dir, tmp_path):
    d = Daemon(build_dir, tmp_path).start()
    try:
        src = make_checkpoint(tmp_path / "m" / "model.safetensors",
                              {"w": np.arange(6, dtype=np.float32)})
        d.import_ok("m", src, activate=True)
        # An empty cursor is the first page, on every list route.
        for path in ("/v1/models", "/v1/models/m/generations",
                     "/v1/models/m/generations/1/tensors", "/v1/jobs", "/v1/blobs"):
            whole = d.get(path)
            r = d.get(path + "?cursor=")
            assert r.status == 200 and r.json() == whole.json(), (path, r)
        # A malformed cursor stays 400.
        assert d.get("/v1/models?cursor=zz").status == 400
        # Integers as JSON Schema reads them: 1.0 is 1; null is not an integer.
        dev = d.get("/v1/devices").json()["devices"][0]["id"]
        r = d.request("POST", "/v1/verify", body={"device_id": float(dev)})
        assert r.status == 202, r
        d.wait_job(r.json()["id"])
        for body in ({"device_id": None}, {"device_id": 1.5}, {"device_id": "1"}):
            r = d.request("POST", "/v1/verify", body=body)
            assert r.status == 400 and "device_id" in r.json()["error"]["message"], (body, r)
        r = d.request("PUT", "/v1/models/m/aliases/prod", body={"generation": 1.0})
        assert r.status == 200 and r.json()["generation"] == 1, r
        r = d.request("POST", "/v1/imports", body={"model": "m", "source": src, "alias": None})
        assert r.status == 400 and "alias" in r.json()["error"]["message"], r
        # Token names are printable ASCII; a control character or a
        # non-ASCII byte is 400, as the schema's pattern says.
        for name in ("a\tb", "caf\u00e9", "x" * 256, ""):
            r = d.request("POST", "/v1/tokens", body={"name": name, "scope": "read"})
            assert r.status == 400, (name, r)
        r = d.request("POST", "/v1/tokens", body={"name": "x" * 255, "scope": "read"})
        assert r.status == 201, r
        # The dashboard's paths and /metrics answer other methods 405 + Allow.
        for path in ("/", "/metrics", "/ui/app.js", "/ui/nosuch"):
            for method in ("POST", "PUT", "DELETE", "PATCH", "TRACE"):
                r = d.request(method, path)
                assert r.status == 405, (method, path, r)
                assert r.headers.get("allow") == "GET", (method, path, r.headers)
                assert r.json()["error"]["code"] == "TV_E_BAD_REQUEST"
            assert d.request("GET", path).status in (200, 404), path
        assert d.request("HEAD", "/metrics").status == 200
    finally:
        assert d.stop() == 0, d.log_text()


def test_spec_states_the_name_rules(spec):
    """The rules the server applies, as the schema writes them: model names
    (1-128 bytes, the component rule), alias names, token names, int64
    ids."""
    import re as _re
    model = _re.compile(spec["components"]["schemas"]["ModelName"]["pattern"])
    assert spec["components"]["schemas"]["ModelName"]["maxLength"] == 128
    for ok in ("m", "org/m", "meta-llama/Llama-3-8B", "a.b-c_d", "a./b"):
        assert model.match(ok), ok
    for bad in ("", ".a", "-a", "a..b", "a//b", "a/", "/a", "a@b", "a b", "a/.b"):
        assert not model.match(bad), bad
    alias = _re.compile(spec["components"]["parameters"]["AliasName"]["schema"]["pattern"])
    for ok in ("prod", "a", "canary-2.x_y", "a" * 64):
        assert alias.match(ok), ok
    for bad in ("", "00", "_p", "a" * 65, "p q"):
        assert not alias.match(bad), bad
    imp = spec["components"]["schemas"]["ImportRequest"]["properties"]
    assert imp["alias"]["not"] == {"const": "active"}
    assert imp["model"] == {"$ref": "#/components/schemas/ModelName"}
    tok = _re.compile(spec["components"]["schemas"]["TokenCreateRequest"]["properties"]["name"]
                      ["pattern"])
    assert tok.match("ci") and tok.match(" ~") and not tok.match("a\tb") and not tok.match("\u00e9")
    for name in ("DeviceId", "JobId"):
        assert spec["components"]["parameters"][name]["schema"]["maximum"] == 2 ** 63 - 1
