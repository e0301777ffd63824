"""What a merge costs its Spark session: the Spark jobs it runs and the time of each of its stages.

The merge's jobs run in one job group of their own, counted from Spark's status tracker at the end; each
stage is named as Delta names its jobs (the Spark UI shows the same names) and timed on the driver.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

__all__ = ["MergeCost", "measured_merge", "stage"]

log = logging.getLogger("delta_merge")

_GROUP_PROPERTY = "spark.jobGroup.id"
_DESCRIPTION_PROPERTY = "spark.job.description"


@dataclass
class MergeCost:
    """The Spark jobs of one merge (``job_group``) and the milliseconds of each stage, in order."""

    job_group: str
    stage_ms: dict[str, int] = field(default_factory=dict)

    def spark_jobs(self, spark: SparkSession) -> int:
        """How many Spark jobs the merge has run so far."""
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(self.job_group))


_current: ContextVar[MergeCost | None] = ContextVar("merge_cost", default=None)


@contextmanager
def measured_merge(spark: SparkSession) -> Iterator[MergeCost]:
    """Run the block's Spark jobs in a job group of their own (the caller's group is restored after)."""
    context = spark.sparkContext
    previous = context.getLocalProperty(_GROUP_PROPERTY)
    cost = MergeCost(job_group=f"delta-merge-{uuid.uuid4().hex}")
    context.setLocalProperty(_GROUP_PROPERTY, cost.job_group)
    token = _current.set(cost)
    try:
        yield cost
    finally:
        _current.reset(token)
        context.setLocalProperty(_GROUP_PROPERTY, previous)  # type: ignore[arg-type]


@contextmanager
def stage(spark: SparkSession, description: str) -> Iterator[None]:
    """Name the Spark jobs of a stage as Delta does, log one progress line for it, and time it for the
    merge being measured (a stage run twice adds up)."""
    log.info("%s", description)
    context = spark.sparkContext
    previous = context.getLocalProperty(_DESCRIPTION_PROPERTY)
    context.setJobDescription(description)
    started = time.monotonic()
    try:
        yield
    finally:
        context.setLocalProperty(_DESCRIPTION_PROPERTY, previous)  # type: ignore[arg-type]
        cost = _current.get()
        if cost is not None:
            elapsed = int((time.monotonic() - started) * 1000)
            cost.stage_ms[description] = cost.stage_ms.get(description, 0) + elapsed
