"""Run the merge job under real spark-submit, watch its output line by line, kill it at a chosen line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.jvm import FAST_START, fast_jvm_options

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
SPARK_SUBMIT = VENV_BIN / "spark-submit"
PYTHON = VENV_BIN / "python"
METRICS_PREFIX = "MERGE_METRICS_JSON="
PROGRESS_PREFIX = "[delta-merge] "
def fast_start_confs() -> dict[str, str]:
    """FAST_START and the driver JVM's options (tests/support/jvm.py), for a spark-submit command line."""
    return {**FAST_START, "spark.driver.extraJavaOptions": fast_jvm_options()}


def submit_env() -> dict[str, str]:
    # PYTHONPATH makes executors' Python workers import this tree's spark_jobs (the driver finds it itself).
    return {**os.environ, "PYSPARK_PYTHON": str(PYTHON), "PYSPARK_DRIVER_PYTHON": str(PYTHON),
            "PYTHONPATH": str(ROOT)}


class Submitted:
    """One spark-submit of the merge job in its own process group, its output collected as it comes.

    The Python driver's stderr (the ``[delta-merge]`` progress lines) arrives on spark-submit's stdout;
    the JVM's log goes to its stderr: both are merged into :attr:`lines`.
    """

    def __init__(
        self, spec: Mapping[str, Any], spec_file: Path, *, master: str = "local[1]",
        confs: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
    ) -> None:
        """:param env: variables added to spark-submit's environment (and so the driver's and, in local
        mode, the executors')."""
        assert SPARK_SUBMIT.is_file(), SPARK_SUBMIT
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        settings = {**fast_start_confs(), **(confs or {})}
        command = [str(SPARK_SUBMIT), "--master", master]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += ["spark_jobs/delta_merge/__main__.py", "--spec", str(spec_file)]
        self.lines: list[str] = []
        self.torn_line: str | None = None  # what a kill cut short, after the last whole line
        self.started = time.monotonic()
        self.arrived: list[float] = []  # seconds since start, per line (to see where time goes)
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            command, cwd=ROOT, env={**submit_env(), **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                if not line.endswith("\n"):  # killed mid-write: a torn line is not the job's output
                    self.torn_line = line
                    continue
                self.lines.append(line.rstrip("\n"))
                self.arrived.append(time.monotonic() - self.started)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, matches: Callable[[str], bool], *, timeout: float = 180) -> str | None:
        """The first line that ``matches``, as soon as it is printed; None if the job ends without it."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if matches(line):
                        return line
                seen = len(self.lines)
                if not self._reader.is_alive():
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no matching line within {timeout} s; last lines: {self.tail()}")
                self._changed.wait(min(remaining, 1.0))

    def kill(self) -> None:
        """SIGKILL the whole process group: spark-submit's JVM, the Python driver, Python workers."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self._reader.join(timeout=30)

    def wait(self, *, timeout: float = 300) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(timeout=30)
        return code

    def progress(self) -> list[str]:
        """The job's ``[delta-merge]`` lines, without the prefix."""
        return [line.split(PROGRESS_PREFIX, 1)[1] for line in self.lines if PROGRESS_PREFIX in line]

    def metrics(self) -> dict[str, Any] | None:
        found = [line for line in self.lines if line.startswith(METRICS_PREFIX)]
        assert len(found) <= 1, self.tail()
        return json.loads(found[0][len(METRICS_PREFIX):]) if found else None

    def failure(self) -> str | None:
        """The job's one-line cause (``MERGE failed: <Type>: ...``), if it failed on purpose."""
        found = [line for line in self.lines if line.startswith("MERGE failed: ")]
        return found[-1] if found else None

    def tail(self, count: int = 40) -> str:
        torn = [f"{self.torn_line} <torn by the kill>"] if self.torn_line is not None else []
        return "\n".join(self.lines[-count:] + torn)


def progress_line(text: str) -> Callable[[str], bool]:
    """Matches a ``[delta-merge]`` progress line containing ``text``."""
    return lambda line: PROGRESS_PREFIX in line and text in line.split(PROGRESS_PREFIX, 1)[1]


def kill_all(jobs: Sequence[Submitted]) -> None:
    for job in jobs:
        if job.process.poll() is None:
            job.kill()
