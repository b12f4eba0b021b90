"""A PostgreSQL cluster of its own for the tests (the `postgres` fixture of
tests/conftest.py; the fleet benchmark): Debian's PostgreSQL
(/usr/lib/postgresql/*/bin), a fresh cluster in a temporary directory owned
by the `postgres` user (initdb refuses root), on 127.0.0.1:PORT
(scram-sha-256 passwords) and a UNIX socket in that directory (trust, for
the superuser). Database and role `tensorvault` with a password.
fresh_db() makes a new empty database of the application role."""
import glob
import os
import shutil
import subprocess
import time
import urllib.parse
import uuid

from harness.net import free_port
from harness.logs import tail


def fresh_db(postgres, prefix="tvdb_"):
    """A new empty database owned by the application role: (name, DSN)."""
    name = prefix + uuid.uuid4().hex[:10]
    postgres.psql(f"CREATE DATABASE {name} OWNER {postgres.user}")
    return name, postgres.dsn.rsplit("/", 1)[0] + "/" + name


def pg_bindir():
    """The newest /usr/lib/postgresql/N/bin with an initdb; None if none."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return d
    return None


def _pg_os_user():
    """The unprivileged user the server runs as when we are root."""
    import pwd
    for name in ("postgres", "tvfleet-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "tvfleet-pg"], check=True)
    return "tvfleet-pg"


class Postgres:
    """A PostgreSQL cluster of its own. dsn/host/port/sockdir/user/password/
    dbname; psql(sql) as the superuser over the socket (or as_app=True: as
    the `tensorvault` role over TCP with its password); stop()/start()/
    restart() keep the data directory and the port."""

    user = "tensorvault"
    password = "tv-fleet-pw"
    dbname = "tensorvault"

    def __init__(self, bindir, base):
        self.bindir = bindir
        self.base = base
        self.datadir = os.path.join(base, "data")
        self.sockdir = base
        self.logfile = os.path.join(base, "postgres.log")
        self.host = "127.0.0.1"
        self.port = free_port()
        self.running = False
        self.also = []  # addresses listened on besides host (listen_also)
        self._runas = []
        os.chmod(base, 0o755)  # the socket is reachable by any user
        if os.geteuid() == 0:
            osuser = _pg_os_user()
            shutil.chown(base, osuser, osuser)
            self._runas = ["runuser", "-u", osuser, "--"]

    @property
    def dsn(self):
        pw = urllib.parse.quote(self.password, safe="")
        return f"postgresql://{self.user}:{pw}@{self.host}:{self.port}/{self.dbname}"

    def dsn_on(self, host, dbname=None):
        """The DSN with another host (e.g. the fleet bridge's address)."""
        pw = urllib.parse.quote(self.password, safe="")
        return f"postgresql://{self.user}:{pw}@{host}:{self.port}/{dbname or self.dbname}"

    def listen_also(self, addr, cidr):
        """Listens on addr as well as 127.0.0.1 (scram-sha-256 for clients
        in cidr): appended to the configuration, then a restart (same port,
        same data). Once per address."""
        if addr in self.also:
            return
        self.also.append(addr)
        with open(os.path.join(self.datadir, "pg_hba.conf"), "a") as f:
            f.write(f"\n# tests/fleet: the fleet network\nhost all all {cidr} scram-sha-256\n")
        with open(os.path.join(self.datadir, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = '{','.join([self.host] + self.also)}'\n")
        if self.running:
            self.restart()

    def _bin(self, name):
        return os.path.join(self.bindir, name)

    def _run(self, argv, **kw):
        r = subprocess.run(self._runas + argv, capture_output=True, text=True, timeout=60, **kw)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}\n"
                               f"{tail(self.logfile, 30)}")
        return r.stdout

    def init(self):
        self._run([self._bin("initdb"), "-D", self.datadir, "-U", "postgres", "--auth-local=trust",
                   "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        conf = os.path.join(self.datadir, "postgresql.conf")
        with open(conf) as f:
            base_conf = f.read()
        for attempt in range(3):  # the free port may be taken before we bind it
            with open(conf, "w") as f:
                f.write(base_conf + "\n# tests/fleet\n"
                        f"port = {self.port}\n"
                        f"listen_addresses = '{self.host}'\n"
                        f"unix_socket_directories = '{self.sockdir}'\n"
                        "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                        "max_connections = 100\n")
            try:
                self.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = free_port()
        self.psql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'")
        self.psql(f"CREATE DATABASE {self.dbname} OWNER {self.user}")
        return self

    def start(self):
        self._run([self._bin("pg_ctl"), "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60",
                   "start"])
        deadline = time.monotonic() + 30
        while True:
            r = subprocess.run([self._bin("pg_isready"), "-h", self.host, "-p", str(self.port),
                                "-t", "1"], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL not ready on {self.host}:{self.port}: {r.stdout}")
            time.sleep(0.1)
        self.running = True

    def stop(self, mode="fast"):
        """mode: smart | fast | immediate (pg_ctl -m; immediate is a crash)."""
        self._run([self._bin("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", "60", "stop"])
        self.running = False

    def restart(self, mode="fast"):
        self.stop(mode)
        self.start()

    def psql(self, sql, as_app=False, dbname=None, check=True):
        """Runs sql (one or more statements) and returns psql's unaligned,
        tuples-only output (fields separated by '|')."""
        if as_app:
            argv = [self._bin("psql"), self.dsn if dbname is None else
                    self.dsn.rsplit("/", 1)[0] + "/" + dbname]
        else:
            argv = [self._bin("psql"), "-h", self.sockdir, "-p", str(self.port), "-U", "postgres",
                    "-d", dbname or "postgres"]
        r = subprocess.run(argv + ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PGCONNECT_TIMEOUT": "5"})
        if check and r.returncode != 0:
            raise RuntimeError(f"psql exited {r.returncode}: {r.stderr.strip()}")
        return r.stdout if check else r

    def close(self):
        if self.running:
            try:
                self.stop("fast")
            except Exception:  # noqa: BLE001 - fall back to a crash stop
                subprocess.run(self._runas + [self._bin("pg_ctl"), "-D", self.datadir, "-m",
                                              "immediate", "stop"], capture_output=True)
            self.running = False
