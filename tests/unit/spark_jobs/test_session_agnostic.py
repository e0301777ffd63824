"""The job runs on a classic session and on a Spark Connect session alike: nothing in it reaches for the
JVM gateway or the RDD API (which a Connect client does not have), and the facts it asks of its session
come the way both kinds answer."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs.delta_merge.session_facts import default_parallelism, estimated_row_bytes, hadoop_version
from spark_jobs.delta_merge.task_frames import spread_tasks

JOB = Path(__file__).resolve().parents[3] / "spark_jobs"
# Attributes only a classic session's JVM gateway or the RDD API have.
JVM_ONLY = frozenset({
    "_jdf", "_jvm", "_jsparkSession", "_jsc", "_jconf", "_sc", "sparkContext", "rdd", "statusTracker",
    "parallelize", "setJobGroup", "setJobDescription", "setLocalProperty", "getLocalProperty",
})  # fmt: skip


def jvm_only_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of each JVM-only attribute or the SparkContext class used in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in JVM_ONLY:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id == "SparkContext":
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] == "SparkContext":
            found.append((0, node.name))
    return found


def test_the_checker_finds_each_kind_of_jvm_call() -> None:
    source = (
        "spark._jsparkSession.x()\ndf._jdf.y()\nspark.sparkContext.parallelize([])\n"
        "from pyspark import SparkContext\n"
    )
    names = {name for _, name in jvm_only_uses(source)}
    assert names == {"_jsparkSession", "_jdf", "sparkContext", "parallelize", "SparkContext"}


# spark-submit's entry point starts the classic session it runs in, and names that session's application
# and live UI (its SparkContext's); a Connect run calls run_merge and never imports it.
CLASSIC_ENTRY_POINT = JOB / "delta_merge" / "__main__.py"


def test_the_job_uses_no_jvm_gateway_and_no_rdd() -> None:
    offenders = [
        f"{path.relative_to(JOB.parent)}:{line}: {name}"
        for path in sorted(JOB.rglob("*.py"))
        if path != CLASSIC_ENTRY_POINT
        for line, name in jvm_only_uses(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_classic_entry_point_reaches_for_its_context_only_to_name_its_application() -> None:
    uses = jvm_only_uses(CLASSIC_ENTRY_POINT.read_text(encoding="utf-8"))
    assert [name for _, name in uses] == ["sparkContext"]


def test_a_rows_estimated_size_is_sparks_default_sizes() -> None:
    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    assert estimated_row_bytes(schema) == 8 + 8 + 20


def test_the_session_answers_its_facts_without_the_jvm_gateway(spark: Any) -> None:
    assert default_parallelism(spark) == spark.sparkContext.defaultParallelism
    assert hadoop_version(spark) == spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion()


def test_task_rows_land_in_the_partition_of_their_slice(spark: Any) -> None:
    schema = StructType([StructField("task", StringType())])
    slices = [[("a",), ("b",)], [("c",)], [("d",), ("e",), ("f",)]]
    placed = spread_tasks(spark, slices, schema).select(F.spark_partition_id().alias("p"), "task").collect()
    assert sorted((r["p"], r["task"]) for r in placed) == [
        (0, "a"), (0, "b"), (1, "c"), (2, "d"), (2, "e"), (2, "f")
    ]
