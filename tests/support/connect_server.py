"""A Spark Connect server from the pyspark installation, on 127.0.0.1, for tests: started by PID, stopped by
PID, admitting only clients that present its token."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.delta_spark import delta_session_confs
from tests.support.jvm import fast_jvm_options
from tests.support.local_servers import free_port, wait_for_port
from tests.support.submit_harness import PYTHON, SPARK_SUBMIT

__all__ = ["ConnectServer", "command_lines_holding", "connect_mode"]

_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectServer:
    """One Spark Connect server (``local[2]``, as the tests' classic session: the same parallelism, so the
    same files written; Delta's extension and catalog loaded, as there) with its log at
    ``root / "server.log"``.

    The token is given in the server's environment (``SPARK_CONNECT_AUTHENTICATE_TOKEN``), never on its
    command line. Its Python workers run this interpreter without this tree on their path: the job reaches
    them only as a session's artifact.
    """

    def __init__(self, root: Path, *, port: int | None = None, token: str | None = None) -> None:
        """:param port: and ``token``: those of a server this one restarts (default: new ones)."""
        self.root = root
        self.port = port or free_port()
        self.token = token or secrets.token_hex(16)
        self.log = root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The address without the token (``localhost``: pyspark sends a token without TLS only there)."""
        return f"sc://localhost:{self.port}"

    def __enter__(self) -> ConnectServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env |= {"PYSPARK_PYTHON": str(PYTHON), "SPARK_CONNECT_AUTHENTICATE_TOKEN": self.token,
                "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC", "spark.driver.memory": "1g",
            "spark.driver.extraJavaOptions": fast_jvm_options(), "spark.python.worker.reuse": "true",
            "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            # Delta's extension and catalog, as on a cluster that has Delta: the job runs there unchanged,
            # and Delta's own MERGE runs beside it.
            **delta_session_confs(),
        }  # fmt: skip
        command = [str(SPARK_SUBMIT), "--master", "local[2]", "--class", _SERVER_CLASS]
        for key, value in confs.items():
            command += ["--conf", f"{key}={value}"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([*command, "spark-internal"], env=env, cwd=self.root, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        wait_for_port(self.port, self.process, name="the Spark Connect server", timeout=120,
                      output=lambda: self.log.read_text(errors="replace")[-3000:])  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the server's process group (its JVM and Python workers), as a crash would."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None

    def session(self, *, token: str | None = None, with_job: bool = True) -> Any:
        """A new client session on this server, with its token (or ``token``) and the job added as an
        artifact (unless not ``with_job``). Use it under :func:`connect_mode`."""
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession

        from airflow_merge_provider.job_package import job_py_files

        channel = DefaultChannelBuilder(f"{self.url}/")
        channel.set("token", self.token if token is None else token)
        session = SparkSession.builder.channelBuilder(channel).create()
        if with_job:
            session.addArtifacts(job_py_files(), pyfile=True)
        return session


def command_lines_holding(text: str) -> list[int]:
    """The PIDs of this machine's processes whose command line holds ``text`` (a secret must be in none)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


@contextlib.contextmanager
def connect_mode(enabled: bool = True) -> Iterator[None]:
    """pyspark's functions build Spark Connect columns inside the block, classic ones outside: one test
    process holds both kinds of session. ``enabled=False``: classic inside the block, wherever it is (the
    classic session is built so, even when a Connect test is the first to ask for it)."""
    previous = os.environ.get(_CONNECT_MODE)
    if enabled:
        os.environ[_CONNECT_MODE] = "1"
    else:
        os.environ.pop(_CONNECT_MODE, None)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_CONNECT_MODE, None)
        else:
            os.environ[_CONNECT_MODE] = previous
