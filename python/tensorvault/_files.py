"""Files the registry holds: safe_open (and the one-line switch, _patch.py)
given a .safetensors file reads it from the generation that holds it.

How a file is matched to a shard, never by reading it whole: its size and
the SHA-256 of its 8 + N header bytes (read here, the first 8 + N bytes),
and one identity that no other file shares:
  - its content hash, when the file is a Hugging Face cache blob (its real
    path is .../blobs/<64 hex digits>: the hub names a blob by the SHA-256
    of its bytes), compared with the SHA-256 the importer computed of every
    shard it stored;
  - or its fstat identity and change stamps (device, inode, size, mtime,
    ctime, in nanoseconds), compared with those the importer recorded when
    it read and hashed that very file (migrations/0006_shard_files.sql).
Two checkpoints of one architecture share size and header, never both: a
different file has another content hash; another file, or the same inode
rewritten, has other stamps (every change of a file's bytes moves its
ctime, which nothing sets back), so a file matches only the shard whose
bytes it had when they were imported.

The lookup asks the daemon (GET /v1/shards over its HTTP UNIX socket
http.socket, found as _paths.py says, or loopback TCP: the daemon names
the peer, no token, and
leaves out models the peer may not read under [access]) or, with store=,
the store's registry in-process (read-only SQLite, the same query as
server/registry/shard_files.c). Any failure of the lookup, and a file no
readable generation holds, hands the file to the official safe_open."""
import hashlib
import http.client
import json
import os
import re
import socket as socketlib
import sqlite3
import stat
import urllib.parse

from . import _checkout
from . import _native as N
from . import _paths
from . import _safe_open as S

HEADER_MAX = 100_000_000  # the official reader's limit on N
TIMEOUT_S = 5.0


class FileId:
    """What names a file for the lookup: size, header hash and header
    bytes, content hash (or None), fstat stamps."""

    __slots__ = ("size", "header", "header_sha256", "sha256", "dev", "ino", "mtime_ns", "ctime_ns")

    def query(self):
        q = {"file_len": self.size, "header_sha256": self.header_sha256, "dev": self.dev,
             "ino": self.ino, "mtime_ns": self.mtime_ns, "ctime_ns": self.ctime_ns}
        if self.sha256:
            q["sha256"] = self.sha256
        return q


_BLOB = re.compile(r"[0-9a-f]{64}")


def identify(path):
    """The FileId of path (symbolic links followed), or None when it is not
    a regular file with a plausible safetensors header. Reads 8 + N bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 8:
            return None
        prefix = os.pread(fd, 8, 0)
        n = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        if n == 0 or n > HEADER_MAX or 8 + n > st.st_size:
            return None
        parts, got = [prefix], 8
        while got < 8 + n:
            b = os.pread(fd, 8 + n - got, got)
            if not b:
                return None
            parts.append(b)
            got += len(b)
    except OSError:
        return None
    finally:
        os.close(fd)
    f = FileId()
    f.header = b"".join(parts)
    f.size = st.st_size
    f.header_sha256 = hashlib.sha256(f.header).hexdigest()
    real = os.path.realpath(path)
    base, parent = os.path.basename(real), os.path.basename(os.path.dirname(real))
    f.sha256 = base if parent == "blobs" and _BLOB.fullmatch(base) else None
    f.dev, f.ino = st.st_dev, st.st_ino
    f.mtime_ns, f.ctime_ns = st.st_mtime_ns, st.st_ctime_ns
    return f


class Hit:
    """A generation holding the file: model, generation number, shard index."""

    __slots__ = ("model", "generation", "shard", "name")

    def __init__(self, model, generation, shard, name):
        self.model, self.generation, self.shard, self.name = model, generation, shard, name


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def lookup_daemon(fid, endpoint):
    """GET /v1/shards: the first shard the daemon lists for fid (the peer
    may read it), or None."""
    if endpoint.startswith("http://"):
        u = urllib.parse.urlsplit(endpoint)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=TIMEOUT_S)
    else:
        conn = _UnixHTTPConnection(endpoint, TIMEOUT_S)
    try:
        conn.request("GET", "/v1/shards?" + urllib.parse.urlencode(fid.query()),
                     headers={"Accept": "application/json"})
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    if r.status != 200:
        return None
    shards = json.loads(body)["shards"]
    if not shards:
        return None
    s = shards[0]
    return Hit(s["model"], s["generation"], s["shard"], s["name"])


# server/registry/shard_files.c's query (the stamps variant), for a store
# read in-process. dev and ino are stored as signed 64-bit values.
LOOKUP_SQL = (
    "SELECT m.name, g.number, s.idx, s.name "
    "FROM shards s JOIN generations g ON g.id = s.generation_id AND g.state = 'ready' "
    "JOIN models m ON m.id = g.model_id WHERE s.header_sha256 = ?1 AND s.file_len = ?2 "
    "AND (s.sha256 = ?3 OR EXISTS (SELECT 1 FROM shard_files f WHERE f.shard_id = s.id "
    "AND f.dev = ?4 AND f.ino = ?5 AND f.size = ?2 AND f.mtime_ns = ?6 AND f.ctime_ns = ?7)) "
    "ORDER BY m.active_generation IS g.number DESC, g.number DESC, m.name LIMIT 64")


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def lookup_store(fid, store):
    """The first shard of the store's registry (read-only) that is fid, or
    None."""
    db = os.path.join(str(store), "registry.db")
    if fid.size >= 1 << 63 or not os.path.isfile(db):
        return None
    con = sqlite3.connect("file:" + urllib.parse.quote(db) + "?mode=ro", uri=True,
                          timeout=TIMEOUT_S)
    try:
        con.execute("PRAGMA query_only = ON")
        row = con.execute(LOOKUP_SQL, (fid.header_sha256, fid.size, fid.sha256, _signed(fid.dev),
                                       _signed(fid.ino), fid.mtime_ns, fid.ctime_ns)).fetchone()
    finally:
        con.close()
    return None if row is None else Hit(*row)


def lookup(path, socket=None, store=None, http=None):
    """(Hit, FileId) for the generation holding the file at path, or None:
    not a safetensors file, held by no generation the caller may read, or
    the lookup failed (no daemon, an older registry...)."""
    fid = identify(path)
    if fid is None:
        return None
    try:
        hit = lookup_store(fid, store) if store is not None else lookup_daemon(
            fid, _paths.http_endpoint(http, socket))
    except (OSError, ValueError, KeyError, TypeError, sqlite3.Error, http.client.HTTPException):
        return None
    return None if hit is None else (hit, fid)


def _official_device(device, dev):
    """device= for the official safe_open: a torch.device (which only
    tensorvault takes) as its string."""
    t = type(device)
    if t.__module__ == "torch" and t.__name__ == "device":
        return dev.shown if dev.kind == "cuda" else str(device)
    return device


def _official(filename, framework, device, backend, why):
    if S.OFFICIAL is None:
        raise N.make_error(N.TV_E_NOT_SUPPORTED,
                           f"{filename!r}: {why}, and reading it directly needs the "
                           "safetensors package, which is not installed")
    return S.OFFICIAL(filename, framework, device=device, backend=backend)


def _open_checkout(path, co, fw, dev, official_args, socket, store, views):
    """A shard named in a checkout's index (_checkout.py): that shard of the
    generation its record names, from the store the caller names, else
    the record's store, else the daemon. A failure goes to the official
    safe_open when the file is there, else raises naming the generation."""
    rec, idx, name = co
    spec = f"{rec['model']}@{rec['generation']}"
    if store is None and socket is None and isinstance(rec.get("store"), str):
        store = rec["store"]
    try:
        m = S._Model.get(spec, None if store is None else str(store),
                         None if socket is None else str(socket), True)
        return S.safe_open._make(m, fw, dev, spec, shard=idx, header=None, views=views)
    except N.Error as e:
        if os.path.exists(path):
            return _official(*official_args, f"its checkout's generation {spec} does not open ({e})")
        raise N.make_error(e.code,
                           f"{path!r} is shard {name!r} of {spec} (the checkout's "
                           f"{_checkout.RECORD}), which does not open: {e}") from None


def open_file(filename, framework, device="cpu", backend="mmap", socket=None, store=None,
              http=None, views=False):
    """safe_open of a file: a handle on the shard of the generation that
    holds it, else (arguments only the official serves, a file no readable
    generation holds, a failure to open that generation) the official
    safe_open's handle, or its error."""
    try:
        fw, dev = S.parse_framework(framework), S.parse_device(device)
        S.check_backend(backend)
    except Exception:
        if S.OFFICIAL is None:
            raise
        return S.OFFICIAL(filename, framework, device=device, backend=backend)
    device = _official_device(device, dev)
    path = filename if isinstance(filename, str) else (
        os.fspath(filename) if isinstance(filename, os.PathLike) else None)
    if not isinstance(path, str):  # the official's TypeError
        return _official(filename, framework, device, backend, "the file name is not a str")
    if fw == "other" or dev.kind == "other":
        return _official(filename, framework, device, backend,
                         f"framework {framework} on device {dev.shown} is not served by tensorvault")
    co = _checkout.shard_of(path)
    if co is not None:
        return _open_checkout(path, co, fw, dev, (filename, framework, device, backend), socket,
                              store, views)
    found = lookup(path, socket=socket, store=store, http=http)
    if found is None:
        return _official(filename, framework, device, backend,
                         "no generation of the registry holds this file")
    hit, fid = found
    spec = f"{hit.model}@{hit.generation}"
    try:
        m = S._Model.get(spec, None if store is None else str(store),
                         None if socket is None else str(socket), True)
        return S.safe_open._make(m, fw, dev, spec, shard=hit.shard, header=fid.header,
                                 views=views)
    except N.Error as e:
        return _official(filename, framework, device, backend,
                         f"its generation {spec} does not open ({e})")
