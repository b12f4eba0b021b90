"""Server logs attached to a failing test's report: a fixture that starts a
server registers its log with attach(name, path) (detach when it stops);
tests/conftest.py's report hook appends the tail of every registered log
to the report of a test that failed meanwhile."""
LOGS = {}  # name -> path of a server log


def attach(name, path):
    LOGS[name] = path


def detach(name):
    LOGS.pop(name, None)


def tail(path, n=60):
    """The last n lines of the file at path (or why there are none)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"
