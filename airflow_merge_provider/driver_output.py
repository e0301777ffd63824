"""What the merge driver's output says: its metrics or failure line, and where its Spark application is.

One reader for the driver's output, whether it arrives through spark-submit's pipe (a waiting task) or
from the log file of a driver started detached (a deferred, durable or fire-and-forget task). The metrics
and failure lines are the job's contract (``spark_jobs.delta_merge.contract``); the application lines
are Spark's own INFO log lines, so they are missing when the driver logs at WARN or above: the links
built from them are then left out, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.delta_merge.contract import (
    JobFailure,
    parse_application_line,
    parse_failure_line,
    parse_metrics_line,
)  # fmt: skip

__all__ = ["DriverOutput", "SparkApplication"]

# Spark 4 logs, in client mode: "Utils: Successfully started service 'SparkUI' on port 4040." and
# "NettyBlockTransferService: Server created on <driver host>:<port>"; older releases "Bound SparkUI to
# 0.0.0.0, and started at http://<host>:4040". Application ids: standalone "Connected to Spark cluster
# with app ID app-...", YARN "Submitted application application_..."; local masters log none.
_UI_PORT = re.compile(r"Successfully started service 'SparkUI' on port (\d+)")
_UI_URL = re.compile(r"Bound SparkUI to \S+, and started at (https?://\S+)")
_DRIVER_HOST = re.compile(r"NettyBlockTransferService: Server created on (\S+):\d+")
_APP_ID_SHAPES = (re.compile(r"app-\d+-\d+"), re.compile(r"application_\d+_\d+"))
_APP_IDS = (
    re.compile(r"Connected to Spark cluster with app ID (app-\d+-\d+)"),
    re.compile(r"\b(application_\d+_\d+)\b"),
)


@dataclass
class SparkApplication:
    """Where the driver's Spark application is, as far as its log said.

    :param app_id: Spark's application id (``app-...`` on a standalone master, ``application_...`` on
        YARN); None on a local master, which logs none.
    :param ui_port: the port of the driver's own web UI (:attr:`ui_url`, live only while the driver runs).
    :param ui_url_logged: the UI's address where Spark logs it whole (releases before 4).
    :param driver_host: the address the driver advertises (its block manager's).
    """

    app_id: str | None = None
    ui_port: int | None = None
    ui_url_logged: str | None = None
    driver_host: str | None = None

    @property
    def ui_url(self) -> str | None:
        """The driver's web UI, from its logged URL or from its port and the driver's host."""
        if self.ui_url_logged is not None:
            return self.ui_url_logged.rstrip("/.")
        if self.ui_port is None or self.driver_host is None:
            return None
        return f"http://{self.driver_host}:{self.ui_port}"

    def feed(self, line: str) -> bool:
        """Take what ``line`` says; return True when it told something new."""
        before = (self.app_id, self.ui_port, self.ui_url_logged, self.driver_host)
        if self.app_id is None:
            for pattern in _APP_IDS:
                if match := pattern.search(line):
                    self.app_id = match[1]
                    break
        if self.ui_port is None and (match := _UI_PORT.search(line)):
            self.ui_port = int(match[1])
        if self.ui_url_logged is None and (match := _UI_URL.search(line)):
            self.ui_url_logged = match[1]
        # The job's own line (Spark's lines above are below its log level): the UI's address, and the
        # application id where it is a cluster's (a local master's "local-..." names no page elsewhere).
        if (application := parse_application_line(line)) is not None:
            app_id, ui_url = application
            if self.ui_url_logged is None and ui_url is not None:
                self.ui_url_logged = ui_url
            if self.app_id is None and any(pattern.fullmatch(app_id) for pattern in _APP_ID_SHAPES):
                self.app_id = app_id
        if self.driver_host is None and (match := _DRIVER_HOST.search(line)):
            self.driver_host = match[1]
        return (self.app_id, self.ui_port, self.ui_url_logged, self.driver_host) != before


@dataclass
class DriverOutput:
    """The driver's output read so far: its metrics line, its failure line, and its application.

    :param metrics: the job's ``MERGE_METRICS_JSON=`` line, parsed (the last one seen).
    :param failure: the job's ``MERGE failed: <Type>: <message>`` line.
    """

    metrics: dict[str, Any] | None = None
    failure: JobFailure | None = None
    application: SparkApplication = field(default_factory=SparkApplication)
    _offset: int = 0
    _pending: str = ""

    def feed(self, line: str) -> None:
        """Take one line of the driver's output (a JVM log line may share it: the parsers search it)."""
        try:
            metrics = parse_metrics_line(line)
        except ValueError:
            metrics = None  # the prefix without a JSON object: not the job's line
        if metrics is not None:
            self.metrics = metrics
        elif (failure := parse_failure_line(line)) is not None:
            self.failure = failure
        self.application.feed(line)

    def read(self, path: str) -> bool:
        """Read what ``path`` gained since the last call; False when the file is not there (another host's
        driver, or a temp dir cleaned up). A last line without its newline waits for the next call."""
        try:
            with Path(path).open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return False
        self._offset += len(data)
        text = self._pending + data.decode("utf-8", errors="replace")
        *lines, self._pending = text.split("\n")
        for line in lines:
            self.feed(line)
        return True

    def finish(self) -> None:
        """Take the last line even without its newline (the driver has exited)."""
        if self._pending:
            self.feed(self._pending)
            self._pending = ""
