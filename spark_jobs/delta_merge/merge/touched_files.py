"""Find the target files a merge must rewrite: one inner join of source and candidate rows.

A broadcast source joins each target row in the task that reads it, so every pair of a target row is in
that task: each task counts its pairs per target row and per file (pyarrow's group_by in the task), and the
driver adds up the few per-file rows. That is one Spark job after the broadcast, where grouping the pairs
by target row with Spark's own aggregation shuffles them first (two more jobs under adaptive execution).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
from spark_jobs.delta_merge.errors import MultipleSourceRowMatchesError, spark_failure
from spark_jobs.delta_merge.merge.row_counter import counted
from spark_jobs.delta_merge.scan.table_scan import FILE_KEY_COLUMN, ROW_INDEX_COLUMN, JoinScan
from spark_jobs.delta_merge.spark_confs import session_confs

__all__ = [
    "ACTS_COLUMN", "MULTIPLE_MATCHES_MESSAGE", "TouchedFiles", "count_pairs_per_file", "find_touched_files",
]

# On every joined row: 1 when some MATCHED clause may act on it (its file is touched), else 0.
ACTS_COLUMN = "__merge_acts"

MULTIPLE_MATCHES_MESSAGE = (
    "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row in "
    "the Delta table in possibly conflicting ways. By SQL semantics of Merge, when multiple source rows "
    "match on the same target row, the result may be ambiguous as it is unclear which source row should "
    "be used to update or delete the matching target row. You can preprocess the source table to "
    "eliminate the possibility of multiple matches. Please refer to "
    "https://docs.delta.io/latest/delta-update.html#upsert-into-a-table-using-merge"
)


@dataclass(frozen=True)
class TouchedFiles:
    """What the scan found: touched file keys, matched target rows, and the source row count.

    :param extra_matches: joined (source, target) pairs beyond one per matched target row; non-zero
        only when multiple matches are allowed (a single unconditional DELETE).
    :param kept_rows: with ``keep``, what it made of the joined rows, kept until :meth:`release`.
    """

    file_keys: frozenset[str]
    matched_target_rows: int
    num_source_rows: int
    extra_matches: int = 0
    kept_rows: DataFrame | None = None

    def release(self) -> None:
        """Drop the kept rows (:func:`find_touched_files`'s ``keep``)."""
        if self.kept_rows is not None:
            self.kept_rows.unpersist()


def _matched_predicate(plan: MergePlan) -> str:
    """For matched-only merges, only joined rows some MATCHED clause acts on touch a file.

    The multiple-match check still counts every joined row, whatever the clause conditions (Delta).
    """
    if not plan.parsed.is_matched_only:
        return "true"
    conditions = [c.condition for c in plan.clauses_of("matched")]
    if any(c is None for c in conditions):
        return "true"
    return " OR ".join(f"({c})" for c in conditions)


def find_touched_files(
    source: DataFrame, target: JoinScan, *, plan: MergePlan, all_candidate_keys: Sequence[str],
    broadcast_source: bool = False, keep: Callable[[DataFrame], DataFrame] | None = None,
) -> TouchedFiles:
    """Join the source with the candidate target rows (broadcasting the source when
    ``broadcast_source``); a target row is its (file, row index).

    :param keep: what to keep (in memory, spilling to disk) of the joined rows, computed from them
        in the same pass: each of its rows must carry :data:`FILE_KEY_COLUMN`, :data:`ROW_INDEX_COLUMN`
        and :data:`ACTS_COLUMN` of a joined row. Merge-on-read without NOT MATCHED BY SOURCE clauses
        needs nothing else of the target, so the touched files are not scanned a second time; Spark
        reads only the target columns ``keep`` uses.

    Raises :class:`MultipleSourceRowMatchesError` when a target row is matched by two or more source
    rows, unless the only MATCHED clause is an unconditional DELETE. With NOT MATCHED BY SOURCE
    clauses every candidate file is touched, since unmatched target rows may change too.
    """
    source, source_rows = counted(source, "merge_source_rows")
    joined = target.matches(source, source_alias=plan.source_alias, target_alias=plan.target_alias,
                            condition=plan.condition, broadcast_source=broadcast_source)  # fmt: skip
    acts = F.coalesce(F.expr(_matched_predicate(plan)), F.lit(False)).cast("int")
    joined = joined.withColumn(ACTS_COLUMN, acts)
    kept = keep(joined).persist(StorageLevel.MEMORY_AND_DISK) if keep is not None else None
    pairs = (joined if kept is None else kept).select(FILE_KEY_COLUMN, ROW_INDEX_COLUMN, ACTS_COLUMN)
    try:
        return _touched(pairs, source_rows, plan=plan, all_candidate_keys=all_candidate_keys, kept_rows=kept,
                        pairs_in_one_task=broadcast_source)
    except Exception as exc:
        if kept is not None:
            kept.unpersist()
        failure = spark_failure(exc)
        if failure is None:
            raise
        if kept is not None:
            # Delta finds the touched files before it computes any clause's output: a target row matched by
            # several source rows is the error to report, even where an output fails too.
            pairs = joined.select(FILE_KEY_COLUMN, ROW_INDEX_COLUMN, ACTS_COLUMN)
            try:
                _touched(pairs, source_rows, plan=plan, all_candidate_keys=all_candidate_keys, kept_rows=None,
                         pairs_in_one_task=broadcast_source)
            except Exception as first:
                earlier = spark_failure(first)
                if earlier is None:
                    raise
                raise earlier from first
        raise failure from exc
    except BaseException:
        if kept is not None:
            kept.unpersist()
        raise


_PER_FILE_SCHEMA = pa.schema([
    (FILE_KEY_COLUMN, pa.string()), ("max_matches", pa.int64()), ("rows", pa.int64()), ("acts", pa.int32()),
    ("extra_matches", pa.int64()),
])  # fmt: skip
_PER_FILE_DDL = f"`{FILE_KEY_COLUMN}` string, max_matches long, rows long, acts int, extra_matches long"


def count_pairs_per_file(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark task (``mapInArrow`` over (file key, row index, acts) pairs holding every pair of their
    target rows): per file, the most pairs of one target row, its matched target rows, whether a MATCHED
    clause may act on one, and the pairs beyond one per target row."""
    received = [batch for batch in batches if batch.num_rows]
    if not received:
        return
    pairs = pa.Table.from_batches(received)
    per_row = pairs.group_by([FILE_KEY_COLUMN, ROW_INDEX_COLUMN], use_threads=False).aggregate(
        [(ACTS_COLUMN, "count"), (ACTS_COLUMN, "max")]
    )
    per_file = per_row.group_by(FILE_KEY_COLUMN, use_threads=False).aggregate([
        (f"{ACTS_COLUMN}_count", "max"), (f"{ACTS_COLUMN}_count", "count"), (f"{ACTS_COLUMN}_max", "max"),
        (f"{ACTS_COLUMN}_count", "sum"),
    ])  # fmt: skip
    rows = per_file[f"{ACTS_COLUMN}_count_count"]
    yield from pa.Table.from_arrays([
        per_file[FILE_KEY_COLUMN], per_file[f"{ACTS_COLUMN}_count_max"], rows,
        per_file[f"{ACTS_COLUMN}_max_max"].cast(pa.int32()),
        pc.subtract(per_file[f"{ACTS_COLUMN}_count_sum"], rows),
    ], schema=_PER_FILE_SCHEMA).to_batches()  # fmt: skip


@dataclass(frozen=True)
class _FileMatches:
    """One file's joined pairs: the most of one target row, its target rows with a pair, whether a MATCHED
    clause may act on one, and the pairs beyond one per target row."""

    file_key: str
    max_matches: int
    rows: int
    acts: bool
    extra_matches: int


def _per_file_in_tasks(pairs: DataFrame) -> list[_FileMatches]:
    """The per-file counts of pairs whose target rows each lie in one task, added up across tasks."""
    totals: dict[str, _FileMatches] = {}
    # Nothing in this query is shuffled, so adaptive execution has nothing to adapt; without it, rows kept
    # in memory (merge-on-read's ``keep``) are cached by the same job instead of a job of their own.
    with session_confs(pairs.sparkSession, {"spark.sql.adaptive.enabled": "false"}):
        parts = pairs.mapInArrow(count_pairs_per_file, _PER_FILE_DDL).collect()
    for part in parts:
        key = part[FILE_KEY_COLUMN]
        before = totals.get(key, _FileMatches(key, 0, 0, False, 0))
        totals[key] = _FileMatches(
            key, max(before.max_matches, part["max_matches"]), before.rows + part["rows"],
            before.acts or bool(part["acts"]), before.extra_matches + part["extra_matches"],
        )
    return list(totals.values())


def _per_file_shuffled(pairs: DataFrame) -> list[_FileMatches]:
    """The per-file counts of pairs wherever they are: grouped by target row with Spark's aggregation."""
    # Both aggregations group by the file first: shuffled once by the file key, each runs within its
    # partition (Spark's planner sees the partitioning satisfies both), one Spark job less than two shuffles.
    per_row = pairs.repartition(FILE_KEY_COLUMN).groupBy(FILE_KEY_COLUMN, ROW_INDEX_COLUMN).agg(
        F.count(F.lit(1)).alias("matches"), F.max(ACTS_COLUMN).alias("acts")
    )
    per_file = per_row.groupBy(FILE_KEY_COLUMN).agg(
        F.max("matches").alias("max_matches"), F.count(F.lit(1)).alias("rows"), F.max("acts").alias("acts"),
        F.sum(F.col("matches") - 1).alias("extra_matches"),
    )
    return [
        _FileMatches(r[FILE_KEY_COLUMN], int(r["max_matches"]), int(r["rows"]), bool(r["acts"]),
                     int(r["extra_matches"]))
        for r in per_file.collect()
    ]


def _touched(
    pairs: DataFrame, source_rows: Callable[[], int], *, plan: MergePlan, all_candidate_keys: Sequence[str],
    kept_rows: DataFrame | None, pairs_in_one_task: bool = False,
) -> TouchedFiles:
    found = _per_file_in_tasks(pairs) if pairs_in_one_task else _per_file_shuffled(pairs)
    num_source_rows = source_rows()
    if any(f.max_matches > 1 for f in found) and not plan.parsed.is_only_one_unconditional_delete:
        raise MultipleSourceRowMatchesError(
            MULTIPLE_MATCHES_MESSAGE, error_class="DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE"
        )
    keys = frozenset(f.file_key for f in found if f.acts)
    if plan.clauses_of("not_matched_by_source"):
        keys = frozenset(all_candidate_keys)
    return TouchedFiles(
        file_keys=keys,
        matched_target_rows=sum(f.rows for f in found),
        num_source_rows=num_source_rows,
        extra_matches=sum(f.extra_matches for f in found),
        kept_rows=kept_rows,
    )
