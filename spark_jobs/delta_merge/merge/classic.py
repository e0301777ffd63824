"""classic_merge: find the touched files, then rewrite them, or mark their changed rows (merge-on-read)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.merge.copy_by_position import copies_by_position, copy_unchanged_rows
from spark_jobs.delta_merge.merge.deletion_vector_updates import mark_rows, writes_deletion_vectors
from spark_jobs.delta_merge.merge.output import _num_indexed_cols, write_output
from spark_jobs.delta_merge.merge.rewrite import (
    ACTION_COLUMN,
    Action,
    classic_output,
    first_match_per_target_row,
    insert_only_output,
    matched_output,
    with_materialized_columns,
)
from spark_jobs.delta_merge.merge.row_counter import counted
from spark_jobs.delta_merge.merge.stats import MergeOutcome, elapsed_ms, file_metrics, row_metrics
from spark_jobs.delta_merge.merge.touched_files import ACTS_COLUMN, TouchedFiles, find_touched_files
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.files import LiveFile, WrittenFile
from spark_jobs.delta_merge.protocol.row_tracking import (
    ROW_COMMIT_VERSION_COLUMN,
    ROW_ID_COLUMN,
    RowTracking,
    row_tracking,
)
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.protocol.table_features import (
    TableConstraints,
    change_data_feed_enabled,
    check_writable,
    materializes_partition_columns,
)
from spark_jobs.delta_merge.scan.table_scan import (
    FILE_KEY_COLUMN,
    ROW_INDEX_COLUMN,
    scan_files,
    scan_for_join,
)
from spark_jobs.delta_merge.sql_names import quoted_path
from spark_jobs.delta_merge.stage_timing import stage
from spark_jobs.delta_merge.write.merge_output import write_empty_change_file

__all__ = ["classic_merge"]

log = logging.getLogger("delta_merge")


def _matched_changes(
    joined: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan, constraints: TableConstraints,
    tracking: RowTracking | None, source_row_id: str | None, extra: tuple[str, ...] = (ACTS_COLUMN,),
) -> DataFrame:
    """Merge-on-read's output for the inner join of source and target rows (see
    :func:`_marked_rows_and_inserts`), carrying what marks a target row, the ``extra`` columns of the
    join and the source's row id (``source_row_id``, when there is one)."""
    carried = (ROW_ID_COLUMN, ROW_COMMIT_VERSION_COLUMN) if tracking is not None else ()
    marks = (FILE_KEY_COLUMN, ROW_INDEX_COLUMN)
    source_ids = (source_row_id,) if source_row_id is not None else ()
    return matched_output(joined, plan=plan, constraints=constraints,
                          change_data=change_data_feed_enabled(snapshot),
                          carried=(*carried, *marks, *extra, *source_ids))  # fmt: skip

def _marked_rows_and_inserts(
    spark: SparkSession, source: DataFrame, uncounted_source: DataFrame, *, snapshot: TargetSnapshot,
    plan: MergePlan, removes: tuple[LiveFile, ...], tracking: RowTracking | None,
    constraints: TableConstraints, deduplicate_deletes: bool, broadcast_source: bool,
    kept: DataFrame | None = None, source_row_id: str | None = None,
) -> DataFrame:
    """Merge-on-read without NOT MATCHED BY SOURCE clauses: no target row that matches nothing is needed.

    The changed rows come from the inner join of the source with the touched files: ``kept`` (its
    :func:`_matched_changes`, computed by the scan that found the touched files), or else joined again
    here (Spark broadcasts a small source into it and reads only the target columns the statement uses,
    instead of shuffling every row of the files). The inserts are the source rows that joined no target
    row: with ``kept``, an anti join on ``source_row_id`` (the source's row id, the same in every scan
    of a materialized source), else an anti join with the target rows the join found (small, so
    broadcast too) rather than with every row of the files. ``source`` counts the rows of the second
    scan where the join reads it; the inserts read ``uncounted_source``, so that no row counts twice.
    """
    joined: DataFrame | None = None
    if kept is None:
        target = scan_for_join(spark, snapshot, removes, row_tracking=tracking)
        joined = target.matches(source, source_alias=plan.source_alias, target_alias=plan.target_alias,
                                condition=plan.condition, broadcast_source=broadcast_source)  # fmt: skip
        output = _matched_changes(joined, snapshot=snapshot, plan=plan, constraints=constraints,
                                  tracking=tracking, source_row_id=None, extra=())  # fmt: skip
    else:
        output = kept
    if deduplicate_deletes:
        output = first_match_per_target_row(output)
    if tracking is not None:
        output = with_materialized_columns(output, tracking, action_column=ACTION_COLUMN)
    # Matched rows no clause changes stay in their files: neither written nor handed to Python.
    output = output.filter(F.col(ACTION_COLUMN) != int(Action.COPY))
    if not plan.clauses_of("not_matched"):
        return output
    if joined is None:
        if kept is None or source_row_id is None:
            raise ValueError("merge-on-read's kept rows need the source's row id to find the inserts")
        unmatched = uncounted_source.join(kept.select(source_row_id), source_row_id, "left_anti")
        inserted = insert_only_output(unmatched, None, plan=plan.only_inserts(), constraints=constraints)
    else:
        # Every target row some source row matches is in `joined`: the touched files are all with a match.
        matched_targets = joined.select(*[F.col(quoted_path((plan.target_alias, f.name)))
                                          for f in snapshot.schema.fields])  # fmt: skip
        inserted = insert_only_output(uncounted_source, matched_targets, plan=plan.only_inserts(),
                                      constraints=constraints)  # fmt: skip
    output = output.unionByName(inserted, allowMissingColumns=True)
    if not snapshot.partition_columns:
        # The union has both sides' partitions, each writing its own file: let AQE size the
        # (changed rows only) output instead, as the writer does for partitioned tables.
        output = output.hint("rebalance")
    return output

def classic_merge(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    candidates: list[LiveFile], constraints: TableConstraints, target_file_size: int, dry_run: bool,
    broadcast_source: bool = False, source_row_id: str | None = None, joinable: list[LiveFile] | None = None,
) -> MergeOutcome:
    """Rewrite (or mark rows of) the touched files and write the inserts (:param joinable: the candidates
    the source's keys may match, default all: the join reads only these)."""
    joinable = candidates if joinable is None else joinable
    by_key = {snapshot.file_key(f): f for f in candidates}
    started = time.monotonic()
    # Merge-on-read without NOT MATCHED BY SOURCE clauses changes only target rows the source matches:
    # the rows this scan joins are all it needs of the target, with the stable row ids of row tracking.
    # Its inserts are the source rows that joined nothing, found by the source's row id.
    may_copy = not dry_run and copies_by_position(spark, candidates, constraints)
    keep_joined = source_row_id is not None and not plan.clauses_of("not_matched_by_source") and (
        writes_deletion_vectors(spark, snapshot) or may_copy)  # fmt: skip
    tracking = row_tracking(snapshot) if keep_joined else None
    tracking = tracking if tracking is not None and tracking.preserves else None
    keep = partial(_matched_changes, snapshot=snapshot, plan=plan, constraints=constraints, tracking=tracking,
                   source_row_id=source_row_id) if keep_joined else None  # fmt: skip
    with stage("MERGE operation - scanning files for matches"):
        if joinable:
            candidate_rows = scan_for_join(spark, snapshot, joinable, row_tracking=tracking)
            touched = find_touched_files(
                source, candidate_rows, plan=plan, all_candidate_keys=list(by_key),
                broadcast_source=broadcast_source, keep=keep,
            )  # fmt: skip
        else:
            # An empty join side would let Spark skip the source scan, so count the source directly.
            touched = TouchedFiles(frozenset(), 0, source.count())
    try:
        return _classic_merge_of_touched(
            spark, source, snapshot=snapshot, plan=plan, candidates=candidates, constraints=constraints,
            target_file_size=target_file_size, dry_run=dry_run, broadcast_source=broadcast_source,
            touched=touched, scan_ms=elapsed_ms(started), source_row_id=source_row_id,
        )
    finally:
        touched.release()

def _classic_merge_of_touched(
    spark: SparkSession, source: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    candidates: list[LiveFile], constraints: TableConstraints, target_file_size: int, dry_run: bool,
    broadcast_source: bool, touched: TouchedFiles, scan_ms: int, source_row_id: str | None,
) -> MergeOutcome:
    """:func:`classic_merge` once the touched files are known (``source_row_id``: the source's row id
    column, or None)."""
    by_key = {snapshot.file_key(f): f for f in candidates}
    unknown = sorted(touched.file_keys - by_key.keys())
    if unknown:
        raise MergeExecutionError(
            f"The scan for matches named target files that are not among the {len(by_key)} candidate files "
            f"(first: {unknown[0]!r}); nothing was written. This is a bug of the merge job: please report it."
        )
    removes = tuple(by_key[k] for k in sorted(touched.file_keys))
    check_writable(snapshot, removes_files=bool(removes))
    log.info("%d of %d candidate files touched", len(removes), len(candidates))
    started = time.monotonic()
    # The kept rows are the second scan of a materialized source: its rows are the first scan's. Any
    # materialized source reads the same rows twice: counting it again could only count a join that reads
    # its source side twice (a nested-loop outer join) twice over.
    kept = touched.kept_rows
    recount = kept is None and source_row_id is None
    uncounted_source = source
    if recount:
        source, second_scan_rows = counted(source, "merge_source_rows_second_scan")
    # Delta's deduplicateCDFDeletes: with the change data feed, a target row deleted by several matches
    # is deleted once; without it, the counts are compensated below.
    change_data = bool(removes) and change_data_feed_enabled(snapshot)
    deduplicate = change_data and touched.extra_matches > 0
    # Row tracking enabled: updated and copied rows keep their stable row ids (and copies their versions).
    tracking = row_tracking(snapshot)
    hidden = tracking.materialized_columns if tracking is not None and removes else ()
    # Merge-on-read: changed rows are marked in deletion vectors, copies stay in their files.
    marking = bool(removes) and writes_deletion_vectors(spark, snapshot)
    # Copy-on-write without NOT MATCHED BY SOURCE clauses: the changed rows are found as merge-on-read
    # marks them, then every other row of the touched files is copied by position, out of the JVM.
    copying = bool(removes) and not (marking or dry_run or plan.clauses_of("not_matched_by_source")) and (
        copies_by_position(spark, removes, constraints))  # fmt: skip
    carried = (ROW_ID_COLUMN, ROW_COMMIT_VERSION_COLUMN) if hidden else ()
    if (marking or copying) and not plan.clauses_of("not_matched_by_source"):
        output = _marked_rows_and_inserts(
            spark, source, uncounted_source, snapshot=snapshot, plan=plan, removes=removes,
            tracking=tracking if hidden else None, constraints=constraints, deduplicate_deletes=deduplicate,
            broadcast_source=broadcast_source, kept=kept, source_row_id=source_row_id,
        )
    elif removes:
        target = scan_files(spark, snapshot, removes, row_tracking=tracking,
                            with_file_key=marking, with_row_index=marking)  # fmt: skip
        output = classic_output(source, target, plan=plan,
                                copy_values=plan.copy_values, constraints=constraints,
                                change_data=change_data, deduplicate_deletes=deduplicate,
                                carried=carried + ((FILE_KEY_COLUMN, ROW_INDEX_COLUMN) if marking else ()))
        if tracking is not None and hidden:
            output = with_materialized_columns(output, tracking, action_column=ACTION_COLUMN)
        if marking:
            # Copied rows (matched rows no clause changes, and unmatched ones NOT MATCHED BY SOURCE
            # clauses leave) are neither written nor handed to Python: filtered in the JVM.
            output = output.filter(F.col(ACTION_COLUMN) != int(Action.COPY))
    elif plan.clauses_of("not_matched"):
        # Nothing matched: like Delta's writeInsertsOnlyWhenNoMatches, only the inserts are written.
        output = insert_only_output(source, None, plan=plan.only_inserts(), constraints=constraints)
    else:
        output = None
    counts: dict[int, int] = {}
    adds: tuple[WrittenFile, ...] = ()
    change_files: tuple[WrittenFile, ...] = ()
    marks: Mapping[str, BitMap64] = {}
    if output is not None:
        description = (f"MERGE operation - writing changed rows of {len(removes)} files with deletion vectors"
                       if marking else f"MERGE operation - writing changed rows of {len(removes)} files"
                       if copying else f"MERGE operation - Rewriting {len(removes)} files")  # fmt: skip
        counts, adds, change_files, marks = write_output(
            spark, output, snapshot=snapshot, plan=plan, target_file_size=target_file_size, dry_run=dry_run,
            description=description, change_data=change_data, hidden=hidden, marking=marking or copying,
        )
    if copying:
        with stage(f"MERGE operation - copying unchanged rows of {len(removes)} files"):
            copies = copy_unchanged_rows(
                spark, snapshot, removes, marks, schema=plan.final_schema, hidden_columns=hidden,
                target_file_size=target_file_size, num_indexed_cols=_num_indexed_cols(snapshot),
            )
        adds = tuple(sorted(adds + copies.files, key=lambda f: f.path))
        counts = {**counts, int(Action.COPY): counts.get(int(Action.COPY), 0) + copies.rows}
    readds: tuple[LiveFile, ...] = ()
    dv_metrics: dict[str, int] = {}
    if marking and not dry_run:
        updates = mark_rows(snapshot, removes, marks)
        touched_count = len(removes)
        removes, readds = updates.removes, updates.readds
        dv_metrics = {
            "numTargetDeletionVectorsAdded": updates.deletion_vectors_added,
            "numTargetDeletionVectorsUpdated": updates.deletion_vectors_updated,
            "numTargetDeletionVectorsRemoved": updates.deletion_vectors_removed,
        }
        log.info("%d of %d touched files got deletion vectors, %d were emptied", len(readds), touched_count,
                 len(updates.fully_removed))  # fmt: skip
    if change_data and not dry_run and not change_files and removes:
        # Every row of the touched files was copied. Delta commits no cdc action then, and readers take a
        # version without one as the deletes of its removes and the inserts of its adds: the copies would
        # read as changes. A change data file without rows says that nothing changed.
        change_files = (write_empty_change_file(
            table_root=snapshot.table_uri, schema=plan.final_schema,
            partition_columns=snapshot.partition_columns, partition_values=removes[0].partition_values,
            column_mapping_mode=snapshot.column_mapping_mode,
            storage_options=snapshot.storage_options,
            materialize_partition_columns=materializes_partition_columns(snapshot),
        ),)
    if touched.extra_matches and not deduplicate:
        # Only a single unconditional DELETE allows multiple matches: the rewrite joined each deleted target
        # row once per matching source row. Count target rows, as Delta does (its delete-only compensation).
        deleted = int(Action.DELETE_MATCHED)
        counts = {**counts, deleted: counts.get(deleted, 0) - touched.extra_matches}
    second_scan = second_scan_rows() if output is not None and recount else touched.num_source_rows
    # With deletion vectors, Delta counts as removed only the files no row of which is left.
    still_live = {f.path for f in readds}
    emptied = tuple(f for f in removes if f.path not in still_live)
    values: dict[str, Any] = {
        **row_metrics(counts), **file_metrics(snapshot, candidates, emptied, adds, change_files),
        **dv_metrics,
        "numSourceRows": touched.num_source_rows, "numSourceRowsInSecondScan": second_scan,
        "scanTimeMs": scan_ms, "rewriteTimeMs": elapsed_ms(started),
    }
    return MergeOutcome(MergeMetrics(**values), removes, adds, tuple(candidates), change_files, readds)
