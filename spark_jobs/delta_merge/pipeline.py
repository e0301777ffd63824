"""``run_merge``: Delta's MergeIntoCommand.run on Spark; the log is read through deltalake, committed here."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.delta_merge.analysis.analysis import resolve_merge
from spark_jobs.delta_merge.analysis.spark_statement import check_with_spark_parser
from spark_jobs.delta_merge.commit import applied_metrics, commit_merge
from spark_jobs.delta_merge.delta_engine import run_delta_merge
from spark_jobs.delta_merge.errors import MergeExecutionError
from spark_jobs.delta_merge.expectations import check_expectations
from spark_jobs.delta_merge.merge.execute import execute_merge
from spark_jobs.delta_merge.metrics import MergeMetrics, stage_times
from spark_jobs.delta_merge.protocol.column_mapping import map_new_fields
from spark_jobs.delta_merge.protocol.iceberg_compat import check_iceberg_compat_schema, iceberg_compat_v2
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot, load_snapshot
from spark_jobs.delta_merge.protocol.type_widening import schema_evolution_widening
from spark_jobs.delta_merge.session_facts import default_parallelism
from spark_jobs.delta_merge.source.materialize import (
    MATERIALIZE_MAX_ATTEMPTS,
    MaterializedSourceLostError,
    materialize_source,
    read_source,
    statement_source,
    storage_level_for_attempt,
)
from spark_jobs.delta_merge.spark_confs import session_confs
from spark_jobs.delta_merge.spec import MergeSpec, ParsedMerge
from spark_jobs.delta_merge.stage_timing import measured_merge, stage
from spark_jobs.delta_merge.storage.storage_errors import credentials_named
from spark_jobs.delta_merge.uniform import uniform_iceberg_enabled, write_iceberg_metadata

__all__ = ["run_merge"]

log = logging.getLogger("delta_merge")

_DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024


def _merge_confs(spark: SparkSession, spec: MergeSpec) -> dict[str, str]:
    partitions = spec.options.shuffle_partitions or max(2, default_parallelism(spark))
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


def _target_file_size(spec: MergeSpec, snapshot: TargetSnapshot) -> int:
    if spec.options.target_file_size:
        return spec.options.target_file_size
    configured = snapshot.configuration.get("delta.targetFileSize")
    return int(configured) if configured else _DEFAULT_TARGET_FILE_SIZE


def run_merge(spark: SparkSession, spec: MergeSpec | Mapping[str, Any]) -> MergeMetrics:
    """Run one merge and return its metrics (committed, or only computed with ``options.dry_run``).

    With ``options.engine`` ``delta``, Delta's own MERGE INTO runs it instead (:func:`run_delta_merge`).

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
    if spec.options.engine == "delta":
        return run_delta_merge(spark, spec, parsed)
    if parsed.schema_evolution and not spec.options.schema_evolution:
        # MERGE WITH SCHEMA EVOLUTION turns evolution on for this statement, as in Delta.
        spec = replace(spec, options=replace(spec.options, schema_evolution=True))
    started = time.monotonic()
    with credentials_named(_credential_sources(spec)):
        return _run_merge(spark, spec, parsed, started=started)


def _credential_sources(spec: MergeSpec) -> dict[str, str | None]:
    sources = {spec.target.uri: spec.target.credentials_from}
    if spec.source.uri is not None:
        sources[spec.source.uri] = spec.source.credentials_from
    return sources


def _run_merge(spark: SparkSession, spec: MergeSpec, parsed: ParsedMerge, *, started: float) -> MergeMetrics:
    """The checked merge: skipped when its app transaction is in the log, else run to its commit."""
    applied = applied_metrics(spec)
    if applied is not None:
        log.info("MERGE skipped: app transaction %s v%s is already in the log (version %d)",
                 spec.run.app_id, spec.run.app_version, applied.tableVersion)
        _catch_up_iceberg_metadata(spec)
        return applied
    with session_confs(spark, _merge_confs(spark, spec)), measured_merge(spark) as cost:
        for attempt in range(1, MATERIALIZE_MAX_ATTEMPTS + 1):
            try:
                metrics = _run_attempt(spark, spec, parsed, started=started, attempt=attempt)
                stages = ", ".join(f"{name}: {ms}" for name, ms in cost.stage_ms.items())
                log.info("MERGE stages (ms): %s", stages)
                return metrics.with_values(stageTimesMs=stage_times(cost.stage_ms))
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
    with stage("MERGE operation - loading the target's snapshot"):
        snapshot = load_snapshot(spec.target.uri, storage_options=dict(spec.target.storage_options))
    log.info(
        "MERGE into %s at version %d (%d files)", spec.target.uri, snapshot.version, len(snapshot.files)
    )
    # The statement's USING query names the spec's source as a view, which lives as long as the attempt.
    with ExitStack() as statement_view:
        with stage("MERGE operation - resolving the statement"):
            source_read = read_source(spark, spec.source)
            if parsed.source_query is not None:
                source_read = statement_view.enter_context(
                    statement_source(spark, source_read, parsed.source_query))
            iceberg_compatible = iceberg_compat_v2(snapshot.protocol.writer_features, snapshot.configuration)
            plan = resolve_merge(
                spark, parsed, target_schema=snapshot.schema, source_schema=source_read.df.schema,
                options=spec.options, widen_types=schema_evolution_widening(
                    snapshot.protocol.reader_features | snapshot.protocol.writer_features,
                    snapshot.configuration, iceberg_compatible=iceberg_compatible),
            )  # fmt: skip
            if iceberg_compatible:
                check_iceberg_compat_schema(plan.final_schema, table_uri=snapshot.table_uri)
            # New columns of a column-mapped table need their physical names before anything is written.
            mapped = map_new_fields(snapshot.configuration, snapshot.schema, plan.final_schema,
                                    mode=snapshot.column_mapping_mode, nested_ids=iceberg_compatible)
            plan = replace(plan, final_schema=mapped)
        with stage("MERGE operation - materializing the source"):
            source = materialize_source(
                source_read, columns=plan.source_columns, options=spec.options,
                insert_only=parsed.is_insert_only, attempt=attempt,
            )
        log.info("source prepared: materialized=%s (%s)%s", source.materialized, source.reason,
                 f", storage level {source.storage_level}" if source.materialized else "")
        try:
            outcome = execute_merge(
                spark, source.df, snapshot=snapshot, plan=plan,
                target_file_size=_target_file_size(spec, snapshot), dry_run=spec.options.dry_run,
                broadcast_source=source.fits_a_broadcast(spark), source_row_id=source.row_id_column,
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
                        "the scans (materialized: %s)", metrics.numSourceRows,
                        metrics.numSourceRowsInSecondScan, source.materialized)  # fmt: skip
        check_expectations(metrics.to_dict(), spec.expected_metrics)
        if spec.options.dry_run:
            return metrics.with_values(dryRun=True, tableVersion=snapshot.version)
        with stage("MERGE operation - committing"):
            committed = commit_merge(spark, spec, snapshot=snapshot, plan=plan, outcome=outcome,
                                     metrics=metrics)
        if uniform_iceberg_enabled(snapshot.configuration) and committed.tableVersion != snapshot.version:
            with stage("MERGE operation - writing Iceberg metadata (UniForm)"):
                _write_iceberg_metadata(spec, committed.tableVersion)
        return committed


def _write_iceberg_metadata(spec: MergeSpec, version: int | None) -> None:
    """The Iceberg metadata of the Delta version the merge committed (UniForm's post-commit conversion)."""
    options = dict(spec.target.storage_options)
    converted = load_snapshot(spec.target.uri, storage_options=options, version=version)
    write_iceberg_metadata(converted, commit_timestamp_ms=converted.in_commit_timestamp)


def _catch_up_iceberg_metadata(spec: MergeSpec) -> None:
    """On a rerun that finds its merge applied: the Iceberg metadata the first run may not have written
    (killed between its commit and its conversion)."""
    latest = load_snapshot(spec.target.uri, storage_options=dict(spec.target.storage_options))
    if uniform_iceberg_enabled(latest.configuration):
        write_iceberg_metadata(latest, commit_timestamp_ms=latest.in_commit_timestamp)
