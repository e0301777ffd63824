"""Delta's own MERGE as the reference: a MERGE scenario run through Delta's ``MERGE INTO`` (delta-spark, in a
session with Delta's extension and catalog: tests/support/delta_spark.py), its outcome in the terms the
job's outcome is compared in (rows, error condition, version, the commit's ``operationMetrics``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.delta_reader import read_rows, read_table_columns, table_version
from tests.support.scenario_harness import dataframe, multiset, session_confs

__all__ = [
    "JOB_ONLY_METRICS", "TIME_METRICS", "delta_history_metrics", "delta_merge_outcome",
    "delta_scenario_outcome",
]  # fmt: skip

# Times: what two runs of one merge differ in, whichever engine.
TIME_METRICS = {"executionTimeMs", "scanTimeMs", "rewriteTimeMs", "materializeSourceTimeMs", "stageTimesMs"}
# What the job reports of a merge and Delta 4.4 does not record in the commit: the job's own (the
# materialization's reason, the versions read and committed, the stages' times), and the metrics of
# Delta's metric table (MergeIntoCommandBase) that Delta computes but leaves out of operationMetrics
# (DeltaOperationMetrics.MERGE lists which it records).
JOB_ONLY_METRICS = {
    "materializeSourceReason", "readVersion", "tableVersion", "stageTimesMs", "skipped", "dryRun",
    "numSourceRowsInSecondScan", "numTargetFilesBeforeSkipping", "numTargetFilesAfterSkipping",
    "numTargetBytesBeforeSkipping", "numTargetBytesAfterSkipping", "numTargetPartitionsAfterSkipping",
    "numTargetPartitionsRemovedFrom", "numTargetPartitionsAddedTo", "numTargetChangeFileBytes",
}  # fmt: skip


def delta_history_metrics(spark: Any, table: Path) -> dict[str, int]:
    """The last commit's ``operationMetrics`` as Delta's ``DESCRIBE HISTORY`` shows them, as ints."""
    last = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]
    return {name: int(value) for name, value in (last["operationMetrics"] or {}).items()}


def delta_scenario_outcome(spark: Any, table: Path, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Run the scenario's statement through Delta's MERGE into ``table`` (a copy of its target):
    :func:`delta_merge_outcome` with the scenario's source, confs and expected columns."""
    columns = None
    if "expected_schema" in scenario:
        columns = [f.name for f in spark.createDataFrame([], scenario["expected_schema"]).schema]
    source = dataframe(spark, scenario["source_schema"], scenario["source_rows"])
    confs = {name: str(value) for name, value in scenario.get("conf", {}).items()}
    return delta_merge_outcome(spark, table, scenario["merge_sql"], source, confs=confs, columns=columns)


def delta_merge_outcome(
    spark: Any, table: Path, merge_sql: str, source: Any, *, confs: Mapping[str, str] | None = None,
    columns: list[str] | None = None,
) -> dict[str, Any]:
    """Run ``merge_sql`` (``MERGE INTO target ... USING source ...``) through Delta's MERGE into ``table``
    with ``source`` as the view ``source``: the rows (read by deltalake, as the job's are; in ``columns``'
    order when the table has them), its columns, the commit's metrics and the version, or the error's
    conditions and message with the version after it."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    version_before = table_version(table)
    source.createOrReplaceTempView("source")
    # A table of the session's catalog, not a view over the path: MERGE evolves a table's schema, never a
    # view's. External (LOCATION): dropping it leaves the files.
    spark.sql(f"CREATE TABLE target USING delta LOCATION '{table}'")
    try:
        with session_confs(spark, confs or {}):
            spark.sql(merge_sql).collect()
    except (Py4JJavaError, PySparkException) as error:
        message = str(error)
        # Every condition the error names: a failed write's is [TASK_WRITE_FAILED] around its cause's.
        conditions = set(re.findall(r"\[([A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)?)\]", message))
        # PySpark renders the message of a class Spark's registry lacks as an INTERNAL_ERROR naming it:
        # Delta 4.4's own classes (DELTA_MERGE_UNRESOLVED_EXPRESSION, ...) reach Python that way.
        conditions |= set(re.findall(r"Cannot find main error class '([A-Z][A-Z0-9_.]+)'", message))
        if isinstance(error, PySparkException) and error.getCondition():
            conditions.add(str(error.getCondition()))
        return {"error": (conditions, message), "version": table_version(table)}
    finally:
        spark.catalog.dropTempView("source")
        spark.sql("DROP TABLE IF EXISTS target")
    version = table_version(table)
    metrics = delta_history_metrics(spark, table) if version > version_before else {}
    names = read_table_columns(table)
    if columns is not None and set(columns) <= set(names):
        names = columns
    return {"rows": multiset(read_rows(table, columns=names)), "columns": names, "metrics": metrics,
            "version": version}  # fmt: skip
