"""The merge on a Spark Connect server: sessions leased from a warm pool, the job's code as their artifact.

The connection is the apache-spark provider's ``spark_connect`` type (host, port, login = user id,
password = the server's authentication token; extras ``use_ssl``, ``max_retries``: how often an unanswered
call is retried, about 14 s for the default 6, and ``session_pool_size``: the warm sessions kept, default 4).
The merge's driver logic (reading the Delta log, planning, committing) runs in the task's own process; Spark
work runs on the server, whose Python workers get the packaged job (``spark_jobs.zip``) as an artifact of
the session: a shared server needs nothing of this provider installed, and two provider versions on one
server never run each other's code (their sessions are apart). The server's Python needs the job's
third-party libraries (pyarrow, deltalake, obstore, pyroaring, numpy).

A session's Python workers start on its first query (over a second); a session kept on the server between
merges keeps them. The pool of such sessions, one merge at a time each, is written by hand (a lock file per
slot): pyspark and the provider's hook open one session per client and have no pool.

The token travels in the gRPC channel's credentials, never in a URL this module logs or puts in a message.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

from airflow_merge_provider.errors import MergeProviderError

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

__all__ = ["CONNECT_CONN_TYPE", "MergeConnectHook", "is_connect_connection", "server_unreachable"]

CONNECT_CONN_TYPE = SparkConnectHook.conn_type
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
# Retries of a call the server did not answer: 50 ms growing fourfold up to 5 s, about 14 s for six.
_RETRIES_EXTRA = "max_retries"
# Warm sessions kept per server, user, Airflow host and job build (extra session_pool_size).
_POOL_EXTRA = "session_pool_size"
_DEFAULT_POOL_SIZE = 4
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# The server closed the session (released, expired) or no longer has it.
_SESSION_GONE = re.compile(r"INVALID_HANDLE\.SESSION_(CLOSED|CHANGED|NOT_FOUND)")
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
        """A Spark Connect session with the job's code added, for one merge at a time.

        Sessions are leased from a pool (the connection's extra ``session_pool_size``, default 4) kept per
        server, user, Airflow host and job build: the server keeps a session's Python workers up between
        merges, which a new session would start again (over a second). A session holds one merge at a time
        (its temporary views and confs are the merge's), and a job build only its own code. When every
        session is leased, or with a pool size of 0, a session of its own is opened and released after.
        A session the server no longer knows (it restarted, or let the session expire) is opened anew.
        """
        from pyspark.sql.connect.session import SparkSession

        from airflow_merge_provider.job_package import job_py_files

        conn = self.get_connection(self.conn_id)
        job_zip = job_py_files()  # digests the installed job: once per session
        pool_size = int(conn.extra_dejson.get(_POOL_EXTRA, _DEFAULT_POOL_SIZE))
        # pyspark's functions build Spark Connect columns only while this is set (what builder.remote() sets).
        previous_mode = os.environ.get(_CONNECT_MODE)
        os.environ[_CONNECT_MODE] = "1"
        active = getattr(SparkSession._active_session, "session", None)
        try:
            with _leased_session_id(self._pool_key(conn, job_zip), pool_size) as lease:
                spark = self._open(conn, lease, job_zip)
                # pyspark binds what a Connect command returns (a checkpointed DataFrame: the materialized
                # source) to the thread's active session, the first one created unless set: this one.
                SparkSession._active_session.session = spark
                self._session = spark
                merged = False
                try:
                    yield spark
                    merged = True
                finally:
                    self._session = None
                    # A failed merge's session is not handed back: what it left on the server (the
                    # materialized source, referenced from the failure's traceback) goes with it.
                    self._close(spark, keep=lease is not None and merged)
        finally:
            SparkSession._active_session.session = active
            _restore(previous_mode)

    def _open(self, conn: Any, lease: _Lease | None, job_zip: str) -> SparkSession:
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession

        params = []
        if conn.login:
            params.append(f"{self.PARAM_USER_ID}={conn.login}")
        use_ssl = conn.extra_dejson.get(self.PARAM_USE_SSL)
        if use_ssl is not None:
            params.append(f"{self.PARAM_USE_SSL}={str(use_ssl).lower()}")
        retries = int(conn.extra_dejson.get(_RETRIES_EXTRA, _DEFAULT_RETRIES))
        for attempt in (1, 2):
            session_params = params + ([f"session_id={lease.session_id}"] if lease is not None else [])
            channel = DefaultChannelBuilder(self.server + "/;" + ";".join(session_params))
            if conn.password:
                channel.set(self.PARAM_TOKEN, conn.password)
            try:
                spark = SparkSession.builder.channelBuilder(channel).create()
                # pyspark retries an unanswered call for 10 minutes by default; a task gives up sooner (and
                # is retried by Airflow, which the idempotency key makes safe).
                policy = DefaultPolicy(max_retries=retries, max_backoff=_MAX_BACKOFF_MS)
                spark.client.set_retry_policies([policy])
                try:
                    spark.addArtifacts(job_zip, pyfile=True)
                except Exception as error:
                    # A leased session has this build's job already (its pool is this build's).
                    if lease is None or "ARTIFACT_ALREADY_EXISTS" not in str(error):
                        raise
                return spark
            except Exception as error:
                if lease is not None and attempt == 1 and _SESSION_GONE.search(str(error)):
                    lease.renew()  # the server closed that session: open another under this slot
                    continue
                raise self.unreachable(error, doing="opening a session") from None
        raise AssertionError("unreachable")

    def _close(self, spark: SparkSession, *, keep: bool) -> None:
        try:
            if keep:
                # A merge that returned has dropped the DataFrame it checkpointed (its materialized source),
                # which released it on the server; the session keeps no other state of the merge's.
                spark.client.close()  # the server keeps the session, and its Python workers, for the next
            else:
                spark.stop()  # released on the server too
        except Exception as error:  # a server gone after the merge: nothing left to release
            self.log.info("Closing the Spark Connect session failed: %s", _first_line(error))

    def _pool_key(self, conn: Any, job_zip: str) -> str:
        build = Path(job_zip).parent.name  # <version>-<content digest>
        seed = f"{self.server}|{conn.login or ''}|{socket.gethostname()}|{build}"
        return hashlib.sha256(seed.encode()).hexdigest()[:24]

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


@dataclass
class _Lease:
    """One slot of a session pool, held (flock) by this process: the session id it keeps."""

    handle: IO[str]
    session_id: str

    def renew(self) -> None:
        self.session_id = str(uuid.uuid4())
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(self.session_id)
        self.handle.flush()


@contextmanager
def _leased_session_id(key: str, pool_size: int) -> Iterator[_Lease | None]:
    """The first free slot of pool ``key`` (its session id), held until the block ends; None when every
    slot is held by another merge."""
    folder = Path(tempfile.gettempdir()) / "airflow-merge-provider" / "connect-sessions" / key
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(pool_size):
        handle = (folder / f"slot-{slot}").open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            handle.seek(0)
            lease = _Lease(handle, handle.read().strip())
            if not _UUID.fullmatch(lease.session_id):
                lease.renew()
            yield lease
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    yield None


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
