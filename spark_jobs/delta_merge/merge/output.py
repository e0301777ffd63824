"""Writing a merge's output rows (or, in a dry run, only counting them) inside the merge's stage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.errors import ConstraintViolationError, spark_failure
from spark_jobs.delta_merge.merge.rewrite import (
    ACTION_COLUMN,
    CHANGE_TYPES,
    DROPPED_ACTIONS,
    MARKED_ACTIONS,
    PREIMAGE_CHANGE_TYPES,
    PREIMAGE_PREFIX,
    VIOLATION_COLUMN,
)
from spark_jobs.delta_merge.protocol.files import WrittenFile
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
from spark_jobs.delta_merge.protocol.table_features import materializes_partition_columns
from spark_jobs.delta_merge.scan.table_scan import (
    FILE_KEY_COLUMN,
    ROW_INDEX_COLUMN,
)
from spark_jobs.delta_merge.stage_timing import stage
from spark_jobs.delta_merge.write.merge_output import (
    MergeOutputPlan,
    write_merge_output,
)

__all__ = ["count_rows", "write_output"]


def count_rows(output: DataFrame) -> dict[int, int]:
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

def write_output(
    spark: SparkSession, output: DataFrame, *, snapshot: TargetSnapshot, plan: MergePlan,
    target_file_size: int, dry_run: bool, description: str, change_data: bool = False,
    hidden: tuple[str, ...] = (), marking: bool = False,
) -> tuple[dict[int, int], tuple[WrittenFile, ...], tuple[WrittenFile, ...], Mapping[str, BitMap64]]:
    """Write the output; with ``change_data``, also its change rows (``output`` carries preimages);
    ``hidden`` columns (long) are written to the data files after the table's. With ``marking``, the
    target rows updated or deleted are marked (``output`` carries their file and row index) and come back
    by file key, for deletion vectors."""
    with stage(description):
        if dry_run:
            return count_rows(output), (), (), {}
        changes: dict[str, Any] = {}
        if change_data:
            changes = {
                "change_types": {int(a): t for a, t in CHANGE_TYPES.items()},
                "preimage_change_types": {int(a): t for a, t in PREIMAGE_CHANGE_TYPES.items()},
                "preimage_columns": [f"{PREIMAGE_PREFIX}{i}" for i in range(len(plan.final_schema.fields))],
            }
        outcome = write_merge_output(output, MergeOutputPlan(
            table_root=snapshot.table_uri,
            schema=StructType(plan.final_schema.fields + [StructField(c, LongType()) for c in hidden]),
            partition_columns=snapshot.partition_columns,
            hidden_columns=hidden,
            action_column=ACTION_COLUMN,
            violation_column=VIOLATION_COLUMN,
            drop_codes=[int(a) for a in DROPPED_ACTIONS],
            target_file_size=target_file_size,
            num_indexed_cols=_num_indexed_cols(snapshot),
            column_mapping_mode=snapshot.column_mapping_mode,
            storage_options=snapshot.storage_options,
            mark_codes=[int(a) for a in MARKED_ACTIONS] if marking else (),
            mark_columns=(FILE_KEY_COLUMN, ROW_INDEX_COLUMN) if marking else None,
            materialize_partition_columns=materializes_partition_columns(snapshot),
            **changes,
        ))
    return dict(outcome.rows_by_code), tuple(outcome.files), outcome.change_files, outcome.marks

def _num_indexed_cols(snapshot: TargetSnapshot) -> int:
    return int(snapshot.configuration.get("delta.dataSkippingNumIndexedCols", "32"))
