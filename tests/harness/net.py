"""Ports for the servers the tests start."""
import socket


def free_port(host="127.0.0.1"):
    """A TCP port free on host right now (a server that binds it later may
    lose a race: the fixtures retry with another)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
