"""Bounded polling: a test waits for a condition, never for a fixed time."""
import time


def wait_for(fn, timeout=30, what="condition", interval=0.1):
    """fn() until it is truthy (returned), polling every interval seconds;
    fails (AssertionError) after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
