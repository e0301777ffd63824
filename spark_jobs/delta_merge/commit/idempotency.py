"""Idempotent merges: an app transaction (app id, version) already in the log is not applied again."""

from __future__ import annotations

from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.protocol.delta_log import (
    app_transaction_version,
    find_app_transaction_commit,
    table_version,
)
from spark_jobs.delta_merge.spec import MergeSpec

__all__ = ["applied_metrics"]


def applied_metrics(spec: MergeSpec) -> MergeMetrics | None:
    """The metrics of the commit that already applied ``spec.run``'s app transaction, if one did
    (marked ``skipped``: not applied again).

    Delta's rule: a transaction of the app id at or above the spec's app version means applied.
    """
    app_id, app_version = spec.run.app_id, spec.run.app_version
    if app_id is None or app_version is None:
        return None
    options = dict(spec.target.storage_options)
    found = find_app_transaction_commit(spec.target.uri, app_id, app_version, storage_options=options)
    if found is not None:
        return MergeMetrics.from_commit(*found).with_values(skipped=True)
    recorded = app_transaction_version(spec.target.uri, app_id, storage_options=options)
    if recorded is not None and recorded >= app_version:
        # A newer application of the same app id superseded this one: it counts as applied, but
        # its own commit (and so its metrics) is not that of this version.
        latest = table_version(spec.target.uri, storage_options=options)
        return MergeMetrics(skipped=True, tableVersion=latest)
    return None
