"""spark-submit of the merge job, detached or attached, with the driver's Spark application reported.

:class:`MergeDriverHook` adds to :class:`MergeSubmitHook` what a durable or deferred merge needs: start
spark-submit in its own session with its output in a log file (so it outlives the task), follow that file
into the task log as if attached, and stop the whole process group on kill. Every line, from the pipe or
the file, goes through the same parsing (the parent's metrics and failure lines, and
:class:`~airflow_merge_provider.driver_output.SparkApplication`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from airflow_merge_provider.driver_output import SparkApplication
from airflow_merge_provider.driver_process import DriverRef, driver_state, remove_spec_file, stop_driver
from airflow_merge_provider.hooks.merge_into import MergeSubmitHook

__all__ = ["MergeDriverHook", "new_driver_log"]

_FOLLOW_INTERVAL = 0.5  # seconds between two reads of a followed driver log


def new_driver_log(app_id: str, app_version: int) -> tuple[int, Path]:
    """A new, private log file (an open descriptor and its path) for one launch of a merge's driver, under
    ``<tempdir>/airflow-merge-provider/detached/``: tries never share (nor misread) a file."""
    directory = Path(tempfile.gettempdir(), "airflow-merge-provider", "detached")
    directory.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", app_id)[:150]
    handle, path = tempfile.mkstemp(prefix=f"{name}.v{app_version}.{time.strftime('%Y%m%dT%H%M%S')}.",
                                    suffix=".log", dir=directory)  # fmt: skip
    return handle, Path(path)


class MergeDriverHook(MergeSubmitHook):
    """:class:`MergeSubmitHook` that can start the driver detached and follow it.

    :attr:`application` holds what the driver's log said of its Spark application so far; ``on_application``
    (set by the caller) is called each time it learns something new.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.application = SparkApplication()
        self.on_application: Callable[[SparkApplication], None] | None = None
        self.driver: DriverRef | None = None
        self._driver_process: subprocess.Popen[bytes] | None = None

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self._watch_application(itr))

    def _watch_application(self, itr: Iterator[Any]) -> Iterator[Any]:
        for raw in itr:
            if self.application.feed(str(raw)) and self.on_application is not None:
                self.on_application(self.application)
            yield raw

    def start_driver(
        self, application: str, *, spec_json: str, app_id: str, app_version: int, spec_in_file: bool
    ) -> DriverRef:
        """Start spark-submit in its own session, its output going to a new log file; return its ref.

        ``spec_in_file``: pass the spec in a private file (mode 0600; client deploy mode only, where the
        driver runs here) rather than on the command line; :meth:`follow` removes it once the driver has
        exited, and so does a retry that finds it exited.
        """
        spec_file = None
        if spec_in_file:
            handle, spec_file = tempfile.mkstemp(prefix="merge-spec-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(spec_json)
            self._application_args = ["--spec", spec_file]
        else:
            self._application_args = ["--spec-json", spec_json]
        command = self._build_spark_submit_command(application)
        env = {**os.environ, **self._env} if self._env else None
        handle, log_path = new_driver_log(app_id, app_version)
        try:
            with os.fdopen(handle, "wb") as log_file:
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, close_fds=True,
                )  # fmt: skip
        except OSError as error:
            if spec_file is not None:
                Path(spec_file).unlink(missing_ok=True)
            raise self._not_runnable(error) from error
        self._driver_process = process
        self._submit_sp = process  # the parent's on_kill stops it too
        self.driver = DriverRef.of_process(process.pid, app_id=app_id, app_version=app_version,
                                           driver_log=str(log_path), spec_file=spec_file)  # fmt: skip
        return self.driver

    def follow(self, driver: DriverRef) -> int | None:
        """Relay the driver's log into the task log, parsing it as spark-submit's pipe is parsed, until the
        driver has exited, then remove it; return the driver's exit code when this process started it (None
        after a reconnect).

        A log file that is gone (a cleaned temp dir) is waited on by the process alone.
        """
        self.driver = driver
        process = self._driver_process if self._driver_process is not None else None
        if process is not None and process.pid != driver.pid:
            process = None
        try:
            self._process_spark_submit_log(self._tail(driver, process))
            exit_code = None if process is None else process.wait()
            # Every line is in the task log now: the file would only pile up in the temp dir.
            Path(driver.driver_log).unlink(missing_ok=True)
            return exit_code
        finally:
            if _exited(driver, process):
                remove_spec_file(driver)

    def replay(self, driver: DriverRef) -> bool:
        """Log and parse an ended driver's log file as if it had come through spark-submit's pipe (a
        deferred task's driver), then remove it; False when the file is not on this host."""
        if driver_state(driver) == "elsewhere":
            return False
        try:
            file = open(driver.driver_log, encoding="utf-8", errors="replace")  # noqa: SIM115
        except FileNotFoundError:
            return False
        with file:
            self._process_spark_submit_log(line.rstrip("\n") for line in file)
        # In the task log now, up to the job's last line (a driver may still be shutting Spark down).
        Path(driver.driver_log).unlink(missing_ok=True)
        return True

    def _tail(self, driver: DriverRef, process: subprocess.Popen[bytes] | None) -> Iterator[str]:
        try:
            file = open(driver.driver_log, encoding="utf-8", errors="replace")  # noqa: SIM115
        except FileNotFoundError:
            self.log.warning("The driver log %s is gone: waiting for pid %d alone", driver.driver_log,
                             driver.pid)  # fmt: skip
            while not _exited(driver, process):
                time.sleep(_FOLLOW_INTERVAL)
            return
        with file:
            pending = ""
            while True:
                # Whether it had exited is asked before reading: the read after it sees every last line.
                done = _exited(driver, process)
                chunk = file.read()
                if chunk:
                    *lines, pending = (pending + chunk).split("\n")
                    yield from lines
                elif done:
                    if pending:
                        yield pending
                    return
                else:
                    time.sleep(_FOLLOW_INTERVAL)

    def on_kill(self) -> None:
        """Stop the detached driver's whole process group (spark-submit and its Python driver), then what
        the parent hook stops (spark-submit, a YARN or Kubernetes application)."""
        if self.driver is not None:
            stop_driver(self.driver)
        super().on_kill()


def _exited(driver: DriverRef, process: subprocess.Popen[bytes] | None) -> bool:
    if process is not None:
        return process.poll() is not None
    return driver_state(driver) != "running"
