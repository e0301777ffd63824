"""Delta Lake MERGE INTO as a PySpark job; the contract (spec) imports without Spark."""

from __future__ import annotations

from typing import Any

__all__ = ["MergeMetrics", "MergeSpec", "run_merge"]


def __getattr__(name: str) -> Any:
    # Lazy so that `spark_jobs.delta_merge.spec` stays importable where pyspark is not installed.
    if name == "run_merge":
        from spark_jobs.delta_merge.pipeline import run_merge

        return run_merge
    if name == "MergeMetrics":
        from spark_jobs.delta_merge.metrics import MergeMetrics

        return MergeMetrics
    if name == "MergeSpec":
        from spark_jobs.delta_merge.spec import MergeSpec

        return MergeSpec
    raise AttributeError(name)
