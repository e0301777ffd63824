"""execute_merge: prune the target's files, then run the insert-only or the classic merge."""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.merge.classic import classic_merge
from spark_jobs.delta_merge.merge.insert_only import insert_only_merge
from spark_jobs.delta_merge.merge.source_key_ranges import joinable_files
from spark_jobs.delta_merge.merge.stats import MergeOutcome
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.protocol.table_features import table_constraints
from spark_jobs.delta_merge.scan.data_skipping import prune_files

__all__ = ["execute_merge"]

log = logging.getLogger("delta_merge")


def execute_merge(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    target_file_size: int, dry_run: bool, broadcast_source: bool = False, source_row_id: str | None = None,
) -> MergeOutcome:
    """Compute the merge's new files and metrics; nothing is committed here.

    :param broadcast_source: the source is small enough to broadcast into its inner joins with the
        target's rows (finding touched files, and merge-on-read's changed rows), whatever Spark estimates.
    :param source_row_id: the source's row id column (a materialized source has one, the same in every
        scan of it), or None.
    """
    candidates = prune_files(
        spark, snapshot, snapshot.files, predicates=plan.target_only_predicates,
        target_alias=plan.target_alias,
    )
    constraints = table_constraints(snapshot)
    joinable = joinable_files(spark, source, snapshot=snapshot, plan=plan, files=candidates)
    log.info("%d of %d candidate files may hold keys of the source", len(joinable), len(candidates))
    if plan.parsed.is_insert_only:
        return insert_only_merge(spark, source, snapshot=snapshot, plan=plan, candidates=candidates,
                            constraints=constraints, target_file_size=target_file_size, dry_run=dry_run,
                            joinable=joinable)
    return classic_merge(spark, source, snapshot=snapshot, plan=plan, candidates=candidates,
                    constraints=constraints, target_file_size=target_file_size, dry_run=dry_run,
                    broadcast_source=broadcast_source, source_row_id=source_row_id, joinable=joinable)
