"""``run_merge``: Delta's MergeIntoCommand.run on Spark, with the log read and committed through deltalake."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.delta_merge.analysis import MergePlan, resolve_merge
from spark_jobs.delta_merge.column_mapping import map_new_fields, mapping_mode, max_column_id_update
from spark_jobs.delta_merge.commit import plan_commit
from spark_jobs.delta_merge.conflicts import ReadSet
from spark_jobs.delta_merge.data_skipping import prune_files
from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.executor import MergeOutcome, execute_merge
from spark_jobs.delta_merge.expectations import check_expectations
from spark_jobs.delta_merge.files import LiveFile
from spark_jobs.delta_merge.idempotency import applied_metrics
from spark_jobs.delta_merge.identity_columns import with_moved_high_water_marks
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.snapshot import TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.source import (
    MATERIALIZE_MAX_ATTEMPTS,
    MaterializedSourceLostError,
    materialize_source,
    read_source,
    read_statement_source,
    storage_level_for_attempt,
)
from spark_jobs.delta_merge.spark_statement import check_with_spark_parser
from spark_jobs.delta_merge.spec import MergeSpec, ParsedMerge
from spark_jobs.delta_merge.transaction import commit_serializably

__all__ = ["run_merge", "session_confs"]

log = logging.getLogger("delta_merge")

_DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """Set session confs for the merge and restore the caller's values afterwards."""
    previous = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _merge_confs(spark: SparkSession, spec: MergeSpec) -> dict[str, str]:
    partitions = spec.options.shuffle_partitions or max(2, spark.sparkContext.defaultParallelism)
    confs = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": "true",
        # Many explicit file paths must not trigger a parallel listing job.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
        "spark.sql.ansi.enabled": "false" if spec.options.store_assignment_policy == "LEGACY" else "true",
        "spark.sql.storeAssignmentPolicy": spec.options.store_assignment_policy,
        # Column mapping's id mode: files are read by Parquet field id (column_mapping.physical_read_schema
        # asks for ids only in that mode; without ids in the read schema, Spark matches names as before).
        "spark.sql.parquet.fieldId.read.enabled": "true",
    }
    return confs


def _operation_parameters(plan: MergePlan) -> dict[str, str]:
    """operationParameters shaped as Delta records a MERGE (values are JSON strings)."""

    def predicates(when: str) -> str:
        items = []
        for clause in plan.parsed.clauses_of(when):  # type: ignore[arg-type]
            item: dict[str, str] = {"actionType": clause.action.replace("_all", "")}
            if clause.condition is not None:
                item = {"predicate": clause.condition, **item}
            items.append(item)
        return _compact_json(items)

    return {
        "predicate": _compact_json([plan.parsed.condition]),
        "matchedPredicates": predicates("matched"),
        "notMatchedPredicates": predicates("not_matched"),
        "notMatchedBySourcePredicates": predicates("not_matched_by_source"),
    }


def _compact_json(value: object) -> str:
    # Delta (Jackson) writes these without spaces: '[{"actionType":"update"}]'.
    return json.dumps(value, separators=(",", ":"))


def _target_file_size(spec: MergeSpec, snapshot: TargetSnapshot) -> int:
    if spec.options.target_file_size:
        return spec.options.target_file_size
    configured = snapshot.configuration.get("delta.targetFileSize")
    return int(configured) if configured else _DEFAULT_TARGET_FILE_SIZE


def run_merge(spark: SparkSession, spec: MergeSpec | Mapping[str, Any]) -> MergeMetrics:
    """Run one merge and return its metrics (committed, or only computed with ``options.dry_run``).

    The steps of MergeIntoCommand.run: pin the target snapshot, resolve the statement, prepare
    (materialize) the source, find the touched files and rewrite them (or only append inserts), then
    commit one version. Any failure before the commit leaves the table as it was. When blocks of the
    materialized source are lost, the whole merge runs again with a more durable storage level, as
    Delta's runWithMaterializedSourceLostRetries does (at most ``MATERIALIZE_MAX_ATTEMPTS`` runs).
    """
    if not isinstance(spec, MergeSpec):
        spec = MergeSpec.from_dict(spec)
    parsed = spec.validate()
    if spec.merge_sql is not None:
        check_with_spark_parser(spark, spec.merge_sql, parsed)
    if parsed.schema_evolution and not spec.options.schema_evolution:
        # MERGE WITH SCHEMA EVOLUTION turns evolution on for this statement, as in Delta.
        spec = replace(spec, options=replace(spec.options, schema_evolution=True))
    started = time.monotonic()
    applied = applied_metrics(spec)
    if applied is not None:
        log.info("MERGE skipped: app transaction %s v%s is already in the log (version %d)",
                 spec.run.app_id, spec.run.app_version, applied.tableVersion)
        return applied
    with session_confs(spark, _merge_confs(spark, spec)):
        for attempt in range(1, MATERIALIZE_MAX_ATTEMPTS + 1):
            try:
                return _run_attempt(spark, spec, parsed, started=started, attempt=attempt)
            except MaterializedSourceLostError as lost:
                if attempt == MATERIALIZE_MAX_ATTEMPTS:
                    raise MergeExecutionError(
                        f"The materialized merge source lost blocks in each of {attempt} attempts "
                        f"(last: {lost}). Check for executors being lost or decommissioned; a replicated "
                        "options.materialize_storage_level or a pinned Delta source (which needs no "
                        "materialization) avoids this."
                    ) from lost
                log.warning(
                    "MERGE retry %d of %d: %s Running the merge again with storage level %s.",
                    attempt + 1, MATERIALIZE_MAX_ATTEMPTS, lost,
                    storage_level_for_attempt(spec.options.materialize_storage_level, attempt + 1),
                )
    raise AssertionError("unreachable")  # the loop returns or raises


def _run_attempt(
    spark: SparkSession, spec: MergeSpec, parsed: ParsedMerge, *, started: float, attempt: int
) -> MergeMetrics:
    """One run of the merge from its snapshot to its commit."""
    snapshot = load_snapshot(spec.target.uri, storage_options=dict(spec.target.storage_options))
    log.info(
        "MERGE into %s at version %d (%d files)", spec.target.uri, snapshot.version, len(snapshot.files)
    )
    source_read = read_source(spark, spec.source)
    if parsed.source_query is not None:
        source_read = read_statement_source(spark, source_read, parsed.source_query)
    plan = resolve_merge(
        spark, parsed, target_schema=snapshot.schema, source_schema=source_read.df.schema,
        options=spec.options,
    )
    # New columns of a column-mapped table need their physical names before anything is written.
    mapped = map_new_fields(snapshot.configuration, snapshot.schema, plan.final_schema)
    plan = replace(plan, final_schema=mapped)
    source = materialize_source(
        source_read, columns=plan.source_columns, options=spec.options, insert_only=parsed.is_insert_only,
        attempt=attempt,
    )
    log.info("source prepared: materialized=%s (%s)%s", source.materialized, source.reason,
             f", storage level {source.storage_level}" if source.materialized else "")
    try:
        outcome = execute_merge(
            spark, source.df, snapshot=snapshot, plan=plan,
            target_file_size=_target_file_size(spec, snapshot), dry_run=spec.options.dry_run,
        )
    except Exception as exc:
        source.raise_if_blocks_lost(exc)
        raise
    finally:
        source.release()
    metrics = outcome.metrics.with_values(
        materializeSourceReason=source.reason,
        materializeSourceTimeMs=source.materialize_time_ms,
        readVersion=snapshot.version,
        executionTimeMs=int((time.monotonic() - started) * 1000),
    )
    if not parsed.is_insert_only and metrics.numSourceRowsInSecondScan != metrics.numSourceRows:
        # Delta's best-effort check (it fails only under merge.failIfSourceChanged, off by default).
        log.warning("the source had %d rows in the first scan but %d in the second: it changed between "
                    "the scans (materialized: %s)", metrics.numSourceRows, metrics.numSourceRowsInSecondScan,
                    source.materialized)
    check_expectations(metrics.to_dict(), spec.expected_metrics)
    if spec.options.dry_run:
        return metrics.with_values(dryRun=True, tableVersion=snapshot.version)
    return _commit(spark, spec, snapshot, plan, outcome, metrics)


def _commit(
    spark: SparkSession, spec: MergeSpec, snapshot: TargetSnapshot, plan: MergePlan, outcome: MergeOutcome,
    metrics: MergeMetrics,
) -> MergeMetrics:
    """Commit under Delta's conflict rules; a concurrent commit of the same app transaction wins."""
    # Moved identity high-water marks are a schema change committed with the data, as in Delta.
    final_schema = with_moved_high_water_marks(
        plan.final_schema, plan.tracked_identity, outcome.adds, table_uri=snapshot.table_uri,
        column_mapping_mode=mapping_mode(snapshot.configuration),
    )
    commit_plan = plan_commit(
        snapshot,
        removes=outcome.removes,
        adds=outcome.adds,
        change_files=outcome.change_files,
        new_schema=final_schema if final_schema != plan.target_schema else None,
        configuration_updates=max_column_id_update(snapshot.configuration, final_schema),
        operation_parameters=_operation_parameters(plan),
        operation_metrics=metrics.operation_metrics(),
        app_transaction=_app_transaction(spec),
        commit_metadata={
            "materializeSourceReason": metrics.materializeSourceReason, **spec.run.commit_metadata
        },
    )
    read = ReadSet(
        # Without target-only predicates (or with NOT MATCHED BY SOURCE) the merge read every file.
        whole_table=not plan.target_only_predicates,
        read_paths=frozenset(f.path for f in outcome.read),
        removed_paths=frozenset(f.path for f in outcome.removes),
        app_id=spec.run.app_id,
        app_version=spec.run.app_version,
        token=commit_plan.token,
        serializable=snapshot.configuration.get("delta.isolationLevel") == "Serializable",
    )

    def matches_read(files: Sequence[LiveFile]) -> bool:
        return bool(prune_files(spark, snapshot, files, predicates=plan.target_only_predicates,
                                target_alias=plan.target_alias))

    log.info("committing: %d files removed, %d added, read version %d",
             len(outcome.removes), len(outcome.adds), snapshot.version)
    landed = commit_serializably(
        commit_plan, read, matches_read=matches_read, storage_options=dict(spec.target.storage_options)
    )
    if landed.already_applied:
        log.info("MERGE not applied again: version %d already applied this app transaction", landed.version)
        return MergeMetrics.from_commit(landed.version, landed.commit_info).with_values(skipped=True)
    log.info("MERGE committed version %d", landed.version)
    return metrics.with_values(tableVersion=landed.version)


def _app_transaction(spec: MergeSpec) -> tuple[str, int] | None:
    if spec.run.app_id is None or spec.run.app_version is None:
        return None
    return spec.run.app_id, spec.run.app_version
