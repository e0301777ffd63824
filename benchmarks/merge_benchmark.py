"""Benchmark: this job's MERGE vs delta-rs vs a naive Spark full rewrite, on Delta's merge benchmark cases.

Run from the repository root (see benchmarks/README.md)::

    .venv/bin/python benchmarks/merge_benchmark.py --rows 20000000 --files 40 --repeats 3

The cases and their names follow ``MergeTestCases`` of Delta's own merge benchmark (delta-io/delta,
``benchmarks/src/main/scala/benchmark/MergeTestCases.scala``); the table is synthetic and key-clustered
instead of TPC-DS ``web_returns``, so that "a fraction of the files" is exactly known.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import importlib
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder, write_deltalake

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("job", "delta-rs", "naive")
# --deletion-vectors: the job merging on read (its default on such a table), the same job copying on write
# (Delta's spark.databricks.delta.merge.deletionVectors.persistent=false for its runs), and delta-rs.
DV_ENGINES = ("job", "job-cow", "delta-rs")
ALL_ENGINES = (*ENGINES, "job-cow")
JOB_ENGINES = ("job", "job-cow")
STRING_LEN = 20
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", dtype=np.uint8)
_CHUNK_ROWS = 1_000_000  # rows generated at a time: ~60 MB of Arrow data, whatever the table size
_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("int_a", pa.int32()),
        ("int_b", pa.int64()),
        ("dbl_a", pa.float64()),
        ("dbl_b", pa.float64()),
        ("str_a", pa.string()),
    ]
)
_COLUMNS: tuple[str, ...] = tuple(_SCHEMA.names)
_BUILD_FORMAT = 1  # bump when the generated table changes, so that a cached pristine copy is rebuilt

log = logging.getLogger("merge_benchmark")


# ---------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Clause:
    """One WHEN clause; the actions are Delta's benchmark ones: UPDATE SET *, DELETE, INSERT *."""

    when: Literal["matched", "not_matched"]
    action: Literal["update_all", "delete", "insert_all"]
    condition: str | None = None


@dataclass(frozen=True)
class MergeCase:
    """A case of Delta's MergeTestCases: which files and rows of the target the source hits."""

    kind: Literal["single_insert_only", "multiple_insert_only", "delete_only", "upsert"]
    file_matched_fraction: float
    row_matched_fraction: float
    row_not_matched_fraction: float

    @property
    def name(self) -> str:
        """Delta's name for the case (Scala prints these doubles as Python does)."""
        parts = [self.kind, f"fileMatchedFraction_{self.file_matched_fraction}"]
        if self.kind != "single_insert_only" and self.kind != "multiple_insert_only":
            parts.append(f"rowMatchedFraction_{self.row_matched_fraction}")
        if self.kind != "delete_only":
            parts.append(f"rowNotMatchedFraction_{self.row_not_matched_fraction}")
        return "_".join(parts)

    @property
    def clauses(self) -> tuple[Clause, ...]:
        """The WHEN clauses of Delta's SQL for this case (aliases ``t`` and ``s``)."""
        if self.kind == "single_insert_only":
            return (Clause("not_matched", "insert_all"),)
        if self.kind == "multiple_insert_only":
            return (
                Clause("not_matched", "insert_all", "s.int_a % 2 = 0"),
                Clause("not_matched", "insert_all"),
            )
        if self.kind == "delete_only":
            return (Clause("matched", "delete"),)
        return (Clause("matched", "update_all"), Clause("not_matched", "insert_all"))


def _insert(kind: Literal["single_insert_only", "multiple_insert_only"], not_matched: float) -> MergeCase:
    return MergeCase(kind, 0.05, 0.0, not_matched)


# All of MergeTestCases.testCases, in Delta's order.
CATALOG: tuple[MergeCase, ...] = (
    *(_insert("single_insert_only", f) for f in (0.05, 0.5, 1.0)),
    *(_insert("multiple_insert_only", f) for f in (0.05, 0.5, 1.0)),
    MergeCase("delete_only", 0.05, 0.05, 0.0),
    MergeCase("upsert", 0.05, 0.1, 0.01),
    MergeCase("upsert", 0.05, 0.0, 0.1),
    MergeCase("upsert", 0.05, 0.01, 0.1),
    MergeCase("upsert", 0.05, 0.1, 0.0),
    MergeCase("upsert", 0.5, 0.01, 0.001),
    MergeCase("upsert", 1.0, 0.01, 0.001),
    MergeCase("upsert", 0.05, 0.5, 0.001),
    MergeCase("upsert", 0.05, 0.99, 0.001),
    MergeCase("upsert", 0.05, 1.0, 0.001),
)
CASES = {case.name: case for case in CATALOG}
INSERT_ONLY = "single_insert_only_fileMatchedFraction_0.05_rowNotMatchedFraction_0.05"
DELETE_ONLY = "delete_only_fileMatchedFraction_0.05_rowMatchedFraction_0.05"
UPSERT_5 = "upsert_fileMatchedFraction_0.05_rowMatchedFraction_0.1_rowNotMatchedFraction_0.01"
UPSERT_50 = "upsert_fileMatchedFraction_0.5_rowMatchedFraction_0.01_rowNotMatchedFraction_0.001"
UPSERT_100 = "upsert_fileMatchedFraction_1.0_rowMatchedFraction_0.01_rowNotMatchedFraction_0.001"
DEFAULT_CASES = (INSERT_ONLY, DELETE_ONLY, UPSERT_5, UPSERT_50, UPSERT_100)
DV_CASES = (UPSERT_5, UPSERT_50, UPSERT_100)


@dataclass(frozen=True)
class Target:
    """A performance goal: the job's median at most ``max_ratio`` times the ``base`` engine's."""

    label: str
    case: str
    max_ratio: float
    no_file_removed: bool = False
    base: str = "naive"
    merge_on_read: bool = False  # the job's runs must have written deletion vectors


TARGETS = (
    Target("5%-of-files upsert <= 0.15x naive", UPSERT_5, 0.15),
    Target("insert-only <= 0.08x naive, no file removed", INSERT_ONLY, 0.08, no_file_removed=True),
    Target("100%-of-files upsert <= 1.0x naive", UPSERT_100, 1.0),
)
# --deletion-vectors: merge-on-read against the job's copy-on-write and delta-rs, on the same table.
DV_TARGETS = (
    Target("100%-of-files upsert <= 0.5x delta-rs", UPSERT_100, 0.5, base="delta-rs", merge_on_read=True),
    Target("100%-of-files upsert <= 0.3x job-cow", UPSERT_100, 0.3, base="job-cow", merge_on_read=True),
    Target("5%-of-files upsert <= 1.0x job-cow", UPSERT_5, 1.0, base="job-cow", merge_on_read=True),
)


# ------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Layout:
    """The target's key clustering: file ``i`` holds exactly the ids ``bounds(i)``."""

    rows: int
    files: int

    def bounds(self, index: int) -> tuple[int, int]:
        """``[low, high)`` of file ``index``'s ids (sizes differ by at most one row)."""
        return index * self.rows // self.files, (index + 1) * self.rows // self.files

    def matched_files(self, fraction: float) -> list[int]:
        """Evenly spaced file indexes, ``round(fraction * files)`` of them (at least one)."""
        count = min(self.files, max(1, round(fraction * self.files)))
        return [int((j + 0.5) * self.files / count) for j in range(count)]


@dataclass(frozen=True)
class SourceInfo:
    """One case's source as written, and the outcome every engine must reach."""

    path: str
    rows: int
    matched_rows: int
    not_matched_rows: int
    matched_files: int
    expected: dict[str, int]


def _columns(rng: np.random.Generator, ids: np.ndarray[Any, np.dtype[np.int64]]) -> pa.Table:
    """The value columns for ``ids``; the string is built from buffers, without Python objects."""
    n = len(ids)
    chars = _ALPHABET[rng.integers(0, len(_ALPHABET), size=n * STRING_LEN)]
    offsets = np.arange(0, (n + 1) * STRING_LEN, STRING_LEN, dtype=np.int32)
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))
    arrays = [
        pa.array(ids, pa.int64()),
        pa.array(rng.integers(0, 1000, size=n, dtype=np.int32)),
        pa.array(rng.integers(0, 2**40, size=n, dtype=np.int64)),
        pa.array(rng.random(n)),
        pa.array(rng.normal(100.0, 15.0, size=n)),
        strings,
    ]
    return pa.Table.from_arrays(arrays, schema=_SCHEMA)


def _chunks(rng: np.random.Generator, low: int, high: int) -> Iterator[pa.RecordBatch]:
    for start in range(low, high, _CHUNK_ROWS):
        ids = np.arange(start, min(high, start + _CHUNK_ROWS), dtype=np.int64)
        yield from _columns(rng, ids).to_batches()


def build_target(path: Path, layout: Layout, *, seed: int, deletion_vectors: bool = False) -> None:
    """Write the table one file per append, so that file ``i`` holds exactly ``layout.bounds(i)``;
    with ``deletion_vectors``, created with ``delta.enableDeletionVectors=true`` (protocol 3/7)."""
    configuration = {"delta.enableDeletionVectors": "true"} if deletion_vectors else None
    for index in range(layout.files):
        rng = np.random.default_rng([seed, index])
        reader = pa.RecordBatchReader.from_batches(_SCHEMA, _chunks(rng, *layout.bounds(index)))
        # A huge target size keeps each append in one file, whatever its size.
        write_deltalake(
            str(path),
            reader,
            mode="append",
            target_file_size=1 << 40,
            configuration=configuration if index == 0 else None,  # set when the first append creates it
        )
    table = DeltaTable(str(path))
    table.create_checkpoint()  # the merges then read one checkpoint, not one commit per file
    if len(table.file_uris()) != layout.files:
        raise RuntimeError(f"built {len(table.file_uris())} files at {path}, expected {layout.files}")
    if deletion_vectors and table.metadata().configuration.get("delta.enableDeletionVectors") != "true":
        raise RuntimeError(f"built {path} without delta.enableDeletionVectors=true")


def pristine_dir(work: Path, *, deletion_vectors: bool) -> Path:
    """The pristine table of the work dir: one with deletion vectors enabled lives next to the other."""
    return work / ("pristine-dv" if deletion_vectors else "pristine")


def ensure_pristine(
    work: Path, layout: Layout, *, seed: int, rebuild: bool, deletion_vectors: bool = False
) -> dict[str, Any]:
    """Build the pristine table once; reuse it while rows, files, seed, format and kind are unchanged."""
    pristine = pristine_dir(work, deletion_vectors=deletion_vectors)
    marker = pristine.with_suffix(".json")
    wanted = {"rows": layout.rows, "files": layout.files, "seed": seed, "format": _BUILD_FORMAT}
    wanted |= {"deletion_vectors": True} if deletion_vectors else {}
    if not rebuild and marker.exists() and pristine.exists():
        info: dict[str, Any] = json.loads(marker.read_text())
        if {key: info.get(key) for key in wanted} == wanted:
            print(f"reusing the pristine table in {pristine} (built in {info['build_seconds']:.1f} s)")
            return info
    shutil.rmtree(pristine, ignore_errors=True)
    marker.unlink(missing_ok=True)
    kind = " deletion-vector" if deletion_vectors else ""
    print(
        f"building a {layout.rows:,}-row, {layout.files}-file{kind} Delta table in {pristine} ...", flush=True
    )
    started = time.perf_counter()
    build_target(pristine, layout, seed=seed, deletion_vectors=deletion_vectors)
    table_bytes = sum(f.stat().st_size for f in pristine.glob("*.parquet"))
    info = wanted | {"build_seconds": time.perf_counter() - started, "bytes": table_bytes}
    marker.write_text(json.dumps(info))
    print(f"built {table_bytes / 2**20:,.0f} MiB in {info['build_seconds']:.1f} s")
    return info


def restore(pristine: Path, target: Path) -> None:
    """Put the pristine table back at ``target`` (untimed)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)


def build_source(case: MergeCase, layout: Layout, path: Path, *, seed: int) -> SourceInfo:
    """Delta's MergeDataLoad, key-clustered: from each matched file, a Bernoulli sample of its rows with
    fresh values (matched) and a sample given new ids beyond the table's max (not matched)."""
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    files = layout.matched_files(case.file_matched_fraction)
    matched_parts, new_count = [], 0
    for index in files:
        low, high = layout.bounds(index)
        matched_parts.append(low + np.flatnonzero(rng.random(high - low) < case.row_matched_fraction))
        new_count += int(np.count_nonzero(rng.random(high - low) < case.row_not_matched_fraction))
    matched = np.concatenate(matched_parts).astype(np.int64)
    new_ids = np.arange(layout.rows, layout.rows + new_count, dtype=np.int64)
    table = _columns(rng, np.concatenate([matched, new_ids]))
    pq.write_table(table, path)
    inserted = new_count if any(c.action == "insert_all" for c in case.clauses) else 0
    updated = len(matched) if any(c.action == "update_all" for c in case.clauses) else 0
    deleted = len(matched) if any(c.action == "delete" for c in case.clauses) else 0
    expected = {
        "inserted": inserted,
        "updated": updated,
        "deleted": deleted,
        "rows_after": layout.rows + inserted - deleted,
    }
    return SourceInfo(str(path), table.num_rows, len(matched), new_count, len(files), expected)


# -------------------------------------------------------------------------------------- engines


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


def job_engine(spark: SparkSession, *, copy_on_write: bool = False) -> Engine:
    """This project's job, in-process: ``run_merge(spark, spec_dict)``; with ``copy_on_write``, with
    Delta's ``spark.databricks.delta.merge.deletionVectors.persistent=false`` set for the run (the touched
    files of a deletion-vector table are rewritten, as on any other table)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.deletion_vector_updates import PERSISTENT_DELETION_VECTORS_CONF

    def run(case: MergeCase, source: SourceInfo, target: Path, scratch: Path) -> Outcome:
        if copy_on_write:
            with _session_conf(spark, PERSISTENT_DELETION_VECTORS_CONF, "false"):
                metrics = run_merge(spark, job_spec(case, source, target)).to_dict()
        else:
            metrics = run_merge(spark, job_spec(case, source, target)).to_dict()
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
                *(F.when(from_source, F.col(f"s.{c}")).otherwise(F.col(f"t.{c}")).alias(c) for c in _COLUMNS)
            )
        )
        output = scratch / "naive-output"
        with _session_conf(spark, "spark.sql.shuffle.partitions", str(len(files))):
            merged.write.mode("overwrite").parquet(str(output))
        return Outcome(len(files), 0, 0, 0, 0, 0, {"output": str(output)})

    return run


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


# ---------------------------------------------------------------------------------------- running


def start_spark(driver_memory: str) -> SparkSession:
    """One local session for the whole benchmark (its ~8 s start is not measured)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[*]")
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
    """Restore the table, run one engine once, time it, check the result against the expected one."""
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
        print(f"    {engine:<9} FAILED: {record['error'].splitlines()[0][:200]}", flush=True)
        return record
    record["seconds"] = time.perf_counter() - started
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
        f"    {engine:<9} {record['seconds']:8.3f} s  removed {outcome.files_removed:>4} files, "
        f"added {outcome.files_added:>4}, copied {outcome.rows_copied:>12,} rows{dv_note}{note}",
        flush=True,
    )
    return record


def summarize(
    runs: Sequence[Mapping[str, Any]], cases: Sequence[str], engines: Sequence[str]
) -> list[dict[str, Any]]:
    """Median seconds per (case, engine) over the measured runs, with the median run's counts."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        medians: dict[str, float] = {}
        for engine in engines:
            good = [
                r
                for r in runs
                if r["case"] == case
                and r["engine"] == engine
                and not r["warmup"]
                and r["seconds"] is not None
            ]
            row: dict[str, Any] = {"case": case, "engine": engine, "runs": len(good), "median_seconds": None}
            if good:
                seconds = [r["seconds"] for r in good]
                median = statistics.median(seconds)
                closest_run = min(good, key=lambda r: abs(r["seconds"] - median))
                closest = closest_run["outcome"]
                medians[engine] = median
                row |= {
                    "median_seconds": median,
                    "min_seconds": min(seconds),
                    "max_seconds": max(seconds),
                    "files_removed": closest["files_removed"],
                    "files_added": closest["files_added"],
                    "rows_copied": closest["rows_copied"],
                    "wrong_results": sum(bool(r["problems"]) for r in good),
                }
                if "deletion_vectors" in closest_run:  # the job's runs
                    dv = closest_run["deletion_vectors"]
                    row |= {"deletion_vectors": dv["added"] + dv["updated"], "rows_marked": dv["rows_marked"]}
            rows.append(row)
        bases = (
            ("naive", "ratio_vs_naive"),
            ("delta-rs", "ratio_vs_delta_rs"),
            ("job-cow", "ratio_vs_job_cow"),
        )
        for row in rows[-len(engines) :]:
            for base, key in bases:
                mine, theirs = row["median_seconds"], medians.get(base)
                row[key] = mine / theirs if mine is not None and theirs else None
    return rows


def check_targets(
    summary: Sequence[Mapping[str, Any]], targets: Sequence[Target] = TARGETS
) -> list[dict[str, Any]]:
    """Each goal of ``targets``: PASS, FAIL, or n/a when its case or an engine was not measured."""
    results = []
    for goal in targets:
        job = next((r for r in summary if r["case"] == goal.case and r["engine"] == "job"), None)
        ratio = job.get(f"ratio_vs_{goal.base.replace('-', '_')}") if job else None
        result: dict[str, Any] = asdict(goal) | {"ratio": ratio, "status": "n/a", "detail": ""}
        if job is None or ratio is None:
            result["detail"] = f"needs the case and the job and {goal.base} engines measured"
        else:
            fails = [f"{ratio:.3f}x {goal.base} > {goal.max_ratio}x"] if ratio > goal.max_ratio else []
            if goal.no_file_removed and job["files_removed"]:
                fails.append(f"{job['files_removed']} file(s) removed")
            if goal.merge_on_read and not job.get("deletion_vectors"):
                fails.append("the job wrote no deletion vector (not merge-on-read)")
            if job["wrong_results"]:
                fails.append("wrong results")
            result["status"] = "FAIL" if fails else "PASS"
            result["detail"] = "; ".join(fails) or f"{ratio:.3f}x {goal.base}"
        results.append(result)
    return results


def _fmt(value: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def print_report(summary: Sequence[Mapping[str, Any]], targets: Sequence[Mapping[str, Any]]) -> None:
    """The summary table (one block per case) and the goals; the job-cow and deletion vector columns
    only when the job-cow engine ran."""
    with_cow = any(row["engine"] == "job-cow" for row in summary)
    header = (
        f"  {'engine':<9} {'median s':>9} {'runs':>4} {'files removed':>13} {'files added':>11} "
        f"{'rows copied':>13} {'x naive':>8} {'x delta-rs':>10}"
        + (f" {'x job-cow':>9} {'DVs':>5} {'rows marked':>12}" if with_cow else "")
    )
    print("\n== medians ==")
    for index, row in enumerate(summary):
        if index == 0 or row["case"] != summary[index - 1]["case"]:
            print(f"\n{row['case']}\n{header}")
        print(
            f"  {row['engine']:<9} {_fmt(row['median_seconds'], '.3f', 9)} {row['runs']:>4} "
            f"{_fmt(row.get('files_removed'), ',', 13)} {_fmt(row.get('files_added'), ',', 11)} "
            f"{_fmt(row.get('rows_copied'), ',', 13)} {_fmt(row.get('ratio_vs_naive'), '.3f', 8)} "
            f"{_fmt(row.get('ratio_vs_delta_rs'), '.2f', 10)}"
            + (
                f" {_fmt(row.get('ratio_vs_job_cow'), '.3f', 9)} {_fmt(row.get('deletion_vectors'), ',', 5)} "
                f"{_fmt(row.get('rows_marked'), ',', 12)}"
                if with_cow
                else ""
            )
            + (f"  ({row['wrong_results']} wrong result(s))" if row.get("wrong_results") else "")
        )
    bases = ", ".join(dict.fromkeys(goal["base"] for goal in targets))
    print(f"\n== targets (this job vs {bases}) ==")
    for goal in targets:
        print(f"  {goal['status']:<4}  {goal['label']:<45} {goal['detail']}")


# ------------------------------------------------------------------------------------ reporting


def _memory_kib() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


def machine_info() -> dict[str, Any]:
    """Enough to tell two result files apart: hardware, load, versions, commit."""
    versions = {}
    for name in ("pyspark", "deltalake", "pyarrow", "numpy"):
        versions[name] = str(getattr(importlib.import_module(name), "__version__", "?"))

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_kib": _memory_kib(),
        "python": sys.version.split()[0],
        "versions": versions,
        "git_commit": git("rev-parse", "HEAD"),
        # What the measured code is: the commit plus uncommitted changes, untracked files included.
        "git_changes": git("status", "--porcelain").splitlines(),
        "load_average_at_start": os.getloadavg(),
    }


def plot(results: Mapping[str, Any], path: Path) -> bool:
    """Grouped bars of median seconds per case and engine (log scale); False without matplotlib."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return False
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    summary, engines = results["summary"], results["config"]["engines"]
    cases = list(dict.fromkeys(row["case"] for row in summary))
    figure, axes = plt.subplots(figsize=(max(8.0, 2.6 * len(cases)), 6.0))
    width = 0.8 / max(1, len(engines))
    for index, engine in enumerate(engines):
        values = [
            next((r["median_seconds"] for r in summary if r["case"] == c and r["engine"] == engine), None)
            for c in cases
        ]
        xs = [i + (index - (len(engines) - 1) / 2) * width for i in range(len(cases))]
        bars = axes.bar(xs, [v or 0.0 for v in values], width, label=engine)
        axes.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in values], fontsize=7)
    labels = [c.replace("_fileMatched", "\nfileMatched").replace("_row", "\nrow") for c in cases]
    axes.set_xticks(range(len(cases)), labels, fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("median seconds (log scale)")
    config = results["config"]
    kind = " deletion-vector" if config.get("deletion_vectors") else ""
    axes.set_title(
        f"MERGE on a {config['rows']:,}-row, {config['files']}-file{kind} Delta table "
        f"(median of {config['repeats']})"
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_outputs(results: dict[str, Any], out: Path) -> None:
    """JSON (everything) and the PNG chart, named by the start time."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"merge_benchmark-{results['started'].replace(':', '').replace('-', '')[:15]}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nresults: {stem.with_suffix('.json')}")
    if plot(results, stem.with_suffix(".png")):
        print(f"chart:   {stem.with_suffix('.png')}")
    else:
        print("chart:   skipped (matplotlib is not installed; see benchmarks/README.md)")


# ----------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; see benchmarks/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000_000, help="target rows (default 20,000,000)")
    parser.add_argument("--files", type=int, default=40, help="target files, key-clustered (default 40)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="measured runs per case and engine (default 3)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured runs per engine before measuring, of the 5%%-of-files upsert (default 1)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="CASE",
        help="Delta's case names, or 'all' (default: the five of the README's table; with "
        "--deletion-vectors, the upserts on 5%%, 50%% and 100%% of the files)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=None,
        choices=ALL_ENGINES,
        help="engines, run in this order (default: job delta-rs naive; with --deletion-vectors, "
        "job job-cow delta-rs)",
    )
    parser.add_argument(
        "--deletion-vectors",
        action="store_true",
        help="merge a table with delta.enableDeletionVectors=true: the job merges on read; job-cow is the "
        "same job with spark.databricks.delta.merge.deletionVectors.persistent=false",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results",
        help="where the JSON and PNG go (default benchmarks/results/)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="tables and sources (default: $TMPDIR/merge-benchmark-ROWSxFILES; kept for reuse)",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the pristine table even if cached")
    parser.add_argument("--clean", action="store_true", help="delete the work dir at the end")
    parser.add_argument("--seed", type=int, default=7, help="data generation seed (default 7)")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (default 6g)")
    parser.add_argument(
        "--plot-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="only redraw the chart of an earlier results JSON",
    )
    parser.add_argument("--verbose", action="store_true", help="show the job's own log lines")
    args = parser.parse_args(argv)
    if args.cases is None:
        args.cases = list(DV_CASES if args.deletion_vectors else DEFAULT_CASES)
    if args.engines is None:
        args.engines = list(DV_ENGINES if args.deletion_vectors else ENGINES)
    if args.cases == ["all"]:
        args.cases = list(CASES)
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; expected names among:\n  " + "\n  ".join(CASES))
    if args.rows < args.files or args.files < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("expected --files >= 1, --rows >= --files, --repeats >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or reuse) the table and sources, run every engine on every case, report."""
    args = parse_args(argv)
    logging.basicConfig(format="[%(name)s] %(message)s")
    logging.getLogger("delta_merge").setLevel(logging.INFO if args.verbose else logging.WARNING)
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    if args.plot_only:
        path = args.plot_only.with_suffix(".png")
        drawn = plot(json.loads(args.plot_only.read_text()), path)
        print(f"chart: {path}" if drawn else "matplotlib is not installed; see benchmarks/README.md")
        return 0 if drawn else 1
    layout = Layout(args.rows, args.files)
    work = args.work_dir or Path(tempfile.gettempdir()) / f"merge-benchmark-{args.rows}x{args.files}"
    work.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    machine = machine_info()
    load = machine["load_average_at_start"][0]
    if load > 0.5:
        print(f"WARNING: load average {load:.1f} at start: other work is running, timings are unreliable")
    dv = args.deletion_vectors
    table = ensure_pristine(work, layout, seed=args.seed, rebuild=args.rebuild, deletion_vectors=dv)
    sources_dir = work / "sources"
    shutil.rmtree(sources_dir, ignore_errors=True)
    sources_dir.mkdir()
    cases = [CASES[name] for name in args.cases]
    sources = {
        c.name: build_source(c, layout, sources_dir / f"{c.name}.parquet", seed=args.seed) for c in cases
    }
    for case in cases:
        info = sources[case.name]
        print(
            f"source {case.name}: {info.rows:,} rows drawn from {info.matched_files} file(s): "
            f"{info.matched_rows:,} matching, {info.not_matched_rows:,} new"
        )
    print("starting Spark ...", flush=True)
    spark = start_spark(args.driver_memory)
    makers: dict[str, Callable[[], Engine]] = {
        "job": lambda: job_engine(spark),
        "job-cow": lambda: job_engine(spark, copy_on_write=True),
        "delta-rs": lambda: delta_rs_engine,
        "naive": lambda: naive_engine(spark),
    }
    engines = {name: makers[name]() for name in args.engines}
    # The 5%-of-files upsert goes through every stage (join, rewrite, append, commit) once per engine.
    warmup_case = CASES[UPSERT_5] if UPSERT_5 in args.cases else cases[0]
    runs: list[dict[str, Any]] = []
    try:
        rounds = [(r, True, [warmup_case]) for r in range(args.warmup)] + [
            (r, False, cases) for r in range(args.repeats)
        ]
        for repeat, warmup, round_cases in rounds:
            for case in round_cases:
                label = "warm-up" if warmup else f"repeat {repeat + 1}/{args.repeats}"
                print(f"[{label}] {case.name}", flush=True)
                for name, run in engines.items():
                    runs.append(
                        run_one(
                            name,
                            run,
                            case,
                            sources[case.name],
                            work,
                            repeat=repeat,
                            warmup=warmup,
                            deletion_vectors=dv,
                        )
                    )
    finally:
        spark.stop()
        shutil.rmtree(work / "target", ignore_errors=True)
        shutil.rmtree(work / "scratch", ignore_errors=True)
        if args.clean:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, args.cases, args.engines)
    targets = check_targets(summary, DV_TARGETS if dv else TARGETS)
    print_report(summary, targets)
    machine["load_average_at_end"] = os.getloadavg()
    results = {
        "benchmark": "merge_benchmark",
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        | {"work_dir": str(work)},
        "machine": machine,
        "table": table,
        "cases": {
            c.name: {
                "clauses": [asdict(x) for x in c.clauses],
                "source": asdict(sources[c.name]),
                "job_spec": job_spec(c, sources[c.name], work / "target"),
            }
            for c in cases
        },
        "runs": runs,
        "summary": summary,
        "targets": targets,
    }
    write_outputs(results, args.out)
    failed = any(r["seconds"] is None or r.get("problems") for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
