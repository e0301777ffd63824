"""Delta itself (delta-spark's JVM) on the test S3 server: a local Spark session with Delta and Hadoop's S3A
connector (:func:`tests.support.delta_spark.delta_s3_session_confs`), in a Python process of its own that
runs what the test sends it.

A process of its own, because S3A must be on the driver's class path when its JVM starts: the shared
``spark`` session cannot take it later (``ADD JAR`` of hadoop-aws and the SDK bundle into a running session,
then the ``fs.s3a.*`` confs set on its Hadoop configuration: Hadoop still finds no ``S3AFileSystem``,
tried), and a Python process holds one SparkContext. Its confs, the S3 key among them, reach it as the
first line of its stdin, never its command line or environment; it starts its session without the key
(a classic builder's confs are its JVM's command line) and then sets the key on the session's Hadoop
configuration (:data:`~tests.support.delta_spark.S3A_KEY_CONFS`). Then one JSON request a line on stdin,
one JSON reply a line on a pipe of its own (the JVM's and pyspark's output go to a log file):

- ``sql``: a statement's rows, or the Java exception it raised (class, error class, message);
- ``log_store``: the class of the log store Delta writes a table's commits with;
- ``log_store_write``: a commit file written through Delta's ``S3SingleDriverLogStore`` itself;
- ``jvm_pid``: the process id of the session's JVM.

A gate (:class:`Gate`) holds Delta between the start of its transaction and its commit while another writer
commits: the SQL function ``gated(x)`` returns ``x``, but the first call waits until the gate opens; a
``log_store_write`` with a gate waits there after the store's existence check, before S3A's upload.
:meth:`DeltaOnS3.start` sends a request without waiting for its reply (:meth:`DeltaOnS3.reply`).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.support.local_servers import stop_process

__all__ = ["DeltaOnS3", "DeltaOnS3Error", "Gate", "start_delta_on_s3"]

ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 180.0
_REPLY_TIMEOUT_S = 300.0


class DeltaOnS3Error(RuntimeError):
    """What a request raised in the Delta process: the Java exception's class, error class and message."""

    def __init__(self, java_class: str, error_class: str | None, message: str) -> None:
        super().__init__(f"{java_class}: {message}")
        self.java_class = java_class
        self.error_class = error_class
        self.message = message


@dataclass(frozen=True)
class Gate:
    """Two marker files in a directory: ``started`` once Delta waits at the gate, ``open`` to let it on."""

    directory: Path

    def wait_until_delta_waits(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not (self.directory / "started").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Delta did not reach the gate in {self.directory} within {timeout} s")
            time.sleep(0.05)

    def open(self) -> None:
        (self.directory / "open").touch()


class DeltaOnS3:
    """The process's client. Requests are served one at a time, in order."""

    def __init__(self, process: subprocess.Popen[bytes], replies: IO[bytes], log: Path) -> None:
        self._process = process
        self._replies = replies
        self._log = log
        self._selector = selectors.DefaultSelector()
        self._selector.register(replies, selectors.EVENT_READ)

    @property
    def pid(self) -> int:
        return self._process.pid

    def sql(self, statement: str) -> list[dict[str, Any]]:
        """The rows of ``statement`` run in Delta's session, as dicts; raises :class:`DeltaOnS3Error`."""
        self.start("sql", statement=statement)
        return list(self.reply())

    def log_store(self, table: str) -> str:
        """The class of the log store Delta writes ``table``'s commits with (behind its delegating one)."""
        self.start("log_store", table=table)
        return str(self.reply())

    def log_store_write(self, path: str, lines: list[str], *, gate: Gate | None = None) -> None:
        """``S3SingleDriverLogStore.write(path, lines, overwrite=false)``, as a commit calls it."""
        self.start("log_store_write", gate=gate, path=path, lines=lines)
        self.reply()

    def jvm_pid(self) -> int:
        self.start("jvm_pid")
        return int(self.reply())

    def gate(self) -> Gate:
        return Gate(Path(tempfile.mkdtemp(prefix="delta-gate-")))

    def start(self, op: str, *, gate: Gate | None = None, **arguments: Any) -> None:
        """Send a request, Delta to wait at ``gate`` if given; :meth:`reply` reads its reply."""
        request = {"op": op, "gate": str(gate.directory) if gate else None, **arguments}
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()

    def reply(self, timeout: float = _REPLY_TIMEOUT_S) -> Any:
        line = self._read_line(timeout)
        answer = json.loads(line)
        if "error" in answer:
            raise DeltaOnS3Error(**answer["error"])
        return answer["result"]

    def stop(self) -> None:
        """Stop the session and the process (by its PID if it does not exit by itself)."""
        try:
            if self._process.poll() is None and self._process.stdin is not None:
                self._process.stdin.close()  # end of requests: the process stops its session and exits
                self._process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self._process.poll() is None:
                stop_process(self._process)
            self._selector.close()
            self._replies.close()

    def _read_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                raise TimeoutError(f"Delta's process did not answer within {timeout} s:\n{self._log_tail()}")
            chunk = os.read(self._replies.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"Delta's process exited ({self._process.poll()}):\n{self._log_tail()}")
            line += chunk
        return line

    def _log_tail(self) -> str:
        return self._log.read_text(errors="replace")[-4000:] if self._log.exists() else ""


def start_delta_on_s3(confs: dict[str, str], log: Path) -> DeltaOnS3:
    """Start the process with a session of ``confs`` (:func:`delta_s3_session_confs`'s, the key among
    them, sent on its stdin) and wait until the session is up; its output goes to ``log``."""
    read_end, write_end = os.pipe()
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": python_path}  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.delta_on_s3", str(write_end)], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, pass_fds=(write_end,),
        )  # fmt: skip
    os.close(write_end)
    client = DeltaOnS3(process, os.fdopen(read_end, "rb", buffering=0), log)
    try:
        assert process.stdin is not None
        process.stdin.write(json.dumps(confs).encode() + b"\n")
        process.stdin.flush()
        client.reply(timeout=_START_TIMEOUT_S)
    except BaseException:
        client.stop()
        raise
    return client


# -- the process ----------------------------------------------------------------------------------------


def _serve(reply_fd: int) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import LongType

    from tests.support.delta_spark import S3A_KEY_CONFS
    from tests.support.jvm import fast_jvm_options

    replies = os.fdopen(reply_fd, "w", encoding="utf-8")
    confs = json.loads(sys.stdin.readline())
    builder = SparkSession.builder.master("local[1]").appName("delta-on-s3")
    local = {
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC", "spark.driver.extraJavaOptions": fast_jvm_options(),
        "spark.sql.warehouse.dir": tempfile.mkdtemp(prefix="spark-warehouse-"),
        "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # A local server: a refused or failed request fails at once, not after minutes of retries.
        "spark.hadoop.fs.s3a.attempts.maximum": "2", "spark.hadoop.fs.s3a.retry.limit": "1",
    }  # fmt: skip
    for key, value in {**local, **confs}.items():
        if key not in S3A_KEY_CONFS:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key in S3A_KEY_CONFS:
        hadoop_conf.set(key.removeprefix("spark.hadoop."), confs[key])

    def answer(result: Any = None, error: dict[str, Any] | None = None) -> None:
        replies.write(json.dumps({"error": error} if error else {"result": result}, default=str) + "\n")
        replies.flush()

    answer("ready")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "sql":
                spark.udf.register("gated", lambda x, d=request["gate"]: _pass_gate(d, x), LongType())
                answer([row.asDict(recursive=True) for row in spark.sql(request["statement"]).collect()])
            elif request["op"] == "log_store":
                answer(_log_store_class(spark, request["table"]))
            elif request["op"] == "jvm_pid":
                jvm: Any = spark._jvm
                answer(jvm.java.lang.ProcessHandle.current().pid())
            elif request["op"] == "log_store_write":
                _log_store_write(spark, request["path"], request["lines"], request["gate"])
                answer()
            else:
                answer(error={"java_class": "", "error_class": None, "message": f"no op {request['op']}"})
        except Exception as exception:  # the test reads it as DeltaOnS3Error
            answer(error=_describe(exception))
    spark.stop()
    return 0


def _pass_gate(directory: str | None, value: Any) -> Any:
    """Wait at the gate in ``directory`` (first caller only: once open, every call passes)."""
    if directory and not os.path.exists(os.path.join(directory, "open")):
        Path(directory, "started").touch()
        while not os.path.exists(os.path.join(directory, "open")):
            time.sleep(0.05)
    return value


def _log_store_class(spark: Any, table: str) -> str:
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
    delegate = log.store().getDelegate(jvm.org.apache.hadoop.fs.Path(f"{table}/_delta_log/0.json"))
    # Delta wraps its Java log stores (io.delta.storage) in an adaptor.
    if delegate.getClass().getSimpleName() == "LogStoreAdaptor":
        delegate = delegate.logStoreImpl()
    return str(delegate.getClass().getName())


def _log_store_write(spark: Any, path: str, lines: list[str], gate: str | None) -> None:
    """The write a commit makes, with the lines handed over one by one from Python (py4j's callback
    server): the store checks that the file does not exist, opens S3A's stream, then takes the lines;
    S3A uploads the object when the stream closes. The gate waits at the first line."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]

    class Lines:
        def __init__(self) -> None:
            self.left = list(lines)

        def hasNext(self) -> bool:
            return bool(self.left)

        def next(self) -> str:
            _pass_gate(gate, None)
            return self.left.pop(0)

        class Java:
            implements = ("java.util.Iterator",)

    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    store = jvm.io.delta.storage.S3SingleDriverLogStore(conf)
    store.write(jvm.org.apache.hadoop.fs.Path(path), Lines(), False, conf)


def _describe(exception: Exception) -> dict[str, Any]:
    java = getattr(exception, "java_exception", None) or getattr(exception, "_origin", None)
    if java is None:
        return {"java_class": "", "error_class": None, "message": f"{type(exception).__name__}: {exception}"}
    from py4j.protocol import Py4JError

    try:
        error_class = java.getErrorClass()  # Spark's and Delta's errors (SparkThrowable)
    except Py4JError:
        error_class = None
    return {"java_class": str(java.getClass().getName()), "error_class": error_class,
            "message": str(java.getMessage())}  # fmt: skip


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
