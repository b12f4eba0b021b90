#!/usr/bin/env python3
"""The Debian package installed as on a host, without touching the host:
tests/integration/test_install.py runs this program as root in private
mount and network namespaces (`unshare --mount --net --propagation
private`: the daemon's 127.0.0.1:8470 is its own), where

  /usr      is an overlay: the package's usr/ (dpkg -x) over the host's
            (read-only), so /usr/bin/tensorvaultd, /usr/lib/libtensorvault.so.1,
            the headers, the .pc file and the unit are at their installed paths;
  /etc      an overlay: the package's etc/ over the host's, writes (useradd,
            ldconfig, the operator's configuration change) going to a
            temporary upper layer;
  /var/lib  an overlay of the host's with a temporary upper layer (the
            postinst's /var/lib/tensorvault, the store);
  /run      a fresh tmpfs (no systemd there, so the maintainer scripts leave
            systemctl alone; the unit's RuntimeDirectory is made as systemd
            makes it);
  /srv      a fresh tmpfs holding /srv/models, the operator's import root
            (the test's checkpoint bound there);
  /var/log  a fresh tmpfs (useradd's lastlog and faillog).

Every mount, user and file made here goes away with the namespace. This
program runs the package's postinst, starts tensorvaultd the way its unit
says (User, Group, SupplementaryGroups, UMask, WorkingDirectory,
StateDirectory, RuntimeDirectory, ExecStart; not the sandboxing options,
which only systemd applies), imports a checkpoint with the admin token over
/run/tensorvault/http.sock, reads it as a worker (another user, in a fresh
virtual environment holding only the wheel and its dependencies, from /tmp,
no TENSORVAULT_* variable) and through a C program built with pkg-config,
stops the daemon and records what it saw in a JSON document (the test
asserts on it).

Usage: installed.py CONFIG_JSON OUT_JSON (CONFIG: root, control, work,
venv, checkpoint, worker_code, c_source)."""
import http.client
import json
import grp
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback

UNIT = "/usr/lib/systemd/system/tensorvaultd.service"
HTTP_SOCK = "/run/tensorvault/http.sock"
FAST_SOCK = "/run/tensorvault/tensorvault.sock"


def run(*cmd, check=True, **kw):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def unit_service(path):
    """The [Service] keys of a unit file: {key: [values]} (a key given
    twice keeps both; comments and continuation-free lines only)."""
    out, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            if section == "Service" and "=" in line:
                k, v = line.split("=", 1)
                out.setdefault(k.strip(), []).append(v.strip())
    return out


def mount_all(root, work):
    run("ip", "link", "set", "lo", "up")  # a network namespace of its own: 127.0.0.1:8470 is free
    def d(name):
        p = os.path.join(work, name)
        os.makedirs(p, exist_ok=True)
        return p
    run("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={root}/usr:/usr", "/usr")
    run("mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={root}/etc:/etc,upperdir={d('etc.up')},workdir={d('etc.wk')}", "/etc")
    run("mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir=/var/lib,upperdir={d('varlib.up')},workdir={d('varlib.wk')}", "/var/lib")
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/srv")
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/var/log")  # useradd's lastlog


def request(method, path, body=None, token=None, sock=HTTP_SOCK):
    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(30)
            self.sock.connect(sock)
    c = Conn("localhost", timeout=30)
    h = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    try:
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def file_facts(path):
    st = os.stat(path)
    return {"mode": oct(stat.S_IMODE(st.st_mode)), "user": pwd.getpwuid(st.st_uid).pw_name,
            "group": grp.getgrgid(st.st_gid).gr_name, "socket": stat.S_ISSOCK(st.st_mode)}


def start_daemon(work, facts):
    """tensorvaultd as the unit starts it. Returns the Popen."""
    svc = unit_service(UNIT)
    one = {k: v[-1] for k, v in svc.items()}
    facts["unit"] = one
    user, group = one["User"], one["Group"]
    uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    for key, base in (("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")):
        p = os.path.join(base, one[key])
        os.makedirs(p, exist_ok=True)
        os.chown(p, uid, gid)
        os.chmod(p, int(one.get(key + "Mode", "0755"), 8))
    supp = " ".join(svc.get("SupplementaryGroups", [])).split()
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
           "--groups=" + ",".join(str(grp.getgrnam(g).gr_gid) for g in supp) if supp
           else "--clear-groups", "--no-new-privs", "--"] + one["ExecStart"].split()
    umask = int(one.get("UMask", "0022"), 8)
    log = open(os.path.join(work, "tensorvaultd.log"), "w")
    return subprocess.Popen(cmd, cwd=one["WorkingDirectory"], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: os.umask(umask), env={"PATH": "/usr/bin:/bin"})


def wait_serving(d, work, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if d.poll() is not None:
            break
        if os.path.exists(FAST_SOCK):
            try:
                if request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
        time.sleep(0.05)
    with open(os.path.join(work, "tensorvaultd.log")) as f:
        raise RuntimeError(f"tensorvaultd did not serve on {HTTP_SOCK} (exit {d.poll()}):\n{f.read()}")


def as_user(user, group, *cmd, cwd="/tmp", env=None):
    """cmd as user (primary group group, its supplementary groups), no
    TENSORVAULT_* variable."""
    e = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    e.update(env or {})
    return run("setpriv", f"--reuid={user}", f"--regid={group}", "--init-groups", "--", *cmd,
               check=False, cwd=cwd, env=e)


def scenario(cfg, facts):
    root, work, venv = cfg["root"], cfg["work"], cfg["venv"]
    mount_all(root, work)
    facts["postinst"] = run(os.path.join(cfg["control"], "postinst"), "configure", check=False,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}).returncode
    run("ldconfig")  # the package's ldconfig trigger
    # The unit as systemd reads it, and its exposure (sandboxing) score.
    v = run("systemd-analyze", "verify", UNIT, check=False)
    facts["verify"] = {"rc": v.returncode, "out": v.stdout + v.stderr}
    a = run("systemd-analyze", "security", "--offline=true", UNIT, check=False)
    facts["exposure"] = a.stdout.strip().splitlines()[-1:] if a.returncode == 0 else a.stderr
    facts["user"] = pwd.getpwnam("tensorvault").pw_shell
    facts["state_dir"] = file_facts("/var/lib/tensorvault")
    facts["import_dir"] = file_facts("/var/lib/tensorvault/import")
    # An operator (group tensorvault) and a worker (group tvml), and the
    # operator's configuration: models under /srv/models, read by tvml.
    run("groupadd", "tvml")
    run("useradd", "-M", "-N", "-g", "tvml", "tvworker")
    run("useradd", "-M", "-N", "-g", "tensorvault", "tvop")
    with open("/etc/tensorvault/tensorvaultd.ini", "a") as f:
        f.write("\n[import]\nroots = /srv/models\n[access]\ndefault = group:tvml token:*\n")
    # The checkpoint, bound (not copied: the importer records a file's
    # stamps, which the file lookups match, only when its ctime is 2 s older
    # than the import, and the test wrote it well before).
    models = "/srv/models/ckpt"
    os.makedirs(models)
    run("mount", "--bind", cfg["checkpoint"], models)

    d = start_daemon(work, facts)
    try:
        wait_serving(d, work)
        sd = "/var/lib/tensorvault"
        facts["files"] = {p: file_facts(p) for p in (
            f"{sd}/admin.token", f"{sd}/store", "/run/tensorvault", FAST_SOCK, HTTP_SOCK)}
        facts["daemon_user"] = pwd.getpwuid(os.stat(f"/proc/{d.pid}").st_uid).pw_name
        token = open(f"{sd}/admin.token").read().strip()
        facts["operator_token"] = as_user("tvop", "tensorvault", "cat",
                                          f"{sd}/admin.token").stdout.strip() == token
        facts["worker_token"] = as_user("tvworker", "tvml", "cat", f"{sd}/admin.token").returncode
        st, body = request("POST", "/v1/imports", {"model": "m1", "source": models, "activate": True},
                        token=token)
        assert st == 202, (st, body)
        job = json.loads(body)["id"]
        deadline = time.monotonic() + 60
        while True:
            j = json.loads(request("GET", f"/v1/jobs/{job}", token=token)[1])
            if j["state"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        facts["import"] = j["state"]
        py = os.path.join(venv, "bin", "python")
        w = as_user("tvworker", "tvml", py, "-c", cfg["worker_code"], models)
        facts["worker"] = {"rc": w.returncode, "out": w.stdout, "err": w.stderr[-4000:]}
        n = as_user("nobody", "nogroup", py, "-c", cfg["denied_code"])
        facts["nobody"] = {"rc": n.returncode, "out": n.stdout, "err": n.stderr[-2000:]}
        # The C library as installed: pkg-config, the headers, the SONAME.
        exe = os.path.join(work, "client")
        flags = run("pkg-config", "--cflags", "--libs", "tensorvault").stdout.split()
        facts["cc"] = run("cc", "-std=c11", "-o", exe, cfg["c_source"], *flags, check=False).stderr
        facts["ldd"] = run("ldd", exe, check=False).stdout
        c = as_user("tvworker", "tvml", exe, "m1")
        facts["c_client"] = {"rc": c.returncode, "out": c.stdout, "err": c.stderr}
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            facts["daemon_exit"] = d.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.kill()
            facts["daemon_exit"] = "killed after 30 s"
        with open(os.path.join(work, "tensorvaultd.log")) as f:
            facts["log"] = f.read()[-4000:]
    shutil.rmtree("/run/tensorvault")  # systemd removes the RuntimeDirectory at stop
    g = as_user("tvworker", "tvml", os.path.join(venv, "bin", "python"), "-c", cfg["denied_code"])
    facts["stopped"] = {"rc": g.returncode, "out": g.stdout, "err": g.stderr[-2000:]}


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    facts = {}
    try:
        scenario(cfg, facts)
    except Exception:
        facts["error"] = traceback.format_exc()
    with open(sys.argv[2], "w") as f:
        json.dump(facts, f, indent=1)
    sys.exit(1 if "error" in facts else 0)


if __name__ == "__main__":
    main()
