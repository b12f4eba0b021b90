"""The installable software, as an operator and a worker get it.

scripts/package builds the Debian package (CPack over a build of its own,
build-pkg/: prefix /usr, CUDA off) and the wheel (pip wheel ./python, then auditwheel: the shared
libraries libtensorvault links go inside). The package is installed in a
private mount namespace (tests/harness/installed.py: overlays of /usr,
/etc and /var/lib with the package's files and temporary upper layers, a
fresh /run): there it sits at its real paths (/usr/bin/tensorvaultd,
/etc/tensorvault/tensorvaultd.ini, /var/lib/tensorvault, /run/tensorvault)
and its postinst really runs (the system user, the directories), while the
host's files, user database and systemd stay untouched, which neither
`dpkg -i` (the host's own /usr and /etc) nor `dpkg --root` (a whole root
filesystem for the maintainer scripts and the daemon's libraries) would
give. tensorvaultd starts as its unit says; the wheel goes into a fresh
virtual environment with only its dependencies (numpy, ml_dtypes: no
safetensors, no source tree), and a worker of another user reads a model
through the installed daemon from /tmp with no TENSORVAULT_* variable, by
name and by file path, byte for byte as the official loader reads the
checkpoint; a C program built with pkg-config against the installed headers
and libtensorvault.so.1 opens it too.

Needs root (mount namespaces, overlays, other users); runs once, beside
the plain build's tests (scripts/test: PLAIN_TESTS)."""
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import harness
from harness.checkpoints import DTYPES, random_tensors, write_checkpoint
from harness.daemon import Daemon
from harness.store import reference_tensors

# Reads the model by name and each of its files by path; run as the worker.
WORKER = r"""
import hashlib, importlib.util, json, os, sys
import tensorvault
from tensorvault import _native
src = sys.argv[1]
def dump(f):
    out = {}
    for k in f.offset_keys():
        a = f.get_tensor(k)
        out[k] = [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
    return out
doc = {"module": tensorvault.__file__, "lib": _native.lib._name, "cwd": os.getcwd(),
       "safetensors": importlib.util.find_spec("safetensors") is not None,
       "env": sorted(k for k in os.environ if k.startswith("TENSORVAULT"))}
with tensorvault.safe_open("m1", framework="np") as f:
    doc["model"] = dump(f)
doc["files"] = {}
for n in sorted(os.listdir(src)):
    if n.endswith(".safetensors"):
        with tensorvault.safe_open(os.path.join(src, n), "np") as f:
            doc["files"][n] = dump(f)
with open("/proc/self/maps") as m:
    doc["libs"] = sorted({ln.split()[-1] for ln in m if ".so" in ln.split()[-1]})
print(json.dumps(doc))
"""

# Opens the model and says what happened (an error's name and message).
DENIED = r"""
import tensorvault
try:
    tensorvault.safe_open("m1", framework="np")
    print("OPENED")
except tensorvault.Error as e:
    print(e.name)
    print(e.message)
"""

C_CLIENT = r"""
#include <stdio.h>
#include <string.h>

#include <tensorvault/client.h>
#include <tensorvault/tensorvault.h>

int main(int argc, char **argv)
{
    tv_error err = {0};
    tv_client *c = NULL;
    tv_model *m = NULL;
    if (argc != 2 || strcmp(tv_version(), TV_VERSION_STRING) != 0) {
        fprintf(stderr, "library %s, header %s\n", tv_version(), TV_VERSION_STRING);
        return 1;
    }
    int rc = tv_client_connect("/run/tensorvault/tensorvault.sock", NULL, &c, &err);
    if (rc == 0)
        rc = tv_model_open_daemon(c, argv[1], NULL, &m, &err);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("%s %zu\n", tv_version(), tv_model_n_tensors(m));
    tv_model_close(m);
    tv_client_close(c);
    return 0;
}
"""


def _run(cmd, timeout=300, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}: exit {p.returncode}\n{p.stdout}{p.stderr}"
    return p.stdout


def _ref_digest(ref):
    return {k: [str(DTYPES[dt]), shape, hashlib.sha256(data).hexdigest()]
            for k, (dt, shape, data) in ref.items()}


def _dependency_wheels():
    """A directory holding the wheel's dependencies (numpy, ml_dtypes at
    requirements/run.txt's versions), downloaded once with pip into
    $TV_WHEEL_CACHE (default /tmp/tv-cache/wheels); pytest.skip with pip's
    reason when that cannot be done (no network)."""
    cache = os.environ.get("TV_WHEEL_CACHE", "/tmp/tv-cache/wheels")
    os.makedirs(cache, exist_ok=True)
    have = {n.split("-")[0].lower() for n in os.listdir(cache) if n.endswith(".whl")}
    if not {"numpy", "ml_dtypes"} <= have:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                            "-c", os.path.join(harness.ROOT, "requirements", "run.txt"), "-d",
                            cache, "numpy", "ml_dtypes"], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            pytest.skip(f"cannot download numpy and ml_dtypes: {p.stderr.strip()[-300:]}")
    return cache


@pytest.fixture
def scratch():
    """A directory other users may traverse (the worker runs the virtual
    environment and the C client from it), removed afterwards."""
    d = tempfile.mkdtemp(prefix="tv-install-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", d], check=False)


def test_package_and_wheel_installed(scratch):
    bd = harness.build_dir()
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace with overlays, and other users")
    if "asan" in os.path.basename(os.path.normpath(bd)):
        pytest.skip("the package has a build of its own (build-pkg/): scripts/test runs this "
                    "test once, with the plain build's tests")
    for tool in ("unshare", "setpriv", "dpkg-deb", "cpack", "pkg-config", "cc", "ip",
                 "systemd-analyze"):
        assert shutil.which(tool), f"{tool} is missing (scripts/deps installs it)"
    root = harness.ROOT
    out = os.path.join(scratch, "dist")
    # The two packages, and the worker's environment, at once.
    deb_p = subprocess.Popen([os.path.join(root, "scripts", "package"), "deb", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    whl_p = subprocess.Popen([os.path.join(root, "scripts", "package"), "wheel", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    venv = os.path.join(scratch, "venv")
    # The system's python (Debian's python3-venv, scripts/deps): other users
    # can run it, as a worker image's would be.
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    _run([base, "-m", "venv", "--without-pip", venv])
    ckpt = os.path.join(scratch, "ckpt")
    write_checkpoint(ckpt, random_tensors(np.random.default_rng(7), 30, 1 << 20), 2)
    for n in os.listdir(ckpt):  # readable by the daemon's user and the worker, whatever the umask
        os.chmod(os.path.join(ckpt, n), 0o644)
    os.chmod(ckpt, 0o755)
    deb_out, deb_err = deb_p.communicate(timeout=300)
    whl_out, whl_err = whl_p.communicate(timeout=300)
    assert deb_p.returncode == 0, deb_err
    assert whl_p.returncode == 0, whl_err
    deb, whl = deb_out.strip(), whl_out.strip()
    assert os.path.basename(deb).startswith("tensorvault_") and deb.endswith(".deb"), deb
    assert "manylinux" in os.path.basename(whl), whl

    # The package's control data and files.
    control = _run(["dpkg-deb", "-f", deb])
    assert "Package: tensorvault" in control and "Depends:" in control, control
    for dep in ("libjansson", "libmicrohttpd", "libsqlite3", "passwd"):
        assert dep in control, (dep, control)
    files = _run(["dpkg-deb", "-c", deb])
    for path in ("./usr/bin/tensorvaultd", "./usr/bin/tensorvault", "/libtensorvault.so.1",
                 "./usr/include/tensorvault/tensorvault.h", "pkgconfig/tensorvault.pc",
                 "./usr/lib/systemd/system/tensorvaultd.service",
                 "./etc/tensorvault/tensorvaultd.ini"):
        assert path in files, (path, files)
    rootdir, ctrl = os.path.join(scratch, "root"), os.path.join(scratch, "control")
    _run(["dpkg-deb", "-x", deb, rootdir])
    _run(["dpkg-deb", "-e", deb, ctrl])
    with open(os.path.join(ctrl, "conffiles")) as f:
        assert f.read().split() == ["/etc/tensorvault/tensorvaultd.ini"]
    lib = [os.path.join(dp, n) for dp, _, ns in os.walk(os.path.join(rootdir, "usr", "lib"))
           for n in ns if n.startswith("libtensorvault.so.0.")]
    assert len(lib) == 1, lib
    assert re.search(r"SONAME\s+libtensorvault\.so\.1\n", _run(["objdump", "-p", lib[0]]))
    with open(os.path.join(rootdir, "usr/lib/systemd/system/tensorvaultd.service")) as f:
        unit = f.read()
    assert ("ExecStart=/usr/bin/tensorvaultd --config /etc/tensorvault/tensorvaultd.ini\n"
            in unit), unit
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                 "ReadWritePaths=/var/lib/tensorvault", "RuntimeDirectory=tensorvault",
                 "SupplementaryGroups=disk", "DevicePolicy=closed", "User=tensorvault"):
        assert line + "\n" in unit, line

    # The wheel: the library and what it links, inside.
    names = _run([sys.executable, "-c", "import sys, zipfile; "
                  "print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))", whl]).split()
    assert "tensorvault/libtensorvault.so" in names, names
    assert any(n.startswith("tensorvault.libs/libjansson") for n in names), names
    _run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install",
          "-q", "--disable-pip-version-check", "--no-index", "--find-links", _dependency_wheels(),
          whl])

    with open(os.path.join(scratch, "client.c"), "w") as f:
        f.write(C_CLIENT)
    cfg = {"root": rootdir, "control": ctrl, "work": os.path.join(scratch, "work"), "venv": venv,
           "checkpoint": ckpt, "worker_code": WORKER, "denied_code": DENIED,
           "c_source": os.path.join(scratch, "client.c")}
    os.makedirs(cfg["work"])
    os.chmod(cfg["work"], 0o755)
    with open(os.path.join(scratch, "config.json"), "w") as f:
        json.dump(cfg, f)
    facts_path = os.path.join(scratch, "facts.json")
    p = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", sys.executable,
                        os.path.join(harness.TESTS, "harness", "installed.py"),
                        os.path.join(scratch, "config.json"), facts_path],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "unshare failed" in p.stderr:
        pytest.skip(f"no mount namespace here: {p.stderr.strip()}")
    assert os.path.exists(facts_path), p.stdout + p.stderr
    with open(facts_path) as f:
        facts = json.load(f)
    if p.returncode != 0 or "error" in facts:
        pytest.fail(f"{facts.get('error', '')}\n--- tensorvaultd ---\n{facts.get('log', '')}\n"
                    f"{p.stderr}", pytrace=False)

    # The maintainer script and the layout it made; the unit as systemd
    # reads it, and how exposed it leaves the daemon (systemd-analyze
    # security: 0 is fully sandboxed, 10 not at all; this unit 1.9).
    assert facts["postinst"] == 0
    assert facts["verify"]["rc"] == 0 and facts["verify"]["out"] == "", facts["verify"]
    m = re.search(r"Overall exposure level for tensorvaultd.service: ([0-9.]+)",
                  " ".join(facts["exposure"]))
    assert m and float(m.group(1)) <= 2.0, facts["exposure"]
    assert facts["user"] == "/usr/sbin/nologin"
    assert facts["state_dir"] == {"mode": "0o750", "user": "tensorvault", "group": "tensorvault",
                                  "socket": False}
    assert facts["import_dir"]["mode"] == "0o2775"
    # The daemon as the unit runs it: its user, its files and sockets.
    assert facts["daemon_user"] == "tensorvault"
    fs = facts["files"]
    assert fs["/var/lib/tensorvault/admin.token"] == {
        "mode": "0o640", "user": "tensorvault", "group": "tensorvault", "socket": False}, fs
    assert fs["/var/lib/tensorvault/store"]["mode"] == "0o700", fs
    assert fs["/run/tensorvault"]["mode"] == "0o755", fs
    for s in ("/run/tensorvault/tensorvault.sock", "/run/tensorvault/http.sock"):
        assert fs[s]["socket"] and fs[s]["mode"] == "0o666", fs
    assert facts["operator_token"] is True  # the group tensorvault reads the admin token
    assert facts["worker_token"] != 0  # others do not
    assert facts["import"] == "succeeded", facts["log"]

    # The worker: the wheel's package and libraries, the installed daemon.
    w = facts["worker"]
    assert w["rc"] == 0, w["err"] + facts["log"]
    doc = json.loads(w["out"])
    assert doc["module"].startswith(venv + "/"), doc["module"]
    assert doc["lib"].startswith(venv + "/"), doc["lib"]
    assert any("tensorvault.libs/libjansson" in p for p in doc["libs"]), doc["libs"]
    assert doc["safetensors"] is False and doc["env"] == [] and doc["cwd"] == "/tmp"
    ref = reference_tensors(ckpt)
    assert doc["model"] == _ref_digest(ref)
    shards = sorted(n for n in os.listdir(ckpt) if n.endswith(".safetensors"))
    assert sorted(doc["files"]) == shards
    for n in shards:
        assert doc["files"][n] == _ref_digest(reference_tensors(os.path.join(ckpt, n))), n
    # [access]: a user no rule names is refused at connect.
    assert facts["nobody"]["out"].split("\n")[0] == "TV_E_PEER_DENIED", facts["nobody"]
    # The C library: pkg-config, headers, libtensorvault.so.1 from /usr/lib.
    assert facts["cc"] == "", facts["cc"]
    assert re.search(r"libtensorvault\.so\.1 => (/usr)?/lib/x86_64-linux-gnu/libtensorvault",
                     facts["ldd"]), facts["ldd"]
    c = facts["c_client"]
    version = re.search(r"project\(tensorvault VERSION ([0-9.]+)", open(
        os.path.join(root, "CMakeLists.txt")).read()).group(1)
    assert c["rc"] == 0 and c["out"].split() == [version, str(len(ref))], c
    # SIGTERM: exit 0; then no daemon, and the error says where it looked.
    assert facts["daemon_exit"] == 0, facts["log"]
    lines = facts["stopped"]["out"].split("\n")
    assert lines[0] == "TV_E_NO_DAEMON", facts["stopped"]
    assert "/run/tensorvault/tensorvault.sock (absent)" in lines[1], lines
    assert "/tmp/var/run/tensorvault.sock (absent)" in lines[1], lines
    assert "set TENSORVAULT_SOCKET" in lines[1], lines


def test_admin_token_file_and_mode(build_dir, tmp_path):
    """store.admin_token puts the token outside the store directory (the
    installed layout), store.admin_token_mode is its mode whatever the
    umask (the unit's 0077), reapplied at each start to the daemon's own
    file; the token itself is never rewritten."""
    tok = tmp_path / "state" / "admin.token"
    tok.parent.mkdir()
    d = Daemon(build_dir, tmp_path, settings={"store.dir": str(tmp_path / "state" / "store"),
                                              "store.admin_token": str(tok),
                                              "store.admin_token_mode": "0640"})
    old = os.umask(0o077)
    try:
        d.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(tok.stat().st_mode) == 0o640
        assert not (tmp_path / "state" / "store" / "admin.token").exists()
        secret = tok.read_text()
        d._token = secret.strip()
        assert d.get("/v1/tokens").status == 200  # the file's token is an admin token
        assert f"admin token in {tok}" in d.log_text()
        d.stop()
        tok.chmod(0o600)
        d.start()
        assert stat.S_IMODE(tok.stat().st_mode) == 0o640 and tok.read_text() == secret
        d.stop()
        d.settings["store.admin_token_mode"] = "0644"
        d.spawn()
        assert d.proc.wait(timeout=30) == 2
        assert "store.admin_token_mode 0644" in d.log_text()
        d.settings["store.admin_token_mode"] = "0600"
        d.start()
        assert stat.S_IMODE(tok.stat().st_mode) == 0o600 and tok.read_text() == secret
    finally:
        d.stop()
