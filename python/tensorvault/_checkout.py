"""Checkouts: a directory `tensorvault checkout NAME@GEN DIR` (docs/cli.md)
wrote, or checkout() below: a generation's sidecar files (config,
tokenizer, ...), a model.safetensors.index.json naming its shards, and
tensorvault.json recording the model and the generation NUMBER they came
from. The shards are not in the directory: a shard file named in its
index resolves through the record to that generation (shard_of, used by
_files.open_file: safe_open and the one-line switch), so the weights read
are the generation's whose config sits beside them, never another's.

Invariants: a record is trusted only when it is a JSON object with a model
name (str), a generation number (int >= 1) and a list of shards; a path
resolves only when its directory holds a record that names its base name
as a shard; checkout() writes every file through a temporary name, after
checking all of them against their SHA-256 and every target in DIR (a
different file is replaced only with force=True)."""
import hashlib
import http.client
import json
import os
import urllib.parse

from . import _paths

RECORD = "tensorvault.json"
INDEX = "model.safetensors.index.json"
TIMEOUT_S = 30.0


def read_record(directory):
    """The checkout record of directory (a dict), or None when it has none
    or it is malformed."""
    try:
        with open(os.path.join(os.fspath(directory), RECORD), "rb") as f:
            rec = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("model"), str):
        return None
    gen = rec.get("generation")
    if type(gen) is not int or gen < 1 or not isinstance(rec.get("shards"), list):
        return None
    return rec


def shard_of(path):
    """(record, shard index, shard name) when path names a shard of a
    checkout (its directory's record lists its base name), else None."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    rec = read_record(directory)
    if rec is None:
        return None
    for i, s in enumerate(rec["shards"]):
        if isinstance(s, dict) and s.get("name") == name:
            return rec, i, name
    return None


def spec_of(directory):
    """"model@N" of a checkout directory, or None."""
    rec = read_record(directory)
    return None if rec is None else f"{rec['model']}@{rec['generation']}"


# ---- checkout() ----------------------------------------------------------------------


def _seg(s):
    return urllib.parse.quote(s, safe="")


class _Api:
    def __init__(self, http):
        self.endpoint = _paths.http_endpoint(http, None)

    def get(self, path, query=None):
        if self.endpoint.startswith("http://"):
            u = urllib.parse.urlsplit(self.endpoint)
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=TIMEOUT_S)
        else:
            from ._files import _UnixHTTPConnection
            conn = _UnixHTTPConnection(self.endpoint, TIMEOUT_S)
        try:
            conn.request("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        if r.status != 200:
            try:
                msg = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = f"status {r.status}"
            raise OSError(f"GET {path}: {msg}")
        return body

    def json(self, path, query=None):
        return json.loads(self.get(path, query))


def _check_target(directory, rel, data, force):
    """True when directory/rel holds data already; raises FileExistsError
    for a different file without force, and for a symbolic link on the way."""
    parts = rel.split("/")
    p = directory
    for i, part in enumerate(parts):
        p = os.path.join(p, part)
        if not os.path.lexists(p):
            return False
        if os.path.islink(p) and (i < len(parts) - 1 or not force):
            raise FileExistsError(f"{p} is a symbolic link: refusing to write through it")
    if os.path.islink(p):
        return False
    with open(p, "rb") as f:
        same = f.read() == data
    if not same and not force:
        raise FileExistsError(f"{p} exists and differs from the generation's '{rel}': "
                              "refusing to overwrite it (force=True replaces it)")
    return same


def _write(directory, rel, data):
    p = os.path.join(directory, *rel.split("/"))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    tmp = f"{p}.tv-{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def checkout(model, directory, generation=None, *, http=None, force=False):
    """What `tensorvault checkout MODEL[@GENERATION] DIRECTORY` does, through
    the daemon's HTTP API (http=: its UNIX socket path or
    http://127.0.0.1:PORT; default as the lookups find it, _paths.py):
    the generation (a number, an alias, or None: the active one) resolved
    once to its number; its sidecar files, the index and tensorvault.json
    written into directory. Returns the record (a dict)."""
    api = _Api(http)
    directory = os.fspath(directory)
    base = f"/v1/models/{_seg(model)}/generations/"
    gen = api.json(base + _seg("active" if generation is None else str(generation)))
    number = gen["generation"]
    base += str(number)
    files = api.json(base + "/files")["files"]
    out = []
    for f in files:
        rel = f["path"]
        if rel in (RECORD, INDEX):
            continue
        if rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
            raise ValueError(f"the daemon listed a file named {rel!r}")
        data = api.get(base + "/files/" + _seg(rel))  # its '/'s as %2F: any depth
        if len(data) != f["size"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise OSError(f"{rel!r} did not arrive as listed (size or SHA-256 differ)")
        out.append((rel, data))
    weight_map, cursor = {}, None
    while True:
        q = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = api.json(base + "/tensors", q)
        for t in page["tensors"]:
            weight_map[t["name"]] = t["shard"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    index = {"metadata": {"total_size": gen["total_bytes"]}, "weight_map": weight_map}
    out.append((INDEX, json.dumps(index, indent=2, sort_keys=True).encode()))
    rec = {"model": model, "generation": number, "files": files, "index": INDEX,
           "shards": [{"name": s["name"], "size": s["file_bytes"], "sha256": s["sha256"]}
                      for s in gen.get("shards", [])]}
    ep = api.endpoint
    rec["url" if ep.startswith("http://") else "socket"] = ep
    out.append((RECORD, json.dumps(rec, indent=2, sort_keys=True).encode()))
    os.makedirs(directory, exist_ok=True)
    todo = [(rel, data) for rel, data in out if not _check_target(directory, rel, data, force)]
    for rel, data in todo:
        _write(directory, rel, data)
    return rec
