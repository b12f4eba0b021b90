"""Where tensorvaultd is, in the tensorvault CLI's order: the socket=
argument, then $TENSORVAULT_SOCKET, then the installed default
/run/tensorvault/tensorvault.sock (the Debian package's configuration,
deploy/tensorvaultd.ini) when it exists, then ./var/run/tensorvault.sock
(the embedded default of a daemon started in the current directory, as
scripts/run does). The HTTP API the file lookups ask (_files.py): http=,
then $TENSORVAULT_URL (the CLI's: http://HOST:PORT, unix:PATH or a socket
path), then $TENSORVAULT_HTTP (the same forms), then http.sock beside the
fast-path socket found (both defaults put it there).

Invariant: a daemon that cannot be reached at a socket found here is a
TV_E_NO_DAEMON error whose message names every place looked (and what was
there) and the variable to set."""
import os
import stat

ENV_SOCKET = "TENSORVAULT_SOCKET"
ENV_URL = "TENSORVAULT_URL"
ENV_HTTP = "TENSORVAULT_HTTP"
INSTALLED_SOCKET = "/run/tensorvault/tensorvault.sock"
LOCAL_SOCKET = "./var/run/tensorvault.sock"


class Where:
    """A fast-path socket path and how it was found: "socket=",
    "$TENSORVAULT_SOCKET", "installed" or "local"."""

    __slots__ = ("path", "how")

    def __init__(self, path, how):
        self.path, self.how = path, how

    def __repr__(self):
        return f"Where({self.path!r}, {self.how!r})"


def fast_socket(socket=None):
    """The Where of the daemon's fast-path socket."""
    if socket is not None:
        return Where(os.fspath(socket), "socket=")
    env = os.environ.get(ENV_SOCKET)
    if env:
        return Where(env, "$" + ENV_SOCKET)
    if os.path.exists(INSTALLED_SOCKET):
        return Where(INSTALLED_SOCKET, "installed")
    return Where(LOCAL_SOCKET, "local")


def http_endpoint(http=None, socket=None):
    """The daemon's HTTP API: a UNIX socket path, or http://HOST:PORT."""
    if http:
        return _endpoint(str(http))
    for name in (ENV_URL, ENV_HTTP):
        env = os.environ.get(name)
        if env:
            return _endpoint(env)
    fast = fast_socket(socket).path
    return os.path.join(os.path.dirname(fast) or ".", "http.sock")


def _endpoint(v):
    """An http:// URL as it is; unix:PATH as PATH; a path as it is."""
    return v[len("unix:"):] if v.startswith("unix:") else v


def _state(path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "absent"
    except OSError as e:
        return e.strerror or str(e)
    return "a socket" if stat.S_ISSOCK(st.st_mode) else "not a socket"


def no_daemon_message(where, detail):
    """The message of TV_E_NO_DAEMON for a connection to where that failed
    (detail: the library's message)."""
    if where.how in ("socket=", "$" + ENV_SOCKET):
        return (f"{detail}; the socket was named by {where.how} (unset it to look in the "
                f"default places: {INSTALLED_SOCKET}, then {LOCAL_SOCKET})")
    local = os.path.abspath(LOCAL_SOCKET)
    return (f"{detail}; looked at ${ENV_SOCKET} (unset), {INSTALLED_SOCKET} "
            f"({_state(INSTALLED_SOCKET)}), {local} ({_state(local)}): start tensorvaultd, or "
            f"set {ENV_SOCKET} (or pass socket=) to its fast-path socket (fastpath.socket)")
