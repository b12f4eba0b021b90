"""Helpers shared by the benchmark drivers (bench/*_bench.py)."""
import fcntl


class Lock:
    """flock(LOCK_EX) on path for the with-block: every measurement holds the
    lock that the other benchmarks on this machine hold too (TV_BENCH_LOCK)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
