"""``python -m airflow_merge_provider metrics DAG_ID TASK_ID RUN``: a merge task's metrics, read from XCom.

Airflow 3's CLI has no ``xcom`` command, so after ``airflow dags test`` (or any run) this prints what the
task returned: the table the task log shows, or the XCom value as JSON (``--json``). It reads the metadata
database of the Airflow installation it runs in (``AIRFLOW_HOME``), as the ``airflow`` command does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "task_metrics"]


def task_metrics(dag_id: str, task_id: str, run: str, *, map_index: int = -1) -> tuple[str, Any]:
    """The run id and the XCom return value of ``task_id`` in the run of ``dag_id`` whose logical date
    (``2024-06-01``, as ``airflow dags test`` takes it) or run id is ``run``.

    :raises LookupError: no metadata database here, no such run, or no return value of the task in it (the
        message says which).
    """
    import pendulum
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import or_, select
    from sqlalchemy.exc import DBAPIError

    try:
        logical_date = pendulum.parse(run)
    except (ValueError, TypeError, pendulum.parsing.exceptions.ParserError):
        logical_date = None
    with create_session() as session:
        matches = DagRun.run_id == run
        if logical_date is not None:
            matches = or_(matches, DagRun.logical_date == logical_date)
        try:
            found = session.scalars(
                select(DagRun.run_id).where(DagRun.dag_id == dag_id, matches).order_by(DagRun.id.desc())
            ).first()
        except DBAPIError as error:
            # The URL is not named: it may hold the database's password.
            home = os.environ.get("AIRFLOW_HOME", "~/airflow")
            raise LookupError(
                f"the metadata database of AIRFLOW_HOME={home!r} has no DAG runs to read "
                f"({type(error.orig).__name__}): set AIRFLOW_HOME to the home the DAG ran in "
                "(scripts/run-example's is .example/airflow), or run `airflow db migrate` there first"
            ) from None
        if found is None:
            raise LookupError(
                f"no run of DAG {dag_id!r} with the logical date or run id {run!r} in this Airflow's "
                f"metadata database: check the DAG id and the date (`airflow dags list-runs {dag_id}` lists "
                "its runs)"
            )
        value = session.scalars(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.task_id == task_id,
                XComModel.run_id == found,
                XComModel.map_index == map_index,
                XComModel.key == "return_value",
            )
        ).first()
    if value is None:
        raise LookupError(
            f"task {task_id!r} of run {found!r} of DAG {dag_id!r} has no return value (map index "
            f"{map_index}): check the task id, and that the task ran and succeeded"
        )
    return found, value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_merge_provider",
        description="Read what a MergeIntoOperator task returned, from Airflow's metadata database.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    metrics = commands.add_parser(
        "metrics", help="print a merge task's metrics (its XCom return value)",
        description="Print a merge task's metrics (its XCom return value) from a DAG run.",
    )  # fmt: skip
    metrics.add_argument("dag_id")
    metrics.add_argument("task_id")
    metrics.add_argument(
        "run", help="the run's logical date (2024-06-01, as airflow dags test takes it) or run id"
    )
    metrics.add_argument(
        "--map-index", type=int, default=-1, help="the mapped task's index (default: not mapped)"
    )
    metrics.add_argument("--json", action="store_true", help="print the XCom value as JSON")
    args = parser.parse_args(argv)

    try:
        run_id, value = task_metrics(args.dag_id, args.task_id, args.run, map_index=args.map_index)
    except LookupError as error:
        print(f"python -m airflow_merge_provider metrics: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(value, indent=2))  # as stored (stageTimesMs lists the stages in the order they ran)
        return 0
    from airflow_merge_provider.metrics import format_metrics_table

    print(f"{args.dag_id}.{args.task_id} in run {run_id}:")
    # Not a merge's metrics (another task's return value): as JSON.
    table = format_metrics_table(value) if isinstance(value, dict) else ""
    print(table or json.dumps(value, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
