"""A writer of a Delta table in a process of its own, for races between writers: Delta's own SQL statements
(delta-spark) or the job's merge, in a local SparkSession that has Delta's extension and catalog loaded.

The process reads one command a line on stdin and answers one result a line on stdout (JSON both):

* ``{"sql": "..."}``: a statement through Delta (``MERGE``, ``UPDATE``, ``DELETE``, ``INSERT``,
  ``OPTIMIZE``), or ``{"merge": spec}``: the job's merge (``run_merge``) with that spec;
* ``"source"``: rows (``[id, p, v]`` lists) to register as the temporary view ``src`` first;
* ``"gate"``: a folder. The statement calls ``race_gate(column)`` (a Python UDF: Spark cannot place one
  without an argument in UPDATE's condition); with a gate, its first call creates ``reached`` in the folder
  and every call blocks until ``go`` exists there. Both engines read their snapshot before they evaluate the
  statement's rows, so a writer at its gate holds a read version, and the test decides what commits before
  the writer's commit is tried. Without a gate the functions return true at once.

The result: ``{"ok": true, "metrics": ...}`` (the job's metrics; None for Delta's statements) or
``{"ok": false, "error_class": ..., "message": ...}``.

Run as ``python -m tests.support.race_writer``. Its first line on stdin is its settings: for a table on the
S3 server, ``{"s3": {"endpoint", "region", "access_key_id", "secret_access_key"}}``, which gives Delta
Hadoop's S3A connector (tests/support/delta_spark.py) and the job its storage options. The key never reaches
a command line or an environment: the session starts without it, then Hadoop's configuration gets it.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

__all__ = ["RaceWriter", "main"]

_GATE_TIMEOUT_S = 300.0
_ROW_SCHEMA = "id BIGINT, p STRING, v STRING"


def _gate(folder: str | None) -> Callable[..., bool]:
    """The body of ``race_gate``: pickled into Spark's Python workers, so it closes over the folder only."""

    def race_gate(*_: Any) -> bool:
        if folder is None:
            return True
        import os as _os
        import time as _time

        reached, go = _os.path.join(folder, "reached"), _os.path.join(folder, "go")
        if not _os.path.exists(reached):
            with open(reached, "a"):
                pass
        deadline = _time.monotonic() + _GATE_TIMEOUT_S
        while not _os.path.exists(go):
            if _time.monotonic() > deadline:
                raise TimeoutError(f"the race's gate {folder} was not opened in time")
            _time.sleep(0.02)
        return True

    return race_gate


def _error_class(error: BaseException) -> str | None:
    """Delta's or the job's error class: the job's errors carry it; Delta's conflict exceptions name it in
    brackets, or (a class PySpark's registry lacks) in "Cannot find main error class"."""
    error_class = getattr(error, "error_class", None)
    if error_class:
        return str(error_class)
    message = str(error)
    found = re.search(r"Cannot find main error class '([A-Z][A-Z0-9_.]+)'", message) or re.search(
        r"\[([A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)?)\]", message
    )
    return found.group(1) if found else None


def _session(s3: Mapping[str, str] | None) -> Any:
    from pyspark.sql import SparkSession

    from tests.support.delta_spark import S3A_KEY_CONFS, delta_s3_session_confs, delta_session_confs
    from tests.support.jvm import fast_jvm_options

    builder = SparkSession.builder.master("local[1]").appName("race-writer")
    delta = delta_session_confs() if s3 is None else delta_s3_session_confs(**s3)
    confs = {
        **{key: value for key, value in delta.items() if key not in S3A_KEY_CONFS},
        "spark.sql.shuffle.partitions": "1",
        "spark.default.parallelism": "1",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "768m",
        "spark.driver.extraJavaOptions": fast_jvm_options(),
        "spark.sql.codegen.wholeStage": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    for key, value in confs.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key in S3A_KEY_CONFS:
        if key in delta:
            hadoop.set(key.removeprefix("spark.hadoop."), delta[key])
    return session


def _run(spark: Any, command: dict[str, Any], storage_options: dict[str, str]) -> dict[str, Any]:
    from spark_jobs.delta_merge.pipeline import run_merge

    gate = _gate(command.get("gate"))
    spark.udf.register("race_gate", gate, "boolean")
    if "source" in command:
        spark.createDataFrame([tuple(row) for row in command["source"]], _ROW_SCHEMA).createOrReplaceTempView(
            "src"
        )
    try:
        if "merge" in command:
            spec = dict(command["merge"])
            spec["target"] = {**spec["target"], "storage_options": storage_options}
            metrics = run_merge(spark, spec)
            return {"ok": True, "metrics": metrics.to_dict()}
        spark.sql(command["sql"]).collect()
        return {"ok": True, "metrics": None}
    except Exception as error:  # every failure is the race's outcome, told to the test
        return {"ok": False, "error_class": _error_class(error), "message": str(error)[:4000]}


class RaceWriter:
    """The test's end of a writer process: :meth:`send` a command, :meth:`result` its answer."""

    def __init__(
        self, name: str, log: Path, *, s3: Mapping[str, str] | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        """``s3``: the S3 server's endpoint, region and key (see the module's docstring); ``storage_options``:
        the job's for the same server."""
        self.name = name
        self._log: TextIO = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.race_writer"], cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.log = log
        self.send({"s3": dict(s3) if s3 else None, "storage_options": dict(storage_options or {})})

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout: float = 180.0) -> None:
        self.result(timeout)

    def send(self, command: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def poll(self) -> dict[str, Any] | None:
        """The next answer if one has come, else None."""
        try:
            return self._answer(self._lines.get_nowait())
        except queue.Empty:
            return None

    def result(self, timeout: float = 300.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = self._answer(self._lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                waited = f"writer {self.name} gave no answer in {timeout:.0f} s; see {self.log}"
                raise TimeoutError(waited) from None
            if answer is not None:
                return answer

    def _answer(self, line: str | None) -> dict[str, Any] | None:
        if line is None:
            raise RuntimeError(f"writer {self.name} ended (exit {self.process.wait()}); see {self.log}")
        try:
            answer = json.loads(line)
        except ValueError:
            return None  # a line of Spark's or the job's, not an answer
        return answer if isinstance(answer, dict) else None

    def stop(self) -> None:
        """Close its stdin and stop it by its PID."""
        from tests.support.local_servers import stop_process

        if self.process.stdin is not None:
            self.process.stdin.close()
        stop_process(self.process)  # type: ignore[arg-type]
        self._log.close()


def main() -> int:
    settings = json.loads(sys.stdin.readline())
    storage_options = settings["storage_options"]
    started = time.monotonic()
    spark = _session(settings["s3"])
    spark.sql("SELECT 1").collect()
    print(json.dumps({"ready": True, "startup_s": round(time.monotonic() - started, 1)}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        result = _run(spark, json.loads(line), storage_options)
        print(json.dumps(result), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main())
