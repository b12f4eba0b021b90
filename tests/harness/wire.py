"""A Python codec of the fast-path wire protocol (core/src/wire/wire.h, the
byte layout; docs/fastpath.md, the semantics) and a small
pure-Python reading client for the integration tests and the benchmark.

Invariants:
  - every layout is a struct.Struct with a '<' format (little-endian, no
    padding) whose size is asserted against wire.h's TV__FP_*_LEN;
  - encoders build exactly the bytes wire.h describes, and take overrides
    (magic, version, reserved, length) so tests can build malformed ones;
  - decode() checks everything a strict peer checks (magic, version, length
    = datagram length, known type, body and entries filling the message
    exactly, reserved fields zero): a daemon message that fails is a test
    failure (FpProtocolError), never silently accepted;
  - the client (Session / Handle) never writes outside a request's buffer:
    every CHUNK entry is checked against the slot, the arena and the
    request's range before the copy, and a request is complete only when
    its chunks covered every byte exactly once and its DONE said 0.
The client is deliberately simple (one thread, blocking socket with a
timeout); it is a test oracle, not a fast loader."""
import fcntl
import mmap
import os
import socket
import struct
import time

MAGIC = 0x50465654  # "TVFP" as little-endian bytes
VERSION = 1      # the base version: what a Session asks for unless told otherwise
MAX_VERSION = 3  # 2 = 1 + READ_SHARD_HEADER; 3 = 2 + the memory tier (OPENED_TIER, views)
READ_SHARD_HEADER = 0x1  # READ entry flag (version 2): tensor = shard index, off/len in its header
READ_VIEW = 0x2          # READ entry flag (version 3): view references, given back by RELEASE_VIEW
OPENED_TIER = 0x1        # OPENED flag (version 3): the arena is the generation's memory tier


def read_flags(version):
    """The READ entry flags a version defines."""
    if 3 <= version <= MAX_VERSION:
        return READ_SHARD_HEADER | READ_VIEW
    return READ_SHARD_HEADER if 2 <= version <= MAX_VERSION else 0


def opened_flags(version):
    """The OPENED flags a version defines (the field is reserved before 3)."""
    return OPENED_TIER if 3 <= version <= MAX_VERSION else 0

MAX_MSG = 65536
MAX_SPEC = 512
MAX_TEXT = 512
MAX_READS = 2047
MAX_CHUNKS = 2047
MAX_DONES = 4094  # 16 + 8 + n x 16 <= 65536
MAX_RELEASE = 16378
ERROR_FATAL = 0x1

HELLO, HELLO_OK, OPEN, OPENED, CLOSE, CLOSED, READ, CHUNK, DONE, RELEASE, ERROR = range(1, 12)
RELEASE_VIEW = 12  # version 3
TYPE_NAMES = {HELLO: "HELLO", HELLO_OK: "HELLO_OK", OPEN: "OPEN", OPENED: "OPENED",
              CLOSE: "CLOSE", CLOSED: "CLOSED", READ: "READ", CHUNK: "CHUNK", DONE: "DONE",
              RELEASE: "RELEASE", ERROR: "ERROR", RELEASE_VIEW: "RELEASE_VIEW"}
CLIENT_TYPES = {HELLO, OPEN, CLOSE, READ, RELEASE, RELEASE_VIEW}
SERVER_TYPES = {HELLO_OK, OPENED, CLOSED, CHUNK, DONE, ERROR}

# Error codes (core/include/tensorvault/errors.h) the tests name.
TV_E_INVALID_ARG = -1003
TV_E_NOT_FOUND = -1004
TV_E_TIMEOUT = -1111
TV_E_BUSY = -1203
TV_E_PROTOCOL = -1300
TV_E_VERSION = -1301
TV_E_PEER_DENIED = -1302
TV_E_CANCELLED = -1303
TV_E_DISCONNECTED = -1304

HDR = struct.Struct("<IHHII")          # magic, version, type, len, reserved
HELLO_B = struct.Struct("<HHI")        # min_version, max_version, reserved
HELLO_OK_B = struct.Struct("<HHIIIQ")  # version, reserved0, max_msg_len, max_requests, max_handles, session_id
OPEN_B = struct.Struct("<II")          # open_id, spec_len
OPENED_B = struct.Struct("<IIqQQIIII")  # open_id, handle, generation, snap_len, arena_len, slot_len, n_slots, credit, flags (reserved before 3)
CLOSE_B = struct.Struct("<II")         # handle, reserved (CLOSE and CLOSED)
LIST_B = struct.Struct("<II")          # handle, n (READ, CHUNK, DONE, RELEASE)
READ_E = struct.Struct("<QIIQQ")       # req_id, tensor, flags, off, len
CHUNK_E = struct.Struct("<QIIIIQ")     # req_id, handle, slot, slot_off, len, dest_off
DONE_E = struct.Struct("<QiI")         # req_id, result, handle
REL_E = struct.Struct("<I")            # slot
ERROR_B = struct.Struct("<iIQII")      # code, flags, req_id, open_id, text_len

for _s, _n in ((HDR, 16), (HELLO_B, 8), (HELLO_OK_B, 24), (OPEN_B, 8), (OPENED_B, 48),
               (CLOSE_B, 8), (LIST_B, 8), (READ_E, 32), (CHUNK_E, 32), (DONE_E, 16), (REL_E, 4),
               (ERROR_B, 24)):
    assert _s.size == _n, (_s.format, _s.size, _n)

LIST_ENTRY = {READ: (READ_E, MAX_READS), CHUNK: (CHUNK_E, MAX_CHUNKS), DONE: (DONE_E, MAX_DONES),
              RELEASE: (REL_E, MAX_RELEASE), RELEASE_VIEW: (REL_E, MAX_RELEASE)}


class FpProtocolError(AssertionError):
    """The daemon sent something the protocol forbids."""


class FpError(Exception):
    """An ERROR message (or a DONE with a non-zero result) from the daemon."""

    def __init__(self, code, text="", fatal=False, req_id=0, open_id=0):
        super().__init__(f"{code} {'fatal ' if fatal else ''}{text}")
        self.code, self.text, self.fatal, self.req_id, self.open_id = code, text, fatal, req_id, open_id


class FpClosed(Exception):
    """The daemon closed the connection (EOF or reset)."""


# ---------------------------------------------------------------- encoding

def message(mtype, body=b"", *, version=VERSION, magic=MAGIC, reserved=0, length=None):
    """Header + body. length overrides the header's len field (default: the
    real length)."""
    n = HDR.size + len(body) if length is None else length
    return HDR.pack(magic, version, mtype, n, reserved) + body


def enc_hello(min_version=VERSION, max_version=VERSION, reserved=0, **kw):
    return message(HELLO, HELLO_B.pack(min_version, max_version, reserved), **kw)


def enc_hello_ok(version=VERSION, max_requests=16, max_handles=16, session_id=1, **kw):
    return message(HELLO_OK, HELLO_OK_B.pack(version, 0, MAX_MSG, max_requests, max_handles,
                                             session_id), **kw)


def enc_open(open_id, spec, spec_len=None, **kw):
    if isinstance(spec, str):
        spec = spec.encode()
    n = len(spec) if spec_len is None else spec_len
    return message(OPEN, OPEN_B.pack(open_id, n) + spec, **kw)


def enc_opened(open_id=1, handle=1, generation=1, snap_len=0, arena_len=0, slot_len=4096,
               n_slots=1, credit=1, flags=0, **kw):
    return message(OPENED, OPENED_B.pack(open_id, handle, generation, snap_len, arena_len,
                                         slot_len, n_slots, credit, flags), **kw)


def enc_close(handle, mtype=CLOSE, reserved=0, **kw):
    return message(mtype, CLOSE_B.pack(handle, reserved), **kw)


def _list(mtype, handle, packed, n=None, **kw):
    return message(mtype, LIST_B.pack(handle, len(packed) if n is None else n) + b"".join(packed),
                   **kw)


def enc_read(handle, entries, n=None, **kw):
    """entries: (req_id, tensor, off, len) or (req_id, tensor, off, len, flags)."""
    packed = []
    for e in entries:
        req_id, tensor, off, ln = e[:4]
        flags = e[4] if len(e) > 4 else 0
        packed.append(READ_E.pack(req_id, tensor, flags, off, ln))
    return _list(READ, handle, packed, n, **kw)


def enc_release(handle, slots, n=None, **kw):
    return _list(RELEASE, handle, [REL_E.pack(s) for s in slots], n, **kw)


def enc_release_view(handle, slots, n=None, **kw):
    return _list(RELEASE_VIEW, handle, [REL_E.pack(s) for s in slots], n, **kw)


def enc_chunk(entries, **kw):
    """entries: (req_id, handle, slot, slot_off, len, dest_off)."""
    return _list(CHUNK, 0, [CHUNK_E.pack(*e) for e in entries], **kw)


def enc_done(entries, **kw):
    """entries: (req_id, result, handle)."""
    return _list(DONE, 0, [DONE_E.pack(*e) for e in entries], **kw)


def enc_error(code, text=b"", flags=0, req_id=0, open_id=0, **kw):
    if isinstance(text, str):
        text = text.encode()
    return message(ERROR, ERROR_B.pack(code, flags, req_id, open_id, len(text)) + text, **kw)


# ---------------------------------------------------------------- decoding

class Msg:
    """A decoded message: type, version, length, f (the fixed fields by name),
    entries (list messages: one dict per entry), text (OPEN's spec / ERROR's
    text, bytes), fds (descriptors that came with it)."""

    def __init__(self, mtype, version, length, f, entries=None, text=None, fds=()):
        self.type, self.version, self.len, self.f = mtype, version, length, f
        self.entries, self.text, self.fds = entries or [], text, list(fds)

    @property
    def name(self):
        return TYPE_NAMES.get(self.type, f"UNKNOWN({self.type})")

    def __repr__(self):
        t = f" text={self.text!r}" if self.text else ""
        e = f" entries={self.entries[:8]}{'...' if len(self.entries) > 8 else ''}" if self.entries else ""
        return f"<{self.name} {self.f}{e}{t} fds={len(self.fds)}>"


def _fields(names, values):
    return dict(zip(names, values))


def decode(buf, version=VERSION):
    """Decodes one datagram; raises FpProtocolError naming what is wrong."""
    if len(buf) < HDR.size:
        raise FpProtocolError(f"datagram of {len(buf)} bytes is shorter than the header")
    magic, ver, mtype, ln, res = HDR.unpack_from(buf)
    if magic != MAGIC:
        raise FpProtocolError(f"bad magic {magic:#x}")
    if ver == 0:
        raise FpProtocolError("header version 0")
    if version and ver != version:
        raise FpProtocolError(f"version {ver}, negotiated {version}")
    if ln != len(buf):
        raise FpProtocolError(f"header length {ln} != datagram length {len(buf)}")
    if len(buf) > MAX_MSG:
        raise FpProtocolError(f"datagram of {len(buf)} bytes > {MAX_MSG}")
    if res:
        raise FpProtocolError("header reserved field not 0")
    if mtype == RELEASE_VIEW and ver < 3:
        raise FpProtocolError(f"unknown message type {mtype} in version {ver}")
    body = memoryview(buf)[HDR.size:]

    def fixed(st, names):
        if len(body) < st.size:
            raise FpProtocolError(f"{TYPE_NAMES.get(mtype)} body of {len(body)} bytes < {st.size}")
        return _fields(names, st.unpack_from(body))

    if mtype == HELLO:
        f = fixed(HELLO_B, ("min_version", "max_version", "reserved"))
        rest = len(body) - HELLO_B.size
    elif mtype == HELLO_OK:
        f = fixed(HELLO_OK_B, ("version", "reserved", "max_msg_len", "max_requests",
                               "max_handles", "session_id"))
        rest = len(body) - HELLO_OK_B.size
    elif mtype == OPENED:
        f = fixed(OPENED_B, ("open_id", "handle", "generation", "snap_len", "arena_len",
                             "slot_len", "n_slots", "credit", "flags"))
        rest = len(body) - OPENED_B.size
        if f["flags"] & ~opened_flags(ver):
            raise FpProtocolError(f"OPENED flags {f['flags']:#x} in version {ver}")
    elif mtype in (CLOSE, CLOSED):
        f = fixed(CLOSE_B, ("handle", "reserved"))
        rest = len(body) - CLOSE_B.size
    elif mtype == OPEN:
        f = fixed(OPEN_B, ("open_id", "spec_len"))
        text = bytes(body[OPEN_B.size:])
        if len(text) != f["spec_len"]:
            raise FpProtocolError(f"OPEN spec_len {f['spec_len']} but {len(text)} bytes follow")
        return Msg(mtype, ver, ln, f, text=text)
    elif mtype == ERROR:
        f = fixed(ERROR_B, ("code", "flags", "req_id", "open_id", "text_len"))
        text = bytes(body[ERROR_B.size:])
        if len(text) != f["text_len"]:
            raise FpProtocolError(f"ERROR text_len {f['text_len']} but {len(text)} bytes follow")
        if f["text_len"] > MAX_TEXT or b"\0" in text:
            raise FpProtocolError(f"ERROR text of {len(text)} bytes or with a NUL")
        if f["flags"] & ~ERROR_FATAL or f["code"] >= 0:
            raise FpProtocolError(f"ERROR flags {f['flags']:#x} code {f['code']}")
        return Msg(mtype, ver, ln, f, text=text)
    elif mtype in LIST_ENTRY:
        f = fixed(LIST_B, ("handle", "n"))
        st, limit = LIST_ENTRY[mtype]
        if not 1 <= f["n"] <= limit:
            raise FpProtocolError(f"{TYPE_NAMES[mtype]} n {f['n']} outside 1..{limit}")
        if len(body) != LIST_B.size + f["n"] * st.size:
            raise FpProtocolError(f"{TYPE_NAMES[mtype]} of n {f['n']} is {len(buf)} bytes")
        ents = []
        for i in range(f["n"]):
            v = st.unpack_from(body, LIST_B.size + i * st.size)
            if mtype == READ:
                e = _fields(("req_id", "tensor", "flags", "off", "len"), v)
                if e["flags"] & ~read_flags(ver):
                    raise FpProtocolError(f"READ entry {i} flags {e['flags']:#x} in version {ver}")
                ents.append(e)
            elif mtype == CHUNK:
                e = _fields(("req_id", "handle", "slot", "slot_off", "len", "dest_off"), v)
                if e["len"] < 1:
                    raise FpProtocolError(f"CHUNK entry {i} of length 0")
                ents.append(e)
            elif mtype == DONE:
                e = _fields(("req_id", "result", "handle"), v)
                if e["result"] > 0:
                    raise FpProtocolError(f"DONE entry {i} result {e['result']} > 0")
                ents.append(e)
            else:
                ents.append({"slot": v[0]})
        if mtype in (CHUNK, DONE) and f["handle"] != 0:
            raise FpProtocolError(f"{TYPE_NAMES[mtype]} list handle {f['handle']} (must be 0)")
        if mtype in (CHUNK, DONE) and any(e["handle"] < 1 for e in ents):
            raise FpProtocolError(f"{TYPE_NAMES[mtype]} entry with handle 0")
        return Msg(mtype, ver, ln, f, entries=ents)
    else:
        raise FpProtocolError(f"unknown message type {mtype}")
    if rest != 0:
        raise FpProtocolError(f"{TYPE_NAMES[mtype]} of {len(buf)} bytes (fixed size)")
    if f.get("reserved"):
        raise FpProtocolError(f"{TYPE_NAMES[mtype]} reserved field not 0")
    return Msg(mtype, ver, ln, f)


# ---------------------------------------------------------------- snapshot

DTYPES = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
          "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64", "F4",
          "F6_E2M3", "F6_E3M2"]
SNAP_HDR = struct.Struct("<8sIIQ32sqIIIIIIQQQQQQQQQQII")
SNAP_SHARD = struct.Struct("<IIQQ32sII")
SNAP_TENSOR = struct.Struct("<IIIIIIQQ")
assert SNAP_HDR.size == 176 and SNAP_SHARD.size == 64 and SNAP_TENSOR.size == 40


class Snapshot:
    """The parts of a manifest snapshot (docs/formats.md section 1) the
    client needs: model, generation, shards and tensors in file order (the
    READ's tensor index). Checks bounds as it goes (no checksum: the C
    client verifies XXH3; the tests compare bytes with the official
    loader)."""

    def __init__(self, img):
        if len(img) < 256:
            raise FpProtocolError(f"snapshot of {len(img)} bytes")
        (magic, ver, hlen, total, _ck, gen, n_dev, n_shards, n_rep, n_tensors, n_index, flags,
         n_dims, strings_len, _dev_off, shards_off, _rep_off, tensors_off, dims_off, strings_off,
         _idx_off, _seed, model_off, model_len) = SNAP_HDR.unpack_from(img)
        if magic != b"TVSNAP01" or hlen != 256 or total != len(img):
            raise FpProtocolError(f"snapshot header: magic {magic!r} header_len {hlen} "
                                  f"total_len {total} of {len(img)}")
        self.img, self.version, self.generation = img, ver, gen
        strings = img[strings_off:strings_off + strings_len]
        if len(strings) != strings_len:
            raise FpProtocolError("snapshot string table outside the image")

        def string(off, ln):
            if off + ln >= strings_len or strings[off + ln] != 0:
                raise FpProtocolError(f"snapshot string ref ({off}, {ln}) invalid")
            return bytes(strings[off:off + ln])

        self.model = string(model_off, model_len).decode("utf-8", "surrogateescape")
        self.shards = []
        for i in range(n_shards):
            no, nl, file_len, header_len, _sha, first_rep, n_reps = SNAP_SHARD.unpack_from(
                img, shards_off + i * SNAP_SHARD.size)
            self.shards.append({"index": i, "name": string(no, nl).decode(), "file_len": file_len,
                                "header_len": header_len, "data_off": 8 + header_len})
        self.tensors = []
        for i in range(n_tensors):
            no, nl, dt, rank, first_dim, shard, begin, end = SNAP_TENSOR.unpack_from(
                img, tensors_off + i * SNAP_TENSOR.size)
            if first_dim + rank > n_dims or shard >= n_shards or not begin <= end or dt >= len(DTYPES):
                raise FpProtocolError(f"snapshot tensor {i} invalid")
            shape = list(struct.unpack_from(f"<{rank}Q", img, dims_off + 8 * first_dim))
            self.tensors.append({"index": i, "name": string(no, nl).decode("utf-8", "surrogateescape"),
                                 "dtype": DTYPES[dt], "shape": shape, "shard": shard,
                                 "begin": begin, "end": end, "nbytes": end - begin})
        self.by_name = {t["name"]: t for t in self.tensors}


# ---------------------------------------------------------------- the client

class Request:
    def __init__(self, req_id, handle, tensor, off, length, flags=0):
        self.req_id, self.handle, self.tensor, self.off, self.len = req_id, handle, tensor, off, length
        self.flags = flags  # READ_SHARD_HEADER: tensor is a shard index; READ_VIEW: a view
        self.view_at = None  # a view: where its bytes start in the arena
        # a range no tensor has (a test of the daemon's refusal) gets no buffer
        self.buf = bytearray(length) if length <= 1 << 36 else None
        self.covered = 0
        self.ranges = []  # (dest_off, len) received
        self.result = None  # DONE's result
        self.error = None   # the ERROR naming this request, if any

    @property
    def done(self):
        return self.result is not None


class Handle:
    """One OPENED handle: the snapshot and the mapped arena."""

    def __init__(self, session, msg):
        f = msg.f
        self.session, self.handle, self.generation = session, f["handle"], f["generation"]
        self.snap_len, self.arena_len = f["snap_len"], f["arena_len"]
        self.slot_len, self.n_slots, self.credit = f["slot_len"], f["n_slots"], f["credit"]
        self.tier = bool(f["flags"] & OPENED_TIER)  # chunk i of the generation is slot i
        if len(msg.fds) != 2:
            raise FpProtocolError(f"OPENED with {len(msg.fds)} descriptors (2 expected)")
        self.snap_fd, self.arena_fd = msg.fds
        if self.handle < 1 or self.slot_len % 4096 or self.slot_len == 0 or self.n_slots == 0:
            raise FpProtocolError(f"OPENED fields {f}")
        if self.arena_len < self.n_slots * self.slot_len:
            raise FpProtocolError(f"arena of {self.arena_len} bytes < {self.n_slots} x {self.slot_len}")
        if os.fstat(self.snap_fd).st_size != self.snap_len or \
                os.fstat(self.arena_fd).st_size != self.arena_len:
            raise FpProtocolError("OPENED lengths differ from the descriptors' sizes")
        self.snap_seals = fcntl.fcntl(self.snap_fd, fcntl.F_GET_SEALS)
        self.arena_seals = fcntl.fcntl(self.arena_fd, fcntl.F_GET_SEALS)
        img = b""
        while len(img) < self.snap_len:
            part = os.pread(self.snap_fd, self.snap_len - len(img), len(img))
            if not part:
                raise FpProtocolError("snapshot memfd shorter than snap_len")
            img += part
        self.snap = Snapshot(img)
        if self.snap.generation != self.generation:
            raise FpProtocolError(f"snapshot generation {self.snap.generation} != OPENED's "
                                  f"{self.generation}")
        self.arena = mmap.mmap(self.arena_fd, self.arena_len, mmap.MAP_SHARED, mmap.PROT_READ)
        self.view = memoryview(self.arena)
        self.bytes_delivered = 0
        self.closed = False

    @property
    def tensors(self):
        return self.snap.tensors

    def index(self, name):
        return self.snap.by_name[name]["index"]

    def slot_bytes(self, slot, off, ln):
        b = slot * self.slot_len + off
        return bytes(self.view[b:b + ln])

    def unmap(self):
        if self.arena is not None:
            self.view.release()
            self.arena.close()
            self.arena = None
            os.close(self.snap_fd)
            os.close(self.arena_fd)


def connect(path, timeout=30.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    s.connect(path)
    return s


class Session:
    """One connection. Protocol-level calls raise FpError for ERRORs that
    answer them and FpClosed when the daemon hangs up. `auto_release`
    False keeps every slot reference (a client that stops releasing)."""

    def __init__(self, path, timeout=30.0, hello=True, auto_release=True, max_version=VERSION,
                 sock=None):
        """max_version: the HELLO offers [1, max_version] (VERSION: a version-1
        client, as before version 2 existed; MAX_VERSION: header reads).
        sock: a socket already connected to path (say by another uid: the
        daemon knows a peer by the credentials of its connect)."""
        self.path, self.timeout = path, timeout
        self.max_version = max_version
        if sock is None:
            sock = connect(path, timeout)
        sock.settimeout(timeout)
        self.sock = sock
        self.version = 0  # 0 until HELLO_OK
        self.handles = {}
        self.used_handles = set()
        self.bytes_delivered = 0  # CHUNK bytes over every handle, closed ones too
        self.reqs = {}      # req_id -> Request (outstanding and done)
        self.held = []      # [(handle, slot)] references not released
        self.vheld = []     # [(handle, slot)] view references (version 3) not released
        self.auto_release = auto_release
        self.next_req = 1
        self.next_open = 1
        self.replies = []   # HELLO_OK / OPENED / CLOSED / non-request ERRORs, in order
        self.fatal = None   # the fatal ERROR, if one came
        self.eof = False
        self.log = []       # every message received (type names), for failure messages
        self.hello_ok = None
        if hello:
            self.hello(VERSION, max_version)

    # -- raw I/O ---------------------------------------------------------------

    def send(self, data, fds=()):
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv_raw(self, timeout=None):
        """(bytes, fds) of one datagram; (None, []) at EOF or reset. Raises
        TimeoutError."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MSG + 4096, 4,
                                                  socket.MSG_CMSG_CLOEXEC)
        except ConnectionResetError:
            # The daemon closed with a message of ours unread: Linux reports
            # the reset before the datagrams still queued here (an ERROR it
            # sent before closing). Drain those first; EOF after them.
            try:
                data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MSG + 4096, 4,
                                                      socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
            except (BlockingIOError, ConnectionResetError):
                return None, []
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            raise FpProtocolError(f"daemon datagram truncated (flags {flags:#x})")
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        return data, fds

    def recv(self, timeout=None):
        """One decoded message, or None at EOF."""
        data, fds = self.recv_raw(timeout)
        if data is None:
            self.eof = True
            return None
        try:
            m = decode(data, self.version)
        except FpProtocolError:
            for fd in fds:
                os.close(fd)
            raise
        m.fds = fds
        if m.type not in SERVER_TYPES:
            raise FpProtocolError(f"the daemon sent a client type {m.name}")
        if m.type != OPENED and fds:
            for fd in fds:
                os.close(fd)
            raise FpProtocolError(f"{m.name} came with {len(fds)} descriptors")
        self.log.append(m.name)
        return m

    def expect_eof(self, timeout=None):
        """The next thing is EOF (after messages of the kinds in `allowed`,
        none here): returns True; raises if a message comes instead."""
        m = self.recv(timeout)
        if m is not None:
            raise AssertionError(f"expected EOF, got {m}")
        return True

    def expect_fatal(self, code, timeout=None):
        """The next message is ERROR{code, FATAL} (code: one code or a set)
        and then EOF. Returns the ERROR's text."""
        codes = code if isinstance(code, (set, frozenset)) else {code}
        m = self.recv(timeout)
        assert m is not None, f"EOF instead of ERROR {code}"
        assert m.type == ERROR, f"expected ERROR {code}, got {m}"
        assert m.f["code"] in codes, f"expected code {code}, got {m}"
        assert m.f["flags"] & ERROR_FATAL, f"ERROR not fatal: {m}"
        assert m.text, f"fatal ERROR without text: {m}"
        self.expect_eof(timeout)
        return m.text.decode("utf-8", "replace")

    # -- dispatch --------------------------------------------------------------

    def pump(self, timeout=None):
        """Receives one message and applies it: CHUNK copies (and releases
        unless auto_release is False), DONE completes, request ERRORs are
        recorded; other messages go to self.replies. Returns the message;
        raises FpClosed at EOF."""
        m = self.recv(timeout)
        if m is None:
            raise FpClosed(f"daemon closed the session (after {self.log[-5:]})")
        if m.type == CHUNK:
            self._chunk(m)
        elif m.type == DONE:
            for e in m.entries:
                r = self.reqs.get(e["req_id"])
                if r is None or r.done:
                    raise FpProtocolError(f"DONE for request {e['req_id']} not outstanding")
                if e["handle"] != r.handle:
                    raise FpProtocolError(f"DONE {e} for a request of handle {r.handle}")
                if e["result"] == 0 and r.covered != r.len:
                    raise FpProtocolError(f"DONE 0 for request {r.req_id} with {r.covered} of "
                                          f"{r.len} bytes delivered")
                if e["result"] != 0 and r.error is None and e["result"] != TV_E_CANCELLED:
                    raise FpProtocolError(f"DONE {e['result']} for request {r.req_id} without "
                                          f"an ERROR before")
                r.result = e["result"]
        elif m.type == ERROR:
            if m.f["flags"] & ERROR_FATAL:
                self.fatal = m
                self.replies.append(m)
            elif m.f["req_id"]:
                r = self.reqs.get(m.f["req_id"])
                if r is None or r.done:
                    raise FpProtocolError(f"ERROR for request {m.f['req_id']} not outstanding")
                r.error = m
            else:
                self.replies.append(m)
        else:
            self.replies.append(m)
        return m

    def _chunk(self, m):
        rel = {}
        for e in m.entries:
            r = self.reqs.get(e["req_id"])
            if r is None or r.done:
                raise FpProtocolError(f"CHUNK for request {e['req_id']} not outstanding")
            h = self.handles.get(e["handle"])
            if h is None or e["handle"] != r.handle:
                raise FpProtocolError(f"CHUNK {e} for handle {r.handle}")
            if e["slot"] >= h.n_slots or e["slot_off"] + e["len"] > h.slot_len:
                raise FpProtocolError(f"CHUNK {e} outside the arena (slots {h.n_slots} x {h.slot_len})")
            if e["dest_off"] + e["len"] > r.len or r.buf is None:
                raise FpProtocolError(f"CHUNK {e} past request {r.req_id}'s {r.len} bytes")
            for d0, n0 in r.ranges:
                if d0 < e["dest_off"] + e["len"] and e["dest_off"] < d0 + n0:
                    raise FpProtocolError(f"CHUNK {e} overlaps [{d0}, +{n0}) of request {r.req_id}")
            b = e["slot"] * h.slot_len + e["slot_off"]
            r.buf[e["dest_off"]:e["dest_off"] + e["len"]] = h.view[b:b + e["len"]]
            r.ranges.append((e["dest_off"], e["len"]))
            r.covered += e["len"]
            h.bytes_delivered += e["len"]
            self.bytes_delivered += e["len"]
            if r.flags & READ_VIEW:  # a view: contiguous in the tier, kept until released
                if not h.tier or (r.view_at is not None and r.view_at != b - e["dest_off"]):
                    raise FpProtocolError(f"CHUNK {e} of a view not where its other bytes are")
                r.view_at = b - e["dest_off"]
                self.vheld.append((e["handle"], e["slot"]))
                continue
            self.held.append((e["handle"], e["slot"]))
            if len(self.held) > h.credit:
                raise FpProtocolError(f"{len(self.held)} slot references held > credit {h.credit}")
            rel.setdefault(e["handle"], []).append(e["slot"])
        if self.auto_release:
            for hd, slots in rel.items():
                self.release(hd, slots)

    def release(self, handle, slots):
        for i in range(0, len(slots), MAX_RELEASE):
            part = slots[i:i + MAX_RELEASE]
            self.send(enc_release(handle, part, version=self.version or VERSION))
            for s in part:
                self.held.remove((handle, s))

    def release_views(self, handle, slots):
        """RELEASE_VIEW of view references (version 3)."""
        for i in range(0, len(slots), MAX_RELEASE):
            part = slots[i:i + MAX_RELEASE]
            self.send(enc_release_view(handle, part, version=self.version))
            for s in part:
                self.vheld.remove((handle, s))

    def release_all(self):
        by = {}
        for hd, s in self.held:
            by.setdefault(hd, []).append(s)
        for hd, slots in by.items():
            self.release(hd, slots)

    def wait_reply(self, types, timeout=None):
        """Pumps until a reply of one of `types` (or an ERROR answering an
        OPEN) is queued; returns it."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            for i, m in enumerate(self.replies):
                if m.type in types or m.type == ERROR:
                    del self.replies[i]
                    if m.type == ERROR:
                        f = m.f
                        raise FpError(f["code"], m.text.decode("utf-8", "replace"),
                                      bool(f["flags"] & ERROR_FATAL), f["req_id"], f["open_id"])
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {[TYPE_NAMES[t] for t in types]} within the timeout "
                                   f"(last messages {self.log[-5:]})")
            self.pump(left)

    # -- protocol --------------------------------------------------------------

    def hello(self, min_version=VERSION, max_version=VERSION):
        """HELLO [min_version, max_version]: the daemon must pick the highest
        version both speak (1..MAX_VERSION). A daemon that refuses the
        connection sends a fatal ERROR and hangs up, maybe before the HELLO
        is sent (which then fails with EPIPE): the ERROR waits all the same
        and is what this raises (FpError)."""
        try:
            self.send(enc_hello(min_version, max_version, version=min_version))
        except BrokenPipeError:
            pass
        m = self.wait_reply({HELLO_OK})
        f = m.f
        if f["version"] != min(max_version, MAX_VERSION) or m.version != f["version"] or \
                f["max_msg_len"] != MAX_MSG or f["max_requests"] < 1 or \
                f["max_handles"] < 1 or f["session_id"] < 1:
            raise FpProtocolError(f"HELLO_OK {f}")
        self.version = f["version"]
        self.hello_ok = f
        return f

    @property
    def session_id(self):
        return self.hello_ok["session_id"]

    def open(self, spec):
        """OPEN spec; returns a Handle, raises FpError for its ERROR."""
        oid = self.next_open
        self.next_open += 1
        self.send(enc_open(oid, spec, version=self.version or VERSION))
        try:
            m = self.wait_reply({OPENED})
        except FpError as e:
            if not e.fatal and e.open_id != oid:
                raise FpProtocolError(f"OPEN {oid} answered by an ERROR for open_id {e.open_id}")
            raise
        if m.f["open_id"] != oid:
            raise FpProtocolError(f"OPENED {m.f} answers open_id {oid}")
        if m.f["handle"] in self.used_handles:
            for fd in m.fds:
                os.close(fd)
            raise FpProtocolError(f"handle {m.f['handle']} reused in the session")
        h = Handle(self, m)
        self.handles[h.handle] = h
        self.used_handles.add(h.handle)
        return h

    def submit(self, handle, entries):
        """Sends READs for entries [(tensor, off, len)] or [(tensor, off, len,
        flags)] (READ_SHARD_HEADER: tensor is a shard index); returns the
        Requests (not waited for). Splits into messages of at most MAX_READS."""
        hd = handle.handle if isinstance(handle, Handle) else handle
        reqs = []
        for e in entries:
            t, off, ln = e[:3]
            r = Request(self.next_req, hd, t, off, ln, e[3] if len(e) > 3 else 0)
            self.next_req += 1
            self.reqs[r.req_id] = r
            reqs.append(r)
        for i in range(0, len(reqs), MAX_READS):
            part = reqs[i:i + MAX_READS]
            self.send(enc_read(hd, [(r.req_id, r.tensor, r.off, r.len, r.flags) for r in part],
                               version=self.version or VERSION))
        return reqs

    def wait(self, reqs, timeout=None):
        """Pumps until every request is done; returns them."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not all(r.done for r in reqs):
            if self.fatal is not None:
                f = self.fatal.f
                raise FpError(f["code"], self.fatal.text.decode("utf-8", "replace"), True)
            left = deadline - time.monotonic()
            if left <= 0:
                n = sum(not r.done for r in reqs)
                raise TimeoutError(f"{n} of {len(reqs)} requests not done (holding "
                                   f"{len(self.held)} slots; last messages {self.log[-5:]})")
            self.pump(left)
        return reqs

    def read(self, handle, entries, window=None, timeout=None):
        """Reads entries [(tensor, off, len)] with at most `window` (default
        the daemon's max_requests) outstanding; returns the Requests in
        order. Raises FpError for the first failed one."""
        window = window or self.hello_ok["max_requests"]
        out, pending = [], list(entries)
        live = []
        while pending or live:
            n = min(len(pending), window - len(live))
            if n > 0:
                batch = self.submit(handle, pending[:n])
                pending = pending[n:]
                out.extend(batch)
                live.extend(batch)
            self.pump(timeout)
            live = [r for r in live if not r.done]
        for r in out:
            if r.result != 0:
                e = r.error
                text = e.text.decode("utf-8", "replace") if e is not None else ""
                raise FpError(r.result, text, False, r.req_id)
        return out

    def read_tensors(self, handle, names=None, timeout=None):
        """{name: bytes} of whole tensors (every tensor when names is None)."""
        ts = handle.tensors if names is None else [handle.snap.by_name[n] for n in names]
        reqs = self.read(handle, [(t["index"], 0, t["nbytes"]) for t in ts], timeout=timeout)
        return {t["name"]: bytes(r.buf) for t, r in zip(ts, reqs)}

    def read_headers(self, handle, shards=None, timeout=None):
        """{shard index: bytes} of whole shard headers (the file's first 8 +
        header_len bytes; every shard when shards is None), with the READ
        flag READ_SHARD_HEADER: a version-2 session only."""
        h = handle if isinstance(handle, Handle) else self.handles[handle]
        ss = h.snap.shards if shards is None else [h.snap.shards[i] for i in shards]
        reqs = self.read(h, [(s["index"], 0, s["data_off"], READ_SHARD_HEADER) for s in ss],
                         timeout=timeout)
        return {s["index"]: bytes(r.buf) for s, r in zip(ss, reqs)}

    def close_handle(self, handle, timeout=None):
        """CLOSE; returns the DONE results of the requests it cancelled
        ({req_id: result}). Held references of that handle are dropped by
        the daemon (forgotten here)."""
        hd = handle.handle if isinstance(handle, Handle) else handle
        outstanding = [r for r in self.reqs.values() if r.handle == hd and not r.done]
        self.send(enc_close(hd, version=self.version or VERSION))
        m = self.wait_reply({CLOSED}, timeout)
        if m.f["handle"] != hd:
            raise FpProtocolError(f"CLOSED {m.f} answers CLOSE {hd}")
        for r in outstanding:
            if not r.done:
                raise FpProtocolError(f"CLOSED before the DONE of request {r.req_id}")
        self.held = [x for x in self.held if x[0] != hd]
        self.vheld = [x for x in self.vheld if x[0] != hd]
        h = self.handles.pop(hd, None)
        if h is not None:
            h.unmap()
        return {r.req_id: r.result for r in outstanding}

    def close(self):
        for h in self.handles.values():
            h.unmap()
        self.handles = {}
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_model(path, spec, names=None, timeout=60.0):
    """Connects, opens spec and reads every tensor (or names); returns
    (generation, {name: bytes}, {name: (dtype, shape)})."""
    with Session(path, timeout=timeout) as s:
        h = s.open(spec)
        data = s.read_tensors(h, names)
        meta = {t["name"]: (t["dtype"], t["shape"]) for t in h.tensors}
        gen = h.generation
        s.close_handle(h)
    return gen, data, meta
