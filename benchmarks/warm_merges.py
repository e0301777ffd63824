"""The README example's merge in an already warm Spark: on a Spark Connect server, or in a classic session.

Run by ``benchmarks/submit_overhead.py`` in a process of its own per session kind (pyspark's functions build
Connect or classic columns for the whole process)::

    .venv/bin/python benchmarks/warm_merges.py --connect sc://localhost:15002 --repeats 5
    .venv/bin/python benchmarks/warm_merges.py --classic --repeats 5

Each repeat merges into a freshly written demo table, after one merge that warms the session up. On Spark
Connect a repeat costs what a task pays (``MergeConnectHook.session``): a session leased from the warm pool
(the job added as its artifact), the merge, the session handed back. Prints one JSON line: the seconds of
each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from run_example import check_result, prepare_demo  # noqa: E402


def _connect_merge(url: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A merge as MergeIntoOperator runs it on a spark_connect connection: a session leased from the
    hook's pool (the job added as its artifact), the merge, the session handed back."""
    from urllib.parse import urlsplit

    from airflow_merge_provider.hooks.merge_connect import MergeConnectHook
    from spark_jobs.delta_merge import run_merge

    address = urlsplit(url)
    conn = {"conn_type": "spark_connect", "host": address.hostname, "port": address.port}
    token = os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")
    if token:
        conn["password"] = token
    os.environ["AIRFLOW_CONN_MERGE_BENCHMARK"] = json.dumps(conn)

    def merge(spec: dict[str, Any]) -> dict[str, Any]:
        with MergeConnectHook("merge_benchmark").session() as spark:
            return run_merge(spark, spec).to_dict()  # type: ignore[arg-type]

    return merge


def _classic_merge() -> Callable[[dict[str, Any]], dict[str, Any]]:
    from pyspark.sql import SparkSession

    from spark_jobs.delta_merge import run_merge

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.log.level", "WARN").getOrCreate()
    )  # fmt: skip
    return lambda spec: run_merge(spark, spec).to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--connect", metavar="URL", help="a Spark Connect server, sc://host:port")
    kind.add_argument("--classic", action="store_true", help="a classic local[2] session in this process")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    merge = _connect_merge(args.connect) if args.connect else _classic_merge()
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="warm-merges-") as scratch:
        for repeat in range(args.repeats + 1):
            demo = prepare_demo(Path(scratch) / f"demo-{repeat}")
            spec = json.loads(demo.spec_path.read_text(encoding="utf-8"))
            started = time.perf_counter()
            metrics = merge(spec)
            seconds = time.perf_counter() - started
            problems = check_result(demo, metrics)
            if problems:
                raise SystemExit("the merge did not do what the demo expects: " + "; ".join(problems))
            if repeat:  # the first merge only warms the session up
                times.append(seconds)
    print(json.dumps({"seconds": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
