"""Benchmark: how the merge should read a target's files, Spark's Parquet reader or pyarrow on the executors.

Run from the repository root (see benchmarks/README.md)::

    .venv/bin/python benchmarks/reader_benchmark.py --rows 2000000 --files 40 --repeats 5

Both readers produce the same DataFrame the merge joins: every column, the file each row came from, and,
for files with deleted rows, only the live rows (a deletion-vector filter on the row index). Two workloads:

- ``scan``: read the files and aggregate in Spark (what finding the touched files costs);
- ``rewrite``: read the files and hand every row to a Python (Arrow) task, as the job's writer does (what
  rewriting touched files costs).

``spark`` is the job's reader (``table_scan.scan_files``: ``spark.read.parquet`` with ``_metadata``, and an
anti join on ``_metadata.row_index`` for deleted rows). ``arrow`` reads the same files with
``pyarrow.parquet`` inside ``mapInArrow`` tasks (one file per task), filtering deleted rows with a mask.
Deleted rows are the same random 1% of the rows of every other file for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from merge_bench.data import Layout, build_target  # noqa: E402
from merge_bench.engines import start_spark  # noqa: E402


def _deleted(paths: Sequence[str], rows_per_file: int, seed: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    return {
        path: sorted(rng.choice(rows_per_file, size=rows_per_file // 100, replace=False).tolist())
        for index, path in enumerate(paths)
        if index % 2 == 0
    }


def spark_reader(spark: Any, table: Path, deleted: dict[str, list[int]]) -> Any:
    """The job's reader, with the deleted rows given by a broadcast anti join on (file, row index)."""
    from pyspark.sql import functions as F

    from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
    from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, scan_files

    snapshot = load_snapshot(str(table))
    df = scan_files(spark, snapshot, snapshot.files, with_file_key=True)
    if not deleted:
        return df
    # scan_files applies descriptors from the log; this table has none, so apply the same anti join here.
    by_key = {snapshot.file_key(f): deleted[f.path] for f in snapshot.files if f.path in deleted}
    rows = [(key, row) for key, indexes in by_key.items() for row in indexes]
    dead = spark.createDataFrame(rows, f"{FILE_KEY_COLUMN} string, __row long")
    plain = spark.read.schema(snapshot.schema).parquet(*[str(table / f.path) for f in snapshot.files])
    with_index = plain.withColumn(
        FILE_KEY_COLUMN, F.regexp_replace("_metadata.file_path", "^file:", "")
    ).withColumn("__row", F.col("_metadata.row_index"))
    return with_index.join(F.broadcast(dead), [FILE_KEY_COLUMN, "__row"], "left_anti").drop("__row")


def arrow_reader(spark: Any, table: Path, deleted: dict[str, list[int]]) -> Any:
    """pyarrow on the executors: one task per file, deleted rows masked out by index."""
    from spark_jobs.delta_merge.protocol.snapshot import load_snapshot
    from spark_jobs.delta_merge.write.merge_output import arrow_schema

    snapshot = load_snapshot(str(table))
    schema = arrow_schema(snapshot.schema).append(pa.field("__merge_file", pa.string()))
    root = str(table)
    files = [(f.path, json.dumps(deleted.get(f.path, []))) for f in snapshot.files]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path, dead_json in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                data = pq.read_table(os.path.join(root, path))
                dead = json.loads(dead_json)
                if dead:
                    keep = np.ones(data.num_rows, dtype=bool)
                    keep[dead] = False
                    data = data.filter(pa.array(keep))
                data = data.append_column("__merge_file", pa.array([path] * data.num_rows, pa.string()))
                yield from data.select(schema.names).to_batches()

    listing = spark.createDataFrame(files, "path string, dead string").repartition(len(files))
    ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in snapshot.schema.fields)
    return listing.mapInArrow(read, f"{ddl}, __merge_file string")


def scan(df: Any) -> int:
    from pyspark.sql import functions as F

    return int(df.groupBy("__merge_file").agg(F.sum("int_b").alias("s")).agg(F.sum("s")).first()[0])


def rewrite(df: Any) -> int:
    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total = 0
        for batch in batches:
            total += batch.num_rows
        yield pa.RecordBatch.from_pydict({"n": [total]})

    return int(df.mapInArrow(count, "n long").groupBy().sum("n").first()[0])


def measure(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    times = []
    result = 0
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="reader-benchmark-"))
    table = work / "target"
    build_target(table, Layout(rows=args.rows, files=args.files), seed=args.seed)
    spark = start_spark("4g")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    from spark_jobs.delta_merge.protocol.snapshot import load_snapshot

    paths = [f.path for f in load_snapshot(str(table)).files]
    deleted = _deleted(paths, args.rows // args.files, args.seed)
    load_start = os.getloadavg()[0]
    report: dict[str, Any] = {"rows": args.rows, "files": args.files, "repeats": args.repeats}
    for with_dv in (False, True):
        dead = deleted if with_dv else {}
        for workload, run in (("scan", scan), ("rewrite", rewrite)):
            for name, reader in (("spark", spark_reader), ("arrow", arrow_reader)):
                run(reader(spark, table, dead))  # warm-up
                seconds, result = measure(
                    lambda r=reader, w=run, d=dead: w(r(spark, table, d)), args.repeats  # type: ignore[misc]
                )
                key = f"{workload}{'_dv' if with_dv else ''}/{name}"
                report[key] = {"median_s": round(seconds, 3), "result": result}
                print(f"{key:<18} {seconds:7.3f} s  (result {result})", flush=True)
    report["load_average"] = {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}
    print(json.dumps(report, indent=1))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
