"""Idempotent merges: an app transaction (app id, version) already in the log is not applied again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_jobs.delta_merge.commit import find_app_transaction_commit
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.spec import MergeSpec

__all__ = ["applied_metrics", "metrics_of_commit"]


def metrics_of_commit(version: int, commit_info: Mapping[str, Any]) -> MergeMetrics:
    """The metrics a merge recorded in its commit, marked as not applied again (``skipped``)."""
    recorded = dict(commit_info.get("operationMetrics", {}))
    if "materializeSourceReason" in commit_info:  # a string: kept beside operationMetrics, not in them
        recorded["materializeSourceReason"] = commit_info["materializeSourceReason"]
    metrics = MergeMetrics.from_mapping(recorded)
    return metrics.with_values(
        skipped=True, tableVersion=version, readVersion=int(commit_info.get("readVersion", -1))
    )


def applied_metrics(spec: MergeSpec) -> MergeMetrics | None:
    """The metrics of the commit that already applied ``spec.run``'s app transaction, if one did.

    Delta's rule: a transaction of the app id at or above the spec's app version means applied.
    """
    app_id, app_version = spec.run.app_id, spec.run.app_version
    if app_id is None or app_version is None:
        return None
    found = find_app_transaction_commit(
        spec.target.uri, app_id, app_version, storage_options=dict(spec.target.storage_options)
    )
    if found is not None:
        return metrics_of_commit(*found)
    import deltalake

    table = deltalake.DeltaTable(spec.target.uri, storage_options=dict(spec.target.storage_options) or None)
    recorded = table.transaction_version(app_id)
    if recorded is not None and recorded >= app_version:
        # A newer application of the same app id superseded this one: it counts as applied, but
        # its own commit (and so its metrics) is not that of this version.
        return MergeMetrics(skipped=True, tableVersion=int(table.version()))
    return None
