"""One-time preparation of a test run, started by ``scripts/test`` while ruff, mypy and MkDocs run.

``python -m tests.support.prepare`` makes what the first tests would otherwise make while the suite runs:
the JVMs' class archive (:mod:`tests.support.jvm`, ~40 s) and the Azurite install
(:mod:`tests.support.azurite_server`, npm). Both at once, each in its own thread (each is a child
process: a JVM, npm). Made here, every test JVM maps the archive from the first test on, and no test
waits for either. Both are also made on demand by the tests, under the same locks, so a run without this
step (``python -m pytest`` directly, or this step failing) is slower, not different: a failure here exits
non-zero with the reason, and ``scripts/test`` goes on with a warning.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tests.support import jvm
from tests.support.azurite_server import install_azurite


def _archive() -> str:
    archive = jvm.class_archive(wait=True)
    if archive is None:
        raise RuntimeError(f"no JVM class archive: {(jvm.failure() or 'unknown reason')[-2000:]}")
    return f"the JVM class archive: {archive}"


def _azurite() -> str:
    return f"Azurite: {install_azurite()}"


def main() -> int:
    """Both steps at once; 0 when both made what they make, 1 (with each failure's reason) otherwise."""
    steps: list[Callable[[], str]] = [_archive, _azurite]
    started = time.monotonic()
    failed = 0
    with ThreadPoolExecutor(max_workers=len(steps)) as pool:
        for future in [pool.submit(step) for step in steps]:
            try:
                made = future.result()
            except Exception as error:  # reported; the tests make it again on demand
                failed += 1
                print(f"prepare: {type(error).__name__}: {error}", file=sys.stderr)
            else:
                print(f"prepare: {made} ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    # Its own process group: scripts/test stops it with its JVM and npm, whatever happens to the script.
    if os.getpgrp() != os.getpid():
        os.setsid()
    sys.exit(main())
