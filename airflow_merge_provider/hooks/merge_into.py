"""spark-submit for the merge job: the apache-spark provider's hook, keeping the lines it would only log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_merge_provider.errors import MergeArgumentError
from spark_jobs.delta_merge.contract import JobFailure, parse_failure_line, parse_metrics_line

__all__ = ["JobFailure", "MergeSubmitHook", "job_arguments", "kubernetes_provider_installed"]

_DEFAULT_BINARY = "spark-submit"
# Above this, the spec goes in a file rather than on the command line (argv limits, log noise).
_SPEC_ARG_LIMIT = 64 * 1024


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
        **kwargs: Any,
    ) -> MergeSubmitHook:
        """A hook for the merge job on the Spark connection ``conn_id``, with the job's ``--py-files``.

        On a ``local`` master, spark-submit's ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` default to
        this interpreter, which has the job's dependencies. ``detached``: in cluster deploy mode,
        spark-submit returns once the application is accepted.

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

        :raises AirflowException: spark-submit exited non-zero (:attr:`failure` says why, when the job
            reported it).
        """
        self._application_args = application_args
        try:
            self.submit(application=application)
        except OSError as error:  # spark-submit itself could not be started
            raise self._not_runnable(error) from error

    def _not_runnable(self, error: OSError) -> MergeArgumentError:
        binary = self._connection["spark_binary"]
        return MergeArgumentError(
            f"Cannot run {binary!r}: {error}. Put spark-submit on PATH, or give its path as spark_binary."
        )

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self._watch(itr))

    def _watch(self, itr: Iterator[Any]) -> Iterator[Any]:
        for raw in itr:
            line = str(raw).strip()
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
            yield raw

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
