"""spark-submit entry point: run one merge from a spec and print its metrics as one JSON line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

if __package__ in (None, ""):
    # Run as a file by spark-submit: make the `spark_jobs` package importable from the source tree
    # (a --py-files zip or an installed package takes precedence when present).
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark_jobs.delta_merge.contract import (
    METRICS_PREFIX,
    PROGRESS_PREFIX,
    application_line,
    failure_line,
    metrics_line,
)  # fmt: skip

__all__ = ["METRICS_PREFIX", "main"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="delta_merge", description="Run one Delta Lake MERGE INTO.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec", help="path of the merge spec JSON file")
    group.add_argument("--spec-json", help="the merge spec as a JSON string")
    return parser.parse_args(argv)


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(PROGRESS_PREFIX + "%(message)s"))
    logger = logging.getLogger("delta_merge")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # PySpark logs every analysis error with its JVM stack before raising it; the job reports causes itself.
    for name in ("SQLQueryContextLogger", "py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _load_spec(args: argparse.Namespace) -> Any:
    from spark_jobs.delta_merge.spec import MergeSpec

    if args.spec is not None:
        with open(args.spec, encoding="utf-8") as handle:
            return MergeSpec.from_json(handle.read())
    return MergeSpec.from_json(args.spec_json)


def main(argv: list[str] | None = None) -> int:
    """Run the merge; exit 0 after printing the metrics line, non-zero with the cause as last stderr line.

    Exit 1: the job refused or failed the merge on purpose (a :class:`MergeJobError`, including Spark's
    data and analysis errors, classified by :func:`spark_failure`); exit 2: anything else.
    """
    args = _parse_args(argv)
    _configure_logging()
    from spark_jobs.delta_merge.errors import MergeJobError, spark_failure

    spark = None
    failure: str | None = None
    code = 0
    try:
        spec = _load_spec(args)
        spec.validate()
        from pyspark.sql import SparkSession

        from spark_jobs.delta_merge.pipeline import run_merge
        from spark_jobs.delta_merge.spark_confs import JOB_SESSION_CONFS

        # spark.log.level: Spark's log level from the context's start (a submitted conf still wins).
        builder = SparkSession.builder.appName(f"delta-merge {spec.target.uri}")
        for key, value in JOB_SESSION_CONFS.items():
            builder = builder.config(key, value)
        spark = builder.config("spark.log.level", "WARN").getOrCreate()
        context = spark.sparkContext
        print(application_line(context.applicationId, context.uiWebUrl), file=sys.stderr, flush=True)
        metrics = run_merge(spark, spec)
        print(metrics_line(metrics.to_dict()), flush=True)
    except MergeJobError as exc:
        failure, code = failure_line(exc), 1
    except Exception as exc:  # anything else still has to end as one clear line
        # Classified while the JVM is up: a cast or overflow on the data must not look like a crash; and a
        # Py4J error's text is fetched from the JVM.
        classified = spark_failure(exc)
        failure, code = (failure_line(exc), 2) if classified is None else (failure_line(classified), 1)
    finally:
        if spark is not None:
            spark.stop()
    if failure is not None:
        sys.stderr.flush()
        print(failure, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
