"""The merge on a Spark Connect server: a session of its own per run, the job's code as session artifacts.

The connection is the apache-spark provider's ``spark_connect`` type (host, port, login = user id,
password = the server's authentication token, extras ``use_ssl`` and ``max_retries``: how often an unanswered
call is retried, about 14 s for the default 6). The merge's driver logic (reading the
Delta log, planning, committing) runs in the task's own process; Spark work runs on the server, whose Python
workers get the packaged job (``spark_jobs.zip``) as an artifact of this session only: a shared server
needs nothing of this provider installed, and two provider versions on one server never run each other's
code. The server's Python needs the job's third-party libraries (pyarrow, deltalake, obstore, pyroaring).

The token travels in the gRPC channel's credentials, never in a URL this module logs or puts in a message.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

from airflow_merge_provider.errors import MergeProviderError

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

__all__ = ["CONNECT_CONN_TYPE", "MergeConnectHook", "is_connect_connection", "server_unreachable"]

CONNECT_CONN_TYPE = SparkConnectHook.conn_type
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
# Retries of a call the server did not answer: 50 ms growing fourfold up to 5 s, about 14 s for six.
_RETRIES_EXTRA = "max_retries"
_DEFAULT_PORT = 15002
_DEFAULT_RETRIES = 6
_MAX_BACKOFF_MS = 5000
# gRPC status codes of a server that is gone or restarting (not of a query the server refused).
_CHANNEL_DOWN = ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "UNKNOWN")


def is_connect_connection(conn_id: str) -> bool:
    """Whether the Airflow connection ``conn_id`` is a Spark Connect one (``spark_connect`` type); False
    for a missing one, which the spark-submit path then names as missing."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return SparkConnectHook.get_connection(conn_id).conn_type == CONNECT_CONN_TYPE
    except AirflowNotFoundException:
        return False


class MergeConnectHook(SparkConnectHook):
    """Sessions on the Spark Connect server of connection ``conn_id`` for merges."""

    def __init__(self, conn_id: str = SparkConnectHook.default_conn_name) -> None:
        super().__init__(conn_id=conn_id)
        self.conn_id = conn_id
        self._session: SparkSession | None = None

    @property
    def server(self) -> str:
        """The server's address as ``sc://host:port`` (no user, no token): what messages name."""
        conn = self.get_connection(self.conn_id)
        host = str(conn.host or "localhost").removeprefix("sc://").rstrip("/")
        return f"sc://{host}:{conn.port}" if conn.port else f"sc://{host}"

    @contextmanager
    def session(self) -> Iterator[SparkSession]:
        """A new Spark Connect session with the job's code added, stopped (released) on exit.

        A new session each time: one whose server restarted is never reused.
        """
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession

        from airflow_merge_provider.job_package import job_py_files

        conn = self.get_connection(self.conn_id)
        params = []
        if conn.login:
            params.append(f"{self.PARAM_USER_ID}={conn.login}")
        use_ssl = conn.extra_dejson.get(self.PARAM_USE_SSL)
        if use_ssl is not None:
            params.append(f"{self.PARAM_USE_SSL}={str(use_ssl).lower()}")
        channel = DefaultChannelBuilder(self.server + "/" + (";" + ";".join(params) if params else ""))
        if conn.password:
            channel.set(self.PARAM_TOKEN, conn.password)
        # pyspark's functions build Spark Connect columns only while this is set (what builder.remote() sets).
        previous_mode = os.environ.get(_CONNECT_MODE)
        os.environ[_CONNECT_MODE] = "1"
        try:
            spark = SparkSession.builder.channelBuilder(channel).create()
            # pyspark retries an unanswered call for 10 minutes by default; a task gives up sooner (and is
            # retried by Airflow, which the idempotency key makes safe).
            retries = int(conn.extra_dejson.get(_RETRIES_EXTRA, _DEFAULT_RETRIES))
            spark.client.set_retry_policies([DefaultPolicy(max_retries=retries, max_backoff=_MAX_BACKOFF_MS)])
            spark.addArtifacts(job_py_files(), pyfile=True)
        except Exception as error:
            _restore(previous_mode)
            raise self.unreachable(error, doing="opening a session") from None
        # pyspark binds what a Connect command returns (a checkpointed DataFrame: the materialized source)
        # to the thread's active session, which is the first one created unless set: make it this one.
        active = getattr(SparkSession._active_session, "session", None)
        SparkSession._active_session.session = spark
        self._session = spark
        try:
            yield spark
        finally:
            self._session = None
            SparkSession._active_session.session = active
            _restore(previous_mode)
            try:
                spark.stop()
            except Exception as error:  # a server gone after the merge: nothing left to release
                self.log.info("Releasing the Spark Connect session failed: %s", _first_line(error))

    def listening(self) -> bool:
        """Whether anything accepts a TCP connection at the server's address now (a killed or restarting
        server does not; its clients' last errors vary with the call they were in)."""
        conn = self.get_connection(self.conn_id)
        host = str(conn.host or "localhost").removeprefix("sc://").split("/")[0].split(":")[0]
        try:
            with socket.create_connection((host, int(conn.port or _DEFAULT_PORT)), timeout=2):
                return True
        except OSError:
            return False

    def interrupt(self) -> None:
        """Interrupt every operation of the running merge's session (on_kill)."""
        if self._session is not None:
            self._session.interruptAll()

    def unreachable(self, error: BaseException, *, doing: str) -> MergeProviderError:
        """The error for a server that did not answer: names the server and the connection, not the token."""
        return MergeProviderError(
            f"The Spark Connect server {self.server} (connection {self.conn_id!r}) did not answer while "
            f"{doing}: {_first_line(error)}. Check that the server runs and that the connection's token "
            "(its password) is the server's."
        )


def server_unreachable(error: BaseException) -> bool:
    """Whether ``error`` (or an error it came from) says the Connect server is gone or unreachable."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = _grpc_code(current)
        if code in _CHANNEL_DOWN or type(current).__name__ == "RetriesExceeded":
            return True
        current = current.__cause__ or current.__context__
    return False


def _restore(previous_mode: str | None) -> None:
    if previous_mode is None:
        os.environ.pop(_CONNECT_MODE, None)
    else:
        os.environ[_CONNECT_MODE] = previous_mode


def _grpc_code(error: BaseException) -> str | None:
    code: Any = getattr(error, "code", None)
    if callable(code):
        try:
            code = code()
        except Exception:
            return None
    name = getattr(code, "name", None)
    return str(name) if name else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
