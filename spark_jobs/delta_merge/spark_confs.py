"""Spark confs the job reads beside its spec (sizes in bytes, as Spark writes them) and sets for a merge."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession

from spark_jobs.delta_merge.errors import MergeSpecError

__all__ = ["JOB_SESSION_CONFS", "session_confs", "size_conf"]


# The confs of the session the submitted job creates. PySpark's DataFrame debugging records the Python call
# site of every Column and DataFrame call in the JVM (four more Py4J calls each, and a walk of the Python
# stack): hundreds per merge, a tenth of a second or more of its driver work. The job's errors name the
# statement, not a line of the job's own code, so the call sites would tell a user nothing.
JOB_SESSION_CONFS = {"spark.python.sql.dataFrameDebugging.enabled": "false"}


def size_conf(spark: SparkSession, name: str, default: int, *, never: str) -> int:
    """The Spark conf ``name``, a size in bytes (``32m``, ``33554432``; -1: ``never``), else ``default``.

    :raises MergeSpecError: the value is no size, before anything is written.
    """
    setting = spark.conf.get(name, None)
    try:
        return default if setting is None else _bytes(setting)
    except ValueError as exc:
        raise MergeSpecError(
            f"The Spark conf {name} must be a size in bytes such as 33554432 or 32m (-1: {never}), "
            f"got {setting!r}."
        ) from exc


def _bytes(text: str) -> int:
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30,
             "gb": 1 << 30}  # fmt: skip
    match = re.fullmatch(r"\s*(-?\d+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in units:
        raise ValueError(text)
    return int(match.group(1)) * units[match.group(2).lower()]


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
