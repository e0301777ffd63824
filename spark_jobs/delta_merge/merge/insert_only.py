"""insert_only_merge: a merge with only NOT MATCHED clauses appends, and never rewrites a file."""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.merge.output import write_output
from spark_jobs.delta_merge.merge.rewrite import insert_only_output
from spark_jobs.delta_merge.merge.row_counter import counted
from spark_jobs.delta_merge.merge.stats import MergeOutcome, elapsed_ms, file_metrics, row_metrics
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.files import LiveFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.protocol.table_features import (
    TableConstraints,
    check_writable,
)
from spark_jobs.delta_merge.scan.table_scan import scan_files

__all__ = ["insert_only_merge"]


def insert_only_merge(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    candidates: list[LiveFile], constraints: TableConstraints, target_file_size: int, dry_run: bool,
    joinable: list[LiveFile] | None = None,
) -> MergeOutcome:
    """Append the source rows that match no target row (:param joinable: the candidates the source's
    keys may match, default all)."""
    check_writable(snapshot, removes_files=False)
    started = time.monotonic()
    source, source_rows = counted(source, "merge_source_rows")
    joinable = candidates if joinable is None else joinable
    target = scan_files(spark, snapshot, joinable) if joinable else None
    output = insert_only_output(source, target, plan=plan, constraints=constraints)
    # As Delta's InsertOnlyMergeExecutor, even with the change data feed on: no change data files, since
    # readers take the adds of a version without cdc actions as its inserts.
    counts, adds, _, _ = write_output(
        spark, output, snapshot=snapshot, plan=plan, target_file_size=target_file_size, dry_run=dry_run,
        description="MERGE operation - writing new files for only inserts",
    )
    values: dict[str, Any] = {
        **row_metrics(counts), **file_metrics(snapshot, candidates, (), adds),
        "numSourceRows": source_rows(), "rewriteTimeMs": elapsed_ms(started),
    }
    return MergeOutcome(MergeMetrics(**values), (), adds, tuple(candidates))
