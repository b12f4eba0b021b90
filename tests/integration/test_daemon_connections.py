"""Every co-located client comes from 127.0.0.1: the default per-IP limit
admits well over 64 concurrent keep-alive connections, and connections
opened right after many were closed are answered, not reset (the limit was
64 and a closed connection counts until libmicrohttpd cleans it up, so a
client following a 64-connection burst was reset)."""
import http.client

import pytest

from harness.daemon import Daemon


@pytest.fixture(scope="module")
def d(build_dir, tmp_path_factory):
    dm = Daemon(build_dir, tmp_path_factory.mktemp("daemon_conns")).start()
    yield dm
    assert dm.stop() == 0, dm.log_text()


def burst(port, n):
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(n)]
    for c in conns:
        c.connect()  # all open at once before any request
    statuses = []
    for c in conns:
        c.request("GET", "/healthz")
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
    for c in conns:
        c.close()
    return statuses


def test_many_loopback_connections(d):
    assert burst(d.port, 150) == [200] * 150
    for _ in range(3):  # right after a burst closed, a new one
        assert burst(d.port, 100) == [200] * 100
    assert "connection limit" not in d.log_text()
