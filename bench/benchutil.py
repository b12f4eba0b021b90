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


def interleaved(fns, repeat, log=None):
    """Runs every measurement of fns ({key: callable returning a row with
    "gb_per_s"}) repeat times, round by round, each round starting one key
    later (no measurement always runs first, right after another's cache
    drop); returns {key: [row per round]}. log (optional) gets one line per
    round."""
    runs = {k: [] for k in fns}
    keys = list(fns)
    for i in range(repeat):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            runs[k].append(fns[k]())
        if log:
            log(f"  round {i + 1} (GB/s): " + ", ".join(f"{k} {runs[k][-1]['gb_per_s']:.2f}"
                                                for k in fns))
    return runs
