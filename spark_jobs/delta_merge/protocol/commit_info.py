"""The commitInfo keys that tell this job's merge commits apart from other writers' commits."""

from __future__ import annotations

__all__ = ["MERGE_ENGINE", "MERGE_OPERATION"]

# Readers that know only Delta's keys see an ordinary MERGE commit; the provider's sensor and the job's
# idempotency check find the job's own commits by these two.
MERGE_ENGINE = "airflow-merge-provider"  # commitInfo["mergeEngine"]
MERGE_OPERATION = "MERGE"  # commitInfo["mergeOperation"] of the data commit
