"""The merge benchmark's engines (this job, its copy-on-write, delta-rs, a naive Spark rewrite, and the
Arrow and Spark floors as references) and one timed, checked run of an engine on a case."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder

from . import ROOT
from .cases import MergeCase
from .data import COLUMNS, Layout, SourceInfo, pristine_dir, restore

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

__all__ = [
    "ALL_ENGINES",
    "DELTA_ENGINES",
    "DV_ENGINES",
    "ENGINES",
    "JOB_ENGINES",
    "REFERENCE_ENGINES",
    "Engine",
    "Outcome",
    "arrow_floor_engine",
    "delta_rs_engine",
    "job_engine",
    "job_spec",
    "naive_engine",
    "run_one",
    "spark_floor_engine",
    "start_spark",
]

ENGINES = ("job", "delta", "delta-rs", "naive", "arrow-floor", "spark-floor")
# --deletion-vectors: the job merging on read (its default on such a table), the same job copying on write
# (Delta's spark.databricks.delta.merge.deletionVectors.persistent=false for its runs), delta-rs, and the
# arrow-floor reference as without the option.
DV_ENGINES = ("job", "job-cow", "delta", "delta-rs", "arrow-floor")
ALL_ENGINES = (*ENGINES, "job-cow")
# Engines that need Delta Lake in the session: Delta's own MERGE INTO.
DELTA_ENGINES = ("delta",)
JOB_ENGINES = ("job", "job-cow")
# Reference lines, not merges: timed and charted, but their results are not checked (they merge nothing,
# so rows_after and the row counts mean nothing) and no target uses them.
REFERENCE_ENGINES = ("arrow-floor", "spark-floor")


@dataclass(frozen=True)
class Outcome:
    """What one engine did in one run, in common names, plus its own metrics as reported."""

    files_removed: int
    files_added: int
    rows_copied: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    raw: dict[str, Any]


# (case, source, target table path, scratch dir) -> outcome; each engine times only its own work.
Engine = Callable[[MergeCase, SourceInfo, Path, Path], Outcome]


def job_engine(spark: SparkSession, *, copy_on_write: bool = False, delta: bool = False) -> Engine:
    """This project's job, in-process: ``run_merge(spark, spec_dict)``; with ``copy_on_write``, with
    Delta's ``spark.databricks.delta.merge.deletionVectors.persistent=false`` set for the run (the touched
    files of a deletion-vector table are rewritten, as on any other table); with ``delta``, the spec's
    ``engine`` is ``delta``: Delta's own MERGE INTO runs it in the same session (the operator's
    ``engine="delta"``), its metrics read back from its commit."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.merge.deletion_vector_updates import PERSISTENT_DELETION_VECTORS_CONF

    def run(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
        spec = job_spec(case, source, target)
        group = f"merge-benchmark-{uuid.uuid4().hex}"
        spark.sparkContext.setJobGroup(group, case.name)
        if delta:
            # The key Delta's commit is found by; every run starts from the pristine table, so one serves.
            spec |= {"options": {"engine": "delta"}, "run": {"app_id": "merge-benchmark", "app_version": 1}}
        if copy_on_write:
            with _session_conf(spark, PERSISTENT_DELETION_VECTORS_CONF, "false"):
                metrics = run_merge(spark, spec).to_dict()
        else:
            metrics = run_merge(spark, spec).to_dict()
        metrics |= spark_jobs_of(spark, group)
        spark.sparkContext.setJobGroup("", "")  # later engines' jobs belong to no merge
        spark.catalog.clearCache()
        return Outcome(
            metrics["numTargetFilesRemoved"],
            metrics["numTargetFilesAdded"],
            metrics["numTargetRowsCopied"],
            metrics["numTargetRowsInserted"],
            metrics["numTargetRowsUpdated"],
            metrics["numTargetRowsDeleted"],
            metrics,
        )

    return run


def spark_jobs_of(spark: SparkSession, group: str) -> dict[str, int]:
    """The Spark jobs of a job group (read from the classic session's status store): how many, and the
    milliseconds during which at least one of them ran. The rest of a merge's time is the driver's own
    work (planning, Python, the log, the commit) and the wait between jobs."""
    context = spark.sparkContext
    store = context._jsc.sc().statusStore()
    job_ids = context.statusTracker().getJobIdsForGroup(group)
    spans = []
    for job_id in job_ids:
        job = store.job(job_id)
        if job.submissionTime().isDefined() and job.completionTime().isDefined():
            spans.append((job.submissionTime().get().getTime(), job.completionTime().get().getTime()))
    busy, reached = 0, None
    for start, end in sorted(spans):
        start = start if reached is None else max(start, reached)
        if end > start:
            busy += end - start
        reached = end if reached is None else max(reached, end)
    return {"sparkJobs": len(job_ids), "sparkJobMs": busy}


def job_spec(case: MergeCase, source: SourceInfo, target: Path) -> dict[str, Any]:
    """The merge spec (structural form) of ``case``."""
    clauses = [
        {"when": c.when, "action": c.action} | ({"condition": c.condition} if c.condition else {})
        for c in case.clauses
    ]
    return {
        "target": {"uri": str(target)},
        "source": {"uri": source.path, "format": "parquet"},
        "target_alias": "t",
        "source_alias": "s",
        "condition": "t.id = s.id",
        "clauses": clauses,
    }


def delta_rs_engine(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
    """delta-rs's merge in its fast mode for small sources; the source's parquet read is included."""
    merger = DeltaTable(str(target)).merge(
        source=pq.read_table(source.path),
        predicate="t.id = s.id",
        source_alias="s",
        target_alias="t",
        streamed_exec=False,
    )
    for clause in case.clauses:
        if clause.action == "update_all":
            merger = merger.when_matched_update_all(clause.condition)
        elif clause.action == "delete":
            merger = merger.when_matched_delete(clause.condition)
        else:
            merger = merger.when_not_matched_insert_all(clause.condition)
    metrics = merger.execute()
    return Outcome(
        metrics["num_target_files_removed"],
        metrics["num_target_files_added"],
        metrics["num_target_rows_copied"],
        metrics["num_target_rows_inserted"],
        metrics["num_target_rows_updated"],
        metrics["num_target_rows_deleted"],
        metrics,
    )


def naive_engine(spark: SparkSession) -> Engine:
    """Rewrite everything: read all live files, full outer join, write all rows with Spark's writer."""
    from pyspark.sql import functions as F

    def run(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
        files = DeltaTable(str(target)).file_uris()
        joined = (
            spark.read.parquet(*files)
            .alias("t")
            .join(spark.read.parquet(source.path).alias("s"), F.col("t.id") == F.col("s.id"), "full_outer")
        )
        in_t, in_s = F.col("t.id").isNotNull(), F.col("s.id").isNotNull()
        # Delta's clause semantics: the first clause of a kind whose condition holds acts; a matched row
        # no clause acts on is copied, a source row no clause acts on is dropped.
        branches: list[tuple[Column, str]] = []
        for clause in case.clauses:
            present = (in_t & in_s) if clause.when == "matched" else (in_s & ~in_t)
            branches.append(
                (present & F.expr(clause.condition) if clause.condition else present, clause.action)
            )
        branches.append((in_t, "copy"))
        action = F.when(branches[0][0], F.lit(branches[0][1]))
        for condition, name in branches[1:]:
            action = action.when(condition, F.lit(name))
        from_source = F.col("_action").isin("update_all", "insert_all")
        merged = (
            joined.withColumn("_action", action)
            .where(F.col("_action").isin("copy", "update_all", "insert_all"))
            .select(
                *(F.when(from_source, F.col(f"s.{c}")).otherwise(F.col(f"t.{c}")).alias(c) for c in COLUMNS)
            )
        )
        output = scratch / "naive-output"
        with _session_conf(spark, "spark.sql.shuffle.partitions", str(len(files))):
            merged.write.mode("overwrite").parquet(str(output))
        return Outcome(len(files), 0, 0, 0, 0, 0, {"output": str(output)})

    return run


def arrow_floor_engine(layout: Layout, pristine: Path) -> Engine:
    """The Arrow read+write floor of a case, a reference line and not a merge: read with pyarrow exactly
    the files holding the case's matched keys (the files a copy-on-write merge removes; none when no key
    matches, as in the insert-only cases) and write their rows back to Parquet in the scratch dir, one file
    per file read. No join, no merge logic, no commit: what reading and rewriting the touched files costs
    at least. See ``REFERENCE_ENGINES``."""
    names = _file_names(layout, pristine)

    def run(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
        touched = layout.matched_files(case.file_matched_fraction) if source.matched_rows else []
        paths = [target / names[index] for index in touched]
        output = scratch / "arrow-floor-output"
        output.mkdir()

        def copy(path: Path) -> int:
            table = pq.read_table(path)
            pq.write_table(table, output / path.name)
            return int(table.num_rows)

        # pyarrow releases the GIL: one file per core at a time, as Spark's local[*] and delta-rs use them.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            rows = sum(pool.map(copy, paths))
        raw = {"files_read": len(paths), "rows_written": rows, "output": str(output)}
        return Outcome(len(paths), len(paths), rows, 0, 0, 0, raw)

    return run


def spark_floor_engine(spark: SparkSession, layout: Layout, pristine: Path) -> Engine:
    """The Spark floor of a case, a reference line and not a merge: the two queries a two-pass merge
    (Delta's) runs at least, each as bare as Spark runs it, on exactly the files holding the case's matched
    keys. First the source's ids joined (broadcast) with those files' ids, one count per file collected;
    then those files read whole, full outer joined with the source and written by Spark's Parquet writer.
    An insert-only case (no file holds a matched key): the source read and written. No key skipping, no
    materialization, no clause logic, no statistics, no commit: what Spark's fixed and per-row costs are
    at least on this machine. See ``REFERENCE_ENGINES``."""
    from pyspark.sql import functions as F

    names = _file_names(layout, pristine)

    def run(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
        touched = layout.matched_files(case.file_matched_fraction) if source.matched_rows else []
        paths = [str(target / names[index]) for index in touched]
        output = str(scratch / "spark-floor-output")
        source_rows = spark.read.parquet(source.path)
        if not paths:
            source_rows.write.parquet(output)
            return Outcome(0, 0, 0, 0, 0, 0, {"queries": 1, "output": output})
        ids = spark.read.parquet(*paths).select("id", F.col("_metadata.file_path").alias("file"))
        ids.join(F.broadcast(source_rows.select("id")), "id").groupBy("file").count().collect()
        joined = spark.read.parquet(*paths).alias("t").join(source_rows.alias("s"), "id", "full_outer")
        joined.select(
            "id", *(F.coalesce(F.col(f"s.{c}"), F.col(f"t.{c}")).alias(c) for c in COLUMNS if c != "id")
        ).write.parquet(output)
        return Outcome(len(paths), 0, 0, 0, 0, 0, {"queries": 2, "files_read": len(paths), "output": output})

    return run


def _file_names(layout: Layout, pristine: Path) -> dict[int, str]:
    """The file name of each of the layout's file indexes, found once (untimed) in the pristine table by
    each file's smallest id; a restored target has the same names."""
    index_of_low = {layout.bounds(index)[0]: index for index in range(layout.files)}
    names: dict[int, str] = {}
    for uri in DeltaTable(str(pristine)).file_uris():
        name = Path(uri).name
        metadata = pq.read_metadata(pristine / name)
        # id is the first column; its smallest value is in the first row group, the rows being sorted.
        index = index_of_low.get(metadata.row_group(0).column(0).statistics.min)
        if index is None or metadata.num_rows != layout.bounds(index)[1] - layout.bounds(index)[0]:
            raise RuntimeError(f"{pristine / name} is not one of the {layout.files} files of {layout}")
        names[index] = name
    if len(names) != layout.files:
        raise RuntimeError(f"found {len(names)} of the {layout.files} files of {layout} in {pristine}")
    return names


@contextlib.contextmanager
def _session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def naive_outcome(outcome: Outcome, source: SourceInfo) -> Outcome:
    """The naive rewrite's counts, from its output's parquet footers (untimed)."""
    parts = sorted(Path(outcome.raw["output"]).glob("part-*.parquet"))
    rows = sum(pq.read_metadata(part).num_rows for part in parts)
    exp = source.expected
    copied = rows - exp["inserted"] - exp["updated"]
    raw = outcome.raw | {"output_files": len(parts), "output_rows": rows}
    return Outcome(
        outcome.files_removed, len(parts), copied, exp["inserted"], exp["updated"], exp["deleted"], raw
    )


def rows_after(engine: str, outcome: Outcome, target: Path, *, live: bool = False) -> int:
    """Rows in the result: the table's row count (from its stats), or the naive output's. With ``live``,
    the rows a scan returns (deltalake's ``count(*)``, which honours deletion vectors; the stats'
    ``numRecords`` still count the rows a vector deletes)."""
    if engine == "naive":
        return int(outcome.raw["output_rows"])
    table = DeltaTable(str(target))
    if not live:
        return table.count()
    result = QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t").read_all()
    return int(pa.table(result).column("n")[0].as_py())


def deletion_vector_counts(outcome: Outcome) -> dict[str, int]:
    """The job's deletion vector metrics; ``rows_marked`` (rows updated or deleted, marked in vectors
    instead of rewritten) is 0 when the run wrote no vector (copy-on-write)."""
    raw = outcome.raw
    counts = {
        "added": int(raw.get("numTargetDeletionVectorsAdded", 0)),
        "updated": int(raw.get("numTargetDeletionVectorsUpdated", 0)),
        "removed": int(raw.get("numTargetDeletionVectorsRemoved", 0)),
    }
    marking = counts["added"] + counts["updated"] > 0
    counts["rows_marked"] = outcome.rows_updated + outcome.rows_deleted if marking else 0
    return counts


def start_spark(driver_memory: str, *, with_delta: bool = False) -> SparkSession:
    """One local session for the whole benchmark (its ~8 s start is not measured); ``with_delta``: with
    Delta Lake loaded (its jars, SQL extension and catalog, as the tests fetch them), for the ``delta``
    engine; every engine then runs in that same session."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spark_jobs.delta_merge.spark_confs import JOB_SESSION_CONFS

    # The session the submitted job creates for itself (its JOB_SESSION_CONFS), for every engine.
    builder = SparkSession.builder
    for key, value in JOB_SESSION_CONFS.items():
        builder = builder.config(key, value)
    if with_delta:
        from tests.support.delta_spark import delta_session_confs

        for key, value in delta_session_confs().items():
            builder = builder.config(key, value)
    spark = (
        builder.master("local[*]")
        .appName("merge-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        # The naive baseline passes every file path too; no engine should pay a parallel listing job.
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run_one(
    engine: str,
    run: Engine,
    case: MergeCase,
    source: SourceInfo,
    work: Path,
    *,
    repeat: int,
    warmup: bool,
    deletion_vectors: bool = False,
) -> dict[str, Any]:
    """Restore the table, run one engine once, time it, check the result against the expected one (a
    reference engine's is not checked: it merges nothing)."""
    target, scratch = work / "target", work / "scratch"
    restore(pristine_dir(work, deletion_vectors=deletion_vectors), target)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    gc.collect()
    record: dict[str, Any] = {"case": case.name, "engine": engine, "repeat": repeat, "warmup": warmup}
    started = time.perf_counter()
    try:
        outcome = run(case, source, target, scratch)
    except Exception as error:  # one failing engine must not lose the other measurements
        record |= {"seconds": None, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
        print(f"    {engine:<11} FAILED: {record['error'].splitlines()[0][:200]}", flush=True)
        return record
    record["seconds"] = time.perf_counter() - started
    if engine in REFERENCE_ENGINES:  # not a merge: nothing to check
        record |= {"outcome": asdict(outcome), "reference": True}
        print(
            f"    {engine:<11} {record['seconds']:8.3f} s  read {outcome.files_removed:>4} files, "
            f"wrote {outcome.files_added:>4}, {outcome.rows_copied:>12,} rows (reference, not a merge)",
            flush=True,
        )
        return record
    if engine == "naive":
        outcome = naive_outcome(outcome, source)
    result_rows = rows_after(engine, outcome, target, live=deletion_vectors)
    got = {
        "inserted": outcome.rows_inserted,
        "updated": outcome.rows_updated,
        "deleted": outcome.rows_deleted,
        "rows_after": result_rows,
    }
    problems = [
        f"{key} {got[key]:,} != expected {want:,}"
        for key, want in source.expected.items()
        if got[key] != want
    ]
    record |= {"outcome": asdict(outcome), "rows_after": result_rows, "problems": problems}
    dv_note = ""
    if engine in JOB_ENGINES:
        record["deletion_vectors"] = dv = deletion_vector_counts(outcome)
        if deletion_vectors:
            dv_note = f", {dv['added'] + dv['updated']:>4} DVs, marked {dv['rows_marked']:>10,} rows"
    note = "  WRONG RESULT: " + "; ".join(problems) if problems else ""
    print(
        f"    {engine:<11} {record['seconds']:8.3f} s  removed {outcome.files_removed:>4} files, "
        f"added {outcome.files_added:>4}, copied {outcome.rows_copied:>12,} rows{dv_note}{note}",
        flush=True,
    )
    return record
