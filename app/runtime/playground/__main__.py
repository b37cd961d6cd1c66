"""`python -m app.runtime.playground`: the playground's model process (`process.py`), started by `PlaygroundClient`.
It answers JSON lines on stdin over the stdout it had; whatever the libraries print goes to stderr (the log)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from app.runtime.playground.client import IDLE_TIMEOUT, NICE, THREADS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.runtime.playground", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT)
    parser.add_argument("--nice", type=int, default=NICE)
    parser.add_argument("--threads", type=int, default=THREADS)
    options = parser.parse_args(argv)
    protocol = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if options.nice:
        os.nice(options.nice)
    # Imported once the priority is low: loading torch and the models' libraries takes seconds of CPU, which a
    # training run beside it keeps. What every request needs is imported before the first one arrives.
    from app.runtime.playground import process

    process.limit_threads(options.threads)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return process.serve(options.idle_timeout, sys.stdin.fileno(), protocol)


if __name__ == "__main__":
    sys.exit(main())
