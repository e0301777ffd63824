"""The two merge strategies: insert_only_merge (append only) and classic_merge (touched files rewritten)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.errors import ConstraintViolationError, MergeExecutionError, spark_failure
from spark_jobs.delta_merge.merge.copy_by_position import copies_by_position, copy_unchanged_rows
from spark_jobs.delta_merge.merge.deletion_vector_updates import mark_rows, writes_deletion_vectors
from spark_jobs.delta_merge.merge.rewrite import (
    ACTION_COLUMN,
    CHANGE_TYPES,
    DROPPED_ACTIONS,
    MARKED_ACTIONS,
    PREIMAGE_CHANGE_TYPES,
    PREIMAGE_PREFIX,
    VIOLATION_COLUMN,
    Action,
    classic_output,
    first_match_per_target_row,
    insert_only_output,
    matched_output,
    with_materialized_columns,
)
from spark_jobs.delta_merge.merge.row_counter import counted
from spark_jobs.delta_merge.merge.source_key_ranges import joinable_files
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
    table_constraints,
)
from spark_jobs.delta_merge.scan.data_skipping import partition_count, prune_files
from spark_jobs.delta_merge.scan.table_scan import (
    FILE_KEY_COLUMN,
    ROW_INDEX_COLUMN,
    file_key,
    scan_files,
    scan_for_join,
)
from spark_jobs.delta_merge.stage_timing import stage
from spark_jobs.delta_merge.write.merge_output import write_empty_change_file, write_merge_output

__all__ = ["MergeOutcome", "classic_merge", "execute_merge", "insert_only_merge"]

log = logging.getLogger("delta_merge")


@dataclass(frozen=True)
class MergeOutcome:
    """What the merge computed: its metrics and the files to remove and add in the commit
    (``change_files``: the change data files, for ``cdc`` actions; ``readds``: removed files added again
    with a new deletion vector)."""

    metrics: MergeMetrics
    removes: tuple[LiveFile, ...]
    adds: tuple[WrittenFile, ...]
    read: tuple[LiveFile, ...] = ()
    change_files: tuple[WrittenFile, ...] = ()
    readds: tuple[LiveFile, ...] = ()


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _count_rows(output: DataFrame) -> dict[int, int]:
    """Dry run: the rows per action code, computed without writing; a constraint violation still fails."""
    try:
        rows = output.groupBy(ACTION_COLUMN).agg(
            F.count(F.lit(1)).alias("rows"), F.min(VIOLATION_COLUMN).alias("violation")
        ).collect()
    except Exception as exc:
        failure = spark_failure(exc)
        if failure is None:
            raise
        raise failure from exc
    violation = min((r["violation"] for r in rows if r["violation"] is not None), default=None)
    if violation is not None:
        raise ConstraintViolationError.from_text(f"{violation} (found by a dry run; nothing was written)")
    return {int(r[ACTION_COLUMN]): int(r["rows"]) for r in rows}


def _write(
    spark: SparkSession, output: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    target_file_size: int, dry_run: bool, description: str, change_data: bool = False,
    hidden: tuple[str, ...] = (), marking: bool = False,
) -> tuple[dict[int, int], tuple[WrittenFile, ...], tuple[WrittenFile, ...], Mapping[str, BitMap64]]:
    """Write the output; with ``change_data``, also its change rows (``output`` carries preimages);
    ``hidden`` columns (long) are written to the data files after the table's. With ``marking``, the
    target rows updated or deleted are marked (``output`` carries their file and row index) and come back
    by file key, for deletion vectors."""
    with stage(spark, description):
        if dry_run:
            return _count_rows(output), (), (), {}
        changes: dict[str, Any] = {}
        if change_data:
            changes = {
                "change_types": {int(a): t for a, t in CHANGE_TYPES.items()},
                "preimage_change_types": {int(a): t for a, t in PREIMAGE_CHANGE_TYPES.items()},
                "preimage_columns": [f"{PREIMAGE_PREFIX}{i}" for i in range(len(plan.final_schema.fields))],
            }
        outcome = write_merge_output(
            output,
            table_root=snapshot.table_uri,
            schema=StructType(plan.final_schema.fields + [StructField(c, LongType()) for c in hidden]),
            partition_columns=snapshot.partition_columns,
            hidden_columns=hidden,
            action_column=ACTION_COLUMN,
            violation_column=VIOLATION_COLUMN,
            drop_codes=[int(a) for a in DROPPED_ACTIONS],
            target_file_size=target_file_size,
            num_indexed_cols=_num_indexed_cols(snapshot),
            job_description=description,
            column_mapping_mode=snapshot.column_mapping_mode,
            storage_options=snapshot.storage_options,
            mark_codes=[int(a) for a in MARKED_ACTIONS] if marking else (),
            mark_columns=(FILE_KEY_COLUMN, ROW_INDEX_COLUMN) if marking else None,
            **changes,
        )
    return dict(outcome.rows_by_code), tuple(outcome.files), outcome.change_files, outcome.marks


def _num_indexed_cols(snapshot: TargetSnapshot) -> int:
    return int(snapshot.configuration.get("delta.dataSkippingNumIndexedCols", "32"))


def _row_metrics(counts: Mapping[int, int]) -> dict[str, int]:
    def n(action: Action) -> int:
        return int(counts.get(int(action), 0))

    updated_m, updated_s = n(Action.UPDATE_MATCHED), n(Action.UPDATE_NOT_MATCHED_BY_SOURCE)
    deleted_m, deleted_s = n(Action.DELETE_MATCHED), n(Action.DELETE_NOT_MATCHED_BY_SOURCE)
    return {
        "numTargetRowsCopied": n(Action.COPY),
        "numTargetRowsInserted": n(Action.INSERT),
        "numTargetRowsUpdated": updated_m + updated_s,
        "numTargetRowsDeleted": deleted_m + deleted_s,
        "numTargetRowsMatchedUpdated": updated_m,
        "numTargetRowsNotMatchedBySourceUpdated": updated_s,
        "numTargetRowsMatchedDeleted": deleted_m,
        "numTargetRowsNotMatchedBySourceDeleted": deleted_s,
        "numOutputRows": n(Action.COPY) + n(Action.INSERT) + updated_m + updated_s,
    }


def _file_metrics(
    snapshot: TargetSnapshot, candidates: list[LiveFile], removes: tuple[LiveFile, ...],
    adds: tuple[WrittenFile, ...], change_files: tuple[WrittenFile, ...] = (),
) -> dict[str, int]:
    parts = snapshot.partition_columns
    return {
        "numTargetChangeFilesAdded": len(change_files),
        "numTargetChangeFileBytes": sum(f.size for f in change_files),
        "numTargetFilesBeforeSkipping": len(snapshot.files),
        "numTargetBytesBeforeSkipping": sum(f.size for f in snapshot.files),
        "numTargetFilesAfterSkipping": len(candidates),
        "numTargetBytesAfterSkipping": sum(f.size for f in candidates),
        "numTargetPartitionsAfterSkipping": partition_count(candidates, parts),
        "numTargetFilesRemoved": len(removes),
        "numTargetBytesRemoved": sum(f.size for f in removes),
        "numTargetPartitionsRemovedFrom": partition_count(removes, parts),
        "numTargetFilesAdded": len(adds),
        "numTargetBytesAdded": sum(f.size for f in adds),
        "numTargetPartitionsAddedTo": len({tuple(sorted(f.partition_values.items())) for f in adds})
        if parts else 0,
    }


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
    counts, adds, _, _ = _write(
        spark, output, snapshot=snapshot, plan=plan, target_file_size=target_file_size, dry_run=dry_run,
        description="MERGE operation - writing new files for only inserts",
    )
    values: dict[str, Any] = {
        **_row_metrics(counts), **_file_metrics(snapshot, candidates, (), adds),
        "numSourceRows": source_rows(), "rewriteTimeMs": _elapsed_ms(started),
    }
    return MergeOutcome(MergeMetrics(**values), (), adds, tuple(candidates))


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
        quoted = [f.name.replace("`", "``") for f in snapshot.schema.fields]
        matched_targets = joined.select(*[F.col(f"`{plan.target_alias}`.`{c}`") for c in quoted])
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
    by_key = {file_key(snapshot, f): f for f in candidates}
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
    with stage(spark, "MERGE operation - scanning files for matches"):
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
            touched=touched, scan_ms=_elapsed_ms(started), source_row_id=source_row_id,
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
    by_key = {file_key(snapshot, f): f for f in candidates}
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
    # The kept rows are the second scan of a materialized source: its rows are the first scan's.
    kept = touched.kept_rows
    uncounted_source = source
    if kept is None:
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
        counts, adds, change_files, marks = _write(
            spark, output, snapshot=snapshot, plan=plan, target_file_size=target_file_size, dry_run=dry_run,
            description=description, change_data=change_data, hidden=hidden, marking=marking or copying,
        )
    if copying:
        with stage(spark, f"MERGE operation - copying unchanged rows of {len(removes)} files"):
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
        ),)
    if touched.extra_matches and not deduplicate:
        # Only a single unconditional DELETE allows multiple matches: the rewrite joined each deleted target
        # row once per matching source row. Count target rows, as Delta does (its delete-only compensation).
        deleted = int(Action.DELETE_MATCHED)
        counts = {**counts, deleted: counts.get(deleted, 0) - touched.extra_matches}
    second_scan = (second_scan_rows() if output is not None and kept is None
                   else touched.num_source_rows)
    # With deletion vectors, Delta counts as removed only the files no row of which is left.
    still_live = {f.path for f in readds}
    emptied = tuple(f for f in removes if f.path not in still_live)
    values: dict[str, Any] = {
        **_row_metrics(counts), **_file_metrics(snapshot, candidates, emptied, adds, change_files),
        **dv_metrics,
        "numSourceRows": touched.num_source_rows, "numSourceRowsInSecondScan": second_scan,
        "scanTimeMs": scan_ms, "rewriteTimeMs": _elapsed_ms(started),
    }
    return MergeOutcome(MergeMetrics(**values), removes, adds, tuple(candidates), change_files, readds)
