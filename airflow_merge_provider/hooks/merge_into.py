"""spark-submit for the merge job: the apache-spark provider's hook, keeping the lines it would only log."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from airflow_merge_provider.errors import MergeArgumentError
from spark_jobs.delta_merge.contract import (
    METRICS_PREFIX,
    PROGRESS_PREFIX,
    JobFailure,
    parse_failure_line,
    parse_metrics_line,
)

__all__ = [
    "DELTA_PACKAGE",
    "JobFailure",
    "MergeSubmitHook",
    "SubmitOutputLevels",
    "job_arguments",
    "kubernetes_provider_installed",
    "with_delta",
]

_DEFAULT_BINARY = "spark-submit"
# Above this, the spec goes in a file rather than on the command line (argv limits, log noise).
_SPEC_ARG_LIMIT = 64 * 1024

# A record of Spark's log4j (the default pattern "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex", or Spark 4's
# structured JSON logging); the lines that follow one without a header of their own are its stack trace.
_LOG4J_RECORD = re.compile(
    r'^(?:\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} |\{"ts":"[^"]*","level":")'
    r"(?P<level>TRACE|DEBUG|INFO|WARN|ERROR|FATAL)\b"
)
# What the JVM and spark-submit print before log4j is set up, and the job's own setLogLevel notice.
_SPARK_BANNERS = ("WARNING: Using incubator modules:", "Using Spark's default log4j profile:",
                  'Setting Spark log level to "', "Setting default log level to ")  # fmt: skip
_JAVA_UNCAUGHT = re.compile(r'^Exception in thread "[^"]*" ')
_PYTHON_TRACEBACK = "Traceback (most recent call last):"
# warnings.showwarning's "<file>:<line>: <Category>: <message>".
_PYTHON_WARNING = re.compile(r"^\S.*:\d+: (?:[A-Z]\w*)?Warning: ")


# Delta Lake for the delta engine: the version the provider is tested against (delta-spark 4.4 for Spark 4.2).
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# The connection extra's value that says the cluster's Spark loads Delta itself (jars, extension, catalog).
DELTA_ON_THE_CLUSTER = "cluster"


def with_delta(conf: Mapping[str, str], delta_package: object) -> tuple[dict[str, str], str | None]:
    """spark-submit's confs and ``--packages`` for an application that runs Delta's own MERGE.

    ``delta_package`` (the Spark connection's extra): unset, Delta's Maven coordinate
    :data:`DELTA_PACKAGE`; another coordinate, that one (a mirror's, another Delta version); ``"cluster"``,
    nothing added: the cluster's spark-defaults load Delta. Delta's SQL extension joins any the conf already
    names, and its catalog is the default unless the conf names another.

    :raises MergeArgumentError: the extra is neither ``"cluster"`` nor a ``group:artifact:version``.
    """
    if delta_package == DELTA_ON_THE_CLUSTER:
        return dict(conf), None
    package = DELTA_PACKAGE if delta_package in (None, "") else delta_package
    if not isinstance(package, str) or len(package.split(":")) != 3:
        raise MergeArgumentError(
            f"The Spark connection's extra delta_package must be Delta's Maven coordinate (such as "
            f"{DELTA_PACKAGE!r}) or {DELTA_ON_THE_CLUSTER!r} (the cluster loads Delta itself), found "
            f"{package!r}"
        )
    merged = dict(conf)
    extensions = [name.strip() for name in merged.get("spark.sql.extensions", "").split(",") if name.strip()]
    if DELTA_EXTENSION not in extensions:
        merged["spark.sql.extensions"] = ",".join([*extensions, DELTA_EXTENSION])
    merged.setdefault("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    return merged, package


class MergeSubmitHook(SparkSubmitHook):
    """:class:`SparkSubmitHook` that keeps the merge job's ``MERGE_METRICS_JSON=`` line and failure line.

    Takes the parent's arguments. In client deploy mode the driver's stdout comes through spark-submit,
    so :attr:`metrics` holds the merge's metrics after :meth:`submit`; in cluster mode it stays None and
    the caller reads them from the merge's commit in the Delta log.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.metrics: dict[str, Any] | None = None
        self.failure: JobFailure | None = None
        binary = self._connection["spark_binary"]
        beside_python = Path(sys.executable).with_name(_DEFAULT_BINARY)
        if binary == _DEFAULT_BINARY and shutil.which(binary) is None and beside_python.is_file():
            # pip's pyspark installs spark-submit next to the interpreter, which a worker started by its
            # full path may not have on PATH.
            self._connection["spark_binary"] = str(beside_python)

    @classmethod
    def for_merge(
        cls,
        *,
        conn_id: str,
        name: str,
        spark_conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        detached: bool = False,
        delta: bool = False,
        **kwargs: Any,
    ) -> MergeSubmitHook:
        """A hook for the merge job on the Spark connection ``conn_id``, with the job's ``--py-files``.

        On a ``local`` master, spark-submit's ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` default to
        this interpreter, which has the job's dependencies. ``detached``: in cluster deploy mode,
        spark-submit returns once the application is accepted. ``delta``: the application loads Delta Lake
        (the ``delta`` engine): :func:`with_delta`, by the connection's ``delta_package`` extra.

        :raises MergeArgumentError: the connection is not defined (the parent hook would silently fall
            back to master ``yarn``).
        """
        try:
            connection = cls.get_connection(conn_id)
        except AirflowNotFoundException as error:
            raise MergeArgumentError(
                f"Spark connection {conn_id!r} is not defined (the Spark hook would silently use master "
                '\'yarn\'). Define it, e.g. AIRFLOW_CONN_SPARK_LOCAL=\'{"conn_type": "spark", "host": '
                '"local[*]"}\', and pass its id.'
            ) from error
        _check_kubernetes_support(conn_id, str(connection.conn_type or ""), str(connection.host or ""))
        conf = {key: str(value) for key, value in (spark_conf or {}).items()}
        if detached:
            conf.setdefault("spark.yarn.submit.waitAppCompletion", "false")
            conf.setdefault("spark.kubernetes.submission.waitAppCompletion", "false")
        if delta:
            conf, kwargs["packages"] = with_delta(conf, connection.extra_dejson.get("delta_package"))
        env = dict(env_vars or {})
        if str(connection.host or "").startswith("local"):
            for variable in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
                if variable not in env and variable not in os.environ:
                    env[variable] = sys.executable
        from airflow_merge_provider.job_package import job_py_files

        return cls(
            conn_id=conn_id, name=name, conf=conf, env_vars=env or None, py_files=job_py_files(), **kwargs
        )

    @property
    def master(self) -> str:
        """The Spark master the connection resolved to (``yarn`` when the connection is missing)."""
        return str(self._connection["master"])

    @property
    def deploy_mode(self) -> str:
        """``client`` (also when unset: spark-submit's default) or ``cluster``."""
        return str(self._connection["deploy_mode"] or "client")

    def submit_job(self, application: str, application_args: list[str]) -> None:
        """Run spark-submit for ``application`` with ``application_args`` and wait for it.

        The task log gets the job's stage lines at INFO and its failure line at ERROR; the command line
        (which holds the spec) and Spark's own log records go to DEBUG (:class:`SubmitOutputLevels`).

        :raises AirflowException: spark-submit exited non-zero: the message is the job's failure when the
            job reported it (also in :attr:`failure`); else the last lines of spark-submit's output, which
            in client mode were logged at WARNING as the output ended.
        """
        self._application_args = application_args
        self.log.info(
            "Running the merge job with spark-submit (master %s, %s deploy mode; the command line is "
            "logged at DEBUG)", self.master, self.deploy_mode,
        )  # fmt: skip
        try:
            self.submit(application=application)
        except OSError as error:  # spark-submit itself could not be started
            raise self._not_runnable(error) from error
        except AirflowException as error:
            exit_code = self._exit_code()
            if exit_code is None:
                raise  # the parent's other failures (no driver id, ...) say what they are
            # The parent's message starts with the whole command line, spec included, which belongs at
            # DEBUG; what it adds to the exit code is in the output, so the chain stops here.
            self.log.debug("%s", error)
            raise self._exit_error(exit_code) from None

    def _exit_code(self) -> int | None:
        """spark-submit's exit code, or the driver's in Kubernetes cluster mode; None when both are 0."""
        process = getattr(self, "_submit_sp", None)
        code = None if process is None else process.returncode
        if code:
            return int(code)
        spark_code = getattr(self, "_spark_exit_code", None)
        return int(spark_code) if self._is_kubernetes and spark_code else None

    def _exit_error(self, exit_code: int) -> AirflowException:
        # Not a MergeProviderError: the caller still has to look for the merge's commit (a driver may die
        # after committing) before it classifies the failure.
        if self.failure is not None:
            return AirflowException(
                f"spark-submit exited with code {exit_code}: the merge job failed with "
                f"{self.failure.kind}: {self.failure.message}"
            )
        # In client mode the output's last lines were logged as it ended (_process_spark_submit_log).
        tail = self._submit_log_tail if self.deploy_mode == "cluster" else " Its last lines are logged above."
        return AirflowException(
            f"spark-submit exited with code {exit_code} before the merge job reported a failure (Spark could "
            f"not start, or the driver died).{tail}"
        )

    def _not_runnable(self, error: OSError) -> MergeArgumentError:
        binary = self._connection["spark_binary"]
        return MergeArgumentError(
            f"Cannot run {binary!r}: {error}. Put spark-submit on PATH, or give its path as spark_binary."
        )

    def _build_spark_submit_command(self, application: str) -> list[str]:
        # The parent logs the command at INFO; it holds the whole spec (--spec-json).
        with self._parent_logs_at(lambda _event, _args: logging.DEBUG):
            return super()._build_spark_submit_command(application)

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        # The parent parses each line (YARN application id, Kubernetes driver pod and exit code, standalone
        # driver id) and logs it at INFO: each line goes out at its own level instead.
        levels = SubmitOutputLevels()
        line = ""

        def watched() -> Iterator[Any]:
            nonlocal line
            for raw in itr:
                line = str(raw).strip()  # as the parent strips it
                self._keep(line)
                yield raw

        def level(event: str, args: tuple[Any, ...]) -> int | None:
            return levels(event) if not args and event == line else None

        with self._parent_logs_at(level):
            super()._process_spark_submit_log(watched())
        if self.failure is None and self.metrics is None and self.deploy_mode == "client":
            # A client-mode driver ends with one of the two lines unless it died: what it printed last
            # (Spark's lines were logged at DEBUG) is all there is to say why. The parent's tail starts at an
            # uncaught JVM exception when there is one.
            self.log.warning(
                "spark-submit's output ended without the merge job's metrics or failure line.%s",
                self._submit_log_tail,
            )

    def _keep(self, line: str) -> None:
        """Keep the job's metrics or failure from a line of its output."""
        # A JVM log line may share the pipe (stdout and stderr are merged): the parsers search the line.
        try:
            metrics = parse_metrics_line(line)
        except ValueError:
            self.log.warning("Ignoring a metrics line that is not valid JSON: %.200s", line)
            metrics = None
        if metrics is not None:
            self.metrics = metrics
        elif (failure := parse_failure_line(line)) is not None:
            self.failure = failure

    @contextmanager
    def _parent_logs_at(self, level: Callable[[str, tuple[Any, ...]], int | None]) -> Iterator[None]:
        """While inside, the hook's ``log.info(event, *args)`` calls go out at ``level(event, args)`` (None:
        INFO); its other calls are unchanged."""
        log = self.log
        self._log = cast("Any", _ReleveledLog(log, level))
        try:
            yield
        finally:
            self._log = log

    def submit_detached(self, application: str, application_args: list[str], *, log_path: str) -> int:
        """Start spark-submit in its own session, writing its output to ``log_path``; return its pid.

        The process outlives the task (fire and forget): wait for its commit with MergeCommitSensor.
        """
        self._application_args = application_args
        command = self._build_spark_submit_command(application)
        env = {**os.environ, **self._env} if self._env else None
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as error:
                raise self._not_runnable(error) from error
        return process.pid


class SubmitOutputLevels:
    """The task-log level of each line of spark-submit's output, called once per line in order.

    The job's failure line is logged at ERROR, its stage lines (``[delta-merge] ...``) and its metrics line
    at INFO. Spark's log records and the JVM's and spark-submit's banners go to DEBUG, but for the first
    line of an ERROR or FATAL record (or of an uncaught Java exception), at WARNING; the stack trace after
    it (lines without a header of their own) goes to DEBUG. Python warnings are logged at WARNING, a Python
    traceback at INFO, and a line without a header at the level of the line it continues (INFO at first).
    """

    def __init__(self) -> None:
        self._following = logging.INFO  # the level of a line that continues the previous one

    def __call__(self, line: str) -> int:
        level, self._following = self._classify(line)
        return level

    def _classify(self, line: str) -> tuple[int, int]:
        if parse_failure_line(line) is not None:
            return logging.ERROR, logging.ERROR
        if METRICS_PREFIX in line:
            return logging.INFO, self._following
        if line.startswith(PROGRESS_PREFIX):
            return logging.INFO, logging.INFO
        if (record := _LOG4J_RECORD.match(line)) is not None:
            serious = record["level"] in ("ERROR", "FATAL")
            return (logging.WARNING if serious else logging.DEBUG), logging.DEBUG
        if _JAVA_UNCAUGHT.match(line):
            return logging.WARNING, logging.DEBUG
        if line.startswith(_SPARK_BANNERS):
            return logging.DEBUG, logging.DEBUG
        if _PYTHON_WARNING.match(line):
            return logging.WARNING, logging.WARNING
        if line.startswith(_PYTHON_TRACEBACK):
            return logging.INFO, logging.INFO
        return self._following, self._following


class _ReleveledLog:
    """A stand-in for a hook's logger that sends some of its ``info`` calls out at another level."""

    def __init__(self, log: Any, level: Callable[[str, tuple[Any, ...]], int | None]) -> None:
        self._target = log
        self._level = level

    def info(self, event: str, *args: Any) -> None:
        level = self._level(event, args)
        if level is None:
            self._target.info(event, *args)
        else:
            self._target.log(level, event, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def kubernetes_provider_installed() -> bool:
    """Whether the cncf.kubernetes provider is installed: the Spark hook needs it for ``k8s://`` masters."""
    import importlib.util

    return importlib.util.find_spec("airflow.providers.cncf.kubernetes") is not None


def _check_kubernetes_support(conn_id: str, conn_type: str, host: str) -> None:
    # Without the provider the parent hook fails with a bare NameError on kube_client.
    kubernetes = conn_type == "k8s" or host.startswith("k8s://")
    if kubernetes and not kubernetes_provider_installed():
        raise MergeArgumentError(
            f"Spark connection {conn_id!r} has a Kubernetes master ({host}), which needs the cncf.kubernetes "
            "provider on the Airflow worker: pip install 'airflow-merge-provider[kubernetes]'."
        )


@contextmanager
def job_arguments(spec_json: str, *, in_file: bool = False) -> Iterator[list[str]]:
    """The job's arguments for a spec: ``--spec-json <json>``, or ``--spec <file>`` when ``in_file`` or
    when the spec is too large for a command line. The file (mode 0600) is removed on exit, so use it
    only where the driver runs on this machine (client deploy mode)."""
    if not in_file and len(spec_json) <= _SPEC_ARG_LIMIT:
        yield ["--spec-json", spec_json]
        return
    handle, path = tempfile.mkstemp(prefix="merge-spec-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(spec_json)
        yield ["--spec", path]
    finally:
        Path(path).unlink(missing_ok=True)
