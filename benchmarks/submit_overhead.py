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
reading the spec, printing the metrics, shutdown). Goals: the merge adds <= 3 s over the empty application,
and at most 2x what the Spark floor application adds over it.

With ``--delta`` (the default; ``--no-delta`` leaves it out), each repeat also submits the same merge with
the spec's ``engine`` ``delta`` (Delta's own MERGE INTO) as the operator submits it: with Delta's package
(resolved by spark-submit from the Ivy cache the tests fetched Delta's jars into) and SQL extension, into a
fresh demo table of its own. Goal: the native job at most 1.0x Delta's MERGE, application to application.

Then the same merge in a Spark that is already up (``benchmarks/warm_merges.py``, ``--warm-repeats`` times
after one warm-up, each into a fresh demo table): on a Spark Connect server started here from the pyspark
installation (``local[2]``, the same confs; each merge leases a session from the operator's pool and adds
the job as its artifact, as a task does), and in a classic session. Goals: the Connect merge takes at most
0.15x the spark-submit merge and at most 1.3x the warm classic session's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
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
VS_FLOOR_GOAL = 2.0
NATIVE_VS_DELTA_GOAL = 1.0
CONNECT_VS_SUBMIT_GOAL = 0.15
CONNECT_VS_CLASSIC_GOAL = 1.3
_CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
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


def _delta_submit_argv(demo_spec: Path) -> list[str]:
    """The README merge with the delta engine, submitted with Delta as the operator adds it."""
    sys.path.insert(0, str(ROOT))
    from airflow_merge_provider.hooks.merge_into import with_delta
    from tests.support.delta_spark import delta_package_confs

    spec = json.loads(demo_spec.read_text(encoding="utf-8"))
    spec["options"] = {**spec.get("options", {}), "engine": "delta"}
    delta_spec = demo_spec.with_name("merge_spec_delta.json")
    delta_spec.write_text(json.dumps(spec), encoding="utf-8")
    confs, package = with_delta(delta_package_confs(), None)
    argv = _submit_argv(JOB_ENTRY_POINT, "--spec", str(delta_spec))
    extra = ["--packages", str(package)]
    extra += [arg for key, value in confs.items() for arg in ("--conf", f"{key}={value}")]
    at = argv.index(str(JOB_ENTRY_POINT))
    return argv[:at] + extra + argv[at:]


def _timed(argv: Sequence[str]) -> tuple[float, str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[-1]} failed with code {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _warm_merges(*kind: str, repeats: int) -> list[float]:
    """``benchmarks/warm_merges.py`` in a process of its own: the seconds of each warm merge."""
    script = ROOT / "benchmarks" / "warm_merges.py"
    _, stdout = _timed([sys.executable, str(script), *kind, "--repeats", str(repeats)])
    seconds: list[float] = json.loads(stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def _connect_merges(scratch: Path, repeats: int) -> list[float]:
    """Warm merges on a Spark Connect server started (and stopped, by PID) here."""
    port = _free_port()
    spark_submit = Path(sys.executable).parent / "spark-submit"
    argv = [
        str(spark_submit), "--master", "local[2]", "--class", _CONNECT_SERVER_CLASS,
        "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", f"spark.connect.grpc.binding.port={port}", "spark-internal",
    ]  # fmt: skip
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    with (scratch / "connect-server.log").open("wb") as log:
        server = subprocess.Popen(argv, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the Spark Connect server did not start") from None
                time.sleep(0.2)
        return _warm_merges("--connect", f"sc://localhost:{port}", repeats=repeats)
    finally:
        server.terminate()
        server.wait(timeout=60)


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
    parser.add_argument("--delta", action=argparse.BooleanOptionalAction, default=True,
                        help="also submit the merge with Delta's own MERGE INTO (default: yes)")
    parser.add_argument("--warm-repeats", type=int, default=5,
                        help="warm merges on Spark Connect and in a classic session (default 5)")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()
    empty_times: list[float] = []
    floor_times: list[float] = []
    merge_times: list[float] = []
    delta_times: list[float] = []
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
            if args.delta:
                delta_demo = prepare_demo(Path(scratch) / f"demo-delta-{repeat}")
                delta_seconds, delta_out = _timed(_delta_submit_argv(delta_demo.spec_path))
                delta_problems = check_result(delta_demo, _merge_metrics(delta_out))
                if delta_problems:
                    raise SystemExit("Delta's merge did not do what the demo expects: "
                                     + "; ".join(delta_problems))
                delta_times.append(delta_seconds)
                print(f"[{repeat}/{args.repeats}] Delta's MERGE through spark-submit {delta_seconds:6.2f} s",
                      flush=True)  # fmt: skip
            empty_times.append(empty_seconds)
            floor_times.append(floor_seconds)
            merge_times.append(merge_seconds)
            runs.append({
                "empty_s": empty_seconds, "floor_s": floor_seconds, "merge_s": merge_seconds,
                "executionTimeMs": metrics["executionTimeMs"], "stageTimesMs": metrics["stageTimesMs"],
            })  # fmt: skip
            print(f"[{repeat}/{args.repeats}] empty application {empty_seconds:6.2f} s, "
                  f"Spark floor {floor_seconds:6.2f} s, "
                  f"merge {merge_seconds:6.2f} s (merge itself {metrics['executionTimeMs'] / 1000:.2f} s)",
                  flush=True)  # fmt: skip
        connect_times: list[float] = []
        classic_times: list[float] = []
        if args.warm_repeats > 0:
            connect_times = _connect_merges(Path(scratch), args.warm_repeats)
            print(f"Spark Connect, warm: {', '.join(f'{s:.2f}' for s in connect_times)} s", flush=True)
            classic_times = _warm_merges("--classic", repeats=args.warm_repeats)
            print(f"classic session, warm: {', '.join(f'{s:.2f}' for s in classic_times)} s", flush=True)
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
    for stage in median_run["stageTimesMs"]:
        print(f"      {stage['stage'].removeprefix('MERGE operation - '):<42} {stage['ms'] / 1000:6.2f} s")
    print(f"    the rest (imports, spec, output, shutdown)  {merge - empty - execution:6.2f} s")
    status = "PASS" if added <= GOAL_SECONDS else "FAIL"
    print(f"\n  {status}  the merge adds {added:.2f} s over the empty application "
          f"(goal <= {GOAL_SECONDS:.0f} s); {merge - floor:.2f} s over the Spark floor")
    floor_added = floor - empty
    ratio = added / floor_added if floor_added > 0 else float("inf")
    status = "PASS" if ratio <= VS_FLOOR_GOAL else "FAIL"
    print(f"  {status}  the merge adds {ratio:.2f}x what the Spark floor application adds over the empty "
          f"application (goal <= {VS_FLOOR_GOAL:.0f}x)")
    if delta_times:
        delta = statistics.median(delta_times)
        ratio = merge / delta
        status = "PASS" if ratio <= NATIVE_VS_DELTA_GOAL else "FAIL"
        print(f"  spark-submit of the same merge with Delta's MERGE INTO (engine delta)  {delta:6.2f} s")
        print(f"  {status}  the native job takes {ratio:.2f}x Delta's MERGE through spark-submit "
              f"(goal <= {NATIVE_VS_DELTA_GOAL}x)")
    if not connect_times:
        print(f"  load average {os.getloadavg()[0]:.1f} at the end (no warm merges: --warm-repeats 0)")
        return 0
    connect, classic = statistics.median(connect_times), statistics.median(classic_times)
    print(f"\n== warm merges, medians of {args.warm_repeats} after one warm-up ==")
    print(f"  on a Spark Connect server (session, artifact, merge)  {connect:6.2f} s")
    print(f"  in a warm classic session                             {classic:6.2f} s")
    ratios = ((connect / merge, CONNECT_VS_SUBMIT_GOAL, "the spark-submit merge"),
              (connect / classic, CONNECT_VS_CLASSIC_GOAL, "the warm classic session's"))  # fmt: skip
    for ratio, goal, what in ratios:
        status = "PASS" if ratio <= goal else "FAIL"
        print(f"  {status}  Spark Connect takes {ratio:.2f}x {what} (goal <= {goal}x)")
    print(f"  load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
