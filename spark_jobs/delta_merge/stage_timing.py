"""What a merge costs its Spark session: the time of each of its stages, and one tag on all its Spark work.

Each stage is named as Delta names its jobs, logged when it starts and timed on the driver. The merge's
operations carry one Spark tag of their own (``SparkSession.addTag``, the same on a classic and a Spark
Connect session), so a caller can interrupt exactly them (``SparkSession.interruptTag``).

Two things the classic session's SparkContext offered are not kept: the count of the merge's Spark jobs
(the status tracker) and the job descriptions the Spark UI shows. Neither is reachable through Spark Connect,
and a metric one session kind cannot give would make the two kinds' metrics differ.
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

__all__ = ["MERGE_TAG_PREFIX", "MergeCost", "measured_merge", "stage"]

log = logging.getLogger("delta_merge")

# The tag of a merge's Spark operations: this prefix and a random suffix, one per run_merge call.
MERGE_TAG_PREFIX = "delta-merge-"


@dataclass
class MergeCost:
    """The Spark tag of one merge's operations and the milliseconds of each stage, in order."""

    tag: str
    stage_ms: dict[str, int] = field(default_factory=dict)


_current: ContextVar[MergeCost | None] = ContextVar("merge_cost", default=None)


@contextmanager
def measured_merge(spark: SparkSession) -> Iterator[MergeCost]:
    """Tag the block's Spark operations with the merge's own tag (removed after; the caller's stay)."""
    cost = MergeCost(tag=f"{MERGE_TAG_PREFIX}{uuid.uuid4().hex}")
    spark.addTag(cost.tag)
    token = _current.set(cost)
    try:
        yield cost
    finally:
        _current.reset(token)
        spark.removeTag(cost.tag)


@contextmanager
def stage(description: str) -> Iterator[None]:
    """Log one progress line for a stage, named as Delta names its jobs, and time it for the merge being
    measured (a stage run twice adds up)."""
    log.info("%s", description)
    started = time.monotonic()
    try:
        yield
    finally:
        cost = _current.get()
        if cost is not None:
            elapsed = int((time.monotonic() - started) * 1000)
            cost.stage_ms[description] = cost.stage_ms.get(description, 0) + elapsed
