"""Benchmark: what the README example's merge costs through spark-submit, over an empty PySpark application.

Run from the repository root::

    .venv/bin/python benchmarks/submit_overhead.py --repeats 3

Both applications are submitted the same way (the same spark-submit, master and confs as
``scripts/run-example --runner spark-submit``), one after the other, ``--repeats`` times; each repeat
merges into a freshly written demo table. The empty application creates its SparkSession and stops it:
the JVM, Python and session start-up every Spark application pays. A third application, the Spark floor,
reads the demo's source with Spark and writes it to Parquet, nothing else: what the first query of a
fresh JVM that reads and writes one small Parquet file costs, which any Spark merge pays at least. The
merge's time is broken down into
that start-up (the empty application's median), the merge itself as the job measures it
(``executionTimeMs``, snapshot to commit, with its ``stageTimesMs``), and the rest (the job's imports,
reading the spec, printing the metrics, shutdown). Goal: the merge adds <= 3 s over the empty application.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from run_example import JOB_ENTRY_POINT, METRICS_MARKER, check_result, prepare_demo  # noqa: E402

GOAL_SECONDS = 3.0
_EMPTY_APPLICATION = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("empty").getOrCreate()
spark.stop()
"""
_FLOOR_APPLICATION = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("floor").getOrCreate()
spark.read.parquet(sys.argv[1]).write.parquet(sys.argv[2])
spark.stop()
"""


def _submit_argv(application: Path, *args: str) -> list[str]:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    return [
        str(spark_submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "--conf", "spark.log.level=WARN", str(application), *args,
    ]  # fmt: skip


def _timed(argv: Sequence[str]) -> tuple[float, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[-1]} failed with code {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout


def _merge_metrics(stdout: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith(METRICS_MARKER):
            metrics: dict[str, Any] = json.loads(line[len(METRICS_MARKER) :])
            return metrics
    raise SystemExit(f"the merge printed no {METRICS_MARKER} line:\n{stdout}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each application (default 3)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    empty_times: list[float] = []
    floor_times: list[float] = []
    merge_times: list[float] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="submit-overhead-") as scratch:
        empty_app = Path(scratch) / "empty_application.py"
        empty_app.write_text(_EMPTY_APPLICATION, encoding="utf-8")
        floor_app = Path(scratch) / "floor_application.py"
        floor_app.write_text(_FLOOR_APPLICATION, encoding="utf-8")
        for repeat in range(1, args.repeats + 1):
            demo = prepare_demo(Path(scratch) / f"demo-{repeat}")
            empty_seconds, _ = _timed(_submit_argv(empty_app))
            floor_out = str(Path(scratch) / f"floor-{repeat}")
            floor_seconds, _ = _timed(_submit_argv(floor_app, demo.source_uri, floor_out))
            merge_seconds, stdout = _timed(_submit_argv(JOB_ENTRY_POINT, "--spec", str(demo.spec_path)))
            metrics = _merge_metrics(stdout)
            problems = check_result(demo, metrics)
            if problems:
                raise SystemExit("the merge did not do what the demo expects: " + "; ".join(problems))
            empty_times.append(empty_seconds)
            floor_times.append(floor_seconds)
            merge_times.append(merge_seconds)
            runs.append({
                "empty_s": empty_seconds, "floor_s": floor_seconds, "merge_s": merge_seconds,
                "executionTimeMs": metrics["executionTimeMs"], "numSparkJobs": metrics["numSparkJobs"],
                "stageTimesMs": metrics["stageTimesMs"],
            })  # fmt: skip
            print(f"[{repeat}/{args.repeats}] empty application {empty_seconds:6.2f} s, "
                  f"Spark floor {floor_seconds:6.2f} s, "
                  f"merge {merge_seconds:6.2f} s (merge itself {metrics['executionTimeMs'] / 1000:.2f} s, "
                  f"{metrics['numSparkJobs']} Spark jobs)", flush=True)  # fmt: skip
    empty, merge = statistics.median(empty_times), statistics.median(merge_times)
    floor = statistics.median(floor_times)
    median_run = min(runs, key=lambda r: abs(r["merge_s"] - merge))
    execution = median_run["executionTimeMs"] / 1000
    added = merge - empty
    load_end = os.getloadavg()
    print(f"\n== medians of {args.repeats} (2 local cores; load average {load_start[0]:.1f} at start, "
          f"{load_end[0]:.1f} at end; {platform.python_version()}) ==")  # fmt: skip
    print(f"  spark-submit of an empty PySpark application  {empty:6.2f} s")
    print(f"  spark-submit of the Spark floor application  {floor:6.2f} s  "
          f"(+{floor - empty:.2f} s: read and write one small Parquet file)")
    print(f"  spark-submit of the README example's merge    {merge:6.2f} s")
    print(f"    start-up (the empty application's)          {empty:6.2f} s")
    print(f"    the merge, snapshot to commit               {execution:6.2f} s")
    for name, ms in median_run["stageTimesMs"].items():
        print(f"      {name.removeprefix('MERGE operation - '):<42} {ms / 1000:6.2f} s")
    print(f"    the rest (imports, spec, output, shutdown)  {merge - empty - execution:6.2f} s")
    status = "PASS" if added <= GOAL_SECONDS else "FAIL"
    print(f"\n  {status}  the merge adds {added:.2f} s over the empty application "
          f"(goal <= {GOAL_SECONDS:.0f} s); {merge - floor:.2f} s over the Spark floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
