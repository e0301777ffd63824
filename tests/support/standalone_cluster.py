"""A Spark standalone master and workers from the pyspark installation, on 127.0.0.1, for tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pyspark

from tests.support.jvm import fast_jvm_options
from tests.support.local_servers import free_port
from tests.support.submit_harness import PYTHON, ROOT, submit_env

__all__ = ["StandaloneCluster", "Worker"]

_SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _wait_for(log: Path, text: str, *, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(encoding="utf-8", errors="replace"):
        assert time.monotonic() < deadline, log.read_text(encoding="utf-8", errors="replace")[-3000:]
        time.sleep(0.2)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _daemon(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A Spark daemon in its own process group, so that killing the group takes its children too."""
    env = {**submit_env(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_DAEMON_JAVA_OPTS": fast_jvm_options()}
    with log.open("wb") as out:
        return subprocess.Popen([str(_SPARK_CLASS), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def _process_parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return parents


@dataclass(frozen=True)
class Worker:
    """One worker daemon; its process group holds the worker JVM and the executors it launched."""

    process: subprocess.Popen[bytes]
    webui_port: int
    work_dir: Path
    log: Path

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def executor_ids(self, app_id: str) -> list[str]:
        """The executors this worker launched for application ``app_id``, running or finished."""
        state = _get_json(f"{self.webui_url}/json/")
        launched = [*state["executors"], *state["finishedexecutors"]]
        return sorted(str(executor["id"]) for executor in launched if executor["appid"] == app_id)

    def executor_pids(self) -> list[int]:
        """Executor JVMs the worker runs (its descendants running CoarseGrainedExecutorBackend)."""
        parents = _process_parents()
        found, frontier = [], [self.process.pid]
        while frontier:
            parent = frontier.pop()
            for pid in [p for p, pp in parents.items() if pp == parent]:
                frontier.append(pid)
                with contextlib.suppress(OSError):
                    if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(pid)
        return found


class StandaloneCluster:
    """A master and ``workers`` workers of one core and 1 GiB each, logs and work dirs under ``root``.

    Use it as a context manager: leaving it SIGKILLs every daemon's process group (executors included)
    and waits for them.
    """

    def __init__(self, root: Path, *, workers: int = 2) -> None:
        self.root = root
        self.port = free_port()
        self.webui_port = free_port()
        self.workers: list[Worker] = []
        self._initial_workers = workers
        self._master: subprocess.Popen[bytes] | None = None
        self._launched = 0

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master, then the workers; return once every worker has registered."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / "master.log"
        self._master = _daemon(log, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.webui_port))
        _wait_for(log, "I have been elected leader")
        started = [self._launch_worker() for _ in range(self._initial_workers)]
        for worker in started:
            _wait_for(worker.log, "Successfully registered with master")

    def _launch_worker(self) -> Worker:
        number = self._launched
        self._launched += 1
        work_dir = self.root / f"work-{number}"
        log = self.root / f"worker-{number}.log"
        webui_port = free_port()
        process = _daemon(log, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                          "--memory", "1g", "--webui-port", str(webui_port), "--work-dir", str(work_dir),
                          self.master_url)
        worker = Worker(process=process, webui_port=webui_port, work_dir=work_dir, log=log)
        self.workers.append(worker)
        return worker

    def start_worker(self) -> Worker:
        """One more worker, registered with the master when this returns."""
        worker = self._launch_worker()
        _wait_for(worker.log, "Successfully registered with master")
        return worker

    def kill_worker(self, worker: Worker, *, timeout: float = 60) -> None:
        """SIGKILL the worker and its executors, and wait until the master has dropped the worker, so
        that it schedules no new executor there."""
        _kill_group(worker.process)
        self.workers.remove(worker)
        deadline = time.monotonic() + timeout
        while any(w["state"] != "DEAD" for w in self._registered(worker)):
            assert time.monotonic() < deadline, (self.root / "master.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)

    def _registered(self, worker: Worker) -> list[dict[str, Any]]:
        """The master's records of ``worker`` (found by its web UI address)."""
        state = _get_json(f"http://127.0.0.1:{self.webui_port}/json/")
        records: list[dict[str, Any]] = state["workers"]
        return [w for w in records if w["webuiaddress"].endswith(f":{worker.webui_port}")]

    def executors_by_worker(self, app_id: str) -> list[list[str]]:
        """Per live worker (in :attr:`workers` order), the executors it launched for ``app_id``."""
        return [worker.executor_ids(app_id) for worker in self.workers]

    def application_confs(self, *, wait_for_executors: int) -> dict[str, str]:
        """Spark confs for an application of one-core, 512 MiB executors on this cluster, which starts its
        first job only once ``wait_for_executors`` executors (up to one per worker) have registered."""
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.executor.cores": "1", "spark.cores.max": str(len(self.workers)),
            "spark.executor.memory": "512m",
            "spark.executor.extraJavaOptions": fast_jvm_options(),
            "spark.executorEnv.PYTHONPATH": str(ROOT), "spark.pyspark.python": str(PYTHON),
            "spark.scheduler.minRegisteredResourcesRatio": str(wait_for_executors / len(self.workers)),
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        }

    def stop(self) -> None:
        for worker in self.workers:
            _kill_group(worker.process)
        self.workers.clear()
        if self._master is not None:
            _kill_group(self._master)
            self._master = None

