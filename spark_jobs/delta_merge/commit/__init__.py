"""The commit stage, one unit: whether the merge already landed, and committing it as one Delta version.

Delta's MergeIntoCommand ends in ``OptimisticTransaction.commit``; its parts live in this package:
``actions`` (the commit's actions per PROTOCOL.md and one put-if-absent attempt), ``validity`` (the files
checked as they will be committed), ``conflicts`` (Delta's conflict rules, at its isolation level, against
what landed since the read), ``serializable`` (the compare-and-swap loop) and ``idempotency`` (app
transactions).
The pipeline calls :func:`applied_metrics` before it reads anything and :func:`commit_merge` at the end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from spark_jobs.delta_merge.commit.actions import plan_commit
from spark_jobs.delta_merge.commit.conflicts import ReadSet
from spark_jobs.delta_merge.commit.idempotency import applied_metrics
from spark_jobs.delta_merge.commit.serializable import commit_serializably
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.column_mapping import max_column_id_update
from spark_jobs.delta_merge.protocol.identity_columns import with_moved_high_water_marks
from spark_jobs.delta_merge.scan.data_skipping import prune_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.delta_merge.analysis.merge_plan import MergePlan
    from spark_jobs.delta_merge.merge.stats import MergeOutcome
    from spark_jobs.delta_merge.protocol.files import LiveFile
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot
    from spark_jobs.delta_merge.spec import MergeSpec

__all__ = ["applied_metrics", "commit_merge"]

log = logging.getLogger("delta_merge")


def commit_merge(
    spark: SparkSession, spec: MergeSpec, *, snapshot: TargetSnapshot, plan: MergePlan, outcome: MergeOutcome,
    metrics: MergeMetrics,
) -> MergeMetrics:
    """Commit the merge's files as one version on the latest one, under Delta's conflict rules, and
    return its metrics with the version it landed on. A concurrent commit of the same app transaction
    wins: its metrics come back, marked ``skipped``.

    :raises ConcurrentModificationError: a conflicting commit landed since ``snapshot.version``.
    :raises MergeExecutionError: a file is not valid as committed, or the commit could not be written.
    """
    # Moved identity high-water marks are a schema change committed with the data, as in Delta.
    final_schema = with_moved_high_water_marks(
        plan.final_schema, plan.tracked_identity, outcome.adds, table_uri=snapshot.table_uri,
        column_mapping_mode=snapshot.column_mapping_mode, storage_options=snapshot.storage_options,
    )
    configuration_updates = max_column_id_update(snapshot.configuration, final_schema,
                                                 mode=snapshot.column_mapping_mode)  # fmt: skip
    changes_table = bool(outcome.removes or outcome.adds or outcome.change_files or outcome.readds
                         or final_schema != plan.target_schema or configuration_updates)  # fmt: skip
    if not changes_table and _app_transaction(spec) is None and _skips_empty_commits(spark):
        # Delta's skipRecordingEmptyCommits (on by default): a merge that changed nothing records no
        # version. One with an app transaction still commits, so that a rerun finds it applied.
        log.info("MERGE changed nothing: no version recorded (Delta's skipRecordingEmptyCommits); the table "
                 "stays at version %d", snapshot.version)  # fmt: skip
        return metrics.with_values(tableVersion=snapshot.version)
    # Delta's isolation level: Serializable, Delta's own (and its only one); WriteSerializable where the
    # table asks for it, as tables Databricks wrote may.
    write_serializable = snapshot.configuration.get("delta.isolationLevel") == "WriteSerializable"
    isolation_level = "WriteSerializable" if write_serializable else "Serializable"
    commit_plan = plan_commit(
        snapshot,
        isolation_level=isolation_level,
        removes=outcome.removes,
        adds=outcome.adds,
        change_files=outcome.change_files,
        readds=outcome.readds,
        new_schema=final_schema if final_schema != plan.target_schema else None,
        configuration_updates=configuration_updates,
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
        read_paths={f.path: f.partition_values for f in outcome.read},
        removed_paths={f.path: f.partition_values for f in outcome.removes},
        app_id=spec.run.app_id,
        app_version=spec.run.app_version,
        token=commit_plan.token,
        serializable=isolation_level == "Serializable",
        table=spec.target.uri,
        partitioned=bool(snapshot.partition_columns),
    )

    def matches_read(files: Sequence[LiveFile]) -> list[LiveFile]:
        # As Delta's read predicates: the partitions the target-only predicates select. Without statistics
        # a file is judged by its partition values alone (the rows it holds do not matter to Delta).
        unjudged = [replace(f, stats=None) for f in files]
        return prune_files(spark, snapshot, unjudged, predicates=plan.target_only_predicates,
                           target_alias=plan.target_alias)

    log.info("committing: %d files removed, %d added, %d given deletion vectors, read version %d",
             len(outcome.removes) - len(outcome.readds), len(outcome.adds), len(outcome.readds),
             snapshot.version)
    landed = commit_serializably(
        commit_plan, read, matches_read=matches_read, storage_options=dict(spec.target.storage_options)
    )
    if landed.already_applied:
        log.info("MERGE not applied again: version %d already applied this app transaction", landed.version)
        return MergeMetrics.from_commit(landed.version, landed.commit_info).with_values(skipped=True)
    log.info("MERGE committed version %d", landed.version)
    return metrics.with_values(tableVersion=landed.version)


# Delta's SQL conf (default true) for leaving out commits without file actions.
SKIP_EMPTY_COMMITS_CONF = "spark.databricks.delta.skipRecordingEmptyCommits"


def _skips_empty_commits(spark: SparkSession) -> bool:
    return str(spark.conf.get(SKIP_EMPTY_COMMITS_CONF, "true")).strip().lower() != "false"


def _app_transaction(spec: MergeSpec) -> tuple[str, int] | None:
    if spec.run.app_id is None or spec.run.app_version is None:
        return None
    return spec.run.app_id, spec.run.app_version


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
